/* Results-file reader (results.h). Every check fails with "<path>:<line>: ..." so that a
 * hand-edited or damaged file points straight at the offending line. */
#define _POSIX_C_SOURCE 200809L
#include "eval/results.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "util/file.h"

/* The largest index or token count accepted: keeps every integer exactly representable in
 * the double cJSON stores and in an int. */
#define MAX_COUNT 2000000000.0

static char *dup_or_null(const char *s) {
    return s ? strdup(s) : NULL;
}

/* ---- field readers: each returns 0, or -1 with the field named ---- */

static int field_string(const cJSON *rec, const char *name, int nullable, char **out, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, name);
    *out = NULL;
    if (nullable && cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v) || !v->valuestring)
        return g4_fail("%s: field \"%s\" is %s, expected a string%s", where, name, v ? "not a string" : "missing",
                       nullable ? " or null" : "");
    if (!(*out = strdup(v->valuestring))) return g4_fail("%s: out of memory", where);
    return 0;
}

static int field_count(const cJSON *rec, const char *name, int *out, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, name);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= MAX_COUNT) || v->valuedouble != floor(v->valuedouble))
        return g4_fail("%s: field \"%s\" is %s, expected a non-negative integer", where, name, v ? "not a valid count" : "missing");
    *out = (int)v->valuedouble;
    return 0;
}

static int field_bool(const cJSON *rec, const char *name, int *out, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, name);
    if (!cJSON_IsBool(v)) return g4_fail("%s: field \"%s\" is %s, expected true or false", where, name, v ? "not a boolean" : "missing");
    *out = cJSON_IsTrue(v);
    return 0;
}

static int field_seconds(const cJSON *rec, const char *name, double *out, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, name);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0))
        return g4_fail("%s: field \"%s\" is %s, expected a non-negative number", where, name, v ? "not a valid duration" : "missing");
    *out = v->valuedouble;
    return 0;
}

static void question_free(g4_result_question *q) {
    free(q->gold);
    free(q->output);
    free(q->answer);
    free(q->status);
    free(q->stop);
    memset(q, 0, sizeof *q);
}

static int parse_question(const cJSON *rec, const char *where, g4_result_question *q) {
    memset(q, 0, sizeof *q);
    if (field_count(rec, "index", &q->index, where) || field_string(rec, "gold", 0, &q->gold, where) ||
        field_string(rec, "output", 0, &q->output, where) || field_string(rec, "answer", 1, &q->answer, where) ||
        field_string(rec, "status", 0, &q->status, where) || field_string(rec, "stop", 0, &q->stop, where) ||
        field_bool(rec, "correct", &q->correct, where) || field_count(rec, "prompt_tokens", &q->prompt_tokens, where) ||
        field_count(rec, "generated_tokens", &q->generated_tokens, where) || field_seconds(rec, "seconds", &q->seconds, where)) {
        question_free(q);
        return -1;
    }
    return 0;
}

/* ---- the file, line by line ---- */

typedef struct {
    g4_results *r;
    int cap_q;
    int line;             /* 1-based number of the line being read */
    long start, end;      /* its byte range, newline excluded */
    int terminated;       /* it ends with '\n' */
    int last_kind;        /* kind of the last accepted record */
} reader;

enum { KIND_HEADER = 1, KIND_QUESTION, KIND_SUMMARY };

static int add_question(reader *rd, const cJSON *rec, const char *where) {
    g4_results *r = rd->r;
    if (r->n_q == rd->cap_q) {
        int cap = rd->cap_q ? 2 * rd->cap_q : 64;
        g4_result_question *q = realloc(r->q, sizeof *q * (size_t)cap);
        if (!q) return g4_fail("%s: out of memory", where);
        r->q = q;
        rd->cap_q = cap;
    }
    if (parse_question(rec, where, &r->q[r->n_q]) != 0) return -1;
    r->q[r->n_q].line = rd->line;
    r->n_q++;
    return 0;
}

/* Accepts one parsed record; `rec` stays owned by the caller unless kept (header/summary). */
static int take_record(reader *rd, cJSON **rec, const char *where) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(*rec, "type");
    g4_results *r = rd->r;
    if (!cJSON_IsString(type)) return g4_fail("%s: field \"type\" is %s, expected a string", where, type ? "not a string" : "missing");
    const char *t = type->valuestring;
    if (!strcmp(t, "header")) {
        if (rd->line != 1 || r->header) return g4_fail("%s: a header record may only be the first line", where);
        r->header = *rec;
        *rec = NULL;
        rd->last_kind = KIND_HEADER;
        return 0;
    }
    if (!r->header) return g4_fail("%s: the first line must be the header record (is this a g4 eval results file?)", where);
    if (!strcmp(t, "question")) {
        rd->last_kind = KIND_QUESTION;
        return add_question(rd, *rec, where);
    }
    if (!strcmp(t, "summary")) {
        cJSON_Delete(r->summary);
        r->summary = *rec;
        *rec = NULL;
        rd->last_kind = KIND_SUMMARY;
        return 0;
    }
    return g4_fail("%s: unknown record type \"%s\"", where, t);
}

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

/* Parses line [start, end) of text. Returns LINE_BLANK, LINE_RECORD, LINE_DROPPED (an
 * unterminated last line left out) or -1. */
enum { LINE_BLANK = 0, LINE_RECORD = 1, LINE_DROPPED = 2 };

static int read_line(reader *rd, const char *text, unsigned flags) {
    char where[1100];
    snprintf(where, sizeof where, "%.1024s:%d", rd->r->path, rd->line);
    const char *s = text + rd->start;
    size_t n = (size_t)(rd->end - rd->start);
    if (blank(s, n)) return LINE_BLANK;
    if (!rd->terminated && (flags & G4_RESULTS_DROP_UNTERMINATED)) return LINE_DROPPED;
    const char *parse_end = NULL;
    cJSON *rec = cJSON_ParseWithLengthOpts(s, n, &parse_end, 0);
    int bad_json = !rec || !cJSON_IsObject(rec) || !parse_end || !blank(parse_end, (size_t)(s + n - parse_end));
    int rc = bad_json ? g4_fail("%s: not a JSON object on one line", where) : take_record(rd, &rec, where);
    cJSON_Delete(rec);
    if (rc != 0 && !rd->terminated) {
        g4_clear_error(); /* an interrupted write, not damage */
        return LINE_DROPPED;
    }
    return rc != 0 ? -1 : LINE_RECORD;
}

static int find_duplicates(const g4_results *r) {
    for (int i = 0; i < r->n_q; i++)
        for (int j = 0; j < i; j++)
            if (r->q[i].index == r->q[j].index)
                return g4_fail("%s:%d: question %d appears twice (first on line %d)", r->path, r->q[i].line, r->q[i].index,
                               r->q[j].line);
    return 0;
}

/* append_offset: after the last complete line, except that a trailing summary (which the
 * resumed run replaces) and an unterminated last line are cut off. -1 when the file ends in a
 * valid record with no newline (only possible without G4_RESULTS_DROP_UNTERMINATED). */
static int read_lines(reader *rd, const char *text, size_t size, unsigned flags) {
    long append = 0, summary_start = -1;
    for (size_t pos = 0; pos < size; rd->line++) {
        const char *nl = memchr(text + pos, '\n', size - pos);
        rd->start = (long)pos;
        rd->end = nl ? (long)(nl - text) : (long)size;
        rd->terminated = nl != NULL;
        int rc = read_line(rd, text, flags);
        if (rc < 0) return -1;
        if (rc == LINE_DROPPED) rd->r->dropped_tail_line = rd->line;
        if (!rd->terminated) {
            if (rc == LINE_RECORD) append = -1;
            break;
        }
        pos = (size_t)(nl - text) + 1;
        if (rc == LINE_RECORD) summary_start = rd->last_kind == KIND_SUMMARY ? (summary_start >= 0 ? summary_start : rd->start) : -1;
        append = (long)pos;
    }
    rd->r->append_offset = summary_start >= 0 && append >= 0 ? summary_start : append;
    return 0;
}

int g4_results_read(const char *path, unsigned flags, g4_results *out) {
    memset(out, 0, sizeof *out);
    char *text = NULL;
    size_t size = 0;
    if (!(out->path = strdup(path))) return g4_fail("out of memory");
    if (g4_read_file_bounded(path, G4_RESULTS_FILE_MAX, G4_READ_REGULAR, &text, &size) != 0) {
        g4_results_free(out);
        return -1;
    }
    reader rd = {.r = out, .line = 1};
    int rc = read_lines(&rd, text, size, flags);
    free(text);
    if (rc == 0) rc = find_duplicates(out);
    if (rc != 0) {
        char *msg = dup_or_null(g4_last_error());
        g4_results_free(out);
        g4_fail("%s", msg ? msg : "out of memory");
        free(msg);
    }
    return rc;
}

void g4_results_free(g4_results *r) {
    for (int i = 0; i < r->n_q; i++) question_free(&r->q[i]);
    free(r->q);
    cJSON_Delete(r->header);
    cJSON_Delete(r->summary);
    free(r->path);
    memset(r, 0, sizeof *r);
}

const g4_result_question *g4_results_find(const g4_results *r, int index) {
    for (int i = 0; i < r->n_q; i++)
        if (r->q[i].index == index) return &r->q[i];
    return NULL;
}
