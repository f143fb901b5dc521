#define _POSIX_C_SOURCE 200809L
#include "safetensors_write.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

void g4_stw_init(g4_stw *w) { memset(w, 0, sizeof *w); }

void g4_stw_free(g4_stw *w) {
    for (int i = 0; i < w->n; i++) free(w->t[i].name);
    free(w->t);
    memset(w, 0, sizeof *w);
}

int g4_stw_add(g4_stw *w, const char *name, g4_dtype dtype, int ndim, const int64_t *shape) {
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        g4_stw_tensor *t = realloc(w->t, sizeof *t * (size_t)cap);
        if (!t) return g4_fail("%s: out of memory", name ? name : "safetensors writer");
        w->t = t;
        w->cap = cap;
    }
    g4_stw_tensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name ? name : ""))) return g4_fail("%s: out of memory", name ? name : "safetensors writer");
    t->dtype = dtype;
    /* out-of-range values are kept as given and refused by g4_stw_write, which knows the path */
    t->ndim = ndim;
    for (int i = 0; i < ndim && i < G4_MAX_DIMS; i++) t->shape[i] = shape[i];
    w->n++;
    return 0;
}

/* Data order: larger elements first keeps every tensor aligned to its element size; names
 * break ties so the layout does not depend on insertion order. */
static int cmp_layout(const void *a, const void *b) {
    const g4_stw_tensor *x = *(const g4_stw_tensor *const *)a, *y = *(const g4_stw_tensor *const *)b;
    size_t sx = g4_dtype_size(x->dtype), sy = g4_dtype_size(y->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const g4_stw_tensor *const *)a)->name, (*(const g4_stw_tensor *const *)b)->name);
}

/* Checks one declaration; sets nbytes. */
static int check_tensor(g4_stw_tensor *t, const char *path) {
    if (!t->name[0]) return g4_fail("%s: a tensor has an empty name", path);
    if (strcmp(t->name, "__metadata__") == 0) return g4_fail("%s: \"__metadata__\" is reserved, not a tensor name", path);
    if ((int)t->dtype < 0 || (int)t->dtype >= (int)G4_DT_COUNT)
        return g4_fail("%s: tensor %s: unknown dtype %d", path, t->name, (int)t->dtype);
    if (t->ndim < 0 || t->ndim > G4_MAX_DIMS)
        return g4_fail("%s: tensor %s: %d dimensions (0 to %d allowed)", path, t->name, t->ndim, G4_MAX_DIMS);
    /* the reader caps dimensions at 2^40 and element counts at 2^50; stay inside that */
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        int64_t d = t->shape[i];
        if (d < 0 || d > ((int64_t)1 << 40)) return g4_fail("%s: tensor %s: invalid dimension %lld", path, t->name, (long long)d);
        if (d && numel > (1ull << 50) / (uint64_t)d) return g4_fail("%s: tensor %s: shape too large", path, t->name);
        numel *= (uint64_t)d;
    }
    t->nbytes = numel * g4_dtype_size(t->dtype);
    return 0;
}

/* Header JSON for the tensors in `order`, offsets assigned; NUL-terminated, malloc'd. */
static char *build_header(const g4_stw *w, g4_stw_tensor *const *order, uint64_t *data_size, const char *path) {
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_CreateObject();
    int ok = root && meta && cJSON_AddItemToObject(root, "__metadata__", meta);
    if (!ok) cJSON_Delete(meta);
    ok = ok && cJSON_AddStringToObject(meta, "format", "pt");
    uint64_t off = 0;
    for (int k = 0; k < w->n && ok; k++) {
        g4_stw_tensor *t = order[k];
        t->offset = off;
        off += t->nbytes;
        cJSON *e = cJSON_CreateObject(), *shape = cJSON_CreateArray(), *offs = cJSON_CreateArray();
        ok = e && shape && offs && cJSON_AddStringToObject(e, "dtype", g4_dtype_name(t->dtype)) &&
             cJSON_AddItemToObject(e, "shape", shape);
        if (!ok) {
            cJSON_Delete(shape);
            cJSON_Delete(offs);
            cJSON_Delete(e);
            break;
        }
        ok = cJSON_AddItemToObject(e, "data_offsets", offs);
        if (!ok) {
            cJSON_Delete(offs);
            cJSON_Delete(e);
            break;
        }
        for (int i = 0; i < t->ndim && ok; i++) ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[i]));
        /* doubles print integers exactly below 2^53; offsets here are far below that */
        ok = ok && cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)t->offset)) &&
             cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(t->offset + t->nbytes)));
        if (!cJSON_AddItemToObject(root, t->name, e)) {
            cJSON_Delete(e);
            ok = 0;
        }
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) g4_fail("%s: out of memory building the header", path);
    *data_size = off;
    return text;
}

static int put(FILE *f, const void *p, size_t n, const char *path) {
    if (n && fwrite(p, 1, n, f) != n) return g4_fail("%s: write failed: %s", path, strerror(errno));
    return 0;
}

/* Header length, header (space padded), then each tensor's chunks from the callback. */
static int write_body(const g4_stw *w, g4_stw_tensor *const *order, FILE *f, const char *path, g4_stw_fill_fn fill, void *user,
                      uint64_t *total) {
    uint64_t data_size;
    char *header = build_header(w, order, &data_size, path);
    if (!header) return -1;
    size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int rc = put(f, len8, 8, path);
    if (rc == 0) rc = put(f, header, hlen, path);
    if (rc == 0) rc = put(f, "        ", padded - hlen, path);
    free(header);
    uint8_t *buf = rc == 0 ? malloc(G4_STW_CHUNK) : NULL;
    if (rc == 0 && !buf) rc = g4_fail("%s: out of memory", path);
    for (int k = 0; k < w->n && rc == 0; k++) {
        const g4_stw_tensor *t = order[k];
        for (uint64_t off = 0; off < t->nbytes && rc == 0; off += G4_STW_CHUNK) {
            size_t n = t->nbytes - off < G4_STW_CHUNK ? (size_t)(t->nbytes - off) : G4_STW_CHUNK;
            if (fill(user, (int)(t - w->t), t, off, buf, n) != 0) rc = g4_fail_prefix("%s: tensor %s: ", path, t->name);
            else rc = put(f, buf, n, path);
        }
    }
    free(buf);
    *total = 8 + padded + data_size;
    return rc;
}

int g4_stw_write(g4_stw *w, const char *path, g4_stw_fill_fn fill, void *user, uint64_t *bytes_written) {
    if (!path || !*path) return g4_fail("safetensors writer: empty output path");
    for (int i = 0; i < w->n; i++)
        if (check_tensor(&w->t[i], path) != 0) return -1;
    g4_stw_tensor **order = malloc(sizeof *order * (size_t)(w->n ? w->n : 1));
    if (!order) return g4_fail("%s: out of memory", path);
    for (int i = 0; i < w->n; i++) order[i] = &w->t[i];
    qsort(order, (size_t)w->n, sizeof *order, cmp_name);
    for (int k = 1; k < w->n; k++)
        if (strcmp(order[k - 1]->name, order[k]->name) == 0) {
            g4_fail("%s: tensor %s declared twice", path, order[k]->name);
            free(order);
            return -1;
        }
    qsort(order, (size_t)w->n, sizeof *order, cmp_layout);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + sizeof ".partial");
    if (!tmp) {
        free(order);
        return g4_fail("%s: out of memory", path);
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".partial", sizeof ".partial");
    FILE *f = fopen(tmp, "wb");
    int rc;
    uint64_t total = 0;
    if (!f) {
        rc = g4_fail("%s: cannot create: %s", path, strerror(errno));
    } else {
        rc = write_body(w, order, f, path, fill, user, &total);
        if (fclose(f) != 0 && rc == 0) rc = g4_fail("%s: write failed: %s", path, strerror(errno));
        if (rc == 0 && rename(tmp, path) != 0) rc = g4_fail("%s: cannot create: %s", path, strerror(errno));
        if (rc != 0) remove(tmp);
    }
    free(tmp);
    free(order);
    if (rc == 0 && bytes_written) *bytes_written = total;
    return rc;
}
