/* Level selection and the portable level. Every level runs its matmuls through the thread pool;
 * the portable one computes each output with the reference dot products, so it equals
 * g4_ref_matmul_* exactly whatever the thread count. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "levels.h"
#include "pool.h"
#include "quant/int8.h"

typedef struct {
    const g4_qweight *w;
    const void *x;
    int n;
    void *y;
} portable_job;

static void portable_f32_rows(void *ctx, int o0, int o1) {
    const portable_job *j = ctx;
    const g4_qweight *w = j->w;
    const float *x = j->x;
    float *y = j->y;
    for (int o = o0; o < o1; o++) {
        const uint8_t *row = w->w + (size_t)o * w->row_bytes;
        for (int t = 0; t < j->n; t++) {
            const float *xt = x + (size_t)t * w->in;
            float *yt = y + (size_t)t * w->out;
            if (w->bits == 16) yt[o] = g4_ref_dot_bf16_f32(xt, row, w->in);
            else yt[o] = w->w_scale[o] * g4_ref_dot_codes_f32(xt, row, w->bits, w->in);
        }
    }
}

static void portable_i8_rows(void *ctx, int o0, int o1) {
    const portable_job *j = ctx;
    const g4_qweight *w = j->w;
    const int8_t *x = j->x;
    int32_t *acc = j->y;
    for (int o = o0; o < o1; o++) {
        const uint8_t *row = w->w + (size_t)o * w->row_bytes;
        for (int t = 0; t < j->n; t++)
            acc[(size_t)t * w->out + o] = g4_dot_packed(x + (size_t)t * w->in, 0, row, w->bits, (size_t)w->in);
    }
}

static double macs(const g4_qweight *w, int n) { return (double)w->out * w->in * n; }

static void portable_matmul_f32(const g4_qweight *w, const float *x, int n, float *y) {
    portable_job j = {w, x, n, y};
    g4_pool_for(w->out, 1, macs(w, n), portable_f32_rows, &j);
}

static void portable_matmul_i8(const g4_qweight *w, const int8_t *x, int n, int32_t *acc) {
    portable_job j = {w, x, n, acc};
    g4_pool_for(w->out, 1, macs(w, n), portable_i8_rows, &j);
}

const g4_kernels g4_kernels_portable = {
    .name = "portable",
    .matmul_f32 = portable_matmul_f32,
    .matmul_i8 = portable_matmul_i8,
};

const g4_kernels *g4_kernels_level(const char *name) {
    if (!name) return NULL;
    if (strcmp(name, "portable") == 0) return &g4_kernels_portable;
    if (strcmp(name, "avx2") == 0) return g4_avx2_supported() ? &g4_kernels_avx2 : NULL;
    if (strcmp(name, "neon") == 0) return g4_neon_supported() ? &g4_kernels_neon : NULL;
    return NULL;
}

static const g4_kernels *best_level(void) {
    if (g4_avx2_supported()) return &g4_kernels_avx2;
    if (g4_neon_supported()) return &g4_kernels_neon;
    return &g4_kernels_portable;
}

const g4_kernels *g4_kernels_get(void) {
    const char *force = getenv("G4_DISPATCH");
    const g4_kernels *best = best_level();
    if (!force || !*force) return best;
    const g4_kernels *k = g4_kernels_level(force);
    if (k) return k;
    /* Sessions call this once each; one warning per process is enough. */
    static atomic_int warned;
    if (!atomic_exchange(&warned, 1)) {
        int known = !strcmp(force, "avx2") || !strcmp(force, "neon");
        fprintf(stderr, "g4: G4_DISPATCH=%s %s; using %s\n", force,
                known ? "is not supported on this CPU" : "is unknown (portable|avx2|neon)", best->name);
    }
    return best;
}
