/* Helpers both multimodal towers use (model/tower.h). */
#include "model/tower.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/err.h"

static pthread_mutex_t tower_lock = PTHREAD_MUTEX_INITIALIZER;

void *g4_tower_get(g4_model *m, void **slot, void (**free_slot)(void *), void *(*load)(g4_model *), void (*free_fn)(void *)) {
    pthread_mutex_lock(&tower_lock);
    if (!*slot) {
        int before = m->n_linears;
        *slot = load(m);
        if (*slot) *free_slot = free_fn;
        else m->n_linears = before;
    }
    void *t = *slot;
    pthread_mutex_unlock(&tower_lock);
    return t;
}

void *g4_tower_alloc(g4_tower_mem *mem, size_t bytes) {
    void **p = realloc(mem->p, sizeof *p * (size_t)(mem->n + 1));
    if (!p) return NULL;
    mem->p = p;
    void *b = calloc(1, bytes ? bytes : 1);
    if (b) mem->p[mem->n++] = b;
    return b;
}

void g4_tower_mem_free(g4_tower_mem *mem) {
    for (int i = 0; i < mem->n; i++) free(mem->p[i]);
    free(mem->p);
    mem->p = NULL;
    mem->n = 0;
}

float *g4_tower_floats(g4_model *m, g4_tower_mem *mem, const char *tower, const char *name, int ndim, const int64_t *shape) {
    const g4_tensor *t = g4_st_find(&m->st, name);
    if (!t) {
        g4_fail("%s: tensor %s missing from the checkpoint (%s)", m->dir, name, tower);
        return NULL;
    }
    int ok = t->dtype == G4_DT_BF16 || t->dtype == G4_DT_F32 || t->dtype == G4_DT_F16;
    int64_t numel = 1;
    if (ndim == 0) {
        ok = ok && (t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1));
    } else {
        ok = ok && t->ndim == ndim;
        for (int d = 0; d < ndim; d++) {
            ok = ok && t->shape[d] == shape[d];
            numel *= shape[d];
        }
    }
    if (!ok) {
        char want[96] = "a float scalar", got[96];
        if (ndim) {
            int at = snprintf(want, sizeof want, "a float tensor [");
            for (int d = 0; d < ndim; d++) at += snprintf(want + at, sizeof want - (size_t)at, d ? ", %lld" : "%lld", (long long)shape[d]);
            snprintf(want + at, sizeof want - (size_t)at, "]");
        }
        g4_fail("%s: tensor %s: expected %s, found %s %s", g4_st_path(&m->st, t), name, want, g4_dtype_name(t->dtype),
                g4_shape_str(t, got, sizeof got));
        return NULL;
    }
    float *v = g4_tower_alloc(mem, sizeof *v * (size_t)numel);
    if (!v) {
        g4_fail("%s: out of memory", name);
        return NULL;
    }
    for (int64_t i = 0; i < numel; i++) v[i] = g4_tensor_float(t, i);
    return v;
}

float *g4_tower_vec(g4_model *m, g4_tower_mem *mem, const char *tower, const char *name, int n) {
    int64_t shape[1] = {n};
    return g4_tower_floats(m, mem, tower, name, 1, shape);
}

static int load_clamp(g4_model *m, g4_tower_mem *mem, const char *tower, const char *module, const char *leaf, float *out) {
    char name[256];
    snprintf(name, sizeof name, "%s.%s", module, leaf);
    if (!g4_st_find(&m->st, name)) return g4_fail("%s: tensor %s missing from the checkpoint (use_clipped_linears is true)", m->dir, name);
    float *v = g4_tower_floats(m, mem, tower, name, 0, NULL);
    if (!v) return -1;
    if (isnan(*v)) return g4_fail("%s: tensor %s is NaN", m->dir, name);
    *out = *v;
    return 0;
}

int g4_tower_bind_clippable(g4_model *m, g4_tower_mem *mem, const char *tower, g4_clip_linear *L, const char *module, int in, int out,
                            int clipped) {
    char lin[224];
    snprintf(lin, sizeof lin, "%s.linear", module);
    if (g4_model_bind_linear(m, &L->lin, lin, in, out) != 0) return -1;
    L->in_min = L->out_min = -INFINITY;
    L->in_max = L->out_max = INFINITY;
    if (!clipped) return 0;
    if (load_clamp(m, mem, tower, module, "input_min", &L->in_min) || load_clamp(m, mem, tower, module, "input_max", &L->in_max) ||
        load_clamp(m, mem, tower, module, "output_min", &L->out_min) || load_clamp(m, mem, tower, module, "output_max", &L->out_max))
        return -1;
    return 0;
}

int g4_tower_bind_float(g4_model *m, g4_linear *L, const char *module, int in, int out) {
    if (g4_model_bind_linear(m, L, module, in, out)) return -1;
    if (L->w.bits != G4_WT_BF16) return g4_fail("%s: %s is quantized; g4 expects it float (modules_to_not_convert)", m->dir, module);
    return 0;
}

void g4_tower_count_macs(const g4_session *s, const g4_linear *L, double *int_macs, double *float_macs) {
    double macs = (double)L->w.in * L->w.out;
    *int_macs += macs * (double)s->rows_int[L->id];
    *float_macs += macs * (double)s->rows_float[L->id];
}

void g4_tower_clamp(float *x, size_t n, float lo, float hi) {
    if (lo == -INFINITY && hi == INFINITY) return;
    for (size_t i = 0; i < n; i++) x[i] = x[i] < lo ? lo : x[i] > hi ? hi : x[i];
}

void g4_tower_linear_rows(g4_session *s, const g4_linear *L, const float *x, int n, float *y) {
    size_t wide = (size_t)(L->w.in > L->w.out ? L->w.in : L->w.out), rows = s->acc_len / wide;
    int step = rows > CHUNK ? CHUNK : (int)rows;
    for (int r = 0; r < n; r += step) {
        int c = n - r < step ? n - r : step;
        g4_forward_linear(s, L, x + (size_t)r * L->w.in, c, y + (size_t)r * L->w.out);
    }
}

void g4_tower_clip_linear(g4_session *s, const g4_clip_linear *L, float *x, int n, float *y) {
    g4_tower_clamp(x, (size_t)n * L->lin.w.in, L->in_min, L->in_max);
    g4_tower_linear_rows(s, &L->lin, x, n, y);
    g4_tower_clamp(y, (size_t)n * L->lin.w.out, L->out_min, L->out_max);
}
