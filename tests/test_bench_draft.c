/* g4 bench --draft-costs: what a drafting round's parts cost, in decode steps, and the speedups
 * they imply. On the tiny fixture with its drafter: the JSON has every field, the times are
 * positive, and each speedup is the formula's (tools/bench_cmd.c, draft_speedup) applied to the
 * printed ratios, within what their rounding to 4 decimals allows, the best K the largest. Nothing
 * compares two timings: on a loaded machine any step can take any time, so the ratios themselves
 * may be anything >= 0 (a time only grows under load: a lower bound on one is safe).
 * Bad combinations are refused with a one-line error. */
#define _POSIX_C_SOURCE 200809L
#include <unistd.h>

#include "cli_util.h"
#include "testutil.h"

#define ASSIST_A "tests/fixtures/tiny-assistant" /* made for ../shared/fixtures/tiny-mobile */
#define BUILTIN "models/gemma4-tiny-math"
#define BUILTIN_DRAFT "models/gemma4-tiny-math-drafter"

static char out[512], err[512];
static const char *bin;

static void expect_error(const char *args, const char *needle) {
    int rc = run_into(bin, args, out, err);
    char *e = slurp(err);
    int lines = 0;
    for (char *p = e; *p; p++) lines += *p == '\n';
    CHECK(rc == 1 && lines == 1 && strstr(e, "error") && strstr(e, needle), "g4 %s: exit %d, stderr \"%s\" (expected one line naming \"%s\")",
          args, rc, e, needle);
    free(e);
}

static double num(const cJSON *o, const char *key) {
    const cJSON *f = cJSON_GetObjectItem(o, key);
    CHECK(cJSON_IsNumber(f), "bench --draft-costs: %s missing", key);
    return cJSON_IsNumber(f) ? f->valuedouble : -1;
}

/* Half a unit of the JSON's last printed decimal (%.4f): how far a printed ratio or speedup may be
 * from the value it rounds, with a little room for the binary representation. */
#define HALF_ULP4 (0.5e-4 * (1 + 1e-9))

/* Whether a printed speedup `got` can be draft_speedup(alpha, k, verify, draft) for some verify and
 * draft that print as v and d: the formula is decreasing in both, so its range over their rounding
 * intervals runs from the largest costs to the smallest (costs are >= 0; a zero lower bound leaves
 * the range open above), and `got` may be half a unit off that range. */
static int speedup_consistent(double got, double alpha, int k, double v, double d) {
    double e = (1 - pow(alpha, k + 1)) / (1 - alpha);
    double den_hi = k * (d + HALF_ULP4) + v + HALF_ULP4, den_lo = k * fmax(d - HALF_ULP4, 0) + fmax(v - HALF_ULP4, 0);
    return got >= e / den_hi - HALF_ULP4 && (den_lo <= 0 || got <= e / den_lo + HALF_ULP4);
}

static void test_costs(void) {
    char args[8192];
    snprintf(args, sizeof args, "bench -m %s --draft %s --draft-costs -p 16 -r 3 --json --bandwidth off", tiny_dir(), ASSIST_A);
    int rc = run_into(bin, args, out, err);
    char *o = slurp(out);
    cJSON *j = cJSON_Parse(o);
    CHECK(rc == 0 && j, "g4 %s: exit %d, output %s", args, rc, o);
    free(o);
    if (!j) return;
    CHECK(num(j, "prompt_tokens") == 16 && num(j, "reps") == 3, "bench --draft-costs: prompt_tokens, reps");
    const cJSON *draft = cJSON_GetObjectItem(j, "draft");
    CHECK(cJSON_IsString(draft) && !strcmp(draft->valuestring, ASSIST_A), "bench --draft-costs: draft");
    double d = num(j, "draft_ratio");
    CHECK(num(j, "decode_step_s") > 0 && num(j, "draft_step_s") > 0 && d >= 0, "bench --draft-costs: positive step times, a draft ratio");
    const cJSON *verify = cJSON_GetObjectItem(j, "verify");
    double ratio[9] = {0};
    CHECK(cJSON_GetArraySize(verify) == 9, "bench --draft-costs: verify for K = 0..8");
    for (int k = 0; k < 9 && k < cJSON_GetArraySize(verify); k++) {
        const cJSON *v = cJSON_GetArrayItem(verify, k);
        ratio[k] = num(v, "ratio");
        CHECK(num(v, "k") == k && num(v, "rows") == k + 1 && num(v, "s") > 0 && ratio[k] >= 0, "bench --draft-costs: verify[%d]", k);
    }
    /* each round's decode step over itself: exactly 1 however long it took */
    CHECK(ratio[0] == 1, "bench --draft-costs: one row is the decode step (ratio %g)", ratio[0]);
    const cJSON *speedup = cJSON_GetObjectItem(j, "speedup");
    static const double alphas[] = {0.5, 0.6, 0.7, 0.8};
    CHECK(cJSON_GetArraySize(speedup) == 4, "bench --draft-costs: speedup for 4 alphas");
    for (int a = 0; a < 4 && a < cJSON_GetArraySize(speedup); a++) {
        const cJSON *s = cJSON_GetArrayItem(speedup, a), *by = cJSON_GetObjectItem(s, "by_k");
        double alpha = num(s, "alpha"), best = num(s, "best_speedup");
        int best_k = (int)num(s, "best_k"), ok = cJSON_GetArraySize(by) == 9 && alpha == alphas[a] && best_k >= 0 && best_k <= 8;
        ok = ok && cJSON_GetArrayItem(by, 0)->valuedouble == 1; /* K = 0 is plain decoding */
        for (int k = 0; ok && k < 9; k++) {
            double got = cJSON_GetArrayItem(by, k)->valuedouble;
            ok = speedup_consistent(got, alpha, k, ratio[k], d) && got <= best; /* both printed alike */
            if (k == best_k) ok = ok && got == best;
        }
        CHECK(ok, "bench --draft-costs: alpha %g: best K %d at %g, the formula on the printed ratios", alpha, best_k, best);
    }
    cJSON_Delete(j);
}

int main(void) {
    if (!(bin = check_bin())) return check_report("bench_draft");
    snprintf(out, sizeof out, "/tmp/g4-bench-draft-%d.out", (int)getpid());
    snprintf(err, sizeof err, "/tmp/g4-bench-draft-%d.err", (int)getpid());
    test_costs();
    char args[8192];
    snprintf(args, sizeof args, "bench -m %s --draft-costs", tiny_dir());
    expect_error(args, "--draft-costs needs --draft DIR");
    expect_error("bench -m " BUILTIN " --draft " ASSIST_A " --draft-costs -p 16 -r 1", "does not match the target");
    expect_error("bench -m " BUILTIN " --draft " BUILTIN_DRAFT " --draft-costs -n 8", "--draft-costs times K");
    expect_error("bench -m " BUILTIN " --draft " BUILTIN_DRAFT " --draft-costs --draft-tokens 2", "--draft-costs times K");
    expect_error("bench -m " BUILTIN " --draft " BUILTIN_DRAFT " --draft-costs -p 0", "--draft-costs times K");
    expect_error("bench -m " BUILTIN " --draft " BUILTIN_DRAFT " --draft-costs --kernels portable", "--draft compares");
    unlink(out);
    unlink(err);
    return check_report("bench_draft");
}
