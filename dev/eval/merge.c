/* `g4 eval merge`: the results files of a run's shards into the file the unsharded run writes
 * (harness.h, g4_eval_merge). Each input is checked whole before anything is written, and every
 * refusal names the file(s) and what is wrong with them. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eval/harness.h"
#include "util/err.h"
#include "util/file.h"

#define MAX_SHARDS (1 << 20)

int g4_eval_parse_shard(const char *text, int *shard, int *n_shards) {
    const char *slash = strchr(text, '/');
    char *end;
    long i = -1, n = 0;
    if (slash && text[0] >= '0' && text[0] <= '9') {
        errno = 0;
        i = strtol(text, &end, 10);
        if (errno || end != slash) i = -1;
        if (i >= 0 && slash[1] >= '0' && slash[1] <= '9') {
            n = strtol(slash + 1, &end, 10);
            if (errno || *end) n = 0;
        }
    }
    if (i < 0 || n < 1 || n > MAX_SHARDS || i >= n)
        return g4_fail("%s: expected I/N, shard I of N with 0 <= I < N <= %d", text, MAX_SHARDS);
    *shard = (int)i;
    *n_shards = (int)n;
    return 0;
}

/* One input: its records and the raw text of each question line. */
typedef struct {
    const char *path;
    g4_results r;
    char *text;
    size_t size;
    int shard, n_shards;
} shard_file;

typedef struct {
    int index;
    const char *line; /* in its file's text, without the newline */
    size_t len;
    const g4_result_question *q;
} merged_record;

static void shard_files_free(shard_file *f, int n) {
    for (int i = 0; f && i < n; i++) {
        g4_results_free(&f[i].r);
        free(f[i].text);
    }
    free(f);
}

/* The shard the header says ("shard" option), or 0/1 for an unsharded run. */
static int header_shard(shard_file *f) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f->r.header, "options"), "shard");
    f->shard = 0;
    f->n_shards = 1;
    if (!v) return 0;
    if (!cJSON_IsString(v) || g4_eval_parse_shard(v->valuestring, &f->shard, &f->n_shards) != 0)
        return g4_fail("%s: the header's shard option is not I/N", f->path);
    return 0;
}

static int summary_count(const cJSON *summary) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(summary, "n");
    return cJSON_IsNumber(n) ? (int)n->valuedouble : -1;
}

/* Reads one input: a results file of a run that finished (a summary counting every record). */
static int read_shard(shard_file *f) {
    if (g4_results_read(f->path, 0, &f->r) != 0) return -1;
    if (!f->r.header) return g4_fail("%s: no header record (not a g4 eval results file)", f->path);
    if (f->r.dropped_tail_line) return g4_fail("%s: line %d is incomplete (is that run still going?)", f->path, f->r.dropped_tail_line);
    if (!f->r.summary) return g4_fail("%s: no summary record: the run has not finished (rerun its command to complete it)", f->path);
    if (header_shard(f) != 0) return -1;
    for (int i = 0; i < f->r.n_q; i++)
        if (!g4_eval_in_shard(f->r.q[i].index, f->shard, f->n_shards))
            return g4_fail("%s:%d: question %d is not in shard %d/%d (%d mod %d is %d)", f->path, f->r.q[i].line, f->r.q[i].index,
                           f->shard, f->n_shards, f->r.q[i].index, f->n_shards, f->r.q[i].index % f->n_shards);
    if (summary_count(f->r.summary) != f->r.n_q)
        return g4_fail("%s: its summary counts %d questions, the file holds %d", f->path, summary_count(f->r.summary), f->r.n_q);
    return g4_read_file_bounded(f->path, G4_RESULTS_FILE_MAX, G4_READ_REGULAR, &f->text, &f->size);
}

/* A copy of the header without its shard option: what every shard shares, and what the
 * unsharded run writes. */
static cJSON *run_header(const cJSON *header) {
    cJSON *h = cJSON_Duplicate(header, 1);
    if (h) cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(h, "options"), "shard");
    return h;
}

/* Same model, data, version and options (the shard apart) as the first input. */
static int same_run(const shard_file *first, const shard_file *f) {
    cJSON *a = run_header(first->r.header), *b = run_header(f->r.header);
    char in_a[1100], in_b[1100];
    snprintf(in_a, sizeof in_a, "in %.1024s", first->path);
    snprintf(in_b, sizeof in_b, "in %.1024s", f->path);
    char *diff = a && b ? g4_eval_header_diff(a, b, in_a, in_b) : NULL;
    int rc = !a || !b ? g4_fail("out of memory") : diff ? g4_fail("not shards of one run: %s", diff) : 0;
    free(diff);
    cJSON_Delete(a);
    cJSON_Delete(b);
    return rc;
}

/* Every shard of one split, each once. */
static int check_split(const shard_file *f, int n) {
    int N = f[0].n_shards;
    if (n > N) N = n; /* more inputs than shards: some shard is given twice, found below */
    const shard_file **by_shard = calloc((size_t)N, sizeof *by_shard);
    if (!by_shard) return g4_fail("out of memory");
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (f[i].n_shards != f[0].n_shards)
            rc = g4_fail("%s is shard %d/%d, %s shard %d/%d: they split the run differently", f[0].path, f[0].shard, f[0].n_shards,
                         f[i].path, f[i].shard, f[i].n_shards);
        else if (by_shard[f[i].shard])
            rc = g4_fail("%s and %s are both shard %d/%d: their questions overlap", by_shard[f[i].shard]->path, f[i].path, f[i].shard,
                         f[i].n_shards);
        else
            by_shard[f[i].shard] = &f[i];
    }
    for (int s = 0; s < f[0].n_shards && rc == 0; s++)
        if (!by_shard[s]) rc = g4_fail("shard %d/%d is missing: its questions would be a gap in the run", s, f[0].n_shards);
    free(by_shard);
    return rc;
}

/* Line `line` (1-based) of a text: its start and length without the newline. */
static const char *text_line(const char *text, size_t size, int line, size_t *len) {
    const char *p = text, *end = text + size;
    for (int l = 1; l < line && p < end; l++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        p = nl ? nl + 1 : end;
    }
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    *len = (size_t)((nl ? nl : end) - p);
    return p;
}

static int by_index(const void *x, const void *y) {
    const merged_record *a = x, *b = y;
    return (a->index > b->index) - (a->index < b->index);
}

/* Every record of every shard, by index; their total must be the run's question count. */
static merged_record *collect_records(const shard_file *f, int n, int *total) {
    int count = 0;
    for (int i = 0; i < n; i++) count += f[i].r.n_q;
    merged_record *m = malloc(sizeof *m * (size_t)(count ? count : 1));
    if (!m) {
        g4_fail("out of memory");
        return NULL;
    }
    int k = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < f[i].r.n_q; j++) {
            const g4_result_question *q = &f[i].r.q[j];
            m[k].index = q->index;
            m[k].q = q;
            m[k].line = text_line(f[i].text, f[i].size, q->line, &m[k].len);
            k++;
        }
    qsort(m, (size_t)count, sizeof *m, by_index);
    const cJSON *selected = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f[0].r.header, "options"), "n");
    if (!cJSON_IsNumber(selected) || (int)selected->valuedouble != count) {
        if (cJSON_IsNumber(selected)) g4_fail("the shards hold %d questions, the run selected %d", count, (int)selected->valuedouble);
        else g4_fail("%s: the header has no option n (the run's question count)", f[0].path);
        free(m);
        return NULL;
    }
    *total = count;
    return m;
}

static double summary_number(const cJSON *summary, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(summary, name);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

/* The merged summary: every record scored; the shards' throughput summed and their wall time the
 * longest (they ran side by side). */
static cJSON *merged_summary(const shard_file *f, int n, const merged_record *m, int total, g4_eval_score *score) {
    g4_results all;
    memset(&all, 0, sizeof all);
    all.q = malloc(sizeof *all.q * (size_t)(total ? total : 1));
    if (!all.q) {
        g4_fail("out of memory");
        return NULL;
    }
    for (int i = 0; i < total; i++) all.q[i] = *m[i].q; /* shallow: the shards own the strings */
    all.n_q = total;
    g4_eval_score_results(&all, score);
    free(all.q);
    g4_eval_timing t = {0};
    double wall = 0;
    int evaluated = 0, batch = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *s = f[i].r.summary;
        t.generated += (long)summary_number(s, "generated_tokens");
        t.prefill_s += summary_number(s, "prefill_seconds");
        t.decode_s += summary_number(s, "decode_seconds");
        evaluated += (int)summary_number(s, "evaluated_this_run");
        if (summary_number(s, "wall_seconds") > wall) wall = summary_number(s, "wall_seconds");
        if (summary_number(s, "batch") > batch) batch = (int)summary_number(s, "batch");
    }
    cJSON *summary = g4_eval_summary_json(score, &t, evaluated, wall, batch);
    if (summary) cJSON_AddNumberToObject(summary, "merged_shards", n);
    return summary;
}

static int write_json_line(FILE *out, const cJSON *j) {
    char *line = cJSON_PrintUnformatted(j);
    int ok = line && fprintf(out, "%s\n", line) >= 0;
    free(line);
    return ok ? 0 : -1;
}

/* Writes the merged file, which must not exist yet; on failure nothing is left behind. */
static int write_merged(const char *path, const cJSON *header, const merged_record *m, int total, const cJSON *summary) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0)
        return g4_fail("%s: %s", path, errno == EEXIST ? "already exists (g4 eval merge writes a new file)" : strerror(errno));
    FILE *out = fdopen(fd, "w");
    int ok = out && write_json_line(out, header) == 0;
    for (int i = 0; ok && i < total; i++) ok = fwrite(m[i].line, 1, m[i].len, out) == m[i].len && fputc('\n', out) != EOF;
    ok = ok && write_json_line(out, summary) == 0;
    ok = out ? fclose(out) == 0 && ok : (close(fd), 0);
    if (!ok) {
        unlink(path);
        return g4_fail("%s: cannot write: %s", path, strerror(errno));
    }
    return 0;
}

int g4_eval_merge(const char *out_path, const char *const *in_paths, int n_in, g4_eval_score *score) {
    if (n_in < 1) return g4_fail("no results files to merge");
    shard_file *f = calloc((size_t)n_in, sizeof *f);
    if (!f) return g4_fail("out of memory");
    int rc = 0;
    for (int i = 0; i < n_in && rc == 0; i++) {
        f[i].path = in_paths[i];
        rc = read_shard(&f[i]);
    }
    for (int i = 1; i < n_in && rc == 0; i++) rc = same_run(&f[0], &f[i]);
    if (rc == 0) rc = check_split(f, n_in);
    int total = 0;
    merged_record *m = rc == 0 ? collect_records(f, n_in, &total) : NULL;
    cJSON *header = m ? run_header(f[0].r.header) : NULL, *summary = header ? merged_summary(f, n_in, m, total, score) : NULL;
    if (rc == 0 && m && !header) rc = g4_fail("out of memory");
    if (rc == 0) rc = summary ? write_merged(out_path, header, m, total, summary) : -1;
    cJSON_Delete(header);
    cJSON_Delete(summary);
    free(m);
    shard_files_free(f, n_in);
    return rc;
}
