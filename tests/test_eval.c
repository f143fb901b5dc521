/* The GSM8K harness: Wilson interval and exact McNemar p-value against worked examples,
 * SHA-256 against the FIPS 180-2 examples, the results reader on damaged files, `g4 eval
 * compare` on hand-made runs (tests/eval/a.jsonl, b.jsonl), the records' scoring (each
 * record's answer, status and correct flag recomputed from its output and gold as the protocol
 * says, and g4_gsm8k_record on the protocol's extractor cases), and `g4 eval gsm8k` on a tiny
 * random checkpoint: resume after a kill, refusal of changed settings, and --batch giving
 * the records of a batch of one. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "eval/harness.h"
#include "eval/results.h"
#include "model/synth.h"
#include "testutil.h"
#include "cli_util.h"
#include "util/err.h"

/* Command lines are built in fixed buffers sized far above what the temporary paths need; a
 * truncated one would fail its test, not pass it. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

static const char *bin;
static char tmp[256], model[600], data[600];

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) exit(2);
    fputs(text, f);
    fclose(f);
}

/* The stderr capture of a run whose --out was `out`. */
static char *err_of(const char *out) {
    char path[800];
    snprintf(path, sizeof path, "%s.err", out);
    return slurp(path);
}

/* One line "g4: error: ...\n" containing `what`. */
static int one_error_line(const char *text, const char *what) {
    const char *nl = strchr(text, '\n');
    return !strncmp(text, "g4: error: ", 11) && strstr(text, what) && nl && !nl[1];
}

static int near(double a, double b, double rel) {
    return fabs(a - b) <= rel * fabs(b) + 1e-300;
}

/* ---------------------------------------------------------------- statistics */

static void test_wilson(void) {
    /* The protocol's worked examples (gsm8k-protocol.md section 6), rounded to 0.1 point. */
    static const struct { long k, n; double lo, hi; } spec[] = {
        {86, 100, 77.9, 91.5}, {73, 100, 63.6, 80.7}, {48, 100, 38.5, 57.7}, {1134, 1319, 84.0, 87.7}};
    for (size_t i = 0; i < sizeof spec / sizeof *spec; i++) {
        double lo, hi;
        g4_wilson95(spec[i].k, spec[i].n, &lo, &hi);
        CHECK(fabs(100 * lo - spec[i].lo) < 0.05 && fabs(100 * hi - spec[i].hi) < 0.05, "%ld/%ld: [%.3f, %.3f]", spec[i].k,
              spec[i].n, 100 * lo, 100 * hi);
        /* Independently of the closed form: the Wilson bounds are the two roots p of
         * (k/n - p)^2 = z^2 p (1 - p) / n. */
        double z = 1.959963984540054, ph = (double)spec[i].k / spec[i].n;
        double r_lo = (ph - lo) * (ph - lo) - z * z * lo * (1 - lo) / spec[i].n;
        double r_hi = (ph - hi) * (ph - hi) - z * z * hi * (1 - hi) / spec[i].n;
        CHECK(fabs(r_lo) < 1e-14 && fabs(r_hi) < 1e-14, "%ld/%ld: not roots (%g, %g)", spec[i].k, spec[i].n, r_lo, r_hi);
    }
    /* Python, z = 1.959963984540054, p = k/n, d = 1 + z*z/n, c = (p + z*z/(2n))/d,
     * h = z/d*sqrt(p(1-p)/n + z*z/(4n^2)): 86/100 -> 0.7786281178903616, 0.9147365634006086;
     * 0/6 -> 0, 0.39033428790216534 (the lower bound is exactly 0: p = 0 is a root). */
    double lo, hi;
    g4_wilson95(86, 100, &lo, &hi);
    CHECK(near(lo, 0.7786281178903616, 1e-12) && near(hi, 0.9147365634006086, 1e-12), "86/100: %.17g %.17g", lo, hi);
    g4_wilson95(0, 6, &lo, &hi);
    CHECK(lo == 0 && near(hi, 0.39033428790216534, 1e-12), "0/6: %.17g %.17g", lo, hi);
    g4_wilson95(6, 6, &lo, &hi);
    CHECK(near(lo, 1 - 0.39033428790216534, 1e-12) && hi == 1, "6/6: %.17g %.17g", lo, hi);
    g4_wilson95(0, 0, &lo, &hi);
    CHECK(lo == 0 && hi == 1, "0/0: %g %g", lo, hi);
}

static void test_mcnemar(void) {
    /* p = min(1, 2 * sum_{i <= min(b,c)} C(b+c, i) / 2^(b+c)), by hand or with Python's
     * fractions.Fraction and math.comb:
     *   b+c = 0             -> 1 (no discordant pair)
     *   (2, 1): 2*(1+3)/8   = 1
     *   (4, 1): 2*(1+5)/32  = 3/8
     *   (10, 2): 2*(1+12+66)/4096 = 79/2048 = 0.03857421875
     *   (0, 5): 2/32 = 1/16;  (1, 9): 2*(1+10)/1024 = 11/512 = 0.021484375
     *   (60, 40):  0.05688793364098079      (Fraction, then float)
     *   (600, 500): 0.0028195449914364275   (needs more than a double's 2^-1074 for 2^-1100
     *                                         if computed naively)
     *   (3, 1000): 3.923720417925807e-294;  (0, 1100): 2^-1099, below the smallest double: 0 */
    static const struct { long b, c; double p; } cases[] = {
        {0, 0, 1.0}, {2, 1, 1.0}, {4, 1, 0.375}, {1, 4, 0.375}, {10, 2, 0.03857421875}, {0, 5, 0.0625},
        {1, 9, 0.021484375}, {60, 40, 0.05688793364098079}, {600, 500, 0.0028195449914364275},
        {500, 600, 0.0028195449914364275}, {3, 1000, 3.923720417925807e-294}, {7, 7, 1.0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        double p = g4_mcnemar_exact_p(cases[i].b, cases[i].c);
        CHECK(near(p, cases[i].p, 1e-9), "McNemar(%ld, %ld) = %.17g, expected %.17g", cases[i].b, cases[i].c, p, cases[i].p);
    }
    CHECK(g4_mcnemar_exact_p(0, 1100) < 1e-300, "McNemar(0, 1100) = %g", g4_mcnemar_exact_p(0, 1100));
}

static void test_sha256(void) {
    /* FIPS 180-2 appendix B examples, and the empty message */
    static const struct { const char *msg, *hex; } v[] = {
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        g4_sha256 c;
        char hex[65];
        g4_sha256_init(&c);
        /* in uneven pieces, to cross block boundaries inside update */
        for (size_t off = 0, n = strlen(v[i].msg), step = 1; off < n; off += step, step += 3)
            g4_sha256_update(&c, v[i].msg + off, off + step > n ? n - off : step);
        g4_sha256_hex(&c, hex);
        CHECK_STREQ(hex, v[i].hex);
    }
    /* a million 'a' (FIPS 180-2 B.3) */
    g4_sha256 c;
    char hex[65], block[1000];
    memset(block, 'a', sizeof block);
    g4_sha256_init(&c);
    for (int i = 0; i < 1000; i++) g4_sha256_update(&c, block, sizeof block);
    g4_sha256_hex(&c, hex);
    CHECK_STREQ(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* The real test set: its sha256 and that of GSM8K-100 as SOURCE.md gives them, and golds
 * named in the protocol (q0 -> 18, q3 -> 540, q5 -> 64, q10 -> 366). */
static void test_data(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/data/gsm8k/test.jsonl", check_shared_dir());
    g4_gsm8k_data d;
    if (g4_gsm8k_data_load(path, 0, 100, &d) != 0) {
        CHECK(0, "%s", g4_last_error());
        return;
    }
    CHECK_STREQ(d.sha256, "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14");
    CHECK_STREQ(d.selected_sha256, "1d266ea030421507ae8e9434bd76a7830553081c0f3d002250c429357b21ff90");
    CHECK(d.n == 100 && d.n_lines == 1319 && d.bytes == 749738, "%d items, %d lines, %ld bytes", d.n, d.n_lines, d.bytes);
    CHECK_STREQ(d.items[0].gold, "18");
    CHECK_STREQ(d.items[3].gold, "540");
    CHECK_STREQ(d.items[5].gold, "64");
    CHECK_STREQ(d.items[10].gold, "366");
    CHECK(d.items[99].index == 99 && !strncmp(d.items[0].question, "Janet\xE2\x80\x99s ducks", 15), "items");
    g4_gsm8k_data_free(&d);
    CHECK(g4_gsm8k_data_load(path, 1310, 100, &d) == 0 && d.n == 9 && d.items[0].index == 1310, "tail selection");
    g4_gsm8k_data_free(&d);
}

/* ---------------------------------------------------------------- the results reader */

#define HEADER "{\"type\":\"header\",\"options\":{}}\n"
/* A valid question record; `extra` fields come first, and the first of two equal keys wins. */
#define Q(i, extra) "{\"type\":\"question\"" extra ",\"index\":" #i ",\"gold\":\"5\",\"output\":\"5\",\"answer\":\"5\"," \
                    "\"status\":\"marker\",\"correct\":true,\"prompt_tokens\":3,\"generated_tokens\":4,\"stop\":\"eos\",\"seconds\":0.5}"

/* Reads text as a results file; returns the reader's status, with the error in err. */
static int read_text(const char *text, unsigned flags, g4_results *r, char *err, size_t cap) {
    char path[700];
    snprintf(path, sizeof path, "%s/r.jsonl", tmp);
    write_text(path, text);
    int rc = g4_results_read(path, flags, r);
    snprintf(err, cap, "%s", rc ? g4_last_error() : "");
    return rc;
}

static void expect_error(const char *text, const char *line_and_message) {
    g4_results r;
    char err[1200], want[800];
    snprintf(want, sizeof want, "%s/r.jsonl:%s", tmp, line_and_message);
    int rc = read_text(text, G4_RESULTS_DROP_UNTERMINATED, &r, err, sizeof err);
    CHECK(rc == -1 && strstr(err, want), "expected \"%s\", got \"%s\"", want, err);
    if (rc == 0) g4_results_free(&r);
}

static void test_reader_errors(void) {
    expect_error(HEADER "not json\n" Q(0, "") "\n", "2: not a JSON object");
    expect_error(HEADER Q(0, "") "\n[1,2]\n", "3: not a JSON object");
    expect_error(HEADER Q(0, "") " trailing\n", "2: not a JSON object");
    expect_error(Q(0, "") "\n", "1: the first line must be the header");
    expect_error(HEADER HEADER, "2: a header record may only be the first line");
    expect_error(HEADER "{\"type\":\"question\",\"index\":1}\n", "2: field \"gold\" is missing");
    expect_error(HEADER "{\"index\":1}\n", "2: field \"type\" is missing");
    expect_error(HEADER "{\"type\":7}\n", "2: field \"type\" is not a string");
    expect_error(HEADER "{\"type\":\"bogus\"}\n", "2: unknown record type \"bogus\"");
    expect_error(HEADER Q(0, ",\"correct\":1") "\n", "2: field \"correct\" is not a boolean");
    expect_error(HEADER "{\"type\":\"question\",\"index\":-1,\"gold\":\"5\"}\n", "2: field \"index\" is not a valid count");
    expect_error(HEADER "{\"type\":\"question\",\"index\":1.5,\"gold\":\"5\"}\n", "2: field \"index\" is not a valid count");
    expect_error(HEADER "{\"type\":\"question\",\"index\":1e300,\"gold\":\"5\"}\n", "2: field \"index\" is not a valid count");
    expect_error(HEADER "{\"type\":\"question\",\"index\":1,\"gold\":5}\n", "2: field \"gold\" is not a string");
    expect_error(HEADER Q(0, ",\"answer\":3") "\n", "2: field \"answer\" is not a string, expected a string or null");
    expect_error(HEADER Q(0, ",\"seconds\":\"x\"") "\n", "2: field \"seconds\" is not a valid duration");
    expect_error(HEADER Q(4, "") "\n" Q(4, "") "\n", "3: question 4 appears twice (first on line 2)");
    /* a NUL byte inside a line is damage, not the end of the line */
    char nul[400];
    size_t n = (size_t)snprintf(nul, sizeof nul, HEADER "{\"type\":\"summary\"}X\n");
    nul[n - 2] = 0;
    char path[700];
    snprintf(path, sizeof path, "%s/r.jsonl", tmp);
    FILE *f = fopen(path, "wb");
    fwrite(nul, 1, n, f);
    fclose(f);
    g4_results r;
    CHECK(g4_results_read(path, 0, &r) == -1 && strstr(g4_last_error(), "r.jsonl:2: not a JSON object"), "NUL: %s", g4_last_error());
    CHECK(g4_results_read("/nonexistent/r.jsonl", 0, &r) == -1, "a missing file was read");
}

static void test_reader_tail(void) {
    g4_results r;
    char err[1200];
    /* an interrupted write: the last line has no newline */
    const char *cut = HEADER Q(0, "") "\n" Q(1, "") "\n{\"type\":\"question\",\"ind";
    CHECK(read_text(cut, G4_RESULTS_DROP_UNTERMINATED, &r, err, sizeof err) == 0, "%s", err);
    CHECK(r.n_q == 2 && r.dropped_tail_line == 4 && r.append_offset == (long)(strlen(cut) - strlen("{\"type\":\"question\",\"ind")),
          "n_q %d dropped %d offset %ld", r.n_q, r.dropped_tail_line, r.append_offset);
    g4_results_free(&r);
    /* resume drops even a complete record without its newline; compare keeps it */
    const char *nonl = HEADER Q(0, "") "\n" Q(1, "");
    CHECK(read_text(nonl, G4_RESULTS_DROP_UNTERMINATED, &r, err, sizeof err) == 0 && r.n_q == 1 && r.dropped_tail_line == 3, "%s", err);
    g4_results_free(&r);
    CHECK(read_text(nonl, 0, &r, err, sizeof err) == 0 && r.n_q == 2 && r.dropped_tail_line == 0 && r.append_offset == -1, "%s", err);
    g4_results_free(&r);
    CHECK(read_text(cut, 0, &r, err, sizeof err) == 0 && r.n_q == 2 && r.dropped_tail_line == 4, "%s", err);
    g4_results_free(&r);
    /* a trailing summary is where a resumed run continues; blank lines are ignored */
    const char *done = HEADER Q(0, "") "\n\n" Q(1, ",\"answer\":null,\"correct\":false") "\n";
    const char *with_summary = HEADER Q(0, "") "\n\n" Q(1, ",\"answer\":null,\"correct\":false") "\n{\"type\":\"summary\",\"n\":2}\n";
    CHECK(read_text(with_summary, 0, &r, err, sizeof err) == 0, "%s", err);
    CHECK(r.n_q == 2 && r.summary && r.header && r.append_offset == (long)strlen(done), "offset %ld", r.append_offset);
    CHECK(r.q[1].answer == NULL && !r.q[1].correct && g4_results_find(&r, 1) == &r.q[1] && !g4_results_find(&r, 2), "records");
    g4_results_free(&r);
    /* empty file, and a header cut short: nothing to keep */
    CHECK(read_text("", 0, &r, err, sizeof err) == 0 && !r.header && r.append_offset == 0, "%s", err);
    g4_results_free(&r);
    CHECK(read_text("{\"type\":\"hea", G4_RESULTS_DROP_UNTERMINATED, &r, err, sizeof err) == 0 && !r.header && r.append_offset == 0,
          "%s", err);
    g4_results_free(&r);
}

/* ---------------------------------------------------------------- compare */

static void test_compare_lib(void) {
    g4_results a, b;
    g4_compare c;
    if (g4_results_read("tests/eval/a.jsonl", 0, &a) != 0 || g4_results_read("tests/eval/b.jsonl", 0, &b) != 0) {
        CHECK(0, "cannot read tests/eval: %s", g4_last_error());
        return;
    }
    CHECK(g4_eval_compare(&a, &b, &c) == 0, "%s", g4_last_error());
    /* by construction (see the files): q0..q9 in both, q10 only in A, q11 only in B;
     * right in A only: q1 q2 q3 q9; in B only: q4; both wrong alike: q5 (7), q8 (none);
     * both wrong differently: q6; both right: q0 q7. p = 2*(C(5,0)+C(5,1))/2^5 = 0.375. */
    CHECK(c.n_a == 11 && c.n_b == 11 && c.common == 10, "%d %d %d", c.n_a, c.n_b, c.common);
    CHECK(c.a_correct == 6 && c.b_correct == 3, "%d %d", c.a_correct, c.b_correct);
    CHECK(c.n_a_only == 4 && c.a_only[0].index == 1 && c.a_only[1].index == 2 && c.a_only[2].index == 3 && c.a_only[3].index == 9,
          "a_only %d", c.n_a_only);
    CHECK(c.n_b_only == 1 && c.b_only[0].index == 4, "b_only %d", c.n_b_only);
    CHECK(c.n_same_wrong == 2 && c.same_wrong[0].index == 5 && c.same_wrong[1].index == 8, "same %d", c.n_same_wrong);
    CHECK(c.different_wrong == 1 && c.both_right == 2 && c.gold_mismatch == 0, "%d %d", c.different_wrong, c.both_right);
    CHECK(c.p == 0.375, "p %.17g", c.p);
    g4_compare_free(&c);
    g4_results_free(&a);
    g4_results_free(&b);
}

static void test_compare_cli(void) {
    char cmd[2048], out[700];
    snprintf(out, sizeof out, "%s/compare.txt", tmp);
    snprintf(cmd, sizeof cmd, "%s eval compare tests/eval/a.jsonl tests/eval/b.jsonl > %s 2>&1", bin, out);
    CHECK(sh(cmd) == 0, "g4 eval compare failed");
    char *t = slurp(out);
    static const char *const want[] = {
        "settings that differ: act \"int\" vs \"fake\"\n",
        "common questions: 10 (only in A: 1, only in B: 1)",
        "accuracy: A 6/10 = 60.0% [31.3, 83.2], B 3/10 = 30.0% [10.8, 60.3]; B - A = -30.0 points\n",
        "right in A, wrong in B: 4\n  index    A answer       B answer       gold\n"
        "  q1       5              6              5\n  q2       540            (none)         540\n"
        "  q3       64             46             64\n  q9       -3             3              -3\n",
        "right in B, wrong in A: 1\n  index    A answer       B answer       gold\n  q4       360            366            366\n",
        "both wrong with the same answer: 2\n  index    answer         gold\n  q5       7              8\n"
        "  q8       (none)         20\n",
        "both right: 2; both wrong with different answers: 1\n",
        "McNemar exact test (two-sided) on b = 4, c = 1: p = 0.375\n"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) CHECK(strstr(t, want[i]) != NULL, "missing \"%s\" in:\n%s", want[i], t);
    free(t);
    /* a damaged file: one clear line naming file and line */
    char bad[700];
    snprintf(bad, sizeof bad, "%s/bad.jsonl", tmp);
    write_text(bad, HEADER "{\"type\":\"question\"\n");
    snprintf(cmd, sizeof cmd, "%s eval compare tests/eval/a.jsonl %s > %s 2>&1", bin, bad, out);
    CHECK(sh(cmd) == 1, "compare accepted a damaged file");
    t = slurp(out);
    CHECK(one_error_line(t, "bad.jsonl:2: not a JSON object"), "%s", t);
    free(t);
}

/* ---------------------------------------------------------------- g4 eval gsm8k */

static void write_data(void) {
    write_text(data, "{\"question\": \"Janet has 3 apples and buys 4 more. How many apples does she have?\", \"answer\": \"3 + 4 = 7\\n#### 7\"}\n"
                     "{\"question\": \"A train goes 60 miles an hour. How far does it go in 3 hours?\", \"answer\": \"60 * 3 = 180\\n#### 180\"}\n"
                     "{\"question\": \"Tom had $1,200 and spent $200. How much is left?\", \"answer\": \"1200 - 200 = 1000\\n#### 1,000\"}\n"
                     "{\"question\": \"What is 12 divided by 4?\", \"answer\": \"12 / 4 = 3\\n#### 3\"}\n"
                     "{\"question\": \"It was 2 degrees and fell by 5. How warm is it now?\", \"answer\": \"2 - 5 = -3\\n#### -3\"}\n"
                     "{\"question\": \"Sara reads 10 pages a day. How many pages in a week?\", \"answer\": \"10 * 7 = 70\\n#### 70\"}\n"
                     "{\"question\": \"Unused seventh line.\", \"answer\": \"#### 1\"}\n"
                     "  \n");
}

/* Runs `g4 eval gsm8k` on the tiny model with extra flags; stderr goes to <out>.err. */
static int eval_cmd(const char *out, const char *extra) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s eval gsm8k -m %s --data %s --n 6 --max-tokens 24 --out %s %s 2> %s.err", bin, model, data, out,
             extra, out);
    return sh(cmd);
}

/* The question records of a results file by index, without their timing; header and
 * summary counted. Returns the number of question records (-1 if a line is not JSON). */
static int load_records(const char *path, cJSON *by_index[8], int *headers, int *summaries) {
    char *text = slurp(path), *save = NULL;
    int n = 0;
    *headers = *summaries = 0;
    for (int i = 0; i < 8; i++) by_index[i] = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *r = cJSON_Parse(line);
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(r, "type"));
        if (!type) n = -1000;
        else if (!strcmp(type, "header")) (*headers)++;
        else if (!strcmp(type, "summary")) (*summaries)++;
        else {
            int idx = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(r, "index"));
            cJSON_DeleteItemFromObject(r, "seconds");
            if (idx >= 0 && idx < 8 && !by_index[idx]) {
                by_index[idx] = r;
                r = NULL;
            }
            n++;
        }
        cJSON_Delete(r);
    }
    free(text);
    return n < 0 ? -1 : n;
}

static void free_records(cJSON *by_index[8]) {
    for (int i = 0; i < 8; i++) cJSON_Delete(by_index[i]);
}

/* Same question records (timing aside), exactly one per question q0..q5, one header, one
 * summary. */
static void expect_same_run(const char *ref, const char *path, const char *what) {
    cJSON *a[8], *b[8];
    int ha, sa, hb, sb;
    int na = load_records(ref, a, &ha, &sa), nb = load_records(path, b, &hb, &sb);
    CHECK(na == 6 && nb == 6 && ha == 1 && hb == 1 && sa == 1 && sb == 1, "%s: %d/%d questions, %d/%d headers, %d/%d summaries", what,
          na, nb, ha, hb, sa, sb);
    int same = 1;
    for (int i = 0; i < 6; i++) same &= a[i] && b[i] && cJSON_Compare(a[i], b[i], 1);
    CHECK(same, "%s: records differ from the uninterrupted run", what);
    free_records(a);
    free_records(b);
}

static void path_in_tmp(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmp, name);
}

/* Keeps the first `lines` lines and half of the next one, as a kill during a write would. */
static void cut_after(const char *src, const char *dst, int lines) {
    char *text = slurp(src), *p = text;
    for (int i = 0; i < lines && p; i++) p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL;
    size_t keep = p ? (size_t)(p - text) + strcspn(p, "\n") / 2 : strlen(text);
    FILE *f = fopen(dst, "w");
    fwrite(text, 1, keep, f);
    fclose(f);
    free(text);
}

/* ---------------------------------------------------------------- scoring */

/* The protocol's verdict (gsm8k-protocol.md §5; extractor_ref.py: pred is not None and
 * Decimal(pred) == Decimal(gold)), recomputed here rather than read from a record. The extracted
 * answer and the gold are both in the normaliser's canonical form (an integer when integral,
 * else a minimal decimal, "-0" as "0"; test_gsm8k checks it against the fixture), so equal
 * values are equal strings and the engine's own g4_gsm8k_is_correct is not needed. */
static int protocol_verdict(const char *answer, const char *gold) { return answer && gold && !strcmp(answer, gold); }

static g4_gsm8k_extractor *extractor;

/* Tally of the question records of one results file, as the protocol scores them. */
typedef struct {
    int questions, right, wrong_number; /* wrong_number: an answer, but not the gold */
} verdicts;

/* Every question record's answer, status and correct flag must be what the extractor and the
 * protocol's verdict give for its own output and gold; the summary must count those verdicts. */
static verdicts expect_scored_by_protocol(const char *path) {
    verdicts v = {0};
    int summary_correct = -1;
    char *text = slurp(path), *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *r = cJSON_Parse(line);
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(r, "type"));
        if (type && !strcmp(type, "summary")) summary_correct = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(r, "correct"));
        if (!type || strcmp(type, "question")) {
            cJSON_Delete(r);
            continue;
        }
        int q = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(r, "index"));
        const char *output = cJSON_GetStringValue(cJSON_GetObjectItem(r, "output"));
        const char *gold = cJSON_GetStringValue(cJSON_GetObjectItem(r, "gold"));
        const cJSON *answer = cJSON_GetObjectItem(r, "answer"), *correct = cJSON_GetObjectItem(r, "correct");
        g4_gsm8k_answer a = {0};
        int ok = output && gold && g4_gsm8k_extract(extractor, output, strlen(output), &a) == 0;
        CHECK(ok, "%s q%d: no output or gold, or the extractor failed", path, q);
        if (ok) {
            int verdict = protocol_verdict(a.value, gold);
            CHECK(a.value ? cJSON_IsString(answer) && !strcmp(answer->valuestring, a.value) : cJSON_IsNull(answer),
                  "%s q%d: answer %s, the extractor finds %s", path, q, cJSON_IsString(answer) ? answer->valuestring : "null",
                  a.value ? a.value : "none");
            const char *status = cJSON_GetStringValue(cJSON_GetObjectItem(r, "status"));
            CHECK(status && !strcmp(status, g4_gsm8k_status_name(a.status)), "%s q%d: status %s, the extractor says %s", path, q,
                  status ? status : "?", g4_gsm8k_status_name(a.status));
            CHECK(cJSON_IsBool(correct) && cJSON_IsTrue(correct) == verdict, "%s q%d: correct is %s, the protocol says %s (answer %s, gold %s)",
                  path, q, cJSON_IsTrue(correct) ? "true" : "false", verdict ? "right" : "wrong", a.value ? a.value : "none", gold);
            v.questions++;
            v.right += verdict;
            v.wrong_number += a.value && !verdict;
        }
        g4_gsm8k_answer_free(&a);
        cJSON_Delete(r);
    }
    free(text);
    CHECK(summary_correct == v.right, "%s: the summary counts %d correct, the protocol %d", path, summary_correct, v.right);
    return v;
}

/* The record of `output` (as ids, then cut by the budget or ended by the stop id 1) against
 * `gold`: its output is the text, its answer and status the case's, its correct flag `right`. */
static void expect_record(const g4_tokenizer *tok, const int32_t *ids, int n, const char *output, const char *gold, const char *expected,
                          const char *how, int right, int no) {
    g4_gsm8k_item item = {.index = no, .question = "q", .gold = (char *)gold};
    for (int eos = 0; eos < 2; eos++) {
        g4_eval_finished f = {.ids = ids, .n_generated = n + eos, .stop = eos ? G4_STOP_EOS : G4_STOP_BUDGET};
        cJSON *r = g4_gsm8k_record(extractor, tok, &item, 7, &f);
        CHECK(r != NULL, "case %d: %s", no, g4_last_error());
        if (!r) continue;
        const cJSON *answer = cJSON_GetObjectItem(r, "answer");
        const char *got_output = cJSON_GetStringValue(cJSON_GetObjectItem(r, "output"));
        const char *status = cJSON_GetStringValue(cJSON_GetObjectItem(r, "status"));
        CHECK(got_output && !strcmp(got_output, output), "case %d: output \"%s\", not the reply", no, got_output ? got_output : "?");
        CHECK(expected ? cJSON_IsString(answer) && !strcmp(answer->valuestring, expected) : cJSON_IsNull(answer), "case %d: answer %s, expected %s",
              no, cJSON_IsString(answer) ? answer->valuestring : "null", expected ? expected : "null");
        CHECK(status && !strcmp(status, how), "case %d: status %s, expected %s", no, status ? status : "?", how);
        CHECK(cJSON_IsBool(cJSON_GetObjectItem(r, "correct")) && cJSON_IsTrue(cJSON_GetObjectItem(r, "correct")) == right,
              "case %d (\"%s\", gold %s): correct should be %s", no, output, gold, right ? "true" : "false");
        cJSON_Delete(r);
    }
}

static void record_case(const g4_tokenizer *tok, const char *output, const char *expected, const char *how, int no) {
    int32_t *ids = NULL;
    size_t n = 0;
    char *back = NULL;
    size_t back_len = 0;
    /* the ids must stand for exactly this text, or the record's output could not be the reply */
    int ok = g4_tokenizer_encode(tok, output, strlen(output), 1, &ids, &n) == 0 &&
             g4_tokenizer_decode(tok, ids, n, &back, &back_len) == 0 && back_len == strlen(output) && !memcmp(back, output, back_len);
    CHECK(ok, "case %d: \"%s\" does not round-trip through the tokenizer", no, output);
    if (ok) {
        int32_t *with_stop = malloc(sizeof *with_stop * (n + 1));
        memcpy(with_stop, ids, sizeof *ids * n);
        with_stop[n] = 1;
        char other[64];
        snprintf(other, sizeof other, "%s1", expected ? expected : "0");
        if (expected) expect_record(tok, with_stop, (int)n, output, expected, expected, how, 1, no);
        expect_record(tok, with_stop, (int)n, output, other, expected, how, 0, no);
        free(with_stop);
    }
    free(ids);
    free(back);
}

/* g4_gsm8k_record on each reply of the protocol's extractor cases (output -> expected answer,
 * from the reference implementation): with the expected answer as gold the record is right,
 * with another number (a digit appended: another value) it is wrong, as it is for a reply with
 * no answer. The reply goes in as token ids, once cut by the budget and once ended by a stop id
 * (left out of the output). */
static void test_record_verdicts(void) {
    char path[700], tok_path[700];
    snprintf(path, sizeof path, "%s/fixtures/gsm8k/extractor_cases.jsonl", check_shared_dir());
    path_in_tmp(tok_path, sizeof tok_path, "tokenizer.json");
    g4_tokenizer *tok = NULL;
    CHECK(g4_synth_write_tokenizer(tok_path, 512) == 0 && (tok = g4_tokenizer_load_ex(tok_path, G4_TOKENIZER_NO_CACHE)), "%s",
          g4_last_error());
    char *text = slurp(path), *save = NULL;
    int cases = 0;
    for (char *line = strtok_r(text, "\n", &save); tok && line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *c = cJSON_Parse(line);
        const char *output = cJSON_GetStringValue(cJSON_GetObjectItem(c, "output"));
        const char *expected = cJSON_GetStringValue(cJSON_GetObjectItem(c, "expected"));
        const char *how = cJSON_GetStringValue(cJSON_GetObjectItem(c, "how"));
        CHECK(output && how, "%s: a case without output or how: %s", path, line);
        if (output && how) record_case(tok, output, expected, how, ++cases);
        cJSON_Delete(c);
    }
    free(text);
    CHECK(cases >= 20, "%d extractor cases in %s", cases, path);
    printf("ok record verdicts: %d extractor cases\n", cases);
    g4_tokenizer_free(tok);
}

static void test_eval_run(const char *full) {
    CHECK(eval_cmd(full, "") == 0, "g4 eval gsm8k failed: %s.err", full);
    cJSON *r[8];
    int h, s;
    CHECK(load_records(full, r, &h, &s) == 6 && h == 1 && s == 1, "records: %d headers %d summaries", h, s);
    for (int i = 0; i < 6; i++) {
        const cJSON *q = r[i];
        const char *stop = cJSON_GetStringValue(cJSON_GetObjectItem(q, "stop"));
        int gen = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(q, "generated_tokens"));
        CHECK(q && cJSON_IsString(cJSON_GetObjectItem(q, "output")) && cJSON_IsBool(cJSON_GetObjectItem(q, "correct")) && stop &&
                  (!strcmp(stop, "budget") ? gen == 24 : !strcmp(stop, "eos") && gen >= 1 && gen <= 24),
              "q%d: stop %s after %d tokens", i, stop ? stop : "?", gen);
    }
    const char *golds[6] = {"7", "180", "1000", "3", "-3", "70"};
    for (int i = 0; i < 6; i++) CHECK_STREQ(r[i] ? cJSON_GetStringValue(cJSON_GetObjectItem(r[i], "gold")) : "", golds[i]);
    free_records(r);
    /* the protocol's scoring of every record; a reply with a number that is not the gold is what
     * a scorer taking any number as right would get wrong, so there must be one */
    verdicts v = expect_scored_by_protocol(full);
    CHECK(v.questions == 6 && v.wrong_number >= 1, "%d records scored, %d with a wrong number", v.questions, v.wrong_number);
    printf("ok eval run: %d of 6 replies with a number other than the gold\n", v.wrong_number);
    char *text = slurp(full);
    CHECK(strstr(text, "\"act\":\"int\"") && strstr(text, "\"max_tokens\":24") && strstr(text, "\"think\":\"off\"") &&
              strstr(text, "\"n\":6") && strstr(text, "\"fingerprint\":\"") && strstr(text, "\"sha256\":\""),
          "header lacks options");
    free(text);
}

/* The same questions with each gold replaced by the answer the run extracted (where it found
 * one): those records must now be right, the others still wrong, and the summary count them. */
static void test_eval_right_answers(const char *full) {
    char right_data[700], out[700];
    path_in_tmp(right_data, sizeof right_data, "right-data.jsonl");
    path_in_tmp(out, sizeof out, "right.jsonl");
    cJSON *r[8];
    int h, s, answered = 0;
    if (load_records(full, r, &h, &s) != 6) {
        CHECK(0, "%s: not 6 records", full);
        free_records(r);
        return;
    }
    char *qs = slurp(data), *save = NULL;
    FILE *f = fopen(right_data, "w");
    if (!f) exit(2);
    int i = 0;
    for (char *line = strtok_r(qs, "\n", &save); line && i < 6; line = strtok_r(NULL, "\n", &save), i++) {
        cJSON *q = cJSON_Parse(line);
        const char *answer = cJSON_GetStringValue(cJSON_GetObjectItem(r[i], "answer"));
        char solution[128];
        snprintf(solution, sizeof solution, "#### %s", answer ? answer : cJSON_GetStringValue(cJSON_GetObjectItem(r[i], "gold")));
        answered += answer != NULL;
        cJSON_ReplaceItemInObject(q, "answer", cJSON_CreateString(solution));
        char *row = cJSON_PrintUnformatted(q);
        fprintf(f, "%s\n", row);
        free(row);
        cJSON_Delete(q);
    }
    fclose(f);
    free(qs);
    free_records(r);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s eval gsm8k -m %s --data %s --n 6 --max-tokens 24 --out %s 2> %s.err", bin, model, right_data, out, out);
    CHECK(sh(cmd) == 0, "g4 eval gsm8k on the answers as golds failed: %s.err", out);
    verdicts v = expect_scored_by_protocol(out);
    CHECK(v.questions == 6 && v.right == answered && answered >= 1, "%d of 6 right, %d answered", v.right, answered);
    printf("ok eval run with the answers as golds: %d of 6 right\n", v.right);
}

static void test_resume(const char *full) {
    char cut[700];
    path_in_tmp(cut, sizeof cut, "cut.jsonl");
    /* header, 3 records, half a line: rerun completes it */
    cut_after(full, cut, 4);
    CHECK(eval_cmd(cut, "") == 0, "resume failed");
    expect_same_run(full, cut, "resumed");
    char *err = err_of(cut);
    CHECK(strstr(err, "3 already in") && strstr(err, "3 to run") && strstr(err, "line 5 was cut short"), "resume said: %s", err);
    free(err);
    /* a finished file: nothing to run, still one summary */
    CHECK(eval_cmd(cut, "") == 0, "rerun of a finished file failed");
    expect_same_run(full, cut, "rerun when finished");
    /* cut right after the header, or inside it */
    cut_after(full, cut, 1);
    CHECK(eval_cmd(cut, "") == 0, "resume after the header failed");
    expect_same_run(full, cut, "resumed after the header");
    cut_after(full, cut, 0);
    CHECK(eval_cmd(cut, "") == 0, "resume inside the header failed");
    expect_same_run(full, cut, "resumed inside the header");
}

/* The kill test's answers are long (KILL_TOKENS each, the tiny model never stops earlier), so
 * that the run is still busy for a long stretch after its first records: a SIGKILL sent as
 * soon as they appear lands mid-run. */
#define KILL_FLAGS "--max-tokens 800 --batch 2"
#define KILL_DEADLINE_S 120.0

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Complete lines ("\n"-terminated) of a file, and of those the question and summary records. */
static void count_lines(const char *path, int *lines, int *questions, int *summaries) {
    char *text = slurp(path);
    *lines = *questions = *summaries = 0;
    for (char *p = text, *nl; (nl = strchr(p, '\n')); p = nl + 1) {
        (*lines)++;
        *questions += !strncmp(p, "{\"type\":\"question\"", 18);
        *summaries += !strncmp(p, "{\"type\":\"summary\"", 17);
    }
    free(text);
}

/* Waits until `path` holds the header and at least one whole question record, the child
 * exits, or the deadline passes. Returns 1 on the first. */
static int wait_first_record(const char *path, pid_t pid, int *exited) {
    double deadline = now_s() + KILL_DEADLINE_S;
    *exited = 0;
    while (now_s() < deadline) {
        int lines, questions, summaries;
        count_lines(path, &lines, &questions, &summaries);
        if (questions >= 1) return 1;
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            *exited = 1;
            return 0;
        }
        nanosleep(&(struct timespec){0, 1000000}, NULL); /* a poll period, not a guess at timing */
    }
    return 0;
}

/* A real kill: SIGKILL as soon as the first record is in the file. The file then holds fewer
 * records than questions and no summary (the kill landed mid-run); the rerun says how many it
 * kept, runs the rest and ends with the records of an uninterrupted run. */
static void test_kill(void) {
    char ref[700], out[700];
    path_in_tmp(ref, sizeof ref, "kill-ref.jsonl");
    path_in_tmp(out, sizeof out, "killed.jsonl");
    CHECK(eval_cmd(ref, KILL_FLAGS) == 0, "uninterrupted run for the kill test failed: %s.err", ref);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *null = freopen("/dev/null", "w", stderr);
        (void)null;
        execl(bin, bin, "eval", "gsm8k", "-m", model, "--data", data, "--n", "6", "--out", out, "--max-tokens", "800", "--batch", "2",
              (char *)NULL);
        _exit(127);
    }
    int exited, seen = wait_first_record(out, pid, &exited), st = 0;
    CHECK(seen || exited, "no record within %.0f s", KILL_DEADLINE_S);
    CHECK(!exited, "g4 eval finished before its first record was seen");
    if (!exited) { /* once reaped, its pid may be another process's */
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "g4 eval ended otherwise than by the kill (status %d)", st);
    }
    int lines, kept, summaries;
    count_lines(out, &lines, &kept, &summaries);
    printf("ok kill: %d of 6 records in the file when killed\n", kept);
    CHECK(kept >= 1 && kept < 6 && summaries == 0, "killed run: %d of 6 records, %d summaries: the kill did not land mid-run", kept,
          summaries);
    CHECK(eval_cmd(out, KILL_FLAGS) == 0, "resume after a kill failed");
    char *err = err_of(out), said[64];
    snprintf(said, sizeof said, "%d already in", kept);
    CHECK(strstr(err, said) != NULL, "the resumed run did not keep the %d records: %s", kept, err);
    snprintf(said, sizeof said, "%d to run", 6 - kept);
    CHECK(strstr(err, said) != NULL, "the resumed run did not run the other %d: %s", 6 - kept, err);
    free(err);
    expect_same_run(ref, out, "resumed after a kill");
}

static void test_refusals(const char *full) {
    char copy[700], cmd[2048];
    path_in_tmp(copy, sizeof copy, "refuse.jsonl");
    snprintf(cmd, sizeof cmd, "cp %s %s", full, copy);
    if (sh(cmd) != 0) exit(2);
    char *before = slurp(copy);
    static const struct { const char *flags, *msg; } cases[] = {
        {"--act fake", "option act is \"int\" in the file, \"fake\" now"},
        {"--kv f32", "option kv is \"int8\" in the file, \"f32\" now"},
        {"--think on", "option think is \"off\" in the file, \"on\" now"},
        {"--offset 1", "option offset is 0 in the file, 1 now"},
        {"--ctx 4000", "option ctx is"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CHECK(eval_cmd(copy, cases[i].flags) == 1, "%s: not refused", cases[i].flags);
        char *err = err_of(copy);
        CHECK(one_error_line(err, cases[i].msg), "%s: %s", cases[i].flags, err);
        free(err);
    }
    /* --max-tokens is given by eval_cmd itself: a second one wins */
    CHECK(eval_cmd(copy, "--max-tokens 25") == 1, "--max-tokens 25 not refused");
    char *after = slurp(copy);
    CHECK(!strcmp(before, after), "a refused run changed the file");
    free(after);
    /* a second run on a file in use */
    int fd = open(copy, O_RDWR);
    CHECK(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0, "cannot lock %s", copy);
    CHECK(eval_cmd(copy, "") == 1, "a locked file was written");
    char *locked = err_of(copy);
    CHECK(one_error_line(locked, "is in use by another g4 eval"), "%s", locked);
    free(locked);
    if (fd >= 0) close(fd);
    /* other data */
    write_text(copy, before);
    snprintf(cmd, sizeof cmd, "cp %s %s.orig && printf '{\"question\": \"More?\", \"answer\": \"#### 2\"}\\n' >> %s", data, data, data);
    if (sh(cmd) != 0) exit(2);
    CHECK(eval_cmd(copy, "") == 1, "changed data not refused");
    char *err = err_of(copy);
    CHECK(one_error_line(err, "the data sha256 is"), "%s", err);
    free(err);
    snprintf(cmd, sizeof cmd, "mv %s.orig %s", data, data);
    if (sh(cmd) != 0) exit(2);
    /* --out naming a file that is not a results file */
    char other[700];
    path_in_tmp(other, sizeof other, "notes.jsonl");
    write_text(other, "{\"question\": \"x\", \"answer\": \"#### 1\"}\n");
    CHECK(eval_cmd(other, "") == 1, "a foreign --out file was overwritten");
    char *kept = slurp(other);
    CHECK(!strcmp(kept, "{\"question\": \"x\", \"answer\": \"#### 1\"}\n"), "foreign file changed");
    free(kept);
    free(before);
}

/* A run holds the lock on its --out file for as long as it runs: stopped (SIGSTOP) mid-run, after
 * it has read the file back and written records, it still holds it, so a second run on the file
 * is refused at once and leaves it alone; let go on, the first ends with the records of an
 * uninterrupted run. */
static void test_lock_held(void) {
    char ref[700], out[700];
    path_in_tmp(ref, sizeof ref, "kill-ref.jsonl"); /* test_kill's uninterrupted run */
    path_in_tmp(out, sizeof out, "held.jsonl");
    pid_t pid = fork();
    if (pid == 0) {
        FILE *null = freopen("/dev/null", "w", stderr);
        (void)null;
        execl(bin, bin, "eval", "gsm8k", "-m", model, "--data", data, "--n", "6", "--out", out, "--max-tokens", "800", "--batch", "2",
              (char *)NULL);
        _exit(127);
    }
    int exited, seen = wait_first_record(out, pid, &exited), st = 0;
    CHECK(seen && !exited, "no record before the run ended");
    if (exited) return;
    kill(pid, SIGSTOP);
    char *before = slurp(out);
    CHECK(eval_cmd(out, KILL_FLAGS) == 1, "a second run on a file in use was not refused");
    char *err = err_of(out), *after = slurp(out);
    CHECK(one_error_line(err, "held.jsonl is in use by another g4 eval"), "second run said: %s", err);
    CHECK(!strcmp(before, after), "the refused run changed the file");
    free(err);
    free(before);
    free(after);
    kill(pid, SIGCONT);
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the first run failed (status %d)", st);
    expect_same_run(ref, out, "run next to a refused second run");
    printf("ok lock held for the whole run\n");
}

/* Files that are not what they should be: a device as --data, --out or a compared file is refused
 * before anything is read (/dev/zero and /dev/full read back endlessly); a results file past the
 * 1 GiB bound is refused before it is read; a write that fails (the file size limit, as a full disk
 * would) ends the run with one line, and a rerun completes the file. */
static void test_files(const char *full) {
    char cmd[4096], out[700], big[700];
    path_in_tmp(out, sizeof out, "files.jsonl");
    snprintf(cmd, sizeof cmd, "%s eval gsm8k -m %s --data /dev/zero --out %s 2> %s.err", bin, model, out, out);
    CHECK(sh(cmd) == 1, "--data /dev/zero accepted");
    char *err = err_of(out);
    CHECK(one_error_line(err, "/dev/zero: not a regular file"), "--data /dev/zero: %s", err);
    free(err);
    CHECK(access(out, F_OK) != 0, "a failed run left %s", out);
    /* the lock (and so the file) comes before the model: a run that fails to load it removes it */
    snprintf(cmd, sizeof cmd, "%s eval gsm8k -m %s/nonexistent --data %s --out %s 2> %s.err", bin, tmp, data, out, out);
    CHECK(sh(cmd) == 1, "a missing model accepted");
    CHECK(access(out, F_OK) != 0, "a run that could not load its model left %s", out);
    snprintf(cmd, sizeof cmd, "%s eval gsm8k -m %s --data %s --out /dev/full 2> %s.err", bin, model, data, out);
    CHECK(sh(cmd) == 1, "--out /dev/full accepted");
    err = err_of(out);
    CHECK(one_error_line(err, "--out /dev/full: not a regular file"), "--out /dev/full: %s", err);
    free(err);
    snprintf(cmd, sizeof cmd, "%s eval compare /dev/zero %s > /dev/null 2> %s.err", bin, full, out);
    CHECK(sh(cmd) == 1, "compare /dev/zero accepted");
    err = err_of(out);
    CHECK(one_error_line(err, "/dev/zero: not a regular file"), "compare /dev/zero: %s", err);
    free(err);
    path_in_tmp(big, sizeof big, "big.jsonl");
    snprintf(cmd, sizeof cmd, "cp %s %s && truncate -s 1073741825 %s", full, big, big); /* sparse: 1 GiB + 1 byte */
    if (sh(cmd) != 0) exit(2);
    snprintf(cmd, sizeof cmd, "%s eval compare %s %s > /dev/null 2> %s.err", bin, big, full, out);
    CHECK(sh(cmd) == 1, "a results file past the bound was compared");
    err = err_of(out);
    CHECK(one_error_line(err, "big.jsonl: larger than 1 GiB, the limit for this file"), "compare big: %s", err);
    free(err);
    unlink(big);
    /* writes fail past 2 KiB (a 512-byte block count, SIGXFSZ ignored so write returns EFBIG) */
    snprintf(cmd, sizeof cmd, "sh -c \"ulimit -f 4; trap '' XFSZ; exec %s eval gsm8k -m %s --data %s --n 6 --max-tokens 24 --out %s\" 2> %s.err",
             bin, model, data, out, out);
    CHECK(sh(cmd) == 1, "a failed write was not an error");
    err = err_of(out);
    const char *last = err;
    for (const char *p = err; *p; p++)
        if (*p == '\n' && p[1]) last = p + 1;
    CHECK(one_error_line(last, "files.jsonl: cannot write: File too large"), "write error: %s", err);
    free(err);
    CHECK(eval_cmd(out, "") == 0, "the rerun after a failed write failed");
    expect_same_run(full, out, "rerun after a failed write");
    printf("ok files: devices refused, results bounded, write errors reported\n");
}

/* Without --data, a model folder's own test.jsonl is the data (as models/gemma4-tiny-math ships
 * one): the same records as with --data naming that file; a folder without one is an error. */
static void test_default_data(const char *full) {
    char cmd[4096], out[700];
    path_in_tmp(out, sizeof out, "default-data.jsonl");
    snprintf(cmd, sizeof cmd, "%s eval gsm8k -m %s --n 6 --max-tokens 24 --out %s 2> %s.err", bin, model, out, out);
    CHECK(sh(cmd) == 1, "a model folder without test.jsonl and no --data accepted");
    char *err = err_of(out);
    CHECK(one_error_line(err, "needs --data FILE"), "no --data: %s", err);
    free(err);
    snprintf(cmd, sizeof cmd, "cp %s %s/test.jsonl", data, model);
    if (sh(cmd) != 0) exit(2);
    snprintf(cmd, sizeof cmd, "%s eval gsm8k -m %s --n 6 --max-tokens 24 --out %s 2> %s.err", bin, model, out, out);
    CHECK(sh(cmd) == 0, "g4 eval gsm8k with the model's test.jsonl failed: %s.err", out);
    expect_same_run(full, out, "the model's own test set");
    char *text = slurp(out), want[800];
    snprintf(want, sizeof want, "\"path\":\"%s/test.jsonl\"", model);
    CHECK(strstr(text, want) != NULL, "the header does not name %s/test.jsonl", model);
    free(text);
    snprintf(cmd, sizeof cmd, "%s/test.jsonl", model);
    unlink(cmd);
    printf("ok default data: the model's test.jsonl\n");
}

static void test_batch(const char *full) {
    char out[700];
    path_in_tmp(out, sizeof out, "batch3.jsonl");
    CHECK(eval_cmd(out, "--batch 3") == 0, "--batch 3 failed");
    expect_same_run(full, out, "--batch 3");
    path_in_tmp(out, sizeof out, "batch8.jsonl");
    CHECK(eval_cmd(out, "--batch 8") == 0, "--batch 8 failed");
    expect_same_run(full, out, "--batch 8");
}

static void test_bad_flags(void) {
    char out[700];
    path_in_tmp(out, sizeof out, "never.jsonl");
    CHECK(eval_cmd(out, "--batch 0") == 1, "--batch 0 accepted");
    CHECK(eval_cmd(out, "--bogus") == 1, "--bogus accepted");
    CHECK(eval_cmd(out, "--offset 8") == 1, "--offset past the end accepted");
    char *err = err_of(out);
    CHECK(one_error_line(err, "--offset 8 is past the end of the file (8 lines)"), "%s", err);
    free(err);
    /* line 7 is blank: no question, but it keeps the numbering */
    CHECK(eval_cmd(out, "--offset 7") == 1, "a blank selection accepted");
    err = err_of(out);
    CHECK(one_error_line(err, "no questions in the selected lines"), "%s", err);
    free(err);
    CHECK(access(out, F_OK) != 0, "a failed run left %s", out);
}

int main(void) {
    bin = check_bin();
    snprintf(tmp, sizeof tmp, "/tmp/g4-eval-XXXXXX");
    if (!mkdtemp(tmp)) return 2;
    test_wilson();
    test_mcnemar();
    test_sha256();
    test_data();
    test_reader_errors();
    test_reader_tail();
    test_compare_lib();
    if (g4_gsm8k_extractor_open(&extractor) != 0) return 2;
    test_record_verdicts();
    if (bin) {
        char cmd[2048], full[700];
        snprintf(model, sizeof model, "%s/tiny", tmp);
        snprintf(data, sizeof data, "%s/data.jsonl", tmp);
        snprintf(cmd, sizeof cmd, "%s synth --preset tiny -o %s > /dev/null", bin, model);
        if (sh(cmd) != 0) return 2;
        write_data();
        path_in_tmp(full, sizeof full, "full.jsonl");
        test_compare_cli();
        test_eval_run(full);
        test_eval_right_answers(full);
        test_resume(full);
        test_kill();
        test_lock_held();
        test_refusals(full);
        test_files(full);
        test_default_data(full);
        test_batch(full);
        test_bad_flags();
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (sh(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    g4_gsm8k_extractor_close(extractor);
    return check_report("eval");
}
