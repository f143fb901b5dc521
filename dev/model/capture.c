#include "capture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "util/npy.h"

static g4_captured *find_or_add(g4_capture *c, const char *name, int row_ndim, const int *row_shape) {
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->t[i].name, name) == 0) return &c->t[i];
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 32;
        g4_captured *t = realloc(c->t, sizeof *t * (size_t)cap);
        if (!t) return NULL;
        c->t = t;
        c->cap = cap;
    }
    g4_captured *t = &c->t[c->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->row_ndim = row_ndim;
    t->width = 1;
    for (int i = 0; i < row_ndim && i < 2; i++) {
        t->row_shape[i] = row_shape[i];
        t->width *= row_shape[i];
    }
    t->pos0 = -1;
    return t;
}

void g4_capture_trace(void *user, const char *name, int pos0, int n, int row_ndim, const int *row_shape,
                      const float *data) {
    g4_capture *c = user;
    g4_captured *t = find_or_add(c, name, row_ndim, row_shape);
    if (!t) {
        c->failed = 1;
        return;
    }
    if (t->pos0 < 0) t->pos0 = pos0;
    if (t->rows + n > t->cap) {
        int cap = t->cap ? t->cap : 16;
        while (cap < t->rows + n) cap *= 2;
        float *d = realloc(t->data, sizeof *d * (size_t)cap * t->width);
        if (!d) {
            c->failed = 1;
            return;
        }
        t->data = d;
        t->cap = cap;
    }
    memcpy(t->data + (size_t)t->rows * t->width, data, sizeof *data * (size_t)n * t->width);
    t->rows += n;
}

const g4_captured *g4_capture_get(const g4_capture *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->t[i].name, name) == 0) return &c->t[i];
    return NULL;
}

static int write_one(const char *dir, const char *name, const float *data, int ndim, const int64_t *shape) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s.npy", dir, name) >= (int)sizeof path) return g4_fail("%s: path too long", dir);
    return g4_npy_write_f32(path, data, ndim, shape);
}

/* hidden_after_layer0..N-1 as one [N, rows, width] array. */
static int write_stacked_hidden(const g4_capture *c, const char *dir) {
    int layers = 0;
    char name[64];
    for (;; layers++) {
        snprintf(name, sizeof name, "hidden_after_layer%d", layers);
        if (!g4_capture_get(c, name)) break;
    }
    if (!layers) return 0;
    const g4_captured *first = g4_capture_get(c, "hidden_after_layer0");
    size_t per = (size_t)first->rows * first->width;
    float *all = malloc(sizeof *all * per * (size_t)layers);
    if (!all) return g4_fail("out of memory writing hidden_after_layer");
    for (int l = 0; l < layers; l++) {
        snprintf(name, sizeof name, "hidden_after_layer%d", l);
        memcpy(all + per * (size_t)l, g4_capture_get(c, name)->data, sizeof *all * per);
    }
    int64_t shape[3] = {layers, first->rows, first->width};
    int rc = write_one(dir, "hidden_after_layer", all, 3, shape);
    free(all);
    return rc;
}

int g4_capture_write_npy(const g4_capture *c, const char *dir) {
    if (c->failed) return g4_fail("out of memory while capturing tensors for %s", dir);
    for (int i = 0; i < c->n; i++) {
        const g4_captured *t = &c->t[i];
        if (strncmp(t->name, "hidden_after_layer", 18) == 0) continue;
        int64_t shape[3] = {t->rows, t->row_shape[0], t->row_shape[1]};
        const char *name = strcmp(t->name, "logits") == 0 ? "prefill_logits" : t->name;
        if (write_one(dir, name, t->data, 1 + t->row_ndim, shape) != 0) return -1;
    }
    return write_stacked_hidden(c, dir);
}

void g4_capture_free(g4_capture *c) {
    for (int i = 0; i < c->n; i++) free(c->t[i].data);
    free(c->t);
    memset(c, 0, sizeof *c);
}
