/* The decoder layer (layer.h), read top to bottom: the elementwise steps, RoPE, the KV cache and
 * attention, then the layer itself. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "layer.h"
#include "linear.h"
#include "quant/int8.h"
#include "rows.h"
#include "session.h"

/* ---- elementwise operations (all fp32, no quantization) ---- */

G4_VECTORIZE static void rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    /* squares are exact in double; four running sums (i mod 4) keep the adds independent */
    double s4[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int l = 0; l < 4; l++) s4[l] += (double)x[i + l] * x[i + l];
    for (; i < n; i++) s4[i & 3] += (double)x[i] * x[i];
    double ss = (s4[0] + s4[1]) + (s4[2] + s4[3]);
    float r = 1.0f / sqrtf((float)(ss / n) + eps);
    /* two plain loops (not a test per element), vectorized */
    if (w)
        for (i = 0; i < n; i++) y[i] = x[i] * r * w[i];
    else
        for (i = 0; i < n; i++) y[i] = x[i] * r;
}

static void rmsnorm_run(const rows_job *j, int t0, int t1) {
    for (int r = t0; r < t1; r++) rmsnorm(j->y + (size_t)r * j->width, j->x + (size_t)r * j->width, j->w, j->width, j->f);
}

/* Rotate-half RoPE on one head vector: dim j pairs with j + hd/2. */
static void rope_apply(float *x, const float *cs, const float *sn, int hd) {
    int h = hd / 2;
    for (int j = 0; j < h; j++) {
        float a = x[j], b = x[j + h];
        x[j] = a * cs[j] - b * sn[j];
        x[j + h] = b * cs[j] + a * sn[j];
    }
}

static void add_normed_run(const rows_job *j, int t0, int t1) {
    for (int r = t0; r < t1; r++) {
        float *x = (float *)j->x + (size_t)r * j->width, *y = j->y + (size_t)r * j->width;
        rmsnorm(y, y, j->w, j->width, j->f);
        for (int i = 0; i < j->width; i++) x[i] += y[i];
    }
}

void g4_forward_rmsnorm(float *y, const float *x, const float *w, int n, float eps) { rmsnorm(y, x, w, n, eps); }

void g4_forward_rmsnorm_rows(float *y, const float *x, const float *w, int rows, int width, float eps) {
    rows_job j = {.run = rmsnorm_run, .y = y, .x = x, .w = w, .width = width, .f = eps};
    for_rows(&j, rows, 4);
}

void g4_forward_add_normed(float *x, float *y, const float *w, int rows, int width, float eps) {
    rows_job j = {.run = add_normed_run, .y = y, .x = x, .w = w, .width = width, .f = eps};
    for_rows(&j, rows, 5);
}

void g4_forward_rope(float *x, const float *cs, const float *sn, int hd) { rope_apply(x, cs, sn, hd); }

static void gelu_run(const rows_job *j, int t0, int t1) {
    size_t at = (size_t)t0 * j->width;
    j->s->k->gelu_mul(j->y + at, j->x + at, (size_t)(t1 - t0) * j->width, j->f);
}

/* ---- tracing ---- */

void g4_trace_rows(const g4_session *s, const char *name, int pos0, int n, int d0, int d1, const float *data) {
    if (!s->trace) return;
    int shape[2] = {d0, d1};
    s->trace(s->trace_user, name, pos0, n, d1 ? 2 : 1, shape, data);
}

static void trace_layer(const g4_layer_rows *io, const char *fmt, int l, int d0, int d1, const float *data) {
    if (!io->observe || !io->s->trace) return;
    char name[64];
    snprintf(name, sizeof name, fmt, l);
    g4_trace_rows(io->s, name, io->pos[0], io->n, d0, d1, data);
}

/* ---- RoPE, the KV cache and attention ---- */

void g4_rope_tables(const g4_model *m, const int *pos, int n, float *const cos[2], float *const sin[2]) {
    for (int type = 0; type < 2; type++) {
        const g4_layer *L = NULL;
        for (int l = 0; l < m->cfg.n_layers && !L; l++)
            if (m->layers[l].type == type) L = &m->layers[l];
        if (!L) continue;
        int h = L->head_dim / 2;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < h; j++) {
                float angle = (float)pos[t] * L->inv_freq[j];
                cos[type][(size_t)t * h + j] = cosf(angle);
                sin[type][(size_t)t * h + j] = sinf(angle);
            }
    }
}

/* Stores one row of K or V at its sequence's position: int8 codes when the cache is quantized
 * (the row is then replaced by its dequantized values, which is what attention sees). */
static void store_kv_row(const g4_session *s, float *row, size_t width, int pos, float *f32_cache, int8_t *q_cache, float scale) {
    size_t at = (size_t)pos * width;
    if (q_cache) {
        g4_quantize_codes(s, row, width, scale, q_cache + at);
        g4_dequantize_vec(q_cache + at, width, scale, row);
    } else {
        memcpy(f32_cache + at, row, sizeof *row * width);
    }
}

/* The query heads of rows [t0, t1): rmsnorm with q_norm, then RoPE. */
static void q_norm_rope_run(const rows_job *j, int t0, int t1) {
    const g4_layer *L = j->layer;
    const g4_layer_rows *io = j->ctx;
    int hd = L->head_dim, h = hd / 2, nh = j->width / hd;
    for (int t = t0; t < t1; t++)
        for (int i = 0; i < nh; i++) {
            float *q = io->q + (size_t)t * j->width + (size_t)i * hd;
            rmsnorm(q, q, L->q_norm, hd, j->f);
            rope_apply(q, io->rope_cos[L->type] + (size_t)t * h, io->rope_sin[L->type] + (size_t)t * h, hd);
        }
}

/* The K heads of rows [t0, t1): rmsnorm with k_norm and RoPE; the V heads: rmsnorm without weight. */
static void kv_norm_rope_run(const rows_job *j, int t0, int t1) {
    const g4_layer *L = j->layer;
    const g4_layer_rows *io = j->ctx;
    int hd = L->head_dim, h = hd / 2;
    for (int t = t0; t < t1; t++)
        for (int g = 0; g < L->n_kv_heads; g++) {
            float *k = io->kk + (size_t)t * j->width + (size_t)g * hd, *v = io->vv + (size_t)t * j->width + (size_t)g * hd;
            rmsnorm(k, k, L->k_norm, hd, j->f);
            rope_apply(k, io->rope_cos[L->type] + (size_t)t * h, io->rope_sin[L->type] + (size_t)t * h, hd);
            rmsnorm(v, v, NULL, hd, j->f);
        }
}

/* Producer: K = rope(k_norm(W_k x)), V = v_norm(W_v x), quantized at cache write when enabled. */
static void write_kv(const g4_layer_rows *io, int l) {
    const g4_session *s = io->s;
    const g4_layer *L = &io->m->layers[l];
    int hd = L->head_dim, kvw = L->n_kv_heads * hd, n = io->n;
    rows_job j = {.run = kv_norm_rope_run, .s = s, .layer = L, .ctx = io, .width = kvw, .f = (float)io->m->cfg.rms_eps};
    for_rows(&j, n, 8);
    for (int t = 0; t < n; t++) {
        kv_cache *c = kv_of(s, io->seq[t], l);
        store_kv_row(s, io->kk + (size_t)t * kvw, (size_t)kvw, io->pos[t], c->kf, c->kq, c->k_scale);
        store_kv_row(s, io->vv + (size_t)t * kvw, (size_t)kvw, io->pos[t], c->vf, c->vq, c->v_scale);
    }
    trace_layer(io, "k_layer%d", l, L->n_kv_heads, hd, io->kk);
    trace_layer(io, "v_layer%d", l, L->n_kv_heads, hd, io->vv);
}

/* Causal softmax attention of the rows' queries over the cache of the layer's K/V source; sliding
 * layers see the last `sliding_window` positions including their own (a drafter's: see
 * g4_layer_rows.target_kv). Scale 1.0. An int8 cache folds s_k into the scores and s_v into the
 * output. */
static void attention(const g4_layer_rows *io, int l) {
    const g4_layer *L = &io->m->layers[l];
    const g4_config *c = &io->m->cfg;
    int hd = L->head_dim, nh = c->n_heads, kvw = L->n_kv_heads * hd, group = nh / L->n_kv_heads;
    int from_target = L->kv_source == G4_KV_FROM_TARGET;
    int src = from_target ? io->target_kv[L->type] : L->kv_source;
    g4_attn_row rows[CHUNK];
    for (int t = 0; t < io->n; t++) {
        const kv_cache *kv = kv_of(io->s, io->seq[t], src);
        int hi = io->pos[t] - from_target, window = c->sliding_window + from_target;
        int lo = L->type == G4_LAYER_SLIDING ? hi - window + 1 : 0;
        if (lo < 0) lo = 0;
        rows[t] = (g4_attn_row){.kq = kv->kq, .vq = kv->vq, .kf = kv->kf, .vf = kv->vf, .k_scale = kv->k_scale,
                                .v_scale = kv->v_scale, .lo = lo, .hi = hi};
    }
    /* per head: scores over [lo, hi], softmax, weighted sum of V (kernels.h, g4_attn) */
    g4_attn a = {.n = io->n, .n_heads = nh, .head_dim = hd, .kv_width = kvw, .group = group, .q = io->q, .out = io->att, .rows = rows};
    io->s->k->attention(&a);
}

/* ---- the decoder layer ---- */

static void layer_linear(const g4_layer_rows *io, const g4_linear *L, const float *x, float *y) {
    if (io->float_linears) g4_linear_float(io->s, L, x, io->n, y);
    else g4_forward_linear(io->s, L, x, io->n, y);
}

static void layer_linear_group(const g4_layer_rows *io, const g4_linear *const *L, float *const *y, int count, const float *x) {
    if (!io->float_linears) {
        g4_linear_group(io->s, L, y, count, x, io->n);
        return;
    }
    for (int i = 0; i < count; i++) g4_linear_float(io->s, L[i], x, io->n, y[i]);
}

void g4_decoder_layer(const g4_layer_rows *io, int l) {
    g4_session *s = io->s;
    const g4_model *m = io->m;
    const g4_layer *L = &m->layers[l];
    int n = io->n, H = m->cfg.hidden, P = m->cfg.ple_dim, nh = m->cfg.n_heads, hd = L->head_dim;
    float eps = (float)m->cfg.rms_eps;
    int quantized = s->q_linear && !io->float_linears; /* the output steps the GELUs may use */
    /* attention block */
    g4_forward_rmsnorm_rows(io->xn, io->x, L->ln_in, n, H, eps);
    int producer = g4_layer_is_producer(m, l);
    const g4_linear *qkv[3] = {&L->q, &L->k, &L->v};
    float *qkv_out[3] = {io->q, io->kk, io->vv};
    layer_linear_group(io, qkv, qkv_out, producer ? 3 : 1, io->xn);
    rows_job qj = {.run = q_norm_rope_run, .s = s, .layer = L, .ctx = io, .width = nh * hd, .f = eps};
    for_rows(&qj, n, 6);
    if (producer) write_kv(io, l);
    {
        double t0 = io->observe && s->profiling ? g4_prof_clock() : 0;
        attention(io, l);
        if (io->observe && s->profiling) s->prof[G4_PROF_ATTENTION] += g4_prof_clock() - t0;
    }
    layer_linear(io, &L->o, io->att, io->proj);
    g4_forward_add_normed(io->x, io->proj, L->ln_post_attn, n, H, eps);
    /* MLP block */
    g4_forward_rmsnorm_rows(io->xn, io->x, L->ln_pre_ffw, n, H, eps);
    const g4_linear *gate_up[2] = {&L->gate, &L->up};
    float *gate_up_out[2] = {io->gate, io->up};
    layer_linear_group(io, gate_up, gate_up_out, 2, io->xn);
    /* gate[i] = gelu_tanh(gate[i]) * up[i]; the gate's output step lets a level reuse one gelu
     * per int8 code */
    rows_job gj = {.run = gelu_run, .s = s, .y = io->gate, .x = io->up, .width = L->mlp_dim, .f = quantized ? L->gate.s_out : 0};
    for_rows(&gj, n, 8);
    layer_linear(io, &L->down, io->gate, io->proj);
    g4_forward_add_normed(io->x, io->proj, L->ln_post_ffw, n, H, eps);
    /* per-layer-input block (a model with hidden_size_per_layer_input > 0): gate on the raw
     * residual stream */
    if (P > 0) {
        layer_linear(io, &L->pl_gate, io->x, io->plg);
        if (io->pli_ready) io->pli_ready(s, l);
        for (int t = 0; t < n; t++) {
            const float *pli = io->pli + ((size_t)t * m->cfg.n_layers + l) * P;
            float *g = io->plg + (size_t)t * P;
            /* g[j] = gelu_tanh(g[j]) * pli[j] */
            s->k->gelu_mul(g, pli, (size_t)P, quantized ? L->pl_gate.s_out : 0);
        }
        layer_linear(io, &L->pl_proj, io->plg, io->proj);
        g4_forward_add_normed(io->x, io->proj, L->ln_post_pli, n, H, eps);
    }
    for (size_t i = 0; i < (size_t)n * H; i++) io->x[i] *= L->layer_scalar;
    trace_layer(io, "hidden_after_layer%d", l, H, 0, io->x);
}
