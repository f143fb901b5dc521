/* One chunk of rows through the Gemma 4 text decoder (model.md §5, §7), read top to bottom: the
 * embeddings and per-layer inputs, then g4_forward_chunk, which runs the chunk through the layers
 * (layer.c), the final norm and the lm_head's outputs (lmhead.c). The session, its options and
 * buffers are session.c's; what a row asks for, decode.c's; the linear step, linear.c's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "kernels/pool.h"
#include "layer.h"
#include "linear.h"
#include "lmhead.h"
#include "quant/int8.h"
#include "quant/pack.h"
#include "session.h"

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
    if (pq && s->o.pmp_out_raw) g4_fake_quant(s, pli, len, s->o.pmp_s_out);
    float proj_scale = (float)(1.0 / sqrt((double)c->hidden)), input_scale = (float)(1.0 / sqrt(2.0));
    for (size_t i = 0; i < len; i++) pli[i] *= proj_scale;
    if (pq && !s->o.pmp_out_raw) g4_fake_quant(s, pli, len, s->o.pmp_s_out);
    g4_forward_rmsnorm_rows(pli, pli, s->m->ple_norm, (int)rows, c->ple_dim, (float)c->rms_eps);
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
    g4_trace_rows(s, "inputs_embeds", s->row_pos[0], n, H, 0, s->x);
    g4_trace_rows(s, "per_layer_inputs_token", s->row_pos[0], n, c->n_layers, P, s->ple_tok);
    /* Context part: W_pmp e, x H^-1/2, with the LiteRT graph's G1/G2 quantization when enabled. */
    /* In int mode too this linear runs in float: its weights are BF16 (activation-quant.md §6). */
    int pq = s->q_pmp;
    const float *in = s->x;
    if (pq) {
        memcpy(s->xq, s->x, sizeof *s->x * (size_t)n * H);
        g4_fake_quant(s, s->xq, (size_t)n * H, s->o.pmp_s_in);
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
    g4_trace_rows(s, "per_layer_inputs", s->row_pos[0], n, c->n_layers, P, s->pli);
}

/* ---- a chunk ---- */

/* The target's rows of a chunk through its layers: the session's buffers, rows and RoPE tables,
 * linears in the session's activation mode, traced and profiled. */
static g4_layer_rows layer_rows(g4_session *s, int n) {
    return (g4_layer_rows){.s = s, .m = s->m, .n = n, .seq = s->row_seq, .pos = s->row_pos, .x = s->x, .xn = s->xn, .q = s->q,
                           .kk = s->kk, .vv = s->vv, .att = s->att, .proj = s->proj, .gate = s->gate, .up = s->up, .plg = s->plg,
                           .pli = s->pli, .rope_cos = {s->rope_cos[0], s->rope_cos[1]}, .rope_sin = {s->rope_sin[0], s->rope_sin[1]},
                           .observe = 1, .pli_ready = ple_layer_ready};
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
    g4_rope_tables(s->m, s->row_pos, n - lo, s->rope_cos, s->rope_sin);
}

/* The final norm of the n rows left in the chunk, into xn. */
static void final_norm(g4_session *s, int n) {
    const g4_model *m = s->m;
    g4_forward_rmsnorm_rows(s->xn, s->x, m->final_norm, n, m->cfg.hidden, (float)m->cfg.rms_eps);
    g4_trace_rows(s, "final_norm", s->row_pos[0], n, m->cfg.hidden, 0, s->xn);
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
    g4_rope_tables(s->m, s->row_pos, n, s->rope_cos, s->rope_sin);
    for (int l = 0; l < s->m->cfg.n_layers; l++) {
        if (l == s->tail_from && cut > 0) {
            keep_rows(s, cut, n);
            n -= cut;
            shift = cut;
            cut = 0;
        }
        if (n == 0) break;
        g4_layer_rows io = layer_rows(s, n);
        g4_decoder_layer(&io, l);
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

/* The target's scaled input embedding of a token (embed_tokens x sqrt(hidden)): the drafter's
 * input (draft.c). */
void g4_forward_embedding(g4_session *s, int32_t id, float *out) {
    embedding_row(s->m, &s->m->embed, id, s->m->embed_scale, s->row_buf, out);
}
