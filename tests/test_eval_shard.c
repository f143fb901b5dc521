/* `g4 eval gsm8k --shard I/N`, `g4 eval merge` and the progress line, on the built-in model
 * (models/gemma4-tiny-math) and its held-out problems: each shard holds exactly the questions qK
 * with K mod N = I (computed here from the indices), its header is the unsharded run's plus the
 * shard; the merged shards are the unsharded run's file (the same header, the same records but
 * for their timing, each record the shard's line byte for byte, the same scores), also with an
 * offset and shards run under GNU parallel; merge refuses gaps, overlaps, other splits, other
 * options or data, unfinished or damaged shards and an existing output, in one line each; a
 * shard resumes, and refuses another shard's or an unsharded command; the progress line goes
 * to stderr (stdout stays empty) with the counts and accuracy the records give. */
#define _POSIX_C_SOURCE 200809L
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "cli_util.h"

/* Command lines are built in fixed buffers sized far above what the temporary paths need; a
 * truncated one would fail its test, not pass it. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define MODEL "models/gemma4-tiny-math"
#define DATA MODEL "/test.jsonl"
#define N_Q 10

static const char *bin;
static char tmp[256], out_path[600], err_path[600];

/* `g4 ARGS`, stdout and stderr into out_path and err_path; the exit status. */
static int run(const char *args) { return run_into(bin, args, out_path, err_path); }

static void path_in_tmp(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmp, name);
}

static int exists(const char *path) {
    return access(path, F_OK) == 0;
}

/* stderr is one line "g4: error: ..." (or "g4 eval: error: ...", a flag's) holding `what`. */
static int one_error_line(const char *what) {
    char *err = slurp(err_path);
    const char *nl = strchr(err, '\n');
    int ok = (!strncmp(err, "g4: error: ", 11) || !strncmp(err, "g4 eval: error: ", 16)) && strstr(err, what) && nl && !nl[1];
    if (!ok) fprintf(stderr, "stderr was: %s\n", err);
    free(err);
    return ok;
}

static int stdout_empty(void) {
    char *out = slurp(out_path);
    int empty = !*out;
    free(out);
    return empty;
}

/* `g4 eval gsm8k` on the built-in model's problems. */
static int eval(const char *out, const char *flags) {
    char args[4096];
    snprintf(args, sizeof args, "eval gsm8k -m " MODEL " --data " DATA " --out %s %s", out, flags);
    return run(args);
}

/* ---------------------------------------------------------------- a results file */

#define MAX_LINES 64

typedef struct {
    int n;
    char *line[MAX_LINES];  /* without the newline */
    cJSON *rec[MAX_LINES];  /* parsed (NULL if not JSON) */
} rfile;

static void rfile_read(const char *path, rfile *f) {
    memset(f, 0, sizeof *f);
    char *text = slurp(path), *save = NULL;
    for (char *l = strtok_r(text, "\n", &save); l && f->n < MAX_LINES; l = strtok_r(NULL, "\n", &save)) {
        f->line[f->n] = strdup(l);
        f->rec[f->n++] = cJSON_Parse(l);
    }
    free(text);
}

static void rfile_free(rfile *f) {
    for (int i = 0; i < f->n; i++) {
        free(f->line[i]);
        cJSON_Delete(f->rec[i]);
    }
    memset(f, 0, sizeof *f);
}

static const char *type_of(const cJSON *r) {
    const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "type"));
    return t ? t : "";
}

static int index_of(const cJSON *r) {
    const cJSON *i = cJSON_GetObjectItemCaseSensitive(r, "index");
    return cJSON_IsNumber(i) ? (int)i->valuedouble : -1;
}

static const cJSON *header_of(const rfile *f) {
    return f->n && !strcmp(type_of(f->rec[0]), "header") ? f->rec[0] : NULL;
}

static const cJSON *summary_of(const rfile *f) {
    return f->n && !strcmp(type_of(f->rec[f->n - 1]), "summary") ? f->rec[f->n - 1] : NULL;
}

/* The question record with this index, or NULL; *line its text. */
static const cJSON *question(const rfile *f, int index, const char **line) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(type_of(f->rec[i]), "question") && index_of(f->rec[i]) == index) {
            if (line) *line = f->line[i];
            return f->rec[i];
        }
    return NULL;
}

/* The question indices in file order. */
static int question_indices(const rfile *f, int *idx) {
    int n = 0;
    for (int i = 0; i < f->n; i++)
        if (!strcmp(type_of(f->rec[i]), "question")) idx[n++] = index_of(f->rec[i]);
    return n;
}

/* Two records equal but for their timing ("seconds": wall time of that question in that run). */
static int same_but_timing(const cJSON *a, const cJSON *b) {
    if (!a || !b) return 0;
    cJSON *x = cJSON_Duplicate(a, 1), *y = cJSON_Duplicate(b, 1);
    cJSON_DeleteItemFromObjectCaseSensitive(x, "seconds");
    cJSON_DeleteItemFromObjectCaseSensitive(y, "seconds");
    int same = cJSON_Compare(x, y, 1);
    cJSON_Delete(x);
    cJSON_Delete(y);
    return same;
}

static int header_without_shard_equals(const cJSON *shard_header, const cJSON *full_header) {
    cJSON *h = cJSON_Duplicate(shard_header, 1);
    cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(h, "options"), "shard");
    int same = cJSON_Compare(h, full_header, 1);
    cJSON_Delete(h);
    return same;
}

static double number(const cJSON *obj, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* ---------------------------------------------------------------- merged == unsharded */

/* The merged file is the unsharded run's: header, the records in index order (the unsharded run
 * at batch 1 writes them so) equal but for timing, each the line of the shard that holds it, and
 * the scores of the summary. */
static void expect_merged_is_full(const char *merged, const char *full, const char *const *shards, int n_shards, const char *what) {
    rfile m, f, s[8];
    rfile_read(merged, &m);
    rfile_read(full, &f);
    for (int i = 0; i < n_shards; i++) rfile_read(shards[i], &s[i]);
    CHECK(header_of(&m) && header_of(&f) && cJSON_Compare(header_of(&m), header_of(&f), 1), "%s: the header is not the unsharded run's",
          what);
    int mi[MAX_LINES], fi[MAX_LINES];
    int nm = question_indices(&m, mi), nf = question_indices(&f, fi);
    CHECK(nm == nf && nm > 0 && !memcmp(mi, fi, sizeof *mi * (size_t)nm), "%s: %d records, the unsharded run %d (or another order)", what, nm,
          nf);
    int same = 0, verbatim = 0;
    for (int k = 0; k < nm && nm == nf; k++) {
        const char *line = NULL, *shard_line = NULL;
        same += same_but_timing(question(&m, mi[k], &line), question(&f, mi[k], NULL));
        for (int i = 0; i < n_shards; i++)
            if (question(&s[i], mi[k], &shard_line) && line && !strcmp(line, shard_line)) verbatim++;
    }
    CHECK(same == nm && verbatim == nm, "%s: %d of %d records equal the unsharded run's, %d are their shard's line", what, same, nm, verbatim);
    const cJSON *ms = summary_of(&m), *fs = summary_of(&f);
    static const char *const scores[] = {"n", "correct", "accuracy", "wilson95_lo", "wilson95_hi", "budget_truncated", "context_truncated",
                                         "no_number", "thought_unclosed"};
    for (size_t i = 0; i < sizeof scores / sizeof *scores; i++)
        CHECK(ms && fs && number(ms, scores[i]) == number(fs, scores[i]), "%s: summary %s %g, unsharded %g", what, scores[i],
              number(ms, scores[i]), number(fs, scores[i]));
    CHECK(number(ms, "merged_shards") == n_shards && m.n == nm + 2, "%s: merged_shards %g, %d lines", what, number(ms, "merged_shards"), m.n);
    double generated = 0;
    for (int i = 0; i < n_shards; i++) generated += number(summary_of(&s[i]), "generated_tokens");
    CHECK(number(ms, "generated_tokens") == generated && generated == number(fs, "generated_tokens"),
          "%s: %g tokens merged, %g in the shards, %g unsharded", what, number(ms, "generated_tokens"), generated,
          number(fs, "generated_tokens"));
    rfile_free(&m);
    rfile_free(&f);
    for (int i = 0; i < n_shards; i++) rfile_free(&s[i]);
}

/* ---------------------------------------------------------------- the shards */

static char full[700], shard_path[3][700], merged[700];

/* Shard i of 3 holds exactly q0..q9 with index mod 3 = i, its header is the unsharded one plus
 * "shard", and the progress line on stderr gives its count and the accuracy of its records. */
static void test_shards(void) {
    CHECK(eval(full, "--n 10") == 0, "the unsharded run failed");
    rfile f;
    rfile_read(full, &f);
    for (int i = 0; i < 3; i++) {
        char flags[64];
        snprintf(flags, sizeof flags, "--n 10 --shard %d/3 --progress on --batch %d", i, 1 + i);
        CHECK(eval(shard_path[i], flags) == 0, "shard %d/3 failed", i);
        CHECK(stdout_empty(), "shard %d/3 wrote to stdout", i);
        rfile s;
        rfile_read(shard_path[i], &s);
        int idx[MAX_LINES], want[N_Q], n_want = 0, right = 0;
        for (int k = 0; k < N_Q; k++)
            if (k % 3 == i) want[n_want++] = k;
        int n = question_indices(&s, idx);
        int ok = n == n_want;
        for (int a = 0; ok && a < n; a++) {
            int found = 0;
            for (int b = 0; b < n_want; b++) found |= idx[a] == want[b];
            ok = found;
        }
        CHECK(ok, "shard %d/3 holds %d records, not exactly q%d, q%d, ...", i, n, want[0], want[1]);
        for (int a = 0; a < n; a++) right += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(question(&s, idx[a], NULL), "correct"));
        const cJSON *shard = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(header_of(&s), "options"), "shard");
        char want_shard[16];
        snprintf(want_shard, sizeof want_shard, "%d/3", i);
        CHECK(cJSON_IsString(shard) && !strcmp(shard->valuestring, want_shard), "shard %d/3: header shard %s", i,
              cJSON_IsString(shard) ? shard->valuestring : "missing");
        CHECK(header_of(&f) && header_of(&s) && header_without_shard_equals(header_of(&s), header_of(&f)),
              "shard %d/3: the header is not the unsharded one plus its shard", i);
        char line[128], *err = slurp(err_path);
        snprintf(line, sizeof line, "\ng4 eval: shard %d/3: %d/%d done, acc %.1f%%, ", i, n_want, n_want, 100.0 * right / n_want);
        CHECK(strstr(err, line) != NULL, "shard %d/3: no progress line \"%s\" in: %s", i, line + 1, err);
        free(err);
        rfile_free(&s);
    }
    rfile_free(&f);
}

static void test_merge(void) {
    char args[4096];
    snprintf(args, sizeof args, "eval merge %s %s %s %s", merged, shard_path[2], shard_path[0], shard_path[1]);
    CHECK(run(args) == 0, "g4 eval merge failed");
    CHECK(stdout_empty(), "g4 eval merge wrote to stdout");
    char *err = slurp(err_path);
    CHECK(strstr(err, "3 files, 10 questions into") != NULL, "merge said: %s", err);
    free(err);
    const char *shards[3] = {shard_path[0], shard_path[1], shard_path[2]};
    expect_merged_is_full(merged, full, shards, 3, "3 shards");
    /* compare sees one experiment; the unsharded command resumes the merged file with nothing to do */
    snprintf(args, sizeof args, "eval compare %s %s", merged, full);
    CHECK(run(args) == 0, "compare failed");
    char *out = slurp(out_path);
    CHECK(strstr(out, "common questions: 10 (only in A: 0, only in B: 0)") && !strstr(out, "settings that differ"), "compare: %s", out);
    free(out);
    CHECK(eval(merged, "--n 10") == 0, "resuming the merged file failed");
    err = slurp(err_path);
    CHECK(strstr(err, "10 already in") && strstr(err, "0 to run"), "resume of the merged file: %s", err);
    free(err);
}

/* With an offset the shards still go by question index: --offset 3 --n 7 is q3..q9; shard 0/2
 * holds q4, q6, q8. */
static void test_offset(void) {
    char ref[700], s[2][700], m[700], args[4096];
    path_in_tmp(ref, sizeof ref, "offset-full.jsonl");
    path_in_tmp(s[0], sizeof s[0], "offset-0.jsonl");
    path_in_tmp(s[1], sizeof s[1], "offset-1.jsonl");
    path_in_tmp(m, sizeof m, "offset-merged.jsonl");
    CHECK(eval(ref, "--offset 3 --n 7") == 0, "unsharded offset run failed");
    CHECK(eval(s[0], "--offset 3 --n 7 --shard 0/2") == 0 && eval(s[1], "--offset 3 --n 7 --shard 1/2") == 0, "offset shards failed");
    rfile f;
    rfile_read(s[0], &f);
    int idx[MAX_LINES], n = question_indices(&f, idx);
    CHECK(n == 3 && idx[0] == 4 && idx[1] == 6 && idx[2] == 8, "shard 0/2 of q3..q9: %d records", n);
    rfile_free(&f);
    snprintf(args, sizeof args, "eval merge %s %s %s", m, s[0], s[1]);
    CHECK(run(args) == 0, "merge of the offset shards failed");
    const char *shards[2] = {s[0], s[1]};
    expect_merged_is_full(m, ref, shards, 2, "offset shards");
}

/* ---------------------------------------------------------------- refusals */

/* `g4 eval merge OUT INPUTS` fails with one line holding `what`, and writes no OUT. */
static void expect_merge_refused(const char *inputs, const char *what) {
    char out[700], args[4096];
    path_in_tmp(out, sizeof out, "refused.jsonl");
    snprintf(args, sizeof args, "eval merge %s %s", out, inputs);
    int rc = run(args);
    CHECK(rc == 1 && one_error_line(what) && !exists(out), "merge %s: exit %d, expected \"%s\"", inputs, rc, what);
    unlink(out);
}

/* Writes lines [from, to) of a file, and then `extra` (NULL: none), to path. */
static void write_lines(const char *path, const rfile *f, int from, int to, const char *extra) {
    FILE *o = fopen(path, "w");
    if (!o) exit(2);
    for (int i = from; i < to && i < f->n; i++) fprintf(o, "%s\n", f->line[i]);
    if (extra) fputs(extra, o);
    fclose(o);
}

static void test_merge_refusals(void) {
    char inputs[4096], a[700], b[700];
    snprintf(inputs, sizeof inputs, "%s %s", shard_path[0], shard_path[1]);
    expect_merge_refused(inputs, "shard 2/3 is missing");
    snprintf(inputs, sizeof inputs, "%s %s %s %s", shard_path[0], shard_path[1], shard_path[2], shard_path[1]);
    expect_merge_refused(inputs, "are both shard 1/3: their questions overlap");
    /* another split of the same run */
    path_in_tmp(a, sizeof a, "half-1.jsonl");
    CHECK(eval(a, "--n 10 --shard 1/2") == 0, "shard 1/2 failed");
    snprintf(inputs, sizeof inputs, "%s %s %s", shard_path[0], a, shard_path[2]);
    expect_merge_refused(inputs, "split the run differently");
    /* another option, other data */
    path_in_tmp(a, sizeof a, "s2-f64.jsonl");
    CHECK(eval(a, "--n 10 --shard 2/3 --requant f64") == 0, "shard 2/3 with --requant f64 failed");
    snprintf(inputs, sizeof inputs, "%s %s %s", shard_path[0], shard_path[1], a);
    char what[1600];
    snprintf(what, sizeof what, "not shards of one run: option requant is \"f32\" in %s, \"f64\" in %s", shard_path[0], a);
    expect_merge_refused(inputs, what);
    path_in_tmp(a, sizeof a, "s2-n9.jsonl");
    CHECK(eval(a, "--n 9 --shard 2/3") == 0, "shard 2/3 of 9 questions failed");
    snprintf(inputs, sizeof inputs, "%s %s %s", shard_path[0], shard_path[1], a);
    expect_merge_refused(inputs, "option n is 10 in");
    /* damaged or unfinished shards */
    rfile s1, s0;
    rfile_read(shard_path[1], &s1);
    rfile_read(shard_path[0], &s0);
    path_in_tmp(b, sizeof b, "s1-damaged.jsonl");
    snprintf(inputs, sizeof inputs, "%s %s %s", shard_path[0], b, shard_path[2]);
    write_lines(b, &s1, 0, s1.n - 1, NULL); /* no summary: a run that was stopped */
    expect_merge_refused(inputs, "no summary record: the run has not finished");
    write_lines(b, &s1, 0, 2, "{\"type\":\"question\",\"index\":4,\"go"); /* killed mid-line */
    expect_merge_refused(inputs, "line 3 is incomplete");
    char extra[8192];
    snprintf(extra, sizeof extra, "%s\n%s\n", s0.line[1], s1.line[s1.n - 1]); /* a record of shard 0 in shard 1 */
    write_lines(b, &s1, 0, s1.n - 1, extra);
    expect_merge_refused(inputs, "question 0 is not in shard 1/3 (0 mod 3 is 0)");
    /* a record left out (its summary counting what is left): the run's 10 questions are not all there */
    cJSON *summary = cJSON_Duplicate(s1.rec[s1.n - 1], 1);
    cJSON_ReplaceItemInObjectCaseSensitive(summary, "n", cJSON_CreateNumber(s1.n - 3));
    char *text = cJSON_PrintUnformatted(summary);
    snprintf(extra, sizeof extra, "%s\n", text);
    write_lines(b, &s1, 0, s1.n - 2, extra);
    expect_merge_refused(inputs, "the shards hold 9 questions, the run selected 10");
    free(text);
    cJSON_Delete(summary);
    rfile_free(&s1);
    rfile_free(&s0);
    /* an output that exists (one of the inputs, say), an input that is not a results file, no inputs */
    char args[4096];
    snprintf(args, sizeof args, "eval merge %s %s %s %s", shard_path[0], shard_path[0], shard_path[1], shard_path[2]);
    char *before = slurp(shard_path[0]);
    CHECK(run(args) == 1 && one_error_line("already exists (g4 eval merge writes a new file)"), "merge over an input");
    char *after = slurp(shard_path[0]);
    CHECK(!strcmp(before, after), "a refused merge changed its output");
    free(before);
    free(after);
    expect_merge_refused(DATA, "test.jsonl:1: field \"type\" is missing");
    CHECK(run("eval merge only-an-output.jsonl") == 1 && one_error_line("usage: g4 eval merge OUT.jsonl SHARD.jsonl"), "merge without inputs");
}

static void test_shard_flag(void) {
    static const char *const bad[] = {"3/3", "1", "-1/2", "1/0", "a/b", "1/2x", "/2", "1/", "1/1048577"};
    char out[700], flags[64];
    path_in_tmp(out, sizeof out, "never.jsonl");
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(flags, sizeof flags, "--n 10 --shard %s", bad[i]);
        char what[96];
        snprintf(what, sizeof what, "--shard %s: expected I/N", bad[i]);
        CHECK(eval(out, flags) == 1 && one_error_line(what) && !exists(out), "--shard %s accepted", bad[i]);
    }
    CHECK(eval(out, "--n 10 --shard") == 1 && one_error_line("--shard needs a value"), "--shard without a value");
    CHECK(eval(out, "--n 10 --progress sometimes") == 1 && one_error_line("--progress sometimes: expected one of auto on off"), "--progress");
}

/* A shard resumes like any run; another shard's command, or the unsharded one, is refused. */
static void test_shard_resume(void) {
    char cut[700];
    path_in_tmp(cut, sizeof cut, "s1-cut.jsonl");
    rfile s1;
    rfile_read(shard_path[1], &s1);
    write_lines(cut, &s1, 0, 2, "{\"type\":\"question\",\"ind"); /* header, one record, a line cut short */
    CHECK(eval(cut, "--n 10 --shard 1/3") == 0, "resuming shard 1/3 failed");
    char *err = slurp(err_path);
    CHECK(strstr(err, "1 already in") && strstr(err, "2 to run"), "resume said: %s", err);
    free(err);
    rfile r;
    rfile_read(cut, &r);
    int idx[MAX_LINES], n = question_indices(&s1, idx), same = 0;
    for (int k = 0; k < n; k++) same += same_but_timing(question(&r, idx[k], NULL), question(&s1, idx[k], NULL));
    CHECK(n == 3 && same == 3 && r.n == 5, "the resumed shard: %d of %d records as before, %d lines", same, n, r.n);
    rfile_free(&r);
    rfile_free(&s1);
    char *before = slurp(cut);
    CHECK(eval(cut, "--n 10 --shard 2/3") == 1 && one_error_line("option shard is \"1/3\" in the file, \"2/3\" now"), "another shard");
    CHECK(eval(cut, "--n 10") == 1 && one_error_line("option shard is \"1/3\" in the file, absent now"), "the unsharded command");
    CHECK(eval(full, "--n 10 --shard 0/3") == 1 && one_error_line("option shard is absent in the file, \"0/3\" now"), "a shard on a full run");
    char *after = slurp(cut);
    CHECK(!strcmp(before, after), "a refused resume changed the shard");
    free(before);
    free(after);
}

/* --progress on without shards: the final line counts every question; off, and auto when stderr
 * is not a terminal, print none; stdout stays empty whichever. */
static void test_progress(void) {
    char out[700];
    rfile f;
    rfile_read(full, &f);
    int right = 0;
    for (int k = 0; k < N_Q; k++) right += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(question(&f, k, NULL), "correct"));
    rfile_free(&f);
    static const char *const modes[] = {"on", "off", "auto"};
    for (int i = 0; i < 3; i++) {
        char flags[64], line[96];
        snprintf(out, sizeof out, "%s/progress-%s.jsonl", tmp, modes[i]);
        snprintf(flags, sizeof flags, "--n 10 --progress %s", modes[i]);
        CHECK(eval(out, flags) == 0 && stdout_empty(), "--progress %s: failed or wrote to stdout", modes[i]);
        char *err = slurp(err_path);
        snprintf(line, sizeof line, "\ng4 eval: %d/%d done, acc %.1f%%, ", N_Q, N_Q, 100.0 * right / N_Q);
        CHECK(i == 0 ? strstr(err, line) != NULL : !strstr(err, " done, acc "), "--progress %s: %s", modes[i], err);
        free(err);
    }
}

/* GNU parallel (scripts/install-deps.sh installs it): the README's command line, three shards at once. */
static void test_gnu_parallel(void) {
    if (sh("command -v parallel > /dev/null") != 0) {
        CHECK(0, "GNU parallel is not installed (scripts/install-deps.sh installs it): the README's sharded run cannot be tried");
        return;
    }
    char cmd[8192], p[3][700], m[700];
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "par-%d.jsonl", i);
        path_in_tmp(p[i], sizeof p[i], name);
    }
    path_in_tmp(m, sizeof m, "par-merged.jsonl");
    snprintf(cmd, sizeof cmd,
             "parallel --will-cite --halt now,fail=1 -j 3 %s eval gsm8k -m " MODEL " --data " DATA
             " --n 10 -t 1 --shard {}/3 --out %s/par-{}.jsonl ::: 0 1 2 > %s 2> %s",
             bin, tmp, out_path, err_path);
    CHECK(sh(cmd) == 0, "the shards under GNU parallel failed");
    char args[4096];
    snprintf(args, sizeof args, "eval merge %s %s %s %s", m, p[0], p[1], p[2]);
    CHECK(run(args) == 0, "merging the GNU parallel shards failed");
    const char *shards[3] = {p[0], p[1], p[2]};
    expect_merged_is_full(m, full, shards, 3, "GNU parallel shards");
}

int main(void) {
    bin = check_bin();
    if (!bin) return check_report("eval_shard");
    snprintf(tmp, sizeof tmp, "/tmp/g4-eval-shard-XXXXXX");
    if (!mkdtemp(tmp)) return 2;
    snprintf(out_path, sizeof out_path, "%s/stdout", tmp);
    snprintf(err_path, sizeof err_path, "%s/stderr", tmp);
    path_in_tmp(full, sizeof full, "full.jsonl");
    path_in_tmp(merged, sizeof merged, "merged.jsonl");
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "shard-%d.jsonl", i);
        path_in_tmp(shard_path[i], sizeof shard_path[i], name);
    }
    test_shards();
    test_merge();
    test_offset();
    test_merge_refusals();
    test_shard_flag();
    test_shard_resume();
    test_progress();
    test_gnu_parallel();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (sh(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return check_report("eval_shard");
}
