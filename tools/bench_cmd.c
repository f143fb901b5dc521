/* `g4 bench`: load time, prefill and decode speed, peak memory and a per-operation breakdown,
 * repeated; and the machine's read bandwidth measured in the same run, so decode speed can be
 * stated as a fraction of the bandwidth roofline. */
#define _DEFAULT_SOURCE /* madvise, MAP_ANONYMOUS */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/stream_bw.h"
#include "cli.h"
#include "g4dev.h"

/* --kernels: the levels compared, at most this many; and the models (-m given several times) */
#define BENCH_MAX_LEVELS 5
/* --draft-costs: the most drafts a verification it times holds (0: a plain decode step) */
#define COST_MAX_K 8
#define G4_STR_(x) #x
#define G4_STR(x) G4_STR_(x)

typedef struct {
    const char *dir;
    /* -m DIR -m DIR2 ...: the reps alternate between these checkpoints, round after round, as
     * between the levels of --kernels (one or the other) */
    const char *dirs[BENCH_MAX_LEVELS];
    int n_models;
    int prompt, gen, reps, json, bandwidth;
    /* --kernels A,B,...: the reps alternate between these levels, round after round; with
     * --alternate steps the decode steps of every rep do as well */
    int n_levels, alt_steps;
    char levels[BENCH_MAX_LEVELS][32];
    int logits; /* LOGITS_GREEDY, LOGITS_FULL (every logit of every step) or LOGITS_TOP (what top-k sampling needs) */
    g4_options o; /* o.threads: -t, else one per online CPU (set explicitly, for the bandwidth probe too) */
    /* --draft DIR [--draft-tokens K]: the reps alternate between decoding without the drafter
     * (variant 0) and with it (variant 1), round after round */
    draft_args draft;
    /* --draft-costs: the costs of a drafting round's parts instead (draft_costs); gen_set: -n given */
    int draft_costs, gen_set;
    const char *image; /* --image FILE|WxH: the vision tower's encode instead of text */
    const char *audio; /* --audio FILE|SECONDS: the audio tower's */
} bench_args;

/* The bandwidth is measured just before and just after every repetition's decode, since this
 * machine's memory speed drifts from second to second (a 512-token prompt takes a few). A child
 * process forked before the model loads (so before any pool thread exists) owns the 1 GiB
 * buffer, so it never counts in the bench's peak resident memory; it measures whenever it reads
 * a byte from `req` and answers on `resp`. */
typedef struct {
    int req, resp;
    pid_t pid;
} bw_probe;

static int bw_probe_start(bw_probe *p, int threads) {
    int a[2], b[2];
    if (pipe(a) != 0) return -1;
    if (pipe(b) != 0) {
        close(a[0]);
        close(a[1]);
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(a[0]), close(a[1]), close(b[0]), close(b[1]);
        return -1;
    }
    if (pid == 0) {
        close(a[1]);
        close(b[0]);
        size_t bytes = (size_t)1 << 30;
        void *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        uint64_t *buf = map == MAP_FAILED ? NULL : map;
        if (buf) madvise(buf, bytes, MADV_HUGEPAGE); /* as resident weights ask (model.c); advice only */
        if (buf)
            for (size_t i = 0; i < bytes / 8; i++) buf[i] = i;
        char c;
        while (read(a[0], &c, 1) == 1) {
            double bw = buf ? g4_stream_bandwidth(buf, bytes, threads, 3) : 0;
            if (write(b[1], &bw, sizeof bw) != (ssize_t)sizeof bw) break;
        }
        _exit(0);
    }
    close(a[0]);
    close(b[1]);
    *p = (bw_probe){a[1], b[0], pid};
    return 0;
}

static double bw_probe_measure(const bw_probe *p) {
    double bw = 0;
    char c = 1;
    if (write(p->req, &c, 1) != 1 || read(p->resp, &bw, sizeof bw) != (ssize_t)sizeof bw) return 0;
    return bw;
}

static void bw_probe_stop(bw_probe *p) {
    close(p->req);
    close(p->resp);
    waitpid(p->pid, NULL, 0);
}

/* ---- one repetition: prefill a random prompt, then decode greedily ---- */

typedef struct {
    double prefill_tok_s, decode_tok_s;
    double read_bw; /* bytes/s around the decode (0: not measured) */
    double prof_prefill[G4_PROF_COUNT], prof_decode[G4_PROF_COUNT];
    /* --alternate steps: each decode step's seconds and the level (index into --kernels) it ran,
     * and each level's per-operation seconds summed over its steps */
    double *step_s;
    int *step_level;
    double step_prof[BENCH_MAX_LEVELS][G4_PROF_COUNT];
    long rounds, drafted, accepted; /* the drafter's rounds (--draft) */
} bench_rep;

enum { LOGITS_GREEDY, LOGITS_FULL, LOGITS_TOP };
static const char *const logits_kinds[] = {"greedy", "full", "top", NULL};
/* top: the 64 largest logits, E2B's generation_config top-k */
#define BENCH_TOP_K 64

/* Greedy decoding of the prompt and then gen tokens, through the stepper as g4 run decodes: each
 * step's token from the greedy shortcut (--logits greedy), from every logit (full), or from the
 * candidates of top-k sampling's shortcut (top, as g4 run samples by default). Each way gives the
 * same tokens. */
static g4_generate_params bench_generation(const bench_args *b) {
    static const int none[1] = {-1}; /* no stop id: every run decodes its gen tokens */
    static const g4_output outputs[] = {[LOGITS_GREEDY] = G4_OUTPUT_ARGMAX, [LOGITS_FULL] = G4_OUTPUT_LOGITS, [LOGITS_TOP] = G4_OUTPUT_TOP};
    g4_generate_params p = {.max_tokens = b->gen + 1, .stop_ids = none, .n_stop_ids = 1, .output = outputs[b->logits], .output_k = BENCH_TOP_K};
    g4_sampling_default(&p.sampling);
    return p;
}

/* probe: NULL, or the bandwidth probe to run around the decode (into r->read_bw). level: the
 * rep's level (index into b->levels, or 0): with --alternate steps its decode steps cycle through
 * the levels from that one, each timed on its own. Without a prompt (-p 0) token 2 stands in for
 * one, and the prefill is not reported. */
static int run_rep(const g4_model *m, const bench_args *b, unsigned seed, const bw_probe *probe, int level, int drafting,
                   bench_rep *r) {
    int V = g4_model_vocab_size(m), n_prompt = b->prompt > 0 ? b->prompt : 1;
    g4_options o = b->o;
    o.ctx = b->prompt + b->gen + 1;
    g4_session *s = g4_session_new(m, &o);
    g4_stepper *st = s ? g4_stepper_new(s, 0) : NULL;
    g4_drafter *dr = st && drafting ? g4_drafter_new(b->draft.d, s) : NULL;
    int32_t *ids = malloc(sizeof *ids * (size_t)n_prompt);
    g4_generate_params gen = bench_generation(b);
    gen.draft = dr;
    gen.draft_tokens = b->draft.tokens;
    g4_step_token token[G4_MAX_DRAFT_TOKENS + 1];
    int rc = -1;
    if (!st || !ids || (drafting && !dr)) {
        if (st && !(drafting && !dr)) g4_fail("out of memory");
        goto done;
    }
    ids[0] = 2;
    for (int i = 0; i < b->prompt; i++) ids[i] = (int32_t)(3 + (seed = seed * 1103515245u + 12345u) % (unsigned)(V - 3));
    if (g4_stepper_add(st, 0, ids, n_prompt, &gen) != 0) goto done;
    g4_session_set_profiling(s, 1);
    double t0 = now_s();
    while (g4_stepper_state(st, 0) == G4_SEQ_PROMPT)
        if (g4_stepper_step(st, token) < 0) goto done;
    double t1 = now_s();
    g4_session_profile(s, r->prof_prefill);
    double bw0 = probe ? bw_probe_measure(probe) : 0;
    g4_session_set_profiling(s, 1);
    double t2 = now_s();
    double before[G4_PROF_COUNT] = {0}, after[G4_PROF_COUNT];
    /* a drafting round gives several tokens a step: decode the budget's gen tokens, however many steps */
    while (drafting && g4_stepper_state(st, 0) == G4_SEQ_GENERATING)
        if (g4_stepper_step(st, token) < 0) goto done;
    for (int i = 0; i < b->gen && !drafting; i++) {
        double ts = 0;
        if (r->step_s) {
            r->step_level[i] = (level + i) % b->n_levels;
            g4_bench_session_level(s, b->levels[r->step_level[i]]);
            ts = now_s();
        }
        if (g4_stepper_step(st, token) < 0) goto done;
        if (r->step_s) {
            r->step_s[i] = now_s() - ts;
            g4_session_profile(s, after);
            for (int k = 0; k < G4_PROF_COUNT; k++) r->step_prof[r->step_level[i]][k] += after[k] - before[k], before[k] = after[k];
        }
    }
    double t3 = now_s();
    g4_session_profile(s, r->prof_decode);
    double bw1 = probe ? bw_probe_measure(probe) : 0;
    r->read_bw = bw0 > 0 && bw1 > 0 ? (bw0 + bw1) / 2 : 0;
    r->prefill_tok_s = b->prompt > 0 ? b->prompt / (t1 - t0) : 0;
    r->decode_tok_s = b->gen > 0 ? b->gen / (t3 - t2) : 0;
    g4_stepper_draft_stats(st, &r->rounds, &r->drafted, &r->accepted);
    rc = 0;
done:
    free(ids);
    g4_stepper_free(st);
    g4_drafter_free(dr);
    g4_session_free(s);
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static const char *weights_name(const g4_model *m) { return g4_model_weights_resident(m) ? "resident" : "mapped"; }

/* The --act value, in the options table's words. */
static const char *act_name(const g4_options *o) {
    static char name[16];
    return g4_options_get(o, "act", name, sizeof name) >= 0 ? name : "?";
}

/* --kernels A,B,...: each a level this CPU has, none twice. */
static int parse_levels(const char *v, bench_args *b) {
    b->n_levels = 0;
    for (const char *c = v; *c;) {
        size_t len = strcspn(c, ",");
        char name[32];
        if (len == 0 || len >= sizeof name) return die("g4 bench: --kernels %s: expected levels separated by commas", v);
        memcpy(name, c, len);
        name[len] = 0;
        if (!g4_bench_level_available(name)) {
            char msg[160];
            snprintf(msg, sizeof msg, "%s is not a level this CPU has (levels: %s)", name, g4_bench_levels());
            return die("g4 bench: --kernels: %s", msg);
        }
        for (int i = 0; i < b->n_levels; i++)
            if (!strcmp(b->levels[i], name)) return die("g4 bench: --kernels: %s given twice", name);
        if (b->n_levels == BENCH_MAX_LEVELS) return die("g4 bench: --kernels %s: too many levels", v);
        memcpy(b->levels[b->n_levels++], name, len + 1);
        c += len;
        c += *c == ',';
    }
    return b->n_levels ? 0 : die("g4 bench: --kernels needs at least one level%s", "");
}

const command_usage usage_bench = {
    "bench [-m DIR]... [-t N] [-p 512] [-n 128] [-r 3] [flags]",
    "Load, prefill and decode speed, memory and per-operation time; reps alternate between the --kernels levels, the\n"
    "-m models, or with and without --draft, and each one's speed is given over the first's.",
    (const usage_line[]){
        {"-m, --model DIR", "the checkpoint folder (default: the built-in model); several -m compare models"},
        {"-p, --prompt-tokens N", "prompt length (default 512)"},
        {"-n, --gen-tokens N", "decoded tokens (default 128)"},
        {"-r, --reps N", "repetitions (default 3)"},
        {"--json", "one JSON object on stdout"},
        {"--bandwidth on|off", "measure the memory bandwidth (in a child process; default on)"},
        {"--logits greedy|full|top", "full: every logit (sampling without top-k); top: what top-k sampling needs (g4 run's)"},
        {"--kernels LEVEL,LEVEL...", "alternate between these kernel levels"},
        {"--alternate reps|steps", "with --kernels: alternate whole reps or decode steps"},
        {"--draft-costs", "with --draft: time verifying K+1 rows (K = 0..8) and one draft step after a -p prompt"},
        {"--image FILE|WxH", "time the vision tower on a PNG/JPEG (or a generated W x H image) at the model's default budget (-r reps, --kernels alternating) and its linears' MAC rate next to a text prefill chunk's"},
        {"--audio FILE|SECONDS", "time the audio tower on a WAV (or a generated clip of that many seconds, up to 30): encode time, x real time, MAC rate"},
        {NULL, NULL},
    },
    USAGE_ENGINE | USAGE_DRAFT,
};

static int parse_bench(args_t *a, bench_args *b) {
    int bad = 0;
    memset(b, 0, sizeof *b);
    g4_options_default(&b->o);
    b->prompt = 512;
    b->gen = 128;
    b->reps = 3;
    b->bandwidth = 1;
    static const char *const onoff[] = {"off", "on", NULL};
    for (a->i = 2; a->i < a->argc && !bad; a->i++) {
        const char *v;
        if (flag_is(a, "-m") || flag_is(a, "--model")) {
            if ((v = flag_value(a, "-m", &bad)) && b->n_models == BENCH_MAX_LEVELS) return die("g4 bench: -m %s: too many models", v);
            if (v) b->dirs[b->n_models++] = b->dir = v;
        }
        else if (flag_is(a, "-p") || flag_is(a, "--prompt-tokens")) {
            if ((v = flag_value(a, "-p", &bad)) && parse_int(a->cmd, "-p", v, 0, 1 << 20, &b->prompt)) bad = 1;
        } else if (flag_is(a, "-n") || flag_is(a, "--gen-tokens")) {
            if ((v = flag_value(a, "-n", &bad)) && parse_int(a->cmd, "-n", v, 0, 1 << 20, &b->gen)) bad = 1;
            b->gen_set = 1;
        } else if (flag_is(a, "-r") || flag_is(a, "--reps")) {
            if ((v = flag_value(a, "-r", &bad)) && parse_int(a->cmd, "-r", v, 1, 1000, &b->reps)) bad = 1;
        } else if (flag_is(a, "--bandwidth")) {
            if ((v = flag_value(a, "--bandwidth", &bad)) && parse_choice(a->cmd, "--bandwidth", v, onoff, &b->bandwidth)) bad = 1;
        } else if (flag_is(a, "--logits")) {
            if ((v = flag_value(a, "--logits", &bad)) && parse_choice(a->cmd, "--logits", v, logits_kinds, &b->logits)) bad = 1;
        } else if (flag_is(a, "--kernels")) {
            if ((v = flag_value(a, "--kernels", &bad)) && parse_levels(v, b)) return 1;
        } else if (flag_is(a, "--alternate")) {
            static const char *const alts[] = {"reps", "steps", NULL};
            if ((v = flag_value(a, "--alternate", &bad)) && parse_choice(a->cmd, "--alternate", v, alts, &b->alt_steps)) bad = 1;
        } else if (flag_is(a, "--json")) b->json = 1;
        else if (flag_is(a, "--draft-costs")) b->draft_costs = 1;
        else if (flag_is(a, "--image")) b->image = flag_value(a, "--image", &bad);
        else if (flag_is(a, "--audio")) b->audio = flag_value(a, "--audio", &bad);
        else if (!engine_flag(a, &b->o, &bad) && !draft_flag(a, &b->draft, &bad)) return unknown_flag(a);
    }
    if (bad) return 1;
    /* said explicitly, so the bandwidth probe measures with the threads the decode uses */
    if (!b->o.threads) b->o.threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (!b->n_models) b->dirs[b->n_models++] = default_model_dir();
    b->dir = b->dirs[0];
    if (b->n_models > 1 && b->n_levels) return die("g4 bench: --kernels compares levels on one model; several -m compare models%s", "");
    if (b->alt_steps && b->n_models > 1) return die("g4 bench: --alternate steps alternates levels, not models%s", "");
    if (b->prompt + b->gen < 1) return die("g4 bench: -p and -n are both 0%s", "");
    if (b->alt_steps && b->n_levels < 2) return die("g4 bench: --alternate steps needs --kernels with two levels or more%s", "");
    if (b->draft.dir && (b->n_levels || b->n_models > 1))
        return die("g4 bench: --draft compares decoding with and without the drafter on one model and level%s", "");
    if (b->draft.tokens && !b->draft.dir) return die("g4 bench: --draft-tokens needs --draft DIR%s", "");
    if (b->draft_costs && !b->draft.dir) return die("g4 bench: --draft-costs needs --draft DIR%s", "");
    if ((b->image || b->audio) && (b->draft.dir || b->n_models > 1 || b->alt_steps || b->draft_costs))
        return die("g4 bench: --image/--audio time one model's towers: no --draft, --draft-costs, --alternate or several -m%s", "");
    if (b->draft_costs && (b->draft.tokens || b->gen_set || b->logits != LOGITS_GREEDY || b->alt_steps || b->prompt < 1))
        return die("g4 bench: --draft-costs times K = 0..%s greedy drafts after a prompt of -p (at least 1) tokens: no -n, --draft-tokens, "
                   "--logits or --alternate", G4_STR(COST_MAX_K));
    return 0;
}

/* What variant l of the reps is: a --kernels level, a -m model, or nothing (one of each). */
static const char *variant_name(const bench_args *b, int l) {
    if (b->draft.dir) return l ? "with --draft" : "without --draft";
    return b->n_levels ? b->levels[l] : b->n_models > 1 ? b->dirs[l] : "";
}

/* The kernel level in use, the one the dispatcher would choose unforced, G4_DISPATCH and the CPU
 * flags the choice is made from, as JSON fields (each run says what it measured) or a line. */
static void print_kernels(FILE *f, int json, const bench_args *b) {
    const char *env = getenv("G4_DISPATCH"), *flags = g4_bench_cpu_flags();
    if (!json) {
        fprintf(f, "  kernels         ");
        if (b->n_levels)
            for (int l = 0; l < b->n_levels; l++) fprintf(f, "%s%s", l ? ", " : "compared: ", b->levels[l]);
        else fprintf(f, "%s (G4_DISPATCH %s)", g4_bench_level(), env && *env ? env : "unset");
        fprintf(f, "; this CPU's best: %s; CPU flags: %s\n", g4_bench_level_best(), *flags ? flags : "none");
        return;
    }
    fprintf(f, ", \"kernels_best\": \"%s\", \"kernels_env\": ", g4_bench_level_best());
    if (env && *env) {
        fputc('"', f);
        for (const char *c = env; *c; c++) /* as a JSON string, whatever it holds */
            if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
            else if ((unsigned char)*c < 0x20) fprintf(f, "\\u%04x", *c);
            else fputc(*c, f);
        fputc('"', f);
    } else {
        fprintf(f, "null");
    }
    fprintf(f, ", \"cpu_flags\": [");
    for (const char *c = flags; *c;) {
        size_t len = strcspn(c, " ");
        fprintf(f, "%s\"%.*s\"", c == flags ? "" : ", ", (int)len, c);
        c += len;
        c += *c == ' ';
    }
    fprintf(f, "]");
}

/* ops: seconds per operation over `tokens` tokens. */
static void print_ops(FILE *f, const char *what, const double *ops, int tokens, int json) {
    double total = 0;
    for (int i = 0; i < G4_PROF_COUNT; i++) total += ops[i];
    if (json) {
        fprintf(f, ", \"ops_%s_s\": {", what);
        for (int i = 0; i < G4_PROF_COUNT; i++) fprintf(f, "%s\"%s\": %.6f", i ? ", " : "", g4_prof_op_name((g4_prof_op)i), ops[i]);
        fprintf(f, "}");
        return;
    }
    fprintf(f, "  %-8s", what);
    for (int i = 0; i < G4_PROF_COUNT; i++)
        fprintf(f, "  %s %.2f ms (%.1f%%)", g4_prof_op_name((g4_prof_op)i), tokens > 0 ? 1e3 * ops[i] / tokens : 0,
                total > 0 ? 100 * ops[i] / total : 0);
    fprintf(f, "\n");
}

/* One level's reps: medians (and spread) of prefill and decode speed, bandwidth and roofline
 * fraction. */
typedef struct {
    double pmed, pmin, pmax, dmed, dmin, dmax, bw, fmed;
} bench_summary;

/* Statistics of reps[at[0]], reps[at[1]], ... (n of them). */
static bench_summary summarise(const bench_rep *reps, const int *at, int n, double bytes) {
    double *pf = calloc((size_t)n, sizeof *pf), *dc = calloc((size_t)n, sizeof *dc);
    double *bws = calloc((size_t)n, sizeof *bws), *frac = calloc((size_t)n, sizeof *frac);
    bench_summary r = {0};
    if (pf && dc && bws && frac) {
        for (int i = 0; i < n; i++) {
            const bench_rep *p = &reps[at[i]];
            pf[i] = p->prefill_tok_s, dc[i] = p->decode_tok_s, bws[i] = p->read_bw;
            frac[i] = bws[i] > 0 ? dc[i] * bytes / bws[i] : 0;
        }
        r.pmin = r.pmax = pf[0], r.dmin = r.dmax = dc[0];
        for (int i = 1; i < n; i++) {
            r.pmin = pf[i] < r.pmin ? pf[i] : r.pmin;
            r.pmax = pf[i] > r.pmax ? pf[i] : r.pmax;
            r.dmin = dc[i] < r.dmin ? dc[i] : r.dmin;
            r.dmax = dc[i] > r.dmax ? dc[i] : r.dmax;
        }
        r.pmed = median(pf, n), r.dmed = median(dc, n), r.bw = median(bws, n), r.fmed = median(frac, n);
    }
    free(pf);
    free(dc);
    free(bws);
    free(frac);
    return r;
}

/* The median over rounds of level l's speed over level 0's in the same round (prefill: what = 0,
 * decode: 1): neighbours in time share the machine's state, so a drifting machine moves both. */
static double round_ratio(const bench_rep *reps, const int *rep_of, int rounds, int n_levels, int l, int what) {
    double *r = calloc((size_t)rounds, sizeof *r);
    if (!r) return 0;
    for (int k = 0; k < rounds; k++) {
        const bench_rep *a = &reps[rep_of[k * n_levels + l]], *b = &reps[rep_of[k * n_levels]];
        double num = what ? a->decode_tok_s : a->prefill_tok_s, den = what ? b->decode_tok_s : b->prefill_tok_s;
        r[k] = den > 0 ? num / den : 0;
    }
    double m = median(r, rounds);
    free(r);
    return m;
}

/* --alternate steps: the median seconds of level l's decode steps over every rep (0: none). */
static double step_median(const bench_rep *reps, int total, int gen, int l) {
    double *t = calloc((size_t)total * (size_t)(gen > 0 ? gen : 1), sizeof *t);
    int n = 0;
    for (int i = 0; t && i < total; i++)
        for (int k = 0; k < gen; k++)
            if (reps[i].step_level[k] == l) t[n++] = reps[i].step_s[k];
    double m = n ? median(t, n) : 0;
    free(t);
    return m;
}

/* ---- --draft-costs: a drafting round's parts, each in decode steps ----
 *
 * After a prompt of -p tokens, each round times (in an order reversed every other round, so a
 * trend over a round favours none; one untimed round first) the verification of K drafts, one
 * g4_decode of K + 1 rows of sequence 0 asking their greedy tokens as the stepper does (K = 0: a
 * plain decode step), each followed by an untimed rollback to the prompt; and one draft step for
 * one row from the prompt's last hidden state, reading the prompt's K/V (every draft step of a
 * round drafts at the same position, so each costs the same). */

/* The speedup over plain greedy decoding that a round of k drafts implies when each draft is
 * accepted with probability alpha, independently: the round costs k draft steps and one
 * verification of k + 1 rows (draft, verify: in decode steps) and yields E = 1 + alpha + ... +
 * alpha^k = (1 - alpha^(k+1)) / (1 - alpha) tokens, where plain decoding yields one a step. */
static double draft_speedup(double alpha, int k, double verify, double draft) {
    double e = 0, p = 1;
    for (int i = 0; i <= k; i++) e += p, p *= alpha;
    return e / (k * draft + verify);
}

static const double cost_alphas[] = {0.5, 0.6, 0.7, 0.8};
#define N_ALPHAS (int)(sizeof cost_alphas / sizeof *cost_alphas)

typedef struct {
    double verify_s[COST_MAX_K + 1], draft_s; /* verify_s[k]: k + 1 rows */
} cost_round;

/* ids[0, n) fed to sequence 0 as prompt tokens (no output), in one g4_decode call. */
static int feed_prompt(g4_session *s, const int32_t *ids, int n) {
    g4_batch_row *rows = calloc((size_t)n, sizeof *rows);
    if (!rows) return g4_fail("out of memory for %d rows", n);
    for (int t = 0; t < n; t++) rows[t] = (g4_batch_row){.seq = 0, .token = ids[t]};
    int rc = g4_decode(s, rows, n);
    free(rows);
    return rc;
}

static int run_costs(const g4_model *m, const bench_args *b, cost_round *rounds) {
    int V = g4_model_vocab_size(m), H = g4_model_hidden_size(m), P = b->prompt, seq = 0;
    unsigned seed = 1234u;
    g4_options o = b->o;
    o.ctx = P + COST_MAX_K + 1;
    g4_session *s = g4_session_new(m, &o);
    g4_drafter *dr = s ? g4_drafter_new(b->draft.d, s) : NULL;
    int32_t *ids = malloc(sizeof *ids * (size_t)P), token, next;
    float *h0 = malloc(sizeof *h0 * (size_t)H), *h = malloc(sizeof *h * (size_t)H);
    g4_batch_row rows[COST_MAX_K + 1];
    int rc = -1;
    if (!dr || !ids || !h0 || !h) {
        if (dr) g4_fail("out of memory");
        goto done;
    }
    ids[0] = 2;
    for (int i = 1; i < P; i++) ids[i] = (int32_t)(3 + (seed = seed * 1103515245u + 12345u) % (unsigned)(V - 3));
    rows[0] = (g4_batch_row){.seq = 0, .token = ids[P - 1], .output = G4_OUTPUT_ARGMAX};
    if ((P > 1 && feed_prompt(s, ids, P - 1) != 0) || g4_decode(s, rows, 1) != 0 || g4_decode_hidden(s, 0, h0) != 0) goto done;
    token = rows[0].argmax; /* the next token: what the first row of a round feeds, and the drafter drafts from */
    for (int r = -1; r < b->reps; r++) {
        for (int j = 0; j <= COST_MAX_K + 1; j++) {
            int k = r % 2 ? COST_MAX_K + 1 - j : j; /* COST_MAX_K + 1: the draft step */
            double t0;
            if (k == COST_MAX_K + 1) {
                memcpy(h, h0, sizeof *h * (size_t)H);
                t0 = now_s();
                if (g4_drafter_step(dr, 1, &seq, &token, h, &next, NULL) != 0) goto done;
                if (r >= 0) rounds[r].draft_s = now_s() - t0;
                continue;
            }
            for (int i = 0; i <= k; i++)
                rows[i] = (g4_batch_row){.seq = 0, .token = i ? (int32_t)((seed = seed * 1103515245u + 12345u) % (unsigned)V) : token,
                                         .output = G4_OUTPUT_ARGMAX};
            t0 = now_s();
            if (g4_decode(s, rows, k + 1) != 0) goto done;
            if (r >= 0) rounds[r].verify_s[k] = now_s() - t0;
            if (g4_session_truncate_seq(s, 0, P) != 0) goto done;
        }
        if (!b->json && r >= 0) {
            const cost_round *c = &rounds[r];
            fprintf(stderr, "round %d: decode step %.2f ms, draft step %.3f of it, verifying 2..%d rows", r + 1, 1e3 * c->verify_s[0],
                    c->draft_s / c->verify_s[0], COST_MAX_K + 1);
            for (int k = 1; k <= COST_MAX_K; k++) fprintf(stderr, " %.2f", c->verify_s[k] / c->verify_s[0]);
            fprintf(stderr, " of it\n");
        }
    }
    rc = 0;
done:
    free(ids);
    free(h0);
    free(h);
    g4_drafter_free(dr);
    g4_session_free(s);
    return rc;
}

/* Runs the rounds and reports: the median seconds of each part, its cost in decode steps (the
 * median over rounds of its time over the same round's decode step) and the speedups
 * (draft_speedup) of every K at each alpha of cost_alphas, with the best K. */
static int draft_costs(const g4_model *m, const bench_args *b, double load_s) {
    cost_round *rounds = calloc((size_t)b->reps, sizeof *rounds);
    double *t = calloc((size_t)b->reps, sizeof *t), *q = calloc((size_t)b->reps, sizeof *q);
    double sec[COST_MAX_K + 2], ratio[COST_MAX_K + 2]; /* [k]: k + 1 rows verified; [COST_MAX_K + 1]: the draft step */
    if (!rounds || !t || !q || run_costs(m, b, rounds) != 0) {
        int rc = rounds && t && q ? die_lib() : die("g4 bench: out of memory%s", "");
        free(rounds), free(t), free(q);
        return rc;
    }
    for (int k = 0; k <= COST_MAX_K + 1; k++) {
        for (int r = 0; r < b->reps; r++) {
            t[r] = k <= COST_MAX_K ? rounds[r].verify_s[k] : rounds[r].draft_s;
            q[r] = t[r] / rounds[r].verify_s[0];
        }
        sec[k] = median(t, b->reps), ratio[k] = median(q, b->reps);
    }
    free(rounds), free(t), free(q);
    double d = ratio[COST_MAX_K + 1], speed[N_ALPHAS][COST_MAX_K + 1];
    int best[N_ALPHAS];
    for (int a = 0; a < N_ALPHAS; a++) {
        best[a] = 0;
        for (int k = 0; k <= COST_MAX_K; k++) {
            speed[a][k] = draft_speedup(cost_alphas[a], k, ratio[k], d);
            if (speed[a][k] > speed[a][best[a]]) best[a] = k;
        }
    }
    if (b->json) {
        printf("{\"model\": \"%s\", \"draft\": \"%s\", \"kernels\": \"%s\", \"threads\": %d, \"act\": \"%s\", \"prompt_tokens\": %d, "
               "\"reps\": %d, \"load_s\": %.4f, \"weights\": \"%s\"",
               b->dir, b->draft.dir, g4_bench_level(), b->o.threads, act_name(&b->o), b->prompt, b->reps, load_s, weights_name(m));
        print_kernels(stdout, 1, b);
        printf(", \"decode_step_s\": %.6f, \"draft_step_s\": %.6f, \"draft_ratio\": %.4f, \"verify\": [", sec[0], sec[COST_MAX_K + 1], d);
        for (int k = 0; k <= COST_MAX_K; k++)
            printf("%s{\"k\": %d, \"rows\": %d, \"s\": %.6f, \"ratio\": %.4f}", k ? ", " : "", k, k + 1, sec[k], ratio[k]);
        printf("], \"speedup\": [");
        for (int a = 0; a < N_ALPHAS; a++) {
            printf("%s{\"alpha\": %.2f, \"best_k\": %d, \"best_speedup\": %.4f, \"by_k\": [", a ? ", " : "", cost_alphas[a], best[a],
                   speed[a][best[a]]);
            for (int k = 0; k <= COST_MAX_K; k++) printf("%s%.4f", k ? ", " : "", speed[a][k]);
            printf("]}");
        }
        printf("]}\n");
        return 0;
    }
    printf("model %s, drafter %s, kernels %s, %d thread(s), --act %s, prompt %d tokens, %d rounds\n", b->dir, b->draft.dir,
           g4_bench_level(), b->o.threads, act_name(&b->o), b->prompt, b->reps);
    print_kernels(stdout, 0, b);
    printf("  load            %.3f s (weights %s)\n", load_s, weights_name(m));
    printf("  decode step     %.2f ms median (1 row)\n", 1e3 * sec[0]);
    printf("  draft step      %.2f ms median (1 row): %.4f decode steps (median over rounds)\n", 1e3 * sec[COST_MAX_K + 1], d);
    printf("verifying K drafts (K + 1 rows), in decode steps (median over rounds):\n  K     ");
    for (int k = 1; k <= COST_MAX_K; k++) printf("%8d", k);
    printf("\n  ms    ");
    for (int k = 1; k <= COST_MAX_K; k++) printf("%8.2f", 1e3 * sec[k]);
    printf("\n  steps ");
    for (int k = 1; k <= COST_MAX_K; k++) printf("%8.4f", ratio[k]);
    printf("\nimplied speedup over plain decoding, each draft accepted with probability alpha:\n"
           "  S(alpha, K) = (1 - alpha^(K+1)) / (1 - alpha) / (K x draft step + verify(K + 1 rows)), both in decode steps\n  alpha ");
    for (int k = 1; k <= COST_MAX_K; k++) printf("%8d", k);
    printf("   best\n");
    for (int a = 0; a < N_ALPHAS; a++) {
        printf("  %.2f  ", cost_alphas[a]);
        for (int k = 1; k <= COST_MAX_K; k++) printf("%8.3f", speed[a][k]);
        printf("   K=%d: %.3fx\n", best[a], speed[a][best[a]]);
    }
    return 0;
}

/* ---- g4 bench --image / --audio: the towers ----
 * Each rep encodes the image and/or the clip once per --kernels level (levels alternating, the
 * order reversed every other round, as the text reps), then times the text model's prefill
 * linears at that level: layer 0's gate_proj and the last layer's (E2B: 4-bit and 2-bit MLPs) on
 * a 64-row chunk, the calls a prefill makes, for >= 0.3 s each. The tower's MAC rate is the
 * multiply-adds of its linears over their seconds (the session profile), so it compares with the
 * text rate linear for linear; the rest of an encode (attention, convolutions, norms) is given
 * apart. */

/* One encode's figures, as the medians read them (offsetof). */
typedef struct {
    double enc, lin, att, sub, int_macs, float_macs;
} tower_rep;

static double rate_g(double macs, double s) { return s > 0 ? macs / s / 1e9 : 0; }

static double median_of(const tower_rep *r, int reps, size_t field) {
    double v[1000];
    for (int i = 0; i < reps; i++) v[i] = *(const double *)(const void *)((const char *)&r[i] + field);
    return median(v, reps);
}

static int tower_bench(const g4_model *m, const bench_args *b) {
    const int L = b->n_levels ? b->n_levels : 1, reps = b->reps;
    int rc = 1, n_img_tokens = 0, n_clip_tokens = 0, last = g4_bench_n_layers(m) - 1;
    g4_bench_media_info in;
    g4_bench_media *bm = NULL;
    tower_rep *vr = calloc((size_t)reps * L, sizeof *vr), *ar = calloc((size_t)reps * L, sizeof *ar);
    g4_bench_linear *t4 = calloc((size_t)reps * L, sizeof *t4), *t2 = calloc((size_t)reps * L, sizeof *t2);
    if (!vr || !ar || !t4 || !t2) {
        die("g4 bench: out of memory%s", "");
        goto done;
    }
    if (!(bm = g4_bench_media_new(m, b->image, b->audio, &in))) goto lib_fail;
    const char *outer = getenv("G4_DISPATCH");
    char *saved_env = outer ? strdup(outer) : NULL;
    int failed = 0;
    for (int r = 0; r < reps && !failed; r++)
        for (int k = 0; k < L && !failed; k++) {
            int l = r % 2 ? L - 1 - k : k, at_i = r * L + l;
            if (b->n_levels) setenv("G4_DISPATCH", b->levels[l], 1);
            g4_bench_encode ve, ae;
            if (g4_bench_media_encode(bm, &b->o, &ve, &ae)) failed = 1;
            if (!failed && in.image) n_img_tokens = ve.n_tokens, vr[at_i] = (tower_rep){ve.seconds, ve.linear_s, ve.attention_s, 0, ve.int_macs, ve.float_macs};
            if (!failed && in.audio)
                n_clip_tokens = ae.n_tokens, ar[at_i] = (tower_rep){ae.seconds, ae.linear_s, ae.attention_s, ae.subsample_s, ae.int_macs, ae.float_macs};
            t4[at_i] = g4_bench_gate_proj(m, &b->o, 0);
            t2[at_i] = g4_bench_gate_proj(m, &b->o, last);
        }
    if (b->n_levels) {
        if (saved_env) setenv("G4_DISPATCH", saved_env, 1);
        else unsetenv("G4_DISPATCH");
    }
    free(saved_env);
    if (failed) goto lib_fail;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double rss_mb = (double)ru.ru_maxrss / 1024.0;
    const char *act = b->o.act == G4_ACT_INT ? "int" : b->o.act == G4_ACT_FAKE ? "fake" : "float";
    if (b->json)
        printf("{\"model\": \"%s\", \"threads\": %d, \"act\": \"%s\", \"reps\": %d, \"peak_rss_mb\": %.1f", b->dir, b->o.threads, act, reps, rss_mb);
    else
        printf("model %s, %d thread(s), --act %s, %d reps (medians), peak RSS %.1f MB with the towers loaded\n", b->dir, b->o.threads, act, reps,
               rss_mb);
    if (in.image) {
        if (b->json)
            printf(", \"image\": {\"input\": \"%s\", \"width\": %d, \"height\": %d, \"patches\": %d, \"grid\": [%d, %d], \"soft_tokens\": %d, "
                   "\"prep_s\": %.6f}",
                   b->image, in.width, in.height, in.patches, in.grid_w, in.grid_h, n_img_tokens, in.image_prep_s);
        else
            printf("image %s: %d x %d -> %d patches (%d x %d) -> %d soft tokens; decode + preprocess %.1f ms\n", b->image, in.width, in.height,
                   in.patches, in.grid_w, in.grid_h, n_img_tokens, in.image_prep_s * 1e3);
    }
    if (in.audio) {
        if (b->json)
            printf(", \"audio\": {\"input\": \"%s\", \"seconds\": %.3f, \"mel_frames\": %d, \"soft_tokens\": %d, \"prep_s\": %.6f}", b->audio,
                   in.clip_s, in.mel_frames, n_clip_tokens, in.clip_prep_s);
        else
            printf("audio %s: %.2f s -> %d mel frames -> %d soft tokens; decode + resample + log-mel %.1f ms\n", b->audio, in.clip_s, in.mel_frames,
                   n_clip_tokens, in.clip_prep_s * 1e3);
    }
    if (b->json) printf(", \"by_kernels\": [");
    for (int l = 0; l < L; l++) {
        tower_rep v[1000], a[1000];
        g4_bench_linear q4 = {0, 0, 0}, q2 = {0, 0, 0};
        for (int r = 0; r < reps; r++) {
            v[r] = vr[r * L + l], a[r] = ar[r * L + l];
            q4.macs += t4[r * L + l].macs, q4.seconds += t4[r * L + l].seconds, q4.int_path = t4[r * L + l].int_path;
            q2.macs += t2[r * L + l].macs, q2.seconds += t2[r * L + l].seconds, q2.int_path = t2[r * L + l].int_path;
        }
        const char *level = b->n_levels ? b->levels[l] : g4_bench_level();
        double text4 = rate_g(q4.macs, q4.seconds), text2 = rate_g(q2.macs, q2.seconds);
        double v_enc = median_of(v, reps, offsetof(tower_rep, enc)), v_lin = median_of(v, reps, offsetof(tower_rep, lin));
        double v_att = median_of(v, reps, offsetof(tower_rep, att)), v_rate = rate_g(v[0].int_macs + v[0].float_macs, v_lin);
        double a_enc = median_of(a, reps, offsetof(tower_rep, enc)), a_lin = median_of(a, reps, offsetof(tower_rep, lin));
        double a_att = median_of(a, reps, offsetof(tower_rep, att)), a_sub = median_of(a, reps, offsetof(tower_rep, sub));
        double a_rate = rate_g(a[0].int_macs + a[0].float_macs, a_lin);
        if (b->json) {
            printf("%s{\"kernels\": \"%s\", \"text_gate_first_gmacs\": %.3f, \"text_gate_last_gmacs\": %.3f", l ? ", " : "", level, text4, text2);
            if (in.image)
                printf(", \"vision\": {\"encode_s\": %.6f, \"linear_s\": %.6f, \"attention_s\": %.6f, \"int_macs\": %.0f, \"float_macs\": %.0f, "
                       "\"linear_gmacs\": %.3f}",
                       v_enc, v_lin, v_att, v[0].int_macs, v[0].float_macs, v_rate);
            if (in.audio)
                printf(", \"audio\": {\"encode_s\": %.6f, \"linear_s\": %.6f, \"attention_s\": %.6f, \"subsample_s\": %.6f, \"int_macs\": %.0f, "
                       "\"float_macs\": %.0f, \"linear_gmacs\": %.3f, \"x_realtime\": %.3f}",
                       a_enc, a_lin, a_att, a_sub, a[0].int_macs, a[0].float_macs, a_rate, a_enc > 0 ? in.clip_s / a_enc : 0);
            printf("}");
            continue;
        }
        printf("  [%s]\n", level);
        printf("  text prefill    %.2f G MAC/s layer 0 gate_proj, %.2f G MAC/s layer %d gate_proj (64 rows, %s path)\n", text4, text2, last,
               q4.int_path == 1 ? "int8" : "float");
        if (in.image) {
            printf("  vision encode   %.1f ms: linears %.1f ms, attention %.1f ms, other %.1f ms\n", v_enc * 1e3, v_lin * 1e3, v_att * 1e3,
                   (v_enc - v_lin - v_att) * 1e3);
            printf("  vision linears  %.2f G MAC/s (%.2f G MACs in int8, %.2f G in float) = %.2f x the layer 0 prefill rate\n", v_rate,
                   v[0].int_macs / 1e9, v[0].float_macs / 1e9, text4 > 0 ? v_rate / text4 : 0);
        }
        if (in.audio) {
            printf("  audio encode    %.1f ms = %.1f x real time (%.1f x with the preprocessing): subsampling %.1f ms, linears %.1f ms, "
                   "attention %.1f ms, other %.1f ms\n",
                   a_enc * 1e3, a_enc > 0 ? in.clip_s / a_enc : 0, in.clip_s / (a_enc + in.clip_prep_s), a_sub * 1e3, a_lin * 1e3, a_att * 1e3,
                   (a_enc - a_sub - a_lin - a_att) * 1e3);
            printf("  audio linears   %.2f G MAC/s (%.2f G MACs in int8, %.2f G in float) = %.2f x the layer %d prefill rate\n", a_rate,
                   a[0].int_macs / 1e9, a[0].float_macs / 1e9, text2 > 0 ? a_rate / text2 : 0, last);
        }
    }
    if (b->json) {
        printf("]");
        print_kernels(stdout, 1, b);
        printf("}\n");
    } else {
        print_kernels(stdout, 0, b);
    }
    rc = 0;
    goto done;
lib_fail:
    rc = die_lib();
done:
    g4_bench_media_free(bm);
    free(vr), free(ar), free(t4), free(t2);
    return rc;
}

int cmd_bench(args_t *a) {
    bench_args b;
    if (parse_bench(a, &b) != 0) return 1;
    bw_probe probe;
    int probing = b.bandwidth && !b.draft_costs && bw_probe_start(&probe, b.o.threads) == 0;
    g4_model *models[BENCH_MAX_LEVELS] = {NULL};
    double loads[BENCH_MAX_LEVELS] = {0};
    const int M = b.n_models > 1 ? b.n_models : 1;
    for (int k = 0; k < M; k++) {
        double t0 = now_s();
        if (!(models[k] = load_model(b.dirs[k], &b.o))) {
            for (int j = 0; j < k; j++) g4_model_free(models[j]);
            if (probing) bw_probe_stop(&probe);
            return die_lib();
        }
        loads[k] = now_s() - t0;
    }
    g4_model *m = models[0];
    double load_s = loads[0];
    if (b.draft.dir && !(b.draft.d = g4_draft_load(b.draft.dir, m))) {
        g4_model_free(m);
        if (probing) bw_probe_stop(&probe);
        return die_lib();
    }
    if (b.image || b.audio) {
        if (probing) bw_probe_stop(&probe);
        int rc = tower_bench(m, &b);
        g4_model_free(m);
        return rc;
    }
    if (b.draft_costs) {
        int rc = draft_costs(m, &b, load_s);
        g4_draft_free(b.draft.d);
        g4_model_free(m);
        return rc;
    }
    /* With --kernels each round runs every level once, in turn (the order reversed every other
     * round, so a trend over a round favours none): a session takes its level from G4_DISPATCH
     * when it is made, and the pool threads never read the environment. Without it, one level:
     * the one G4_DISPATCH or the CPU gives. */
    const int L = b.n_levels ? b.n_levels : b.draft.dir ? 2 : M, total = b.reps * L;
    const char *outer = getenv("G4_DISPATCH");
    char *saved_env = outer ? strdup(outer) : NULL;
    bench_rep *reps = calloc((size_t)total, sizeof *reps);
    int *rep_of = calloc((size_t)total, sizeof *rep_of); /* [round][level] -> rep index */
    const char **rep_level = calloc((size_t)total, sizeof *rep_level);
    double bytes = (double)g4_model_decode_bytes(m), var_bytes[BENCH_MAX_LEVELS];
    for (int l = 0; l < L; l++) var_bytes[l] = (double)g4_model_decode_bytes(models[b.n_levels || b.draft.dir ? 0 : l]);
    int rc = reps && rep_of && rep_level ? 0 : die("g4 bench: out of memory%s", "");
    for (int i = 0; i < total && rc == 0; i++) {
        int round = i / L, l = round % 2 ? L - 1 - i % L : i % L;
        rep_of[round * L + l] = i;
        if (b.n_levels) setenv("G4_DISPATCH", b.levels[l], 1);
        rep_level[i] = g4_bench_level();
        if (b.alt_steps) {
            reps[i].step_s = calloc((size_t)(b.gen > 0 ? b.gen : 1), sizeof *reps[i].step_s);
            reps[i].step_level = calloc((size_t)(b.gen > 0 ? b.gen : 1), sizeof *reps[i].step_level);
            if (!reps[i].step_s || !reps[i].step_level) rc = die("g4 bench: out of memory%s", "");
        }
        if (rc == 0 && run_rep(models[b.n_levels || b.draft.dir ? 0 : l], &b, 1234u + (unsigned)round, probing ? &probe : NULL, l,
                               b.draft.dir && l == 1, &reps[i]) != 0)
            rc = die_lib();
        if (!b.json && rc == 0) {
            const bench_rep *r = &reps[i];
            double frac = r->read_bw > 0 ? r->decode_tok_s * var_bytes[l] / r->read_bw : 0;
            fprintf(stderr, "rep %d%s%s: prefill %.2f tok/s, decode %.2f tok/s", i + 1, L > 1 ? " " : "", b.n_levels ? rep_level[i] : variant_name(&b, l),
                    r->prefill_tok_s, r->decode_tok_s);
            if (r->read_bw > 0) fprintf(stderr, ", read bandwidth %.2f GB/s: decode at %.2f of its roofline", r->read_bw / 1e9, frac);
            if (r->rounds)
                fprintf(stderr, ", %ld rounds: %.2f of %ld drafts accepted, %.2f tokens a round", r->rounds,
                        r->drafted ? (double)r->accepted / r->drafted : 0, r->drafted, (double)b.gen / r->rounds);
            fprintf(stderr, "\n");
        }
    }
    if (b.n_levels) {
        if (saved_env) setenv("G4_DISPATCH", saved_env, 1);
        else unsetenv("G4_DISPATCH");
    }
    free(saved_env);
    if (probing) bw_probe_stop(&probe);
    if (rc == 0) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        double peak = (double)ru.ru_maxrss * 1024;
        bench_summary sum[BENCH_MAX_LEVELS];
        const bench_rep *last[BENCH_MAX_LEVELS];
        int *at = calloc((size_t)b.reps, sizeof *at);
        for (int l = 0; l < L && at; l++) {
            for (int k = 0; k < b.reps; k++) at[k] = rep_of[k * L + l];
            sum[l] = summarise(reps, at, b.reps, var_bytes[l]);
            last[l] = &reps[rep_of[(b.reps - 1) * L + l]];
        }
        free(at);
        const bench_summary *s0 = &sum[0]; /* the top-level figures: the first (or only) level's */
        double roof = s0->bw > 0 ? s0->bw / bytes : 0;
        const char *kname = rep_level[rep_of[0]];
        if (b.json) {
            printf("{\"model\": \"%s\", \"kernels\": \"%s\", \"threads\": %d, \"act\": \"%s\", \"logits\": \"%s\", \"prompt_tokens\": %d, "
                   "\"gen_tokens\": %d, \"reps\": %d, \"load_s\": %.4f, \"prefill_tok_s\": %.3f, \"prefill_tok_s_min\": %.3f, "
                   "\"prefill_tok_s_max\": %.3f, \"decode_tok_s\": %.3f, \"decode_tok_s_min\": %.3f, \"decode_tok_s_max\": %.3f, "
                   "\"peak_rss_bytes\": %.0f, \"decode_bytes_per_token\": %.0f, \"read_bw_bytes_s\": %.0f, \"roofline_tok_s\": %.3f, "
                   "\"roofline_fraction\": %.4f, \"read_bw_loads\": \"%s\", \"weights\": \"%s\"",
                   b.dir, kname, b.o.threads, act_name(&b.o), logits_kinds[b.logits], b.prompt, b.gen, b.reps, load_s, s0->pmed, s0->pmin,
                   s0->pmax, s0->dmed, s0->dmin, s0->dmax, peak, bytes, s0->bw, roof, s0->fmed, s0->bw > 0 ? g4_stream_loads() : "off",
                   weights_name(m));
            print_kernels(stdout, 1, &b);
            print_ops(stdout, "prefill", last[0]->prof_prefill, b.prompt, 1);
            print_ops(stdout, "decode", last[0]->prof_decode, b.gen, 1);
            if (L > 1) {
                /* every level's (or model's) figures, and its speed over the first one's (median over rounds) */
                printf(b.n_levels ? ", \"by_kernels\": [" : b.draft.dir ? ", \"by_draft\": [" : ", \"by_model\": [");
                for (int l = 0; l < L; l++) {
                    const bench_summary *x = &sum[l];
                    printf("%s{\"%s\": \"%s\", \"prefill_tok_s\": %.3f, \"prefill_tok_s_min\": %.3f, \"prefill_tok_s_max\": %.3f, "
                           "\"decode_tok_s\": %.3f, \"decode_tok_s_min\": %.3f, \"decode_tok_s_max\": %.3f, \"roofline_fraction\": %.4f, "
                           "\"prefill_ratio\": %.4f, \"decode_ratio\": %.4f",
                           l ? ", " : "", b.n_levels ? "kernels" : b.draft.dir ? "draft" : "model", variant_name(&b, l), x->pmed, x->pmin, x->pmax, x->dmed, x->dmin,
                           x->dmax, x->fmed, round_ratio(reps, rep_of, b.reps, L, l, 0), round_ratio(reps, rep_of, b.reps, L, l, 1));
                    if (b.draft.dir) {
                        long rounds = 0, drafted = 0, accepted = 0;
                        for (int k = 0; k < b.reps; k++) {
                            const bench_rep *r = &reps[rep_of[k * L + l]];
                            rounds += r->rounds, drafted += r->drafted, accepted += r->accepted;
                        }
                        printf(", \"draft_rounds\": %ld, \"drafted\": %ld, \"accepted\": %ld", rounds, drafted, accepted);
                    } else if (!b.n_levels)
                        printf(", \"load_s\": %.4f, \"decode_bytes_per_token\": %.0f, \"read_bw_bytes_s\": %.0f", loads[l], var_bytes[l], x->bw);
                    if (b.alt_steps) {
                        double m0 = step_median(reps, total, b.gen, 0), ml = step_median(reps, total, b.gen, l);
                        printf(", \"decode_step_s_median\": %.6f, \"decode_step_ratio\": %.4f", ml, ml > 0 ? m0 / ml : 0);
                    }
                    print_ops(stdout, "prefill", last[l]->prof_prefill, b.prompt, 1);
                    print_ops(stdout, "decode", last[l]->prof_decode, b.gen, 1);
                    printf("}");
                }
                printf("]");
            }
            printf("}\n");
        } else {
            printf("model %s, kernels %s, %d thread(s), --act %s, --logits %s, %d reps%s\n", M > 1 ? "compared" : b.dir,
                   b.n_levels ? "compared" : kname, b.o.threads, act_name(&b.o), logits_kinds[b.logits], b.reps,
                   b.alt_steps ? " per level, alternating (and their decode steps alternating: each rep's decode figures and profile mix the levels)"
                   : b.n_levels ? " per level, alternating" : M > 1 ? " per model, alternating" : "");
            print_kernels(stdout, 0, &b);
            if (M == 1) printf("  load            %.3f s (weights %s)\n", load_s, weights_name(m));
            printf("  peak resident   %.1f MiB%s\n", peak / 1048576, M > 1 ? " (every model loaded)" : "");
            for (int l = 0; l < L; l++) {
                const bench_summary *x = &sum[l];
                if (b.n_levels) printf("level %s:\n", b.levels[l]);
                if (b.draft.dir) {
                    long rounds = 0, drafted = 0, accepted = 0;
                    for (int k = 0; k < b.reps; k++) {
                        const bench_rep *r = &reps[rep_of[k * L + l]];
                        rounds += r->rounds, drafted += r->drafted, accepted += r->accepted;
                    }
                    printf("%s:\n", variant_name(&b, l));
                    if (rounds)
                        printf("  drafting        %ld rounds, %ld drafts, %ld accepted (%.3f), %.2f tokens a round (every rep)\n", rounds,
                               drafted, accepted, drafted ? (double)accepted / drafted : 0, (double)b.gen * b.reps / rounds);
                }
                if (M > 1) printf("model %s:\n  load            %.3f s (weights %s)\n", b.dirs[l], loads[l], weights_name(models[l]));
                printf("  prefill (%4d)  %.2f tok/s median (min %.2f, max %.2f)", b.prompt, x->pmed, x->pmin, x->pmax);
                if (l) printf("; %.3fx %s (median over rounds)", round_ratio(reps, rep_of, b.reps, L, l, 0), variant_name(&b, 0));
                printf("\n  decode  (%4d)  %.2f tok/s median (min %.2f, max %.2f)", b.gen, x->dmed, x->dmin, x->dmax);
                if (l) printf("; %.3fx %s (median over rounds)", round_ratio(reps, rep_of, b.reps, L, l, 1), variant_name(&b, 0));
                printf("\n");
                if (b.alt_steps) {
                    double m0 = step_median(reps, total, b.gen, 0), ml = step_median(reps, total, b.gen, l);
                    printf("  decode steps    %.2f ms median of this level's steps (%.2f tok/s)", 1e3 * ml, ml > 0 ? 1 / ml : 0);
                    if (l) printf("; %.3fx %s (median step times)", ml > 0 ? m0 / ml : 0, b.levels[0]);
                    double ops[G4_PROF_COUNT] = {0};
                    int steps = 0;
                    for (int i = 0; i < total; i++) {
                        for (int k = 0; k < G4_PROF_COUNT; k++) ops[k] += reps[i].step_prof[l][k];
                        for (int k = 0; k < b.gen; k++) steps += reps[i].step_level[k] == l;
                    }
                    printf("\ntime per operation and token over this level's decode steps (every rep):\n");
                    print_ops(stdout, "steps", ops, steps, 0);
                }
                if (x->bw > 0)
                    printf("  read bandwidth  %.2f GB/s median (%s loads), measured around each decode -> roofline %.2f tok/s at %.2f MB/token;\n"
                           "                  decode at %.2f of it (median of the reps' own ratios)\n",
                           x->bw / 1e9, g4_stream_loads(), x->bw / var_bytes[l], var_bytes[l] / 1e6, x->fmed);
                printf("time per operation and token (last rep):\n");
                print_ops(stdout, "prefill", last[l]->prof_prefill, b.prompt, 0);
                print_ops(stdout, "decode", last[l]->prof_decode, b.gen, 0);
            }
        }
    }
    for (int i = 0; reps && i < total; i++) {
        free(reps[i].step_s);
        free(reps[i].step_level);
    }
    free(reps);
    free(rep_of);
    free(rep_level);
    for (int k = 0; k < M; k++) g4_model_free(models[k]);
    g4_draft_free(b.draft.d);
    return rc;
}
