/* The layer math of the Gemma 4 text decoder (model.md §5-§7) for one chunk of rows, read top to
 * bottom: the elementwise steps, the linears, the embeddings and per-layer inputs, RoPE, the KV
 * cache and attention, the decoder layer, and g4_forward_chunk, which runs a chunk through them.
 * The session, its options and buffers are session.c's; what a row asks for and the lm_head's
 * search, decode.c's and lmhead.c's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/pool.h"
#include "quant/dynamic.h"
#include "quant/int8.h"
#include "quant/pack.h"
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

/* The per-row steps of a chunk (norms, quantization, requantization, GELU) split over the pool by
 * rows: with the 64 rows of a prefill chunk they would otherwise run on one thread while the
 * others wait. A decode step's single row stays on the caller. Each row is computed exactly as
 * on its own. */
typedef struct rows_job rows_job;
struct rows_job {
    void (*run)(const rows_job *j, int t0, int t1);
    const g4_session *s;
    const g4_linear *L;
    const g4_layer *layer;
    float *y;
    const float *x, *w;
    int8_t *codes;
    int width;
    int o0;  /* requant_run: the first output of the slice the sums in s->acc belong to */
    float f; /* eps, scale */
};

static void rows_items(void *ctx, int b, int e) {
    const rows_job *j = ctx;
    j->run(j, b, e);
}

/* work: about the multiply-adds of one element */
static void for_rows(rows_job *j, int rows, double work) {
    g4_pool_for(rows, 1, (double)rows * j->width * work, rows_items, j);
}

static void rmsnorm_run(const rows_job *j, int t0, int t1) {
    for (int r = t0; r < t1; r++) rmsnorm(j->y + (size_t)r * j->width, j->x + (size_t)r * j->width, j->w, j->width, j->f);
}

/* rmsnorm over each of `rows` consecutive vectors of `width`. */
static void rmsnorm_rows(float *y, const float *x, const float *w, int rows, int width, float eps) {
    rows_job j = {.run = rmsnorm_run, .y = y, .x = x, .w = w, .width = width, .f = eps};
    for_rows(&j, rows, 4);
}

/* Q(x; s) = s * clamp(round(x / s), -128, 127) in place, with the session's rounding and
 * division rules; s = 0 is the identity (an uncalibrated point). */
static void fake_quant(const g4_session *s, float *x, size_t n, float scale) {
    if (scale == 0) return;
    g4_quantizer q;
    g4_quantizer_init(&q, scale, 0, s->round, s->qdiv); /* scales were validated at load */
    s->k->fake_quant(&q, x, n);
}

static void quantize_codes(const g4_session *s, const float *x, size_t n, float scale, int8_t *codes) {
    g4_quantizer q;
    g4_quantizer_init(&q, scale, 0, s->round, s->qdiv);
    s->k->quantize(&q, x, n, codes);
}

static void quantize_run(const rows_job *j, int t0, int t1) {
    size_t at = (size_t)t0 * j->width;
    quantize_codes(j->s, j->x + at, (size_t)(t1 - t0) * j->width, j->f, j->codes + at);
}

/* quantize_codes over `rows` rows of `width`, split over the pool. */
static void quantize_rows(const g4_session *s, const float *x, int rows, int width, float scale, int8_t *codes) {
    rows_job j = {.run = quantize_run, .s = s, .x = x, .codes = codes, .width = width, .f = scale};
    for_rows(&j, rows, 2);
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

/* ---- linears ---- */

/* Rows [t0, t1) of the slice of sums in s->acc (j->width outputs from j->o0) into j->y. */
static void requant_run(const rows_job *j, int t0, int t1) {
    const g4_linear *L = j->L;
    const int32_t *acc = j->s->acc + (size_t)t0 * j->width;
    g4_requant_apply(j->s, L, acc, t1 - t0, j->width, j->o0, j->y + (size_t)t0 * L->w.out + j->o0);
}

/* y = dequant(requant(W codes)) for n rows whose input codes are already in `codes`. A layer
 * linear's n x out sums fit s->acc in one pass; a wider linear (a calibrated lm_head: vocab
 * outputs) runs in slices of output rows that fit, each slice's sums exact as in one pass. */
static void linear_from_codes(g4_session *s, const g4_linear *L, const int8_t *codes, int n, float *y) {
    s->rows_int[L->id] += n;
    int out = L->w.out, step = (int)(s->acc_len / (size_t)n); /* n <= CHUNK, so step >= the widest layer linear */
    for (int o0 = 0; o0 < out; o0 += step) {
        int width = out - o0 < step ? out - o0 : step;
        g4_qweight slice = g4_qweight_rows(&L->w, o0, width);
        s->k->matmul_i8(&slice, codes, n, s->acc);
        rows_job j = {.run = requant_run, .s = s, .L = L, .y = y, .width = width, .o0 = o0};
        for_rows(&j, n, 2);
    }
}

/* y = Q(W Q(x; s_in); s_out) for n rows: float, fake-quant or true integer, per the session. */
static void linear_body(g4_session *s, const g4_linear *L, const float *x, int n, float *y) {
    if (runs_int(s, L)) {
        quantize_rows(s, x, n, L->w.in, L->s_in, s->xcodes);
        linear_from_codes(s, L, s->xcodes, n, y);
        return;
    }
    if (s->q_linear && L->s_in != 0) {
        size_t len = (size_t)n * L->w.in;
        memcpy(s->xq, x, len * sizeof *x);
        fake_quant(s, s->xq, len, L->s_in);
        x = s->xq;
    }
    s->rows_float[L->id] += n;
    s->k->matmul_f32(&L->w, x, n, y);
    if (s->q_linear) fake_quant(s, y, (size_t)n * L->w.out, L->s_out);
}

static void linear(g4_session *s, const g4_linear *L, const float *x, int n, float *y) {
    PROF_BEGIN(s);
    linear_body(s, L, x, n, y);
    PROF_END(s, G4_PROF_LINEAR);
}

/* Linears reading the same input (q/k/v, gate/up): in int mode the input is quantized once
 * and its codes shared when the input scales are bit-identical (they are in the checkpoint). */
static void linear_group(g4_session *s, const g4_linear *const *L, float *const *y, int count, const float *x, int n) {
    for (int i = 0; i < count; i++) {
        int share = i > 0 && runs_int(s, L[0]) && runs_int(s, L[i]) && memcmp(&L[i]->s_in, &L[0]->s_in, sizeof(float)) == 0;
        if (share) {
            PROF_BEGIN(s);
            linear_from_codes(s, L[i], s->xcodes, n, y[i]);
            PROF_END(s, G4_PROF_LINEAR);
        } else {
            linear(s, L[i], x, n, y[i]);
        }
    }
}

/* Reports rows [pos, pos + n) of a tensor whose rows have shape {d0} or {d0, d1}. */
static void trace(const g4_session *s, const char *name, int n, int d0, int d1, const float *data) {
    if (!s->trace) return;
    int shape[2] = {d0, d1};
    s->trace(s->trace_user, name, s->row_pos[0], n, d1 ? 2 : 1, shape, data);
}

static void trace_layer(const g4_session *s, const char *fmt, int l, int n, int d0, int d1, const float *data) {
    if (!s->trace) return;
    char name[64];
    snprintf(name, sizeof name, fmt, l);
    trace(s, name, n, d0, d1, data);
}

/* ---- embeddings and per-layer inputs ---- */

/* Row r's codes and scales of an embedding table, read from the file into buf (s->row_buf, room
 * for either table's row and scales) when the table is in the file mapping. Each prompt token touches other
 * rows of E2B's 1.2 GB of embedding tables; read through the mapping, every row's pages (a whole
 * large folio of the page cache at a time, on recent kernels) would stay in the resident set for
 * good: a 2,048-token prompt took g4 bench's peak RSS from 0.80 to 1.13 GiB, above the 0.9 target.
 * Tables in memory (a tied lm_head's resident copy), or a failed read, use the memory itself. */
static void embedding_row_bytes(const g4_model *m, const g4_qembedding *e, int r, uint8_t *buf, const uint8_t **codes,
                                const uint8_t **scales) {
    *codes = e->codes + (size_t)r * e->row_bytes;
    *scales = NULL;
    if (g4_st_pread(&m->st, *codes, e->row_bytes, buf) == 0) *codes = buf;
    if (!e->scale) return; /* BF16 */
    size_t sb = (size_t)e->nblocks * g4_dtype_size(e->scale->dtype);
    *scales = e->scale->data + (size_t)r * sb;
    if (g4_st_pread(&m->st, *scales, sb, buf + e->row_bytes) == 0) *scales = buf + e->row_bytes;
}

/* Scale k of an embedding row's scales (F32, or F16 in the block-scaled format). */
static float embedding_scale_at(const g4_qembedding *e, const uint8_t *scales, int k) {
    if (e->scale->dtype == G4_DT_F16) return g4_f16_to_f32((uint16_t)(scales[2 * k] | scales[2 * k + 1] << 8));
    return g4_load_f32(scales + 4 * k);
}

/* Row r of an embedding table, dequantized (or BF16 widened), times `mult` (buf: see
 * embedding_row_bytes): code x scale rounded to f32, then the multiplier, as transformers does. */
static void embedding_row(const g4_model *m, const g4_qembedding *e, int r, float mult, uint8_t *buf, float *out) {
    const uint8_t *codes, *scales;
    embedding_row_bytes(m, e, r, buf, &codes, &scales);
    if (e->bits == G4_WT_BF16) {
        for (int c = 0; c < e->cols; c++) out[c] = g4_bf16_to_f32((uint16_t)(codes[2 * c] | codes[2 * c + 1] << 8)) * mult;
        return;
    }
    int block = e->cols / e->nblocks;
    for (int c = 0; c < e->cols; c++) {
        float scale = embedding_scale_at(e, scales, c / block);
        out[c] = (float)g4_packed_code(codes, e->bits, (size_t)c) * scale * mult;
    }
}

/* The per-layer inputs from `rows` projected slices of P at pli and the token parts at ple_tok,
 * in place: x H^-1/2 (with the G2 quantization around it when enabled), rmsnorm per slice, plus
 * the token part, x 2^-1/2. */
static void ple_combine(const g4_session *s, float *pli, const float *ple_tok, size_t rows) {
    const g4_config *c = &s->m->cfg;
    size_t len = rows * (size_t)c->ple_dim;
    int pq = s->q_pmp;
    if (pq && s->o.pmp_out_raw) fake_quant(s, pli, len, s->o.pmp_s_out);
    float proj_scale = (float)(1.0 / sqrt((double)c->hidden)), input_scale = (float)(1.0 / sqrt(2.0));
    for (size_t i = 0; i < len; i++) pli[i] *= proj_scale;
    if (pq && !s->o.pmp_out_raw) fake_quant(s, pli, len, s->o.pmp_s_out);
    rmsnorm_rows(pli, pli, s->m->ple_norm, (int)rows, c->ple_dim, (float)c->rms_eps);
    for (size_t i = 0; i < len; i++) pli[i] = (pli[i] + ple_tok[i]) * input_scale;
}

/* A decode step's projection W_pmp e (27.5 MB of BF16 weights on E2B) goes out as background
 * items of PLE_ITEM_ROWS outputs (24 KB of weights each), which the idle pool worker streams in
 * the gaps where the caller works alone (norms, quantization, GELU: about 2 ms a token on E2B);
 * a layer finishes its own slice when it needs it (ple_layer_ready), running whatever is left.
 * Each output row is computed by the same kernel whoever runs it, so nothing changes but the
 * time: decode steps alternating with and without it in one process were 2-3 % faster with. */
#define PLE_ITEM_ROWS 8

static void ple_item(void *ctx, int b, int e) {
    g4_session *s = ctx;
    const g4_qweight *w = &s->m->pmp.w;
    for (int k = b; k < e; k++) {
        g4_qweight sub = g4_qweight_rows(w, k * PLE_ITEM_ROWS, PLE_ITEM_ROWS);
        s->k->matmul_f32(&sub, s->pmp_in, 1, s->pli + (size_t)k * PLE_ITEM_ROWS);
    }
}

static int ple_items_per_layer(const g4_session *s) { return s->m->cfg.ple_dim / PLE_ITEM_ROWS; }

/* Layer l's slice of a pending projection, finished and combined (one row). */
static void ple_layer_ready(g4_session *s, int l) {
    if (!s->ple_pending) return;
    PROF_BEGIN(s);
    const g4_config *c = &s->m->cfg;
    g4_pool_background_wait((l + 1) * ple_items_per_layer(s));
    size_t at = (size_t)l * c->ple_dim;
    ple_combine(s, s->pli + at, s->ple_tok + at, 1);
    PROF_END(s, G4_PROF_EMBED);
}

/* Ends a pending projection once the step's layers are done (every item has been waited for by
 * then), handing the background set back. */
static void ple_end(g4_session *s) {
    if (!s->ple_pending) return;
    g4_pool_background_end();
    s->ple_pending = 0;
}

/* Main embedding and the per-layer inputs pli [n][L][P] (model.md §5). Rows [0, cut) stop
 * before the consumer layers (g4_forward_chunk), so their consumer inputs are left zero instead
 * of projected. A single row that every layer sees (a decode step) may leave its projection
 * pending (see ple_item). */
static void embed_tokens(g4_session *s, const int32_t *ids, const float *const *embd, int n, int cut) {
    const g4_model *m = s->m;
    const g4_config *c = &m->cfg;
    int H = c->hidden, P = c->ple_dim, LP = c->n_layers * P;
    for (int t = 0; t < n; t++) {
        /* an embedding row: its embedding as given; ids[t] is then the pad id, for the token part below */
        if (embd[t]) memcpy(s->x + (size_t)t * H, embd[t], sizeof *s->x * (size_t)H);
        else embedding_row(m, &m->embed, ids[t], m->embed_scale, s->row_buf, s->x + (size_t)t * H);
        embedding_row(m, &m->embed_ple, ids[t], m->ple_embed_scale, s->row_buf, s->ple_tok + (size_t)t * LP);
    }
    trace(s, "inputs_embeds", n, H, 0, s->x);
    trace(s, "per_layer_inputs_token", n, c->n_layers, P, s->ple_tok);
    /* Context part: W_pmp e, x H^-1/2, with the LiteRT graph's G1/G2 quantization when enabled. */
    /* In int mode too this linear runs in float: its weights are BF16 (activation-quant.md §6). */
    int pq = s->q_pmp;
    const float *in = s->x;
    if (pq) {
        memcpy(s->xq, s->x, sizeof *s->x * (size_t)n * H);
        fake_quant(s, s->xq, (size_t)n * H, s->o.pmp_s_in);
        in = s->xq;
    }
    if (n == 1 && cut == 0 && !s->trace && P % PLE_ITEM_ROWS == 0 && m->pmp.w.out == LP) {
        memcpy(s->pmp_in, in, sizeof *in * (size_t)H);
        s->ple_pending = g4_pool_background(c->n_layers * ple_items_per_layer(s), ple_item, s);
        if (s->ple_pending) return;
    }
    int LPp = s->tail_from * P; /* the producers' inputs, which every row needs */
    if (cut > 0 && LPp < LP) {
        g4_qweight head = g4_qweight_rows(&m->pmp.w, 0, LPp);
        s->k->matmul_f32(&head, in, cut, s->pli); /* rows LPp apart, spread out below */
        for (int t = cut - 1; t >= 0; t--) {
            memmove(s->pli + (size_t)t * LP, s->pli + (size_t)t * LPp, sizeof *s->pli * (size_t)LPp);
            memset(s->pli + (size_t)t * LP + LPp, 0, sizeof *s->pli * (size_t)(LP - LPp));
        }
        if (n > cut) s->k->matmul_f32(&m->pmp.w, in + (size_t)cut * H, n - cut, s->pli + (size_t)cut * LP);
    } else {
        s->k->matmul_f32(&m->pmp.w, in, n, s->pli);
    }
    ple_combine(s, s->pli, s->ple_tok, (size_t)n * c->n_layers);
    trace(s, "per_layer_inputs", n, c->n_layers, P, s->pli);
}

/* ---- RoPE, the KV cache and attention ---- */

/* cos/sin of position * frequency for both layer types, for the chunk's positions. */
static void rope_tables(g4_session *s, int n) {
    const g4_model *m = s->m;
    for (int type = 0; type < 2; type++) {
        const g4_layer *L = NULL;
        for (int l = 0; l < m->cfg.n_layers && !L; l++)
            if (m->layers[l].type == type) L = &m->layers[l];
        if (!L) continue;
        int h = L->head_dim / 2;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < h; j++) {
                float angle = (float)s->row_pos[t] * L->inv_freq[j];
                s->rope_cos[type][(size_t)t * h + j] = cosf(angle);
                s->rope_sin[type][(size_t)t * h + j] = sinf(angle);
            }
    }
}

/* Stores one row of K or V at its sequence's position: int8 codes when the cache is quantized
 * (the row is then replaced by its dequantized values, which is what attention sees). */
static void store_kv_row(g4_session *s, float *row, size_t width, int pos, float *f32_cache, int8_t *q_cache, float scale) {
    size_t at = (size_t)pos * width;
    if (q_cache) {
        quantize_codes(s, row, width, scale, q_cache + at);
        g4_dequantize_vec(q_cache + at, width, scale, row);
    } else {
        memcpy(f32_cache + at, row, sizeof *row * width);
    }
}

/* The query heads of rows [t0, t1): rmsnorm with q_norm, then RoPE. */
static void q_norm_rope_run(const rows_job *j, int t0, int t1) {
    const g4_layer *L = j->layer;
    const g4_session *s = j->s;
    int hd = L->head_dim, h = hd / 2, nh = j->width / hd;
    for (int t = t0; t < t1; t++)
        for (int i = 0; i < nh; i++) {
            float *q = s->q + (size_t)t * j->width + (size_t)i * hd;
            rmsnorm(q, q, L->q_norm, hd, j->f);
            rope_apply(q, s->rope_cos[L->type] + (size_t)t * h, s->rope_sin[L->type] + (size_t)t * h, hd);
        }
}

/* The K heads of rows [t0, t1): rmsnorm with k_norm and RoPE; the V heads: rmsnorm without weight. */
static void kv_norm_rope_run(const rows_job *j, int t0, int t1) {
    const g4_layer *L = j->layer;
    const g4_session *s = j->s;
    int hd = L->head_dim, h = hd / 2;
    for (int t = t0; t < t1; t++)
        for (int g = 0; g < L->n_kv_heads; g++) {
            float *k = s->kk + (size_t)t * j->width + (size_t)g * hd, *v = s->vv + (size_t)t * j->width + (size_t)g * hd;
            rmsnorm(k, k, L->k_norm, hd, j->f);
            rope_apply(k, s->rope_cos[L->type] + (size_t)t * h, s->rope_sin[L->type] + (size_t)t * h, hd);
            rmsnorm(v, v, NULL, hd, j->f);
        }
}

/* Producer: K = rope(k_norm(W_k x)), V = v_norm(W_v x), quantized at cache write when enabled. */
static void write_kv(g4_session *s, int l, int n) {
    const g4_layer *L = &s->m->layers[l];
    int hd = L->head_dim, kvw = L->n_kv_heads * hd;
    rows_job j = {.run = kv_norm_rope_run, .s = s, .layer = L, .width = kvw, .f = (float)s->m->cfg.rms_eps};
    for_rows(&j, n, 8);
    for (int t = 0; t < n; t++) {
        kv_cache *c = kv_of(s, s->row_seq[t], l);
        store_kv_row(s, s->kk + (size_t)t * kvw, (size_t)kvw, s->row_pos[t], c->kf, c->kq, c->k_scale);
        store_kv_row(s, s->vv + (size_t)t * kvw, (size_t)kvw, s->row_pos[t], c->vf, c->vq, c->v_scale);
    }
    trace_layer(s, "k_layer%d", l, n, L->n_kv_heads, hd, s->kk);
    trace_layer(s, "v_layer%d", l, n, L->n_kv_heads, hd, s->vv);
}

/* Causal softmax attention of the chunk's queries over the cache of the layer's KV source;
 * sliding layers see the last `sliding_window` positions including their own. Scale 1.0.
 * An int8 cache folds s_k into the scores and s_v into the output. */
static void attention(g4_session *s, int l, int n) {
    const g4_layer *L = &s->m->layers[l];
    int hd = L->head_dim, nh = s->m->cfg.n_heads, kvw = L->n_kv_heads * hd, group = nh / L->n_kv_heads;
    g4_attn_row rows[CHUNK];
    for (int t = 0; t < n; t++) {
        const kv_cache *c = kv_of(s, s->row_seq[t], L->kv_source);
        int p = s->row_pos[t];
        int lo = L->type == G4_LAYER_SLIDING ? p - s->m->cfg.sliding_window + 1 : 0;
        if (lo < 0) lo = 0;
        rows[t] = (g4_attn_row){.kq = c->kq, .vq = c->vq, .kf = c->kf, .vf = c->vf, .k_scale = c->k_scale,
                                .v_scale = c->v_scale, .lo = lo, .hi = p};
    }
    /* per head: scores over [lo, p], softmax, weighted sum of V (kernels.h, g4_attn) */
    g4_attn a = {.n = n, .n_heads = nh, .head_dim = hd, .kv_width = kvw, .group = group,
                 .q = s->q, .out = s->att, .rows = rows};
    s->k->attention(&a);
}

/* ---- the decoder layer ---- */

static void add_normed_run(const rows_job *j, int t0, int t1) {
    for (int r = t0; r < t1; r++) {
        float *x = (float *)j->x + (size_t)r * j->width, *y = j->y + (size_t)r * j->width;
        rmsnorm(y, y, j->w, j->width, j->f);
        for (int i = 0; i < j->width; i++) x[i] += y[i];
    }
}

/* x += rmsnorm(y) row by row (y is normed in place). */
static void add_normed(float *x, float *y, const float *w, int n, int H, float eps) {
    rows_job j = {.run = add_normed_run, .y = y, .x = x, .w = w, .width = H, .f = eps};
    for_rows(&j, n, 5);
}

static void gelu_run(const rows_job *j, int t0, int t1) {
    size_t at = (size_t)t0 * j->width;
    j->s->k->gelu_mul(j->y + at, j->x + at, (size_t)(t1 - t0) * j->width, j->f);
}

static void decoder_layer(g4_session *s, int l, int n) {
    const g4_model *m = s->m;
    const g4_layer *L = &m->layers[l];
    int H = m->cfg.hidden, P = m->cfg.ple_dim, nh = m->cfg.n_heads, hd = L->head_dim;
    float eps = (float)m->cfg.rms_eps;
    /* attention block */
    rmsnorm_rows(s->xn, s->x, L->ln_in, n, H, eps);
    int producer = g4_layer_is_producer(m, l);
    const g4_linear *qkv[3] = {&L->q, &L->k, &L->v};
    float *qkv_out[3] = {s->q, s->kk, s->vv};
    linear_group(s, qkv, qkv_out, producer ? 3 : 1, s->xn, n);
    rows_job qj = {.run = q_norm_rope_run, .s = s, .layer = L, .width = nh * hd, .f = eps};
    for_rows(&qj, n, 6);
    if (producer) write_kv(s, l, n);
    PROF_BEGIN(s);
    attention(s, l, n);
    PROF_END(s, G4_PROF_ATTENTION);
    linear(s, &L->o, s->att, n, s->proj);
    add_normed(s->x, s->proj, L->ln_post_attn, n, H, eps);
    /* MLP block */
    rmsnorm_rows(s->xn, s->x, L->ln_pre_ffw, n, H, eps);
    const g4_linear *gate_up[2] = {&L->gate, &L->up};
    float *gate_up_out[2] = {s->gate, s->up};
    linear_group(s, gate_up, gate_up_out, 2, s->xn, n);
    /* gate[i] = gelu_tanh(gate[i]) * up[i]; the gate's output step lets a level reuse one gelu
     * per int8 code */
    rows_job gj = {.run = gelu_run, .s = s, .y = s->gate, .x = s->up, .width = L->mlp_dim, .f = s->q_linear ? L->gate.s_out : 0};
    for_rows(&gj, n, 8);
    linear(s, &L->down, s->gate, n, s->proj);
    add_normed(s->x, s->proj, L->ln_post_ffw, n, H, eps);
    /* per-layer-input block: gate on the raw residual stream */
    linear(s, &L->pl_gate, s->x, n, s->plg);
    ple_layer_ready(s, l);
    for (int t = 0; t < n; t++) {
        const float *pli = s->pli + ((size_t)t * m->cfg.n_layers + l) * P;
        float *g = s->plg + (size_t)t * P;
        /* g[j] = gelu_tanh(g[j]) * pli[j] */
        s->k->gelu_mul(g, pli, (size_t)P, s->q_linear ? L->pl_gate.s_out : 0);
    }
    linear(s, &L->pl_proj, s->plg, n, s->proj);
    add_normed(s->x, s->proj, L->ln_post_pli, n, H, eps);
    for (size_t i = 0; i < (size_t)n * H; i++) s->x[i] *= L->layer_scalar;
    trace_layer(s, "hidden_after_layer%d", l, n, H, 0, s->x);
}

/* ---- the lm_head's logits ---- */

void g4_forward_lm_head_logits(g4_session *s, int n, int first, float *logits) {
    const g4_model *m = s->m;
    const g4_linear *L = &m->lm_head;
    int H = m->cfg.hidden, V = m->cfg.vocab;
    if (s->o.lmhead_dynamic_q8 && !lm_head_static_input(s) && L->w.bits != G4_WT_BF16 && L->w.block == 0) {
        /* LiteRT's XNNPACK runs a float-input FC with int weights by quantizing each input row
         * at run time (qd8); reproduce it when asked (int8-arithmetic.md §3.3, tools/ref). A
         * static input scale takes precedence: the delegate then sees an int8 input and takes
         * its static path, as the engine does. The f32 output still meets point G4. */
        for (int t = first; t < n; t++)
            g4_dynq_matvec_packed(G4_DYNQ_XNN_QD8, s->xn + (size_t)t * H, (size_t)H, L->w.w, L->w.bits, (size_t)V, L->w.w_scale,
                                  s->xcodes, logits + (size_t)(t - first) * V);
        if (s->q_linear) fake_quant(s, logits, (size_t)(n - first) * V, L->s_out);
    } else {
        linear(s, L, s->xn + (size_t)first * H, n - first, logits);
    }
    double cap = m->cfg.final_softcap;
    if (cap > 0) {
        float fc = (float)cap;
        s->k->softcap(logits, (size_t)(n - first) * V, fc);
    }
}

/* ---- a chunk ---- */

/* Moves rows [lo, n) of the chunk to [0, n - lo): the rows that go on through the consumer
 * layers. Their residual stream, per-layer inputs, sequence, position and RoPE tables move;
 * every other buffer is rewritten by the next layer. */
static void keep_rows(g4_session *s, int lo, int n) {
    const g4_config *c = &s->m->cfg;
    size_t H = (size_t)c->hidden, LP = (size_t)c->n_layers * c->ple_dim, rows = (size_t)(n - lo);
    memmove(s->x, s->x + lo * H, sizeof *s->x * rows * H);
    memmove(s->pli, s->pli + lo * LP, sizeof *s->pli * rows * LP);
    memmove(s->row_seq, s->row_seq + lo, sizeof *s->row_seq * rows);
    memmove(s->row_pos, s->row_pos + lo, sizeof *s->row_pos * rows);
    rope_tables(s, n - lo);
}

/* The final norm of the n rows left in the chunk, into xn. */
static void final_norm(g4_session *s, int n) {
    const g4_model *m = s->m;
    rmsnorm_rows(s->xn, s->x, m->final_norm, n, m->cfg.hidden, (float)m->cfg.rms_eps);
    trace(s, "final_norm", n, m->cfg.hidden, 0, s->xn);
}

/* Computes the chunk p plans. The rows that ask for nothing skip the consumer layers
 * (tail_from), unless a trace wants every row of every layer. */
void g4_forward_chunk(g4_session *s, const chunk_plan *p) {
    double t0 = s->profiling ? g4_prof_clock() : 0;
    int n = p->n, cut = s->trace ? 0 : p->start[GROUP_LOGITS]; /* rows [0, cut) stop at tail_from */
    int shift = 0;                                               /* chunk row t is row t - shift from then on */
    {
        PROF_BEGIN(s);
        embed_tokens(s, p->ids, p->embd, n, cut);
        PROF_END(s, G4_PROF_EMBED);
    }
    rope_tables(s, n);
    for (int l = 0; l < s->m->cfg.n_layers; l++) {
        if (l == s->tail_from && cut > 0) {
            keep_rows(s, cut, n);
            n -= cut;
            shift = cut;
            cut = 0;
        }
        if (n == 0) break;
        decoder_layer(s, l, n);
    }
    ple_end(s);
    if (n > 0) {
        /* the final norm and the lm_head are counted here, the lm_head not as a layer linear */
        double before = s->prof[G4_PROF_LINEAR];
        PROF_BEGIN(s);
        final_norm(s, n);
        g4_lm_head_outputs(s, p, shift);
        PROF_END(s, G4_PROF_LM_HEAD);
        s->prof[G4_PROF_LINEAR] = before;
    }
    if (s->profiling) s->prof_total += g4_prof_clock() - t0;
}

/* The steps a drafter's layers share with the target's (draft.c): the same functions, the same bits. */
void g4_forward_rmsnorm(float *y, const float *x, const float *w, int n, float eps) { rmsnorm(y, x, w, n, eps); }
void g4_forward_rmsnorm_rows(float *y, const float *x, const float *w, int rows, int width, float eps) {
    rmsnorm_rows(y, x, w, rows, width, eps);
}
void g4_forward_add_normed(float *x, float *y, const float *w, int rows, int width, float eps) { add_normed(x, y, w, rows, width, eps); }
void g4_forward_rope(float *x, const float *cs, const float *sn, int hd) { rope_apply(x, cs, sn, hd); }
void g4_forward_embedding(g4_session *s, int32_t id, float *out) {
    embedding_row(s->m, &s->m->embed, id, s->m->embed_scale, s->row_buf, out);
}

/* One linear by itself, for the probes (session.c, g4_session_run_linear). */
void g4_forward_linear(g4_session *s, const g4_linear *L, const float *x, int n, float *y) { linear(s, L, x, n, y); }
