/* The Gemma 4 text decoder forward pass (model.md §5-§7) with its run state and KV cache.
 * Activations are fp32 [n tokens][width] row-major; a call processes up to CHUNK tokens at a
 * time, so prefill and decode run the same code. Quantization points follow
 * activation-quant.md §2; which ones are active is decided once, in the session options. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/pool.h"
#include "model.h"
#include "probe.h"
#include "quant/dynamic.h"
#include "quant/int8.h"
#include "quant/pack.h"
#include "util/err.h"

#define CHUNK 64

/* The K/V cache of one producer layer, [ctx][n_kv_heads * head_dim]: int8 codes with the
 * layer's cache scale when the KV points are quantized (A5/A6), f32 otherwise. */
typedef struct {
    float *kf, *vf;
    int8_t *kq, *vq;
    float k_scale, v_scale;
} kv_cache;

struct g4_session {
    const g4_model *m;
    g4_options o;
    const g4_kernels *k;
    int n_seq;
    int *seq_pos;     /* [n_seq] tokens in each sequence's cache */
    /* The rows of the chunk being computed: which sequence each belongs to and its position.
     * A prefill chunk is consecutive positions of one sequence; a batched decode step is one
     * token of each of several sequences. Every row is computed independently except in
     * attention, which reads its own sequence's cache. */
    int row_seq[CHUNK], row_pos[CHUNK];
    /* Resolved switches: which quantization points are on, and the rules they use. */
    int q_linear, q_kv, q_pmp;
    g4_round round;
    g4_qdiv qdiv;
    g4_requant **rq; /* [n_linears] per-row requantization (int mode, rules other than f32) */
    float **rq_f32;  /* [n_linears] per-row f32 multipliers (int mode, requant f32: XNNPACK's rule) */
    long long *rows_int, *rows_float; /* [n_linears] token rows each linear ran through either path (probe.h) */
    kv_cache *kv;    /* [n_seq][n_layers]; empty for consumers */
    /* Per-chunk scratch. */
    float *x, *xn, *xq, *q, *kk, *vv, *att, *proj, *gate, *up, *pli, *ple_tok, *plg;
    uint8_t *row_buf; /* one embedding row's codes and scales, read from the file */
    /* A decode step's per-layer-input projection runs as background items (embed_tokens): its
     * input row, and whether it is pending (layers finish their slices as they need them). */
    float *pmp_in;
    int ple_pending;
    int8_t *xcodes;
    int32_t *acc;     /* int32 sums of the integer path: acc_len of them (CHUNK x the widest layer linear) */
    size_t acc_len;
    float *logit_row; /* [vocab], the greedy path's fallback (allocated on first use) */
    void *argmax_scratch; /* the greedy lm_head's buffers (g4_codes_f32_argmax), grown on use */
    size_t argmax_bytes;
    int *argmax_hold; /* [n_seq] shortcut calls left that use two digit rows (lm_head_coarse) */
    /* One g4_decode call: each sequence's coarse image (read at the start of the call), whether
     * its shortcut ran and whether it left a row unsettled; a chunk's rows per sequence. */
    int *call_coarse, *seq_rank;
    unsigned char *call_ran, *call_unsettled;
    /* The final-normed rows of the last call's greedy and top rows, and their batch rows
     * (g4_decode_logits). */
    float *kept;
    int *kept_row, n_kept, cap_kept;
    float *rope_cos[2], *rope_sin[2];
    /* The layers from tail_from on are all KV consumers: they write no cache, so what they
     * compute for a row reaches nothing but that row's own output. Rows whose outputs are not
     * wanted (a prefill's every row but the last) stop before them. */
    int tail_from;
    g4_trace_fn trace;
    void *trace_user;
    int profiling;
    double prof[G4_PROF_COUNT], prof_total;
};

static double clock_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Profiling brackets: PROF_BEGIN starts a clock when profiling is on, PROF_END charges the
 * elapsed time to an operation class. */
#define PROF_BEGIN(s) double prof_t0_ = (s)->profiling ? clock_s() : 0
#define PROF_END(s, op) \
    do { \
        if ((s)->profiling) (s)->prof[op] += clock_s() - prof_t0_; \
    } while (0)

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

/* ---- session ---- */

/* True integer path: int8 input codes x packed weight codes -> int32 -> requantized. */
static int runs_int(const g4_session *s, const g4_linear *L) {
    return s->o.act == G4_ACT_INT && s->q_linear && L->s_in != 0 && L->w.bits != 16;
}

/* n rows of int32 sums of L's outputs [o0, o0 + width) into floats, each row of acc `width` long
 * and of y L->w.out long (y points at output o0 of its first row): requantized to the output
 * step, or only scaled when the output is not quantized. */
static void requant_rows(const g4_session *s, const g4_linear *L, const int32_t *acc, int n, int width, int o0, float *y) {
    int out = L->w.out;
    const g4_requant *rq = s->rq[L->id];
    const float *m32 = s->rq_f32[L->id];
    if (m32 && width == out) {
        s->k->requant_f32(acc, n, out, m32, L->s_out, y);
    } else if (m32) {
        for (int t = 0; t < n; t++) s->k->requant_f32(acc + (size_t)t * width, 1, width, m32 + o0, L->s_out, y + (size_t)t * out);
    } else if (rq) {
        for (int t = 0; t < n; t++)
            for (int o = 0; o < width; o++)
                y[(size_t)t * out + o] = g4_dequantize(g4_requantize(&rq[o0 + o], acc[(size_t)t * width + o]), L->s_out, 0);
    } else if (width == out) {
        s->k->acc_scale(acc, n, out, L->s_in, L->w.w_scale, y); /* s_out == 0: float output */
    } else {
        for (int t = 0; t < n; t++) s->k->acc_scale(acc + (size_t)t * width, 1, width, L->s_in, L->w.w_scale + o0, y + (size_t)t * out);
    }
}

/* Rows [t0, t1) of the slice of sums in s->acc (j->width outputs from j->o0) into j->y. */
static void requant_run(const rows_job *j, int t0, int t1) {
    const g4_linear *L = j->L;
    const int32_t *acc = j->s->acc + (size_t)t0 * j->width;
    requant_rows(j->s, L, acc, t1 - t0, j->width, j->o0, j->y + (size_t)t0 * L->w.out + j->o0);
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

/* Row r's codes and scales of an embedding table, read from the file into buf (s->row_buf, room
 * for either table's row and scales) when the table is in the file mapping. Each prompt token touches other
 * rows of E2B's 1.2 GB of embedding tables; read through the mapping, every row's pages (a whole
 * large folio of the page cache at a time, on recent kernels) would stay in the resident set for
 * good: a 2,048-token prompt took g4 bench's peak RSS from 0.80 to 1.13 GiB, above the 0.9 target.
 * Tables in memory (a tied lm_head's resident copy), or a failed read, use the memory itself. */
static void embedding_row_bytes(const g4_model *m, const g4_qembedding *e, int r, uint8_t *buf, const uint8_t **codes,
                                const uint8_t **scales) {
    size_t sb = (size_t)e->nblocks * 4;
    *codes = e->codes + (size_t)r * e->row_bytes;
    *scales = e->scale->data + (size_t)r * sb;
    if (g4_st_pread(&m->st, *codes, e->row_bytes, buf) == 0) *codes = buf;
    if (g4_st_pread(&m->st, *scales, sb, buf + e->row_bytes) == 0) *scales = buf + e->row_bytes;
}

/* Dequantized row r of an embedding table, times `mult` (buf: see embedding_row_bytes). */
static void embedding_row(const g4_model *m, const g4_qembedding *e, int r, float mult, uint8_t *buf, float *out) {
    const uint8_t *codes, *scales;
    embedding_row_bytes(m, e, r, buf, &codes, &scales);
    int block = e->cols / e->nblocks;
    for (int c = 0; c < e->cols; c++) {
        float scale = g4_load_f32(scales + 4 * (c / block));
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
 * before the consumer layers (forward_rows), so their consumer inputs are left zero instead of
 * projected. A single row that every layer sees (a decode step) may leave its projection
 * pending (see ple_item). */
static void embed_tokens(g4_session *s, const int32_t *ids, int n, int cut) {
    const g4_model *m = s->m;
    const g4_config *c = &m->cfg;
    int H = c->hidden, P = c->ple_dim, LP = c->n_layers * P;
    for (int t = 0; t < n; t++) {
        embedding_row(m, &m->embed, ids[t], m->embed_scale, s->row_buf, s->x + (size_t)t * H);
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

static kv_cache *kv_of(const g4_session *s, int seq, int layer) { return &s->kv[(size_t)seq * s->m->cfg.n_layers + layer]; }

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

/* Whether the session quantizes the lm_head input with a static scale (point G3): an lm_head
 * with an input_activation_scale, with the linear points on. The published checkpoint's scale
 * is 0, so its lm_head input stays float. */
static int lm_head_static_input(const g4_session *s) { return s->q_linear && s->m->lm_head.s_in != 0; }

/* The lm_head of rows [first, n) of xn into logits, softcapped. */
static void lm_head_logits(g4_session *s, int n, int first, float *logits) {
    const g4_model *m = s->m;
    const g4_linear *L = &m->lm_head;
    int H = m->cfg.hidden, V = m->cfg.vocab;
    if (s->o.lmhead_dynamic_q8 && !lm_head_static_input(s) && L->w.bits != 16) {
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

/* Shortcut calls (greedy or top-k) that take the two digit rows after the one-row image left a
 * call unsettled. */
#define ARGMAX_HOLD 64

/* The shortcuts below apply to a float lm_head input against packed codes (the checkpoint's), as
 * the full path computes it (no run-time input quantization, no activation scales). */
static int lm_head_shortcut_applies(const g4_session *s) {
    const g4_linear *L = &s->m->lm_head;
    return !s->o.lmhead_dynamic_q8 && L->w.bits != 16 && !(s->q_linear && (L->s_in != 0 || L->s_out != 0));
}

/* The shortcut's scratch for `rows` rows, kept for the session (decode would otherwise map ~1 MB
 * a token); NULL when it cannot grow (the kernel then allocates its own). */
static void *lm_head_scratch(g4_session *s, int rows) {
    size_t need = g4_codes_f32_argmax_scratch(&s->m->lm_head.w, rows);
    if (need > s->argmax_bytes) {
        void *p = realloc(s->argmax_scratch, need);
        if (p) s->argmax_scratch = p, s->argmax_bytes = need;
    }
    return need <= s->argmax_bytes ? s->argmax_scratch : NULL;
}

static float lm_head_cap(const g4_session *s) { return s->m->cfg.final_softcap > 0 ? (float)s->m->cfg.final_softcap : 0; }

/* The one-row image is the cheaper coarse image; when it leaves a call unsettled (an outlier in
 * the activations can widen its bounds past any use), the sequence's next ARGMAX_HOLD calls take
 * the two digit rows, whose bounds stay tight, before the cheaper one is tried again. The state is
 * each sequence's own and a g4_decode call reads it once, at its start (begin_call), so that what
 * a row gets never depends on the other rows of the batch. */
static int lm_head_coarse(const g4_session *s, int seq) { return s->argmax_hold[seq] > 0 ? 2 : 1; }

static void lm_head_coarse_done(g4_session *s, int seq, int coarse, int unsettled) {
    if (coarse == 2) s->argmax_hold[seq]--;
    else if (unsettled) s->argmax_hold[seq] = ARGMAX_HOLD;
}

/* The greedy token of rows [first, n) of xn into next, as g4_argmax over their logits would pick
 * it. When the lm_head takes float rows against packed codes (the checkpoint's), most logits are
 * never finished (g4_codes_f32_argmax with the coarse image `coarse`); unsettled[t] marks the rows
 * it could not decide. Those, and every row of other lm_heads, go through the full logits in
 * s->logit_row. Returns whether the shortcut ran. */
static int lm_head_argmax(g4_session *s, int n, int first, int coarse, int32_t *next, unsigned char *unsettled) {
    const g4_model *m = s->m;
    int H = m->cfg.hidden, V = m->cfg.vocab, ran = lm_head_shortcut_applies(s);
    for (int t = 0; t < n - first; t++) next[t] = -1;
    if (ran)
        g4_codes_f32_argmax(&m->lm_head.w, s->xn + (size_t)first * H, n - first, lm_head_cap(s), coarse, s->k->matmul_i8, next,
                            lm_head_scratch(s, n - first));
    for (int t = first; t < n; t++) {
        unsettled[t - first] = ran && next[t - first] < 0;
        if (next[t - first] >= 0) continue;
        lm_head_logits(s, t + 1, t, s->logit_row);
        next[t - first] = g4_argmax(s->logit_row, V);
    }
    return ran;
}

/* The candidates of xn row `row` for c (g4_candidates), through the same shortcut as
 * lm_head_argmax with the coarse image `coarse`; c->n = -1 when it does not apply or cannot tell.
 * Returns whether the shortcut ran. */
static int lm_head_top(g4_session *s, int row, int coarse, g4_candidates *c) {
    const g4_model *m = s->m;
    const g4_linear *L = &m->lm_head;
    c->n = -1;
    if (!lm_head_shortcut_applies(s) || c->k < 1 || c->k > L->w.out) return 0;
    c->n = g4_codes_f32_top(&L->w, s->xn + (size_t)row * m->cfg.hidden, lm_head_cap(s), c->k, c->extra, c->n_extra > 0 ? c->n_extra : 0,
                            coarse, s->k->matmul_i8, c->ids, c->logits, c->cap, &c->bound, lm_head_scratch(s, 1));
    return 1;
}

/* ---- a chunk of batch rows ---- */

/* The rows of a chunk in the order they are computed: the rows that ask for nothing first (they
 * stop before the tail layers), then one group per output, so that each group is one contiguous
 * range of rows through the lm_head; greedy rows are grouped by the coarse image their sequence
 * uses. The order changes no bit: rows are computed independently, and attention reads the
 * cache, which every row of the chunk has written before any row attends. */
enum { GROUP_NONE, GROUP_LOGITS, GROUP_ARGMAX_1, GROUP_ARGMAX_2, GROUP_TOP, N_GROUPS };

typedef struct {
    g4_batch_row *rows;      /* the whole batch */
    int n;                   /* rows in the chunk */
    int start[N_GROUPS + 1]; /* group g holds chunk rows [start[g], start[g + 1]) */
    int at[CHUNK];           /* the batch row of each chunk row */
    int32_t ids[CHUNK];
} chunk_plan;

static int row_group(const g4_session *s, const g4_batch_row *r) {
    switch (r->output) {
    case G4_OUTPUT_LOGITS: return GROUP_LOGITS;
    case G4_OUTPUT_ARGMAX: return s->call_coarse[r->seq] == 2 ? GROUP_ARGMAX_2 : GROUP_ARGMAX_1;
    case G4_OUTPUT_TOP: return GROUP_TOP;
    default: return GROUP_NONE;
    }
}

static g4_batch_row *chunk_row(const chunk_plan *p, int t) { return &p->rows[p->at[t]]; }

/* Orders batch rows [b0, b0 + n) into groups (stable within each) and gives each row its
 * sequence's next position: a sequence's rows take consecutive positions in batch order. */
static void plan_chunk(g4_session *s, g4_batch_row *rows, int b0, int n, chunk_plan *p) {
    int fill[N_GROUPS] = {0};
    p->rows = rows;
    p->n = n;
    for (int i = b0; i < b0 + n; i++) {
        fill[row_group(s, &rows[i])]++;
        s->seq_rank[rows[i].seq] = 0;
    }
    p->start[0] = 0;
    for (int g = 0; g < N_GROUPS; g++) {
        p->start[g + 1] = p->start[g] + fill[g];
        fill[g] = p->start[g];
    }
    for (int i = b0; i < b0 + n; i++) {
        int t = fill[row_group(s, &rows[i])]++, q = rows[i].seq;
        p->at[t] = i;
        p->ids[t] = rows[i].token;
        s->row_seq[t] = q;
        s->row_pos[t] = s->seq_pos[q] + s->seq_rank[q]++;
    }
}

static void note_shortcut(g4_session *s, int seq, int ran, int unsettled) {
    s->call_ran[seq] |= (unsigned char)ran;
    s->call_unsettled[seq] |= (unsigned char)unsettled;
}

/* The logits of the GROUP_LOGITS rows (chunk row t is row t - shift of xn): each run of rows whose
 * buffers follow one another in memory takes one pass over the lm_head. */
static void logits_rows(g4_session *s, const chunk_plan *p, int shift) {
    size_t V = (size_t)s->m->cfg.vocab;
    int end = p->start[GROUP_LOGITS + 1];
    for (int a = p->start[GROUP_LOGITS], b; a < end; a = b) {
        float *out = chunk_row(p, a)->logits;
        for (b = a + 1; b < end && chunk_row(p, b)->logits == out + (size_t)(b - a) * V; b++) {}
        lm_head_logits(s, b - shift, a - shift, out);
        if (s->trace) {
            int shape[1] = {(int)V};
            s->trace(s->trace_user, "logits", s->row_pos[a - shift], b - a, 1, shape, out);
        }
    }
}

/* The greedy tokens of one greedy group, all with the coarse image `coarse`. */
static void argmax_rows(g4_session *s, const chunk_plan *p, int shift, int group, int coarse) {
    int a = p->start[group], b = p->start[group + 1];
    if (a == b) return;
    int32_t next[CHUNK];
    unsigned char unsettled[CHUNK];
    int ran = lm_head_argmax(s, b - shift, a - shift, coarse, next, unsettled);
    for (int t = a; t < b; t++) {
        g4_batch_row *r = chunk_row(p, t);
        r->argmax = next[t - a];
        note_shortcut(s, r->seq, ran, unsettled[t - a]);
    }
}

static void top_rows(g4_session *s, const chunk_plan *p, int shift) {
    for (int t = p->start[GROUP_TOP]; t < p->start[GROUP_TOP + 1]; t++) {
        g4_batch_row *r = chunk_row(p, t);
        int ran = lm_head_top(s, t - shift, s->call_coarse[r->seq], r->top);
        note_shortcut(s, r->seq, ran, ran && r->top->n < 0);
    }
}

/* Keeps the final-normed rows of the greedy and top groups, which come last, for
 * g4_decode_logits (check_batch made room for them). */
static void keep_hidden(g4_session *s, const chunk_plan *p, int shift) {
    size_t H = (size_t)s->m->cfg.hidden;
    for (int t = p->start[GROUP_ARGMAX_1]; t < p->start[N_GROUPS]; t++) {
        memcpy(s->kept + (size_t)s->n_kept * H, s->xn + (size_t)(t - shift) * H, sizeof *s->kept * H);
        s->kept_row[s->n_kept++] = p->at[t];
    }
}

/* Final norm of the n rows left in the chunk, then each group's output. */
static void output_head(g4_session *s, const chunk_plan *p, int n, int shift) {
    const g4_model *m = s->m;
    rmsnorm_rows(s->xn, s->x, m->final_norm, n, m->cfg.hidden, (float)m->cfg.rms_eps);
    trace(s, "final_norm", n, m->cfg.hidden, 0, s->xn);
    logits_rows(s, p, shift);
    argmax_rows(s, p, shift, GROUP_ARGMAX_1, 1);
    argmax_rows(s, p, shift, GROUP_ARGMAX_2, 2);
    top_rows(s, p, shift);
    keep_hidden(s, p, shift);
}

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

/* Computes the chunk p plans. The rows that ask for nothing skip the consumer layers
 * (tail_from), unless a trace wants every row of every layer. */
static void forward_chunk(g4_session *s, const chunk_plan *p) {
    double t0 = s->profiling ? clock_s() : 0;
    int n = p->n, cut = s->trace ? 0 : p->start[GROUP_LOGITS]; /* rows [0, cut) stop at tail_from */
    int shift = 0;                                               /* chunk row t is row t - shift from then on */
    {
        PROF_BEGIN(s);
        embed_tokens(s, p->ids, n, cut);
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
        /* the lm_head's own time is counted here, not as a layer linear */
        double before = s->prof[G4_PROF_LINEAR];
        PROF_BEGIN(s);
        output_head(s, p, n, shift);
        PROF_END(s, G4_PROF_LM_HEAD);
        s->prof[G4_PROF_LINEAR] = before;
    }
    if (s->profiling) s->prof_total += clock_s() - t0;
}

static int check_ids(const g4_session *s, const int32_t *ids, int n) {
    const g4_config *c = &s->m->cfg;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab || ids[i] >= c->vocab_ple)
            return g4_fail("token id %d is outside the vocabulary (0..%d)", ids[i], c->vocab - 1);
    return 0;
}

/* The greedy path's one row of full logits, allocated on its first use. */
static int ensure_logit_row(g4_session *s) {
    if (!s->logit_row) s->logit_row = malloc(sizeof *s->logit_row * (size_t)s->m->cfg.vocab);
    return s->logit_row ? 0 : g4_fail("out of memory for a row of logits");
}

/* Room for the hidden state of n kept rows (keep_hidden). */
static int ensure_kept(g4_session *s, int n) {
    if (n <= s->cap_kept) return 0;
    float *kept = realloc(s->kept, sizeof *kept * (size_t)n * (size_t)s->m->cfg.hidden);
    if (kept) s->kept = kept;
    int *rows = kept ? realloc(s->kept_row, sizeof *rows * (size_t)n) : NULL;
    if (rows) s->kept_row = rows;
    if (!kept || !rows) return g4_fail("out of memory for %d rows of hidden state", n);
    s->cap_kept = n;
    return 0;
}

/* Everything g4_decode could fail on, checked before any row is computed. */
static int check_batch(g4_session *s, const g4_batch_row *rows, int n) {
    if (n <= 0) return g4_fail("no tokens to evaluate");
    int greedy = 0, kept = 0;
    for (int i = 0; i < n; i++) {
        const g4_batch_row *r = &rows[i];
        if (r->seq < 0 || r->seq >= s->n_seq) return g4_fail("sequence %d does not exist (the session has %d)", r->seq, s->n_seq);
        if (check_ids(s, &r->token, 1) != 0) return -1;
        if (r->output == G4_OUTPUT_LOGITS && !r->logits) return g4_fail("batch row %d asks for logits and gives no room for them", i);
        if (r->output == G4_OUTPUT_TOP && (!r->top || r->top->cap < 0 || (r->top->cap > 0 && (!r->top->ids || !r->top->logits))))
            return g4_fail("batch row %d asks for candidates and gives no room for them", i);
        if (r->output < G4_OUTPUT_NONE || r->output > G4_OUTPUT_TOP) return g4_fail("batch row %d: unknown output %d", i, (int)r->output);
        greedy |= r->output == G4_OUTPUT_ARGMAX;
        kept += r->output == G4_OUTPUT_ARGMAX || r->output == G4_OUTPUT_TOP;
        s->seq_rank[r->seq] = 0;
    }
    for (int i = 0; i < n; i++) {
        int q = rows[i].seq, pos = s->seq_pos[q];
        if (++s->seq_rank[q] == s->o.ctx - pos + 1)
            return g4_fail("sequence %d: tokens at position %d run past the context of %d tokens (--ctx)", q, pos, s->o.ctx);
    }
    if (greedy && ensure_logit_row(s) != 0) return -1;
    return ensure_kept(s, kept);
}

/* Each sequence's coarse image for this call, read once (lm_head_coarse); no shortcut ran yet. */
static void begin_call(g4_session *s) {
    for (int q = 0; q < s->n_seq; q++) {
        s->call_coarse[q] = lm_head_coarse(s, q);
        s->call_ran[q] = s->call_unsettled[q] = 0;
    }
    s->n_kept = 0;
}

static void end_call(g4_session *s) {
    for (int q = 0; q < s->n_seq; q++)
        if (s->call_ran[q]) lm_head_coarse_done(s, q, s->call_coarse[q], s->call_unsettled[q]);
}

int g4_decode(g4_session *s, g4_batch_row *rows, int n) {
    if (check_batch(s, rows, n) != 0) return -1;
    begin_call(s);
    for (int b0 = 0; b0 < n; b0 += CHUNK) {
        int len = n - b0 < CHUNK ? n - b0 : CHUNK;
        chunk_plan p;
        plan_chunk(s, rows, b0, len, &p);
        forward_chunk(s, &p);
        for (int i = b0; i < b0 + len; i++) s->seq_pos[rows[i].seq]++;
    }
    end_call(s);
    return 0;
}

/* The logits of kept row k, from its hidden state put back into xn. */
static void kept_logits(g4_session *s, int k, float *logits) {
    size_t H = (size_t)s->m->cfg.hidden;
    memcpy(s->xn, s->kept + (size_t)k * H, sizeof *s->xn * H);
    lm_head_logits(s, 1, 0, logits);
}

int g4_decode_logits(g4_session *s, int row, float *logits) {
    for (int k = 0; k < s->n_kept; k++)
        if (s->kept_row[k] == row) {
            kept_logits(s, k, logits);
            return 0;
        }
    return g4_fail("row %d of the last g4_decode call asked for no greedy token or candidates", row);
}

/* ---- the compatibility forms: each feeds g4_decode a chunk of rows at a time ---- */

/* n tokens of sequence seq; the last one's logits, greedy token (next) or candidates (top), or
 * every one's logits (all_logits). */
static int eval_seq(g4_session *s, int seq, const int32_t *ids, int n, float *logits, int all_logits, int32_t *next, g4_candidates *top) {
    if (seq < 0 || seq >= s->n_seq) return g4_fail("sequence %d does not exist (the session has %d)", seq, s->n_seq);
    if (n <= 0) return g4_fail("no tokens to evaluate");
    int pos = s->seq_pos[seq];
    if (n > s->o.ctx - pos) return g4_fail("%d tokens at position %d run past the context of %d tokens (--ctx)", n, pos, s->o.ctx);
    if (check_ids(s, ids, n) != 0) return -1;
    size_t V = (size_t)s->m->cfg.vocab;
    g4_batch_row rows[CHUNK];
    for (int done = 0; done < n;) {
        int len = n - done < CHUNK ? n - done : CHUNK, last = done + len == n;
        for (int t = 0; t < len; t++) {
            rows[t] = (g4_batch_row){.seq = seq, .token = ids[done + t]};
            if (logits && all_logits) rows[t].output = G4_OUTPUT_LOGITS, rows[t].logits = logits + (size_t)(done + t) * V;
        }
        g4_batch_row *end = &rows[len - 1];
        if (last && logits && !all_logits) end->output = G4_OUTPUT_LOGITS, end->logits = logits;
        else if (last && next) end->output = G4_OUTPUT_ARGMAX;
        else if (last && top) end->output = G4_OUTPUT_TOP, end->top = top;
        if (g4_decode(s, rows, len) != 0) return -1;
        if (last && next) *next = end->argmax;
        done += len;
    }
    return 0;
}

int g4_session_eval_seq(g4_session *s, int seq, const int32_t *ids, int n, float *logits, int all_logits) {
    return eval_seq(s, seq, ids, n, logits, all_logits, NULL, NULL);
}

int g4_session_eval(g4_session *s, const int32_t *ids, int n, float *logits, int all_logits) {
    return eval_seq(s, 0, ids, n, logits, all_logits, NULL, NULL);
}

int g4_session_eval_argmax_seq(g4_session *s, int seq, const int32_t *ids, int n, int32_t *next) {
    return eval_seq(s, seq, ids, n, NULL, 0, next, NULL);
}

int g4_session_eval_argmax(g4_session *s, const int32_t *ids, int n, int32_t *next) {
    return eval_seq(s, 0, ids, n, NULL, 0, next, NULL);
}

int g4_session_eval_top(g4_session *s, const int32_t *ids, int n, int k, const int32_t *extra, int n_extra, int32_t *cand, float *vals,
                        int max_cand, float *bound, int *n_cand) {
    g4_candidates c = {.k = k, .extra = extra, .n_extra = n_extra, .ids = cand, .logits = vals, .cap = max_cand, .n = -1, .bound = *bound};
    int rc = eval_seq(s, 0, ids, n, NULL, 0, NULL, &c);
    *n_cand = c.n;
    *bound = c.bound;
    return rc;
}

int g4_session_last_logits(g4_session *s, float *logits) {
    if (s->n_kept == 0) return g4_fail("no token evaluated by g4_session_eval_top to give the logits of");
    kept_logits(s, s->n_kept - 1, logits);
    return 0;
}

/* One token of each of n distinct sequences, with every row's logits or greedy token. */
static int eval_batch(g4_session *s, const int *seqs, const int32_t *ids, int n, float *logits, int32_t *next) {
    if (n <= 0 || n > CHUNK) return g4_fail("a batch step takes 1 to %d tokens, not %d", CHUNK, n);
    g4_batch_row rows[CHUNK];
    for (int t = 0; t < n; t++) {
        int q = seqs[t];
        if (q < 0 || q >= s->n_seq) return g4_fail("sequence %d does not exist (the session has %d)", q, s->n_seq);
        for (int u = 0; u < t; u++)
            if (seqs[u] == q) return g4_fail("sequence %d appears twice in one batch step", q);
        if (s->seq_pos[q] >= s->o.ctx) return g4_fail("sequence %d is at the end of its context of %d tokens (--ctx)", q, s->o.ctx);
        rows[t] = (g4_batch_row){.seq = q, .token = ids[t]};
        if (logits) rows[t].output = G4_OUTPUT_LOGITS, rows[t].logits = logits + (size_t)t * (size_t)s->m->cfg.vocab;
        else if (next) rows[t].output = G4_OUTPUT_ARGMAX;
    }
    if (g4_decode(s, rows, n) != 0) return -1;
    for (int t = 0; next && t < n; t++) next[t] = rows[t].argmax;
    return 0;
}

int g4_session_eval_batch(g4_session *s, const int *seqs, const int32_t *ids, int n, float *logits) {
    return eval_batch(s, seqs, ids, n, logits, NULL);
}

int g4_session_eval_batch_argmax(g4_session *s, const int *seqs, const int32_t *ids, int n, int32_t *next) {
    return eval_batch(s, seqs, ids, n, NULL, next);
}

/* The first index of the largest value, NaNs never winning, except that a NaN at index 0 wins
 * (nothing compares greater than it): the plain loop's answer. Eight lanes (i mod 8) keep
 * independent running maxima so the compares do not wait on each other; ties between lanes go to
 * the smaller index. */
int g4_argmax(const float *logits, int n) {
    if (n <= 0 || isnan(logits[0])) return 0;
    float mv[8];
    int mi[8];
    for (int l = 0; l < 8; l++) mv[l] = -INFINITY, mi[l] = -1;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            if (logits[i + l] > mv[l]) mv[l] = logits[i + l], mi[l] = i + l;
    for (; i < n; i++)
        if (logits[i] > mv[i & 7]) mv[i & 7] = logits[i], mi[i & 7] = i;
    int best = -1;
    for (int l = 0; l < 8; l++)
        if (mi[l] >= 0 && (best < 0 || mv[l] > logits[best] || (mv[l] == logits[best] && mi[l] < best))) best = mi[l];
    return best < 0 ? 0 : best; /* every value -inf or NaN: index 0, as the plain loop */
}

static void *alloc_or_flag(size_t bytes, int *ok) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) *ok = 0;
    return p;
}
#define ALLOC(ptr, count, ok) ((ptr) = alloc_or_flag(sizeof *(ptr) * (size_t)(count), (ok)))

/* Resolves the options into the switches the forward pass reads. */
static int resolve_options(g4_session *s) {
    const g4_options *o = &s->o;
    if (o->act < G4_ACT_FLOAT || o->act > G4_ACT_INT) return g4_fail("unknown activation mode %d", (int)o->act);
    int quantized = o->act != G4_ACT_FLOAT;
    s->q_linear = quantized && o->linear_quant;
    s->q_kv = quantized && o->kv_quant;
    s->q_pmp = quantized && o->pmp_quant;
    if (o->lmhead_dynamic_q8 && lm_head_static_input(s))
        g4_warn("--lmhead-dynamic-q8 has no effect: lm_head.input_activation_scale is %g, a static input quantization that takes precedence",
                s->m->lm_head.s_in);
    g4_options resolved = *o;
    g4_options_resolve(&resolved); /* what the engine chooses is decided in one place (options.c) */
    if (resolved.round != G4_ROUND_EVEN && resolved.round != G4_ROUND_AWAY) return g4_fail("unknown rounding rule %d", (int)o->round);
    if (resolved.qdiv != G4_QDIV_RECIPROCAL && resolved.qdiv != G4_QDIV_DIVIDE) return g4_fail("unknown quantizer division %d", (int)o->qdiv);
    s->round = resolved.round;
    s->qdiv = resolved.qdiv;
    if (s->q_pmp) {
        g4_quantizer q;
        if (g4_quantizer_init(&q, o->pmp_s_in, 0, s->round, s->qdiv) || g4_quantizer_init(&q, o->pmp_s_out, 0, s->round, s->qdiv))
            return g4_fail("--pmp-scales: %s", g4_last_error());
    }
    return 0;
}

/* L's per-row requantization table, when it runs in integers with a quantized output. */
static int build_requant_table(g4_session *s, const g4_linear *L) {
    if (!runs_int(s, L) || L->s_out == 0) return 0;
    g4_requant *rq = malloc(sizeof *rq * (size_t)L->w.out);
    if (!rq) return g4_fail("out of memory for requantization tables");
    /* every rule is validated the same way; f32 then keeps only its multipliers (4 bytes a row) */
    int rc = g4_requant_init_rows(rq, (size_t)L->w.out, s->o.requant, L->s_in, L->w.w_scale, L->s_out, 0);
    if (rc == 0 && s->o.requant == G4_REQUANT_F32) {
        float *m32 = malloc(sizeof *m32 * (size_t)L->w.out);
        if (!m32) rc = g4_fail("out of memory for requantization tables");
        for (int o = 0; m32 && o < L->w.out; o++) m32[o] = rq[o].scale_f32;
        s->rq_f32[L->id] = m32;
        free(rq);
        rq = NULL;
    }
    s->rq[L->id] = rq;
    return rc != 0 ? g4_fail("%s: %s", L->name, g4_last_error()) : 0;
}

/* Per-row requantization tables for every linear that runs in integers: the layer linears, and
 * an lm_head with activation scales (points G3/G4; the published checkpoint's are 0, so its
 * lm_head stays float). */
static int build_requant_tables(g4_session *s) {
    const g4_model *m = s->m;
    s->rq = calloc((size_t)(m->n_linears > 0 ? m->n_linears : 1), sizeof *s->rq);
    s->rq_f32 = calloc((size_t)(m->n_linears > 0 ? m->n_linears : 1), sizeof *s->rq_f32);
    if (!s->rq || !s->rq_f32) return g4_fail("out of memory for requantization tables");
    if (s->o.requant < G4_REQUANT_F32 || s->o.requant > G4_REQUANT_TFL_REF) return g4_fail("unknown requant rule %d", (int)s->o.requant);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const g4_linear *lins[9];
        int count = g4_layer_linears(&m->layers[l], g4_layer_is_producer(m, l), lins);
        for (int i = 0; i < count; i++)
            if (build_requant_table(s, lins[i]) != 0) return -1;
    }
    return build_requant_table(s, &m->lm_head);
}

/* The per-linear row counts of probe.h (g4_session_linear_rows). */
static int alloc_linear_counts(g4_session *s) {
    size_t n = (size_t)(s->m->n_linears > 0 ? s->m->n_linears : 1);
    s->rows_int = calloc(n, sizeof *s->rows_int);
    s->rows_float = calloc(n, sizeof *s->rows_float);
    return s->rows_int && s->rows_float ? 0 : g4_fail("out of memory for the session");
}

/* Bytes of memory the system can still give (MemAvailable), or 0 when unknown; the environment
 * variable G4_MEMORY_LIMIT_MB caps it (to keep g4 within a budget on a shared machine). */
static double available_memory(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    double bytes = kb * 1024;
    const char *limit = getenv("G4_MEMORY_LIMIT_MB");
    if (limit && *limit) {
        double mb = atof(limit) * 1048576;
        if (mb > 0 && (bytes == 0 || mb < bytes)) bytes = mb;
    }
    return bytes;
}

/* The KV cache's size, checked against the memory available before anything is allocated. */
static int check_kv_memory(const g4_session *s) {
    const g4_model *m = s->m;
    double bytes = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const g4_layer *L = &m->layers[l];
        if (!g4_layer_is_producer(m, l)) continue;
        double width = (double)L->n_kv_heads * L->head_dim;
        bytes += width * (s->q_kv && L->k_cache_scale != 0 ? 1 : 4) + width * (s->q_kv && L->v_cache_scale != 0 ? 1 : 4);
    }
    bytes *= (double)s->o.ctx * s->n_seq;
    double avail = available_memory();
    if (avail > 0 && bytes > avail)
        return g4_fail("the KV cache for %d sequence(s) of %d tokens (--ctx) needs %.0f MiB, but only %.0f MiB of memory are available",
                       s->n_seq, s->o.ctx, bytes / 1048576, avail / 1048576);
    return 0;
}

/* K/V storage for each producer: int8 codes where the point is quantized with a non-zero scale. */
static int alloc_kv(g4_session *s) {
    const g4_model *m = s->m;
    int ok = 1;
    if (check_kv_memory(s) != 0) return -1;
    s->kv = calloc((size_t)(unsigned)m->cfg.n_layers * (size_t)s->n_seq, sizeof *s->kv);
    if (!s->kv) return g4_fail("out of memory for the KV cache");
    for (int i = 0; i < m->cfg.n_layers * s->n_seq && ok; i++) {
        int l = i % m->cfg.n_layers;
        const g4_layer *L = &m->layers[l];
        if (!g4_layer_is_producer(m, l)) continue;
        kv_cache *c = &s->kv[i];
        size_t len = (size_t)s->o.ctx * L->n_kv_heads * L->head_dim;
        c->k_scale = s->q_kv ? L->k_cache_scale : 0;
        c->v_scale = s->q_kv ? L->v_cache_scale : 0;
        if (c->k_scale != 0) ALLOC(c->kq, len, &ok);
        else ALLOC(c->kf, len, &ok);
        if (c->v_scale != 0) ALLOC(c->vq, len, &ok);
        else ALLOC(c->vf, len, &ok);
    }
    if (!ok) return g4_fail("out of memory for a KV cache of %d tokens", s->o.ctx);
    return 0;
}

static int alloc_scratch(g4_session *s) {
    const g4_config *c = &s->m->cfg;
    int H = c->hidden, LP = c->n_layers * c->ple_dim, ok = 1;
    int max_q = 0, max_kv = 0, max_mlp = 0, max_hd = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const g4_layer *ly = &s->m->layers[l];
        if (c->n_heads * ly->head_dim > max_q) max_q = c->n_heads * ly->head_dim;
        if (ly->n_kv_heads * ly->head_dim > max_kv) max_kv = ly->n_kv_heads * ly->head_dim;
        if (ly->mlp_dim > max_mlp) max_mlp = ly->mlp_dim;
        if (ly->head_dim > max_hd) max_hd = ly->head_dim;
    }
    int max_in = H > max_q ? H : max_q; /* widest input or output of a layer linear */
    if (max_mlp > max_in) max_in = max_mlp;
    ALLOC(s->x, CHUNK * H, &ok);
    ALLOC(s->xn, CHUNK * H, &ok);
    ALLOC(s->xq, CHUNK * max_in, &ok);
    ALLOC(s->xcodes, CHUNK * max_in, &ok);
    s->acc_len = (size_t)CHUNK * (size_t)max_in;
    ALLOC(s->acc, s->acc_len, &ok);
    ALLOC(s->q, CHUNK * max_q, &ok);
    ALLOC(s->kk, CHUNK * max_kv, &ok);
    ALLOC(s->vv, CHUNK * max_kv, &ok);
    ALLOC(s->att, CHUNK * max_q, &ok);
    ALLOC(s->proj, CHUNK * H, &ok);
    ALLOC(s->gate, CHUNK * max_mlp, &ok);
    ALLOC(s->up, CHUNK * max_mlp, &ok);
    ALLOC(s->pli, CHUNK * LP, &ok);
    ALLOC(s->ple_tok, CHUNK * LP, &ok);
    const g4_qembedding *tables[2] = {&s->m->embed, &s->m->embed_ple};
    size_t row_buf = 0;
    for (int t = 0; t < 2; t++)
        if (tables[t]->row_bytes + (size_t)tables[t]->nblocks * 4 > row_buf) row_buf = tables[t]->row_bytes + (size_t)tables[t]->nblocks * 4;
    ALLOC(s->row_buf, row_buf, &ok);
    ALLOC(s->plg, CHUNK * c->ple_dim, &ok);
    ALLOC(s->pmp_in, H, &ok);
    for (int t = 0; t < 2; t++) {
        ALLOC(s->rope_cos[t], CHUNK * max_hd / 2, &ok);
        ALLOC(s->rope_sin[t], CHUNK * max_hd / 2, &ok);
    }
    return ok ? 0 : g4_fail("out of memory for the session's buffers");
}

g4_session *g4_session_new(const g4_model *m, const g4_options *o) {
    const g4_config *c = &m->cfg;
    if (o->ctx < 1 || o->ctx > c->max_positions) {
        g4_fail("--ctx %d: must be between 1 and %d (max_position_embeddings)", o->ctx, c->max_positions);
        return NULL;
    }
    g4_session *s = calloc(1, sizeof *s);
    if (!s) {
        g4_fail("out of memory for the session");
        return NULL;
    }
    s->m = m;
    s->o = *o;
    s->k = g4_kernels_get();
    s->n_seq = o->n_seq > 0 ? o->n_seq : 1;
    if (s->n_seq > CHUNK) {
        g4_session_free(s);
        g4_fail("--batch %d: at most %d sequences", o->n_seq, CHUNK);
        return NULL;
    }
    for (s->tail_from = c->n_layers; s->tail_from > 0 && !g4_layer_is_producer(m, s->tail_from - 1);) s->tail_from--;
    size_t nq = (size_t)s->n_seq;
    s->seq_pos = calloc(nq, sizeof *s->seq_pos);
    s->argmax_hold = calloc(nq, sizeof *s->argmax_hold);
    s->call_coarse = calloc(nq, sizeof *s->call_coarse);
    s->seq_rank = calloc(nq, sizeof *s->seq_rank);
    s->call_ran = calloc(nq, 1);
    s->call_unsettled = calloc(nq, 1);
    if (!s->seq_pos || !s->argmax_hold || !s->call_coarse || !s->seq_rank || !s->call_ran || !s->call_unsettled) {
        g4_session_free(s);
        g4_fail("out of memory for the session");
        return NULL;
    }
    if (resolve_options(s) || build_requant_tables(s) || alloc_linear_counts(s) || alloc_kv(s) || alloc_scratch(s)) {
        g4_session_free(s);
        return NULL;
    }
    return s;
}

void g4_session_free(g4_session *s) {
    if (!s) return;
    int L = s->m->cfg.n_layers;
    for (int i = 0; s->kv && i < L * s->n_seq; i++) {
        free(s->kv[i].kf);
        free(s->kv[i].vf);
        free(s->kv[i].kq);
        free(s->kv[i].vq);
    }
    free(s->kv);
    void *per_seq[] = {s->seq_pos, s->argmax_hold, s->call_coarse, s->seq_rank, s->call_ran, s->call_unsettled, s->kept, s->kept_row};
    for (size_t i = 0; i < sizeof per_seq / sizeof *per_seq; i++) free(per_seq[i]);
    for (int i = 0; s->rq && i < s->m->n_linears; i++) free(s->rq[i]);
    for (int i = 0; s->rq_f32 && i < s->m->n_linears; i++) free(s->rq_f32[i]);
    free(s->rq);
    free(s->rq_f32);
    free(s->rows_int);
    free(s->rows_float);
    void *bufs[] = {s->logit_row, s->argmax_scratch, s->x, s->xn, s->xq, s->xcodes, s->acc, s->q, s->kk, s->vv, s->att, s->proj, s->gate, s->up, s->pli,
                    s->ple_tok, s->plg, s->pmp_in, s->row_buf, s->rope_cos[0], s->rope_cos[1], s->rope_sin[0], s->rope_sin[1]};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(s);
}

void g4_session_set_profiling(g4_session *s, int on) {
    s->profiling = on;
    memset(s->prof, 0, sizeof s->prof);
    s->prof_total = 0;
}

void g4_session_profile(const g4_session *s, double seconds[G4_PROF_COUNT]) {
    double named = 0;
    for (int i = 0; i < G4_PROF_COUNT; i++) {
        seconds[i] = s->prof[i];
        if (i != G4_PROF_OTHER) named += s->prof[i];
    }
    seconds[G4_PROF_OTHER] = s->prof_total > named ? s->prof_total - named : 0; /* norms, RoPE, GELU, PLE block glue */
}

const char *g4_prof_op_name(g4_prof_op op) {
    static const char *names[G4_PROF_COUNT] = {"embed+ple", "linear", "attention", "lm_head", "other"};
    return op < G4_PROF_COUNT ? names[op] : "?";
}

/* A sequence starts over: its cache empty, and its shortcut state (lm_head_coarse) fresh, so that
 * what it gets does not depend on what the sequence held before. */
void g4_session_reset_seq(g4_session *s, int seq) {
    if (seq < 0 || seq >= s->n_seq) return;
    s->seq_pos[seq] = 0;
    s->argmax_hold[seq] = 0;
}
/* The cache is indexed by position, so keeping a prefix is only moving the position back: the
 * next token overwrites what followed (sliding layers read positions before their own only). */
int g4_session_truncate_seq(g4_session *s, int seq, int n) {
    if (seq < 0 || seq >= s->n_seq) return g4_fail("sequence %d does not exist (the session has %d)", seq, s->n_seq);
    if (n < 0 || n > s->seq_pos[seq]) return g4_fail("sequence %d holds %d tokens: it cannot keep %d", seq, s->seq_pos[seq], n);
    s->seq_pos[seq] = n;
    s->argmax_hold[seq] = 0;
    return 0;
}
void g4_session_reset(g4_session *s) {
    for (int i = 0; i < s->n_seq; i++) g4_session_reset_seq(s, i);
    s->n_kept = 0;
}
int g4_session_pos(const g4_session *s) { return s->seq_pos[0]; }
int g4_session_seq_pos(const g4_session *s, int seq) { return seq >= 0 && seq < s->n_seq ? s->seq_pos[seq] : -1; }
int g4_session_n_seq(const g4_session *s) { return s->n_seq; }
int g4_session_ctx(const g4_session *s) { return s->o.ctx; }
const g4_model *g4_session_model(const g4_session *s) { return s->m; }
void g4_session_set_trace(g4_session *s, g4_trace_fn fn, void *user) {
    s->trace = fn;
    s->trace_user = user;
}

/* ---- probes for the tests (probe.h) ---- */

/* The decoder-layer linear named `module`, or NULL. */
static const g4_linear *find_layer_linear(const g4_model *m, const char *module) {
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const g4_linear *lins[9];
        int count = g4_layer_linears(&m->layers[l], g4_layer_is_producer(m, l), lins);
        for (int i = 0; i < count; i++)
            if (strcmp(lins[i]->name, module) == 0) return lins[i];
    }
    return NULL;
}

int g4_session_set_kernels(g4_session *s, const char *level) {
    const g4_kernels *k = g4_kernels_level(level);
    if (!k) return -1;
    s->k = k;
    return 0;
}

int g4_session_linear_rows(const g4_session *s, const char *module, long long *int_rows, long long *float_rows) {
    const g4_model *m = s->m;
    const g4_linear *L = find_layer_linear(m, module);
    if (!L && strcmp(m->lm_head.name, module) == 0) L = &m->lm_head;
    if (!L && strcmp(m->pmp.name, module) == 0) L = &m->pmp;
    if (!L) return g4_fail("no linear named %s", module);
    *int_rows = s->rows_int[L->id];
    *float_rows = s->rows_float[L->id];
    return 0;
}

int g4_session_run_linear(g4_session *s, const char *module, const float *x, int n, float *y, int8_t *codes, int32_t *acc) {
    const g4_linear *L = find_layer_linear(s->m, module);
    if (!L) return g4_fail("no decoder-layer linear named %s", module);
    if (n < 1 || n > CHUNK) return g4_fail("%d rows: a linear takes 1 to %d", n, CHUNK);
    long long before = s->rows_int[L->id];
    linear(s, L, x, n, y);
    int ran_int = s->rows_int[L->id] != before;
    if (ran_int && codes) memcpy(codes, s->xcodes, sizeof *codes * (size_t)n * L->w.in);
    if (ran_int && acc) memcpy(acc, s->acc, sizeof *acc * (size_t)n * L->w.out);
    return ran_int;
}

const int8_t *g4_session_kv_codes(const g4_session *s, int seq, int layer, int v, float *scale, int *width) {
    const g4_model *m = s->m;
    if (seq < 0 || seq >= s->n_seq || layer < 0 || layer >= m->cfg.n_layers || !g4_layer_is_producer(m, layer)) return NULL;
    const kv_cache *c = kv_of(s, seq, layer);
    *scale = v ? c->v_scale : c->k_scale;
    *width = m->layers[layer].n_kv_heads * m->layers[layer].head_dim;
    return v ? c->vq : c->kq;
}
