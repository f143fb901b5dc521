/* The portable level: the references, each output computed by the reference dot products but
 * the rows split over the thread pool, so it equals g4_ref_matmul_* exactly whatever the thread
 * count. It runs on every CPU, and is the level every other one is tested against. */
#include <stdlib.h>

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

static void portable_bf16_rows(void *ctx, int o0, int o1) {
    const portable_job *j = ctx;
    const g4_qweight *w = j->w;
    const float *x = j->x;
    float *y = j->y;
    for (int o = o0; o < o1; o++) {
        const uint8_t *row = w->w + (size_t)o * w->row_bytes;
        for (int t = 0; t < j->n; t++) y[(size_t)t * w->out + o] = g4_ref_dot_bf16_f32(x + (size_t)t * w->in, row, w->in);
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

static void portable_blocks_rows(void *ctx, int o0, int o1) {
    const portable_job *j = ctx;
    g4_ref_matmul_blocks_rows(j->w, j->x, j->n, j->y, o0, o1);
}

static double macs(const g4_qweight *w, int n) { return (double)w->out * w->in * n; }

void g4_portable_matmul_blocks_f32(const g4_qweight *w, const float *x, int n, float *y) {
    portable_job j = {w, x, n, y};
    g4_pool_for(w->out, 1, macs(w, n), portable_blocks_rows, &j);
}

void g4_portable_matmul_f32(const g4_qweight *w, const float *x, int n, float *y) {
    if (w->block > 0 && w->bits != G4_WT_BF16) {
        g4_portable_matmul_blocks_f32(w, x, n, y);
        return;
    }
    if (w->bits != G4_WT_BF16) {
        g4_matmul_codes_f32(w, x, n, y, g4_portable_matmul_i8);
        return;
    }
    portable_job j = {w, x, n, y};
    g4_pool_for(w->out, 1, macs(w, n), portable_bf16_rows, &j);
}

void g4_portable_matmul_i8(const g4_qweight *w, const int8_t *x, int n, int32_t *acc) {
    portable_job j = {w, x, n, acc};
    g4_pool_for(w->out, 1, macs(w, n), portable_i8_rows, &j);
}

/* ---- elementwise and attention: the references, split over the pool where that helps ---- */

typedef struct {
    float *g;
    const float *m; /* gelu_mul: the multiplier */
    float cap;      /* softcap */
    void (*span)(float *x, size_t n, float cap);
} elem_job;

/* Pool cost of one tanhf and of one expf, in multiply-adds (about 10-15 ns and 4 ns). */
#define TANH_WORK 40.0
#define EXP_WORK 10.0

static void gelu_items(void *ctx, int b, int e) {
    const elem_job *j = ctx;
    g4_ref_gelu_mul(j->g + b, j->m + b, (size_t)(e - b));
}

static void softcap_items(void *ctx, int b, int e) {
    const elem_job *j = ctx;
    j->span(j->g + b, (size_t)(e - b), j->cap);
}

/* Runs fn over [0, n) on the pool in int-sized pieces. */
static void pool_elementwise(size_t n, double work_per_item, g4_pool_fn fn, elem_job *j) {
    const size_t piece = (size_t)1 << 30;
    for (size_t at = 0; at < n; at += piece) {
        size_t len = n - at < piece ? n - at : piece;
        elem_job sub = {j->g + at, j->m ? j->m + at : NULL, j->cap, j->span};
        g4_pool_for((int)len, 64, (double)len * work_per_item, fn, &sub);
    }
}

void g4_portable_gelu_mul(float *g, const float *m, size_t n, float scale) {
    (void)scale;
    elem_job j = {g, m, 0, NULL};
    pool_elementwise(n, TANH_WORK, gelu_items, &j);
}

void g4_softcap_pooled(float *x, size_t n, float cap, void (*span)(float *x, size_t n, float cap), double work_per_item) {
    elem_job j = {x, NULL, cap, span};
    pool_elementwise(n, work_per_item, softcap_items, &j);
}

void g4_portable_softcap(float *x, size_t n, float cap) { g4_softcap_pooled(x, n, cap, g4_ref_softcap, TANH_WORK); }

static void attention_items(void *ctx, int b, int e) {
    const g4_attn *a = ctx;
    int most = 1;
    for (int i = b; i < e; i++) {
        const g4_attn_row *r = &a->rows[i / a->n_heads];
        if (r->hi - r->lo + 1 > most) most = r->hi - r->lo + 1;
    }
    float *scores = malloc(sizeof *scores * (size_t)most); /* NULL: the head recomputes */
    for (int i = b; i < e; i++) g4_ref_attention_head(a, i / a->n_heads, i % a->n_heads, scores);
    free(scores);
}

double g4_attention_work(const g4_attn *a) {
    double positions = 0;
    for (int t = 0; t < a->n; t++) positions += a->rows[t].hi - a->rows[t].lo + 1;
    return positions * a->n_heads * (2.0 * a->head_dim + EXP_WORK);
}

void g4_portable_attention(const g4_attn *a) {
    if (a->n <= 0 || a->n_heads <= 0) return;
    g4_pool_for(a->n * a->n_heads, 1, g4_attention_work(a), attention_items, (void *)a);
}

const g4_kernels g4_kernels_portable = {
    .name = "portable",
    .cpu_needs = "",
    .built = 1,
    .matmul_f32 = g4_portable_matmul_f32,
    .matmul_i8 = g4_portable_matmul_i8,
    .quantize = g4_ref_quantize,
    .fake_quant = g4_ref_fake_quant,
    .requant_f32 = g4_ref_requant_f32,
    .acc_scale = g4_ref_acc_scale,
    .gelu_mul = g4_portable_gelu_mul,
    .attention = g4_portable_attention,
    .softcap = g4_portable_softcap,
};
