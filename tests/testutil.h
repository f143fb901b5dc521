/* Helpers shared by the tests: fixture paths, golden tensors, tensor comparison, running the
 * model with every intermediate tensor captured. */
#ifndef G4_TEST_UTIL_H
#define G4_TEST_UTIL_H

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "format/safetensors.h"
#include "g4.h"
#include "kernels/kernels.h"
#include "model/capture.h"
#include "util/err.h"
#include "util/file.h"

/* `make dispatch-test` runs the model-level tests again under each kernel level, named by
 * G4_DISPATCH. Returns 1 when the program is to run its checks: G4_DISPATCH is unset, or it names
 * a level this build and CPU have and the sessions get that level (checked). Returns 0 after a
 * SKIP_FEATURE line when the CPU lacks the level, having checked that the dispatcher falls back to
 * the best level instead: the model-level checks would only repeat that level's run. */
static inline int check_dispatch_level(void) {
    const char *want = getenv("G4_DISPATCH");
    if (!want || !*want) return 1;
    const g4_kernels *got = g4_kernels_get();
    if (g4_kernels_level(want)) {
        CHECK(strcmp(got->name, want) == 0, "G4_DISPATCH=%s gave the %s level", want, got->name);
        printf("ok kernels: the sessions run level %s, as G4_DISPATCH asks\n", got->name);
        return 1;
    }
    CHECK(got == g4_kernels_best(), "G4_DISPATCH=%s (not on this CPU) gave %s, not the best level %s", want, got->name,
          g4_kernels_best()->name);
    SKIP_FEATURE("G4_DISPATCH=%s: this build or CPU lacks the level (it falls back to %s); the model-level checks are skipped", want,
                 got->name);
    return 0;
}

/* G4_TEST_PARTS="a,b" runs only those named parts of a program that names its parts (each part a
 * whole check of its own, as `make test` runs it): the mutation test's `part:` (tests/mutations.txt)
 * runs a slow killer's part that kills the mutant before, if need be, the whole program. Unset: all. */
static inline int in_list(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || !p[n])) return 1;
    return 0;
}

static inline int test_part(const char *name) {
    const char *want = getenv("G4_TEST_PARTS");
    return !want || !*want || in_list(want, name);
}

/* 1 when G4_TEST_PARTS names only parts of `known` (comma-separated); else a failed check, so a
 * misspelt part cannot pass for a run that checked nothing. */
static inline int test_parts_known(const char *known) {
    const char *want = getenv("G4_TEST_PARTS");
    if (!want || !*want) return 1;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", want);
    int ok = 1;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) ok = ok && in_list(known, t);
    CHECK(ok && strlen(want) < sizeof buf, "G4_TEST_PARTS=%s: parts of this program are %s", want, known);
    return ok;
}

static inline const char *tiny_dir(void) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/fixtures/tiny-mobile", check_shared_dir());
    return buf;
}

static inline cJSON *read_json(const char *path) {
    char *text;
    if (g4_read_file(path, &text, NULL) != 0) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) {
        fprintf(stderr, "%s: not JSON\n", path);
        exit(2);
    }
    return j;
}

/* Integer list field of a JSON object into a malloc'd int32 array. */
static inline int32_t *json_ids(const cJSON *arr, int *n) {
    *n = cJSON_GetArraySize(arr);
    int32_t *ids = malloc(sizeof *ids * (size_t)(*n ? *n : 1));
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valuedouble;
    return ids;
}

/* Golden float tensor `name`, as f32 (rows are contiguous). Exits if missing. */
static inline const float *golden_f32(const g4_safetensors *st, const char *name, int64_t *numel) {
    const g4_tensor *t = g4_st_find(st, name);
    if (!t || t->dtype != G4_DT_F32 || ((uintptr_t)t->data & 3)) {
        fprintf(stderr, "golden tensor %s missing or not aligned F32\n", name);
        exit(2);
    }
    if (numel) *numel = t->numel;
    return (const float *)(const void *)t->data;
}

/* ---- goldens of the towers' tests (test_vision, test_audio, test_bf16_towers, test_synth_towers) ---- */

/* Opens the safetensors file at path (goldens, or a checkpoint a test wrote); a failed check naming
 * it when it cannot. 0 or -1. */
static inline int golden_open(g4_safetensors *st, const char *path) {
    int rc = g4_st_open_file(st, path);
    CHECK(rc == 0, "%s", g4_last_error());
    return rc;
}

/* The golden tensor named like printf(fmt, ...) ("img%d.%s"), or NULL after a failed check. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline const g4_tensor *golden_find(const g4_safetensors *st, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const g4_tensor *t = g4_st_find(st, name);
    CHECK(t != NULL, "golden tensor %s missing", name);
    return t;
}

/* Float tensor t's values copied out of the map (malloc'd; any alignment). */
static inline float *golden_copy_f32(const g4_tensor *t) {
    float *v = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *v);
    for (int64_t i = 0; v && i < t->numel; i++) v[i] = g4_load_f32(t->data + 4 * i);
    return v;
}

/* Max |a - b| over n values, relative to the largest |b| (a NaN propagates as a failure). */
static inline double rel_diff(const float *a, const float *b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md)) md = d;
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return mb > 0 ? md / mb : md;
}

/* A tower's n_rows soft tokens e (rows of D floats) against golden float tensor g of as many rows:
 * within band of it, relative to its largest value (rel_diff). Prints what it measured under
 * `what` and checks the band; returns the difference. */
static inline double golden_band(const char *what, const float *e, int n_rows, int D, const g4_tensor *g, double band) {
    double r = rel_diff(e, (const float *)(const void *)g->data, (size_t)n_rows * D);
    printf("ok %s: %d soft tokens, max |g4 - transformers| / max |transformers| = %.3g (band %.3g)\n", what, n_rows, r, band);
    CHECK(r <= band, "%s: relative difference %.3g over the band %.3g", what, r, band);
    return r;
}

/* Writes a whole file; a test that cannot write its own temp files exits (status 2). */
/* One line of tests/structured/validate.py's input: {"schema": SCHEMA, "text": TEXT}, the text a
 * reply that must be a JSON instance of the schema. */
static inline void json_line(FILE *f, const char *schema, const char *text) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "schema", cJSON_Parse(schema));
    cJSON_AddStringToObject(o, "text", text);
    char *line = cJSON_PrintUnformatted(o);
    fprintf(f, "%s\n", line);
    free(line);
    cJSON_Delete(o);
}

static inline void write_file_or_exit(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
}

/* The tiny-mobile fixture's model.safetensors and config.json in memory, for tests that write
 * patched copies of it into their own temp dir (caller frees). Exits (status 2) when unreadable. */
static inline void read_tiny_fixture(unsigned char **st, size_t *st_len, char **config) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", tiny_dir());
    if (g4_read_file(path, (char **)st, st_len) != 0) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
    snprintf(path, sizeof path, "%s/config.json", tiny_dir());
    if (g4_read_file(path, config, NULL) != 0) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
}

/* A whole file as a string; an empty string when it cannot be read (the caller's check fails). */
static inline char *slurp(const char *path) {
    char *s;
    if (g4_read_file(path, &s, NULL) != 0) return calloc(1, 1);
    return s;
}

static inline double max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN propagates as a failure */
    }
    return m;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* 99th percentile of |a - b| (numpy's linear interpolation). */
static inline double p99_abs_diff(const float *a, const float *b, int64_t n) {
    double *d = malloc(sizeof *d * (size_t)n);
    for (int64_t i = 0; i < n; i++) d[i] = fabs((double)a[i] - b[i]);
    qsort(d, (size_t)n, sizeof *d, cmp_double);
    double pos = 0.99 * (double)(n - 1);
    int64_t lo = (int64_t)pos;
    double r = lo + 1 < n ? d[lo] + (d[lo + 1] - d[lo]) * (pos - (double)lo) : d[lo];
    free(d);
    return r;
}

#endif
