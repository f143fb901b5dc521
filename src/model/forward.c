/* The Gemma 4 text decoder forward pass (model.md §5-§7) with its run state and KV cache.
 * Activations are fp32 [n tokens][width] row-major; a call processes up to CHUNK tokens at a
 * time, so prefill and decode run the same code. Quantization points follow
 * activation-quant.md §2; which ones are active is decided once, in the session options. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "quant/pack.h"
#include "util/err.h"

#define CHUNK 64

struct g4_session {
    const g4_model *m;
    g4_options o;
    const g4_kernels *k;
    int pos;
    /* K/V cache of producer layers: [ctx][n_kv_heads * head_dim]; NULL for consumers. */
    float **kc, **vc;
    /* Per-chunk scratch. */
    float *x, *xn, *xq, *q, *kk, *vv, *att, *proj, *gate, *up, *pli, *ple_tok, *plg, *scores;
    float *rope_cos[2], *rope_sin[2];
    g4_trace_fn trace;
    void *trace_user;
};

void g4_options_default(g4_options *o) {
    *o = (g4_options){.act = G4_ACT_FAKE, .linear_quant = 1, .kv_quant = 1, .pmp_quant = 1, .pmp_out_raw = 0,
                      .pmp_s_in = 0.038878f, .pmp_s_out = 0.002353f, .ctx = 4096};
}

/* ---- elementwise operations (all fp32, no quantization) ---- */

static void rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) y[i] = w ? x[i] * r * w[i] : x[i] * r;
}

/* rmsnorm over each of `rows` consecutive vectors of `width`. */
static void rmsnorm_rows(float *y, const float *x, const float *w, int rows, int width, float eps) {
    for (int r = 0; r < rows; r++) rmsnorm(y + (size_t)r * width, x + (size_t)r * width, w, width, eps);
}

static float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

/* Static-range quantization Q(x; s) = s * clamp(round_half_even(x / s), -128, 127); s = 0 is identity. */
static void srq(float *x, size_t n, float s) {
    if (s == 0) return;
    for (size_t i = 0; i < n; i++) {
        float c = nearbyintf(x[i] / s);
        c = c < -128.0f ? -128.0f : c > 127.0f ? 127.0f : c;
        x[i] = c * s;
    }
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

static float dot_f32(const float *a, const float *b, int n) {
    float acc[8] = {0};
    for (int i = 0; i < n; i++) acc[i & 7] += a[i] * b[i];
    return g4_reduce8(acc);
}

/* ---- session ---- */

static int linear_quantized(const g4_session *s) { return s->o.act != G4_ACT_FLOAT && s->o.linear_quant; }

/* y = Q(W Q(x; s_in); s_out) for n rows; the points are active only in fake/int modes. */
static void linear(g4_session *s, const g4_linear *L, const float *x, int n, float *y) {
    int q = linear_quantized(s);
    if (q && L->s_in != 0) {
        size_t len = (size_t)n * L->w.in;
        memcpy(s->xq, x, len * sizeof *x);
        srq(s->xq, len, L->s_in);
        x = s->xq;
    }
    s->k->matmul_f32(&L->w, x, n, y);
    if (q) srq(y, (size_t)n * L->w.out, L->s_out);
}

/* Reports rows [pos, pos + n) of a tensor whose rows have shape {d0} or {d0, d1}. */
static void trace(const g4_session *s, const char *name, int n, int d0, int d1, const float *data) {
    if (!s->trace) return;
    int shape[2] = {d0, d1};
    s->trace(s->trace_user, name, s->pos, n, d1 ? 2 : 1, shape, data);
}

static void trace_layer(const g4_session *s, const char *fmt, int l, int n, int d0, int d1, const float *data) {
    if (!s->trace) return;
    char name[64];
    snprintf(name, sizeof name, fmt, l);
    trace(s, name, n, d0, d1, data);
}

/* Dequantized row r of an embedding table, times `mult`. */
static void embedding_row(const g4_qembedding *e, int r, float mult, float *out) {
    const uint8_t *codes = e->codes + (size_t)r * e->row_bytes;
    const uint8_t *scales = e->scale->data + (size_t)r * e->nblocks * 4;
    int block = e->cols / e->nblocks;
    for (int c = 0; c < e->cols; c++) {
        float scale = g4_load_f32(scales + 4 * (c / block));
        out[c] = (float)g4_packed_code(codes, e->bits, (size_t)c) * scale * mult;
    }
}

/* Main embedding and the per-layer inputs pli [n][L][P] (model.md §5). */
static void embed_tokens(g4_session *s, const int32_t *ids, int n) {
    const g4_model *m = s->m;
    const g4_config *c = &m->cfg;
    int H = c->hidden, P = c->ple_dim, LP = c->n_layers * P;
    for (int t = 0; t < n; t++) {
        embedding_row(&m->embed, ids[t], m->embed_scale, s->x + (size_t)t * H);
        embedding_row(&m->embed_ple, ids[t], m->ple_embed_scale, s->ple_tok + (size_t)t * LP);
    }
    trace(s, "inputs_embeds", n, H, 0, s->x);
    trace(s, "per_layer_inputs_token", n, c->n_layers, P, s->ple_tok);
    /* Context part: W_pmp e, x H^-1/2, with the LiteRT graph's G1/G2 quantization when enabled. */
    int pq = s->o.act != G4_ACT_FLOAT && s->o.pmp_quant;
    const float *in = s->x;
    if (pq) {
        memcpy(s->xq, s->x, sizeof *s->x * (size_t)n * H);
        srq(s->xq, (size_t)n * H, s->o.pmp_s_in);
        in = s->xq;
    }
    s->k->matmul_f32(&m->pmp.w, in, n, s->pli);
    size_t len = (size_t)n * LP;
    if (pq && s->o.pmp_out_raw) srq(s->pli, len, s->o.pmp_s_out);
    float proj_scale = (float)(1.0 / sqrt((double)H)), input_scale = (float)(1.0 / sqrt(2.0));
    for (size_t i = 0; i < len; i++) s->pli[i] *= proj_scale;
    if (pq && !s->o.pmp_out_raw) srq(s->pli, len, s->o.pmp_s_out);
    rmsnorm_rows(s->pli, s->pli, m->ple_norm, n * c->n_layers, P, (float)c->rms_eps);
    for (size_t i = 0; i < len; i++) s->pli[i] = (s->pli[i] + s->ple_tok[i]) * input_scale;
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
                float angle = (float)(s->pos + t) * L->inv_freq[j];
                s->rope_cos[type][(size_t)t * h + j] = cosf(angle);
                s->rope_sin[type][(size_t)t * h + j] = sinf(angle);
            }
    }
}

/* Producer: K = rope(k_norm(W_k x)), V = v_norm(W_v x), quantized at cache write when enabled. */
static void write_kv(g4_session *s, int l, int n) {
    const g4_layer *L = &s->m->layers[l];
    int hd = L->head_dim, kvw = L->n_kv_heads * hd, h = hd / 2;
    float eps = (float)s->m->cfg.rms_eps;
    linear(s, &L->k, s->xn, n, s->kk);
    linear(s, &L->v, s->xn, n, s->vv);
    for (int t = 0; t < n; t++)
        for (int g = 0; g < L->n_kv_heads; g++) {
            float *k = s->kk + (size_t)t * kvw + g * hd, *v = s->vv + (size_t)t * kvw + g * hd;
            rmsnorm(k, k, L->k_norm, hd, eps);
            rope_apply(k, s->rope_cos[L->type] + (size_t)t * h, s->rope_sin[L->type] + (size_t)t * h, hd);
            rmsnorm(v, v, NULL, hd, eps);
        }
    if (s->o.act != G4_ACT_FLOAT && s->o.kv_quant) {
        srq(s->kk, (size_t)n * kvw, L->k_cache_scale);
        srq(s->vv, (size_t)n * kvw, L->v_cache_scale);
    }
    memcpy(s->kc[l] + (size_t)s->pos * kvw, s->kk, sizeof(float) * (size_t)n * kvw);
    memcpy(s->vc[l] + (size_t)s->pos * kvw, s->vv, sizeof(float) * (size_t)n * kvw);
    trace_layer(s, "k_layer%d", l, n, L->n_kv_heads, hd, s->kk);
    trace_layer(s, "v_layer%d", l, n, L->n_kv_heads, hd, s->vv);
}

/* Causal softmax attention of the chunk's queries over the cache of the layer's KV source;
 * sliding layers see the last `sliding_window` positions including their own. Scale 1.0. */
static void attention(g4_session *s, int l, int n) {
    const g4_layer *L = &s->m->layers[l];
    int hd = L->head_dim, nh = s->m->cfg.n_heads, kvw = L->n_kv_heads * hd, group = nh / L->n_kv_heads;
    const float *K = s->kc[L->kv_source], *V = s->vc[L->kv_source];
    for (int t = 0; t < n; t++) {
        int p = s->pos + t;
        int lo = L->type == G4_LAYER_SLIDING ? p - s->m->cfg.sliding_window + 1 : 0;
        if (lo < 0) lo = 0;
        for (int h = 0; h < nh; h++) {
            const float *q = s->q + (size_t)t * nh * hd + (size_t)h * hd;
            int g = h / group;
            float mx = -INFINITY, sum = 0;
            for (int j = lo; j <= p; j++) {
                float sc = dot_f32(q, K + (size_t)j * kvw + g * hd, hd);
                s->scores[j - lo] = sc;
                if (sc > mx) mx = sc;
            }
            for (int j = lo; j <= p; j++) sum += s->scores[j - lo] = expf(s->scores[j - lo] - mx);
            float *out = s->att + (size_t)t * nh * hd + (size_t)h * hd;
            memset(out, 0, sizeof *out * (size_t)hd);
            for (int j = lo; j <= p; j++) {
                float w = s->scores[j - lo] / sum;
                const float *v = V + (size_t)j * kvw + g * hd;
                for (int d = 0; d < hd; d++) out[d] += w * v[d];
            }
        }
    }
}

static void add_normed(float *x, float *y, const float *w, int n, int H, float eps) {
    rmsnorm_rows(y, y, w, n, H, eps);
    for (size_t i = 0; i < (size_t)n * H; i++) x[i] += y[i];
}

static void decoder_layer(g4_session *s, int l, int n) {
    const g4_model *m = s->m;
    const g4_layer *L = &m->layers[l];
    int H = m->cfg.hidden, P = m->cfg.ple_dim, nh = m->cfg.n_heads, hd = L->head_dim, h = hd / 2;
    float eps = (float)m->cfg.rms_eps;
    /* attention block */
    rmsnorm_rows(s->xn, s->x, L->ln_in, n, H, eps);
    linear(s, &L->q, s->xn, n, s->q);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < nh; i++) {
            float *q = s->q + (size_t)t * nh * hd + (size_t)i * hd;
            rmsnorm(q, q, L->q_norm, hd, eps);
            rope_apply(q, s->rope_cos[L->type] + (size_t)t * h, s->rope_sin[L->type] + (size_t)t * h, hd);
        }
    if (g4_layer_is_producer(m, l)) write_kv(s, l, n);
    attention(s, l, n);
    linear(s, &L->o, s->att, n, s->proj);
    add_normed(s->x, s->proj, L->ln_post_attn, n, H, eps);
    /* MLP block */
    rmsnorm_rows(s->xn, s->x, L->ln_pre_ffw, n, H, eps);
    linear(s, &L->gate, s->xn, n, s->gate);
    linear(s, &L->up, s->xn, n, s->up);
    for (size_t i = 0; i < (size_t)n * L->mlp_dim; i++) s->gate[i] = gelu_tanh(s->gate[i]) * s->up[i];
    linear(s, &L->down, s->gate, n, s->proj);
    add_normed(s->x, s->proj, L->ln_post_ffw, n, H, eps);
    /* per-layer-input block: gate on the raw residual stream */
    linear(s, &L->pl_gate, s->x, n, s->plg);
    for (int t = 0; t < n; t++) {
        const float *pli = s->pli + ((size_t)t * m->cfg.n_layers + l) * P;
        float *g = s->plg + (size_t)t * P;
        for (int j = 0; j < P; j++) g[j] = gelu_tanh(g[j]) * pli[j];
    }
    linear(s, &L->pl_proj, s->plg, n, s->proj);
    add_normed(s->x, s->proj, L->ln_post_pli, n, H, eps);
    for (size_t i = 0; i < (size_t)n * H; i++) s->x[i] *= L->layer_scalar;
    trace_layer(s, "hidden_after_layer%d", l, n, H, 0, s->x);
}

/* Final norm of every row; lm_head + softcap on rows [first, n). */
static void output_head(g4_session *s, int n, int first, float *logits) {
    const g4_model *m = s->m;
    int H = m->cfg.hidden, V = m->cfg.vocab;
    rmsnorm_rows(s->xn, s->x, m->final_norm, n, H, (float)m->cfg.rms_eps);
    trace(s, "final_norm", n, H, 0, s->xn);
    if (!logits) return;
    linear(s, &m->lm_head, s->xn + (size_t)first * H, n - first, logits);
    double cap = m->cfg.final_softcap;
    if (cap > 0) {
        float fc = (float)cap;
        for (size_t i = 0; i < (size_t)(n - first) * V; i++) logits[i] = fc * tanhf(logits[i] / fc);
    }
}

static int forward_chunk(g4_session *s, const int32_t *ids, int n, float *logits, int all_logits) {
    embed_tokens(s, ids, n);
    rope_tables(s, n);
    for (int l = 0; l < s->m->cfg.n_layers; l++) decoder_layer(s, l, n);
    output_head(s, n, all_logits ? 0 : n - 1, logits);
    if (logits && s->trace) {
        int first = all_logits ? 0 : n - 1, shape[1] = {s->m->cfg.vocab};
        s->trace(s->trace_user, "logits", s->pos + first, n - first, 1, shape, logits);
    }
    s->pos += n;
    return 0;
}

int g4_session_eval(g4_session *s, const int32_t *ids, int n, float *logits, int all_logits) {
    const g4_config *c = &s->m->cfg;
    if (n <= 0) return g4_fail("no tokens to evaluate");
    if (n > s->o.ctx - s->pos)
        return g4_fail("%d tokens at position %d run past the context of %d tokens (--ctx)", n, s->pos, s->o.ctx);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab || ids[i] >= c->vocab_ple)
            return g4_fail("token id %d is outside the vocabulary (0..%d)", ids[i], c->vocab - 1);
    for (int done = 0; done < n;) {
        int len = n - done < CHUNK ? n - done : CHUNK;
        int last = done + len == n;
        float *out = NULL;
        if (logits && all_logits) out = logits + (size_t)done * c->vocab;
        else if (logits && last) out = logits;
        if (forward_chunk(s, ids + done, len, out, all_logits) != 0) return -1;
        done += len;
    }
    return 0;
}

int g4_argmax(const float *logits, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

static void *alloc_floats(size_t n, int *ok) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    if (!p) *ok = 0;
    return p;
}

g4_session *g4_session_new(const g4_model *m, const g4_options *o) {
    const g4_config *c = &m->cfg;
    if (o->act == G4_ACT_INT) {
        g4_fail("--act int: true integer linears are not implemented yet; use --act fake or --act float");
        return NULL;
    }
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
    int H = c->hidden, L = c->n_layers, LP = L * c->ple_dim, ok = 1;
    int max_q = 0, max_kv = 0, max_mlp = 0, max_hd = 0;
    for (int l = 0; l < L; l++) {
        const g4_layer *ly = &m->layers[l];
        if (c->n_heads * ly->head_dim > max_q) max_q = c->n_heads * ly->head_dim;
        if (ly->n_kv_heads * ly->head_dim > max_kv) max_kv = ly->n_kv_heads * ly->head_dim;
        if (ly->mlp_dim > max_mlp) max_mlp = ly->mlp_dim;
        if (ly->head_dim > max_hd) max_hd = ly->head_dim;
    }
    size_t max_in = (size_t)H;
    if ((size_t)max_q > max_in) max_in = (size_t)max_q;
    if ((size_t)max_mlp > max_in) max_in = (size_t)max_mlp;
    size_t n_layers = (size_t)(unsigned)L;
    s->kc = calloc(n_layers, sizeof *s->kc);
    s->vc = calloc(n_layers, sizeof *s->vc);
    if (!s->kc || !s->vc) ok = 0;
    for (int l = 0; l < L && ok; l++) {
        if (!g4_layer_is_producer(m, l)) continue;
        size_t kvw = (size_t)m->layers[l].n_kv_heads * m->layers[l].head_dim;
        s->kc[l] = alloc_floats((size_t)o->ctx * kvw, &ok);
        s->vc[l] = alloc_floats((size_t)o->ctx * kvw, &ok);
    }
    s->x = alloc_floats((size_t)CHUNK * H, &ok);
    s->xn = alloc_floats((size_t)CHUNK * H, &ok);
    s->xq = alloc_floats((size_t)CHUNK * max_in, &ok);
    s->q = alloc_floats((size_t)CHUNK * max_q, &ok);
    s->kk = alloc_floats((size_t)CHUNK * max_kv, &ok);
    s->vv = alloc_floats((size_t)CHUNK * max_kv, &ok);
    s->att = alloc_floats((size_t)CHUNK * max_q, &ok);
    s->proj = alloc_floats((size_t)CHUNK * H, &ok);
    s->gate = alloc_floats((size_t)CHUNK * max_mlp, &ok);
    s->up = alloc_floats((size_t)CHUNK * max_mlp, &ok);
    s->pli = alloc_floats((size_t)CHUNK * LP, &ok);
    s->ple_tok = alloc_floats((size_t)CHUNK * LP, &ok);
    s->plg = alloc_floats((size_t)CHUNK * c->ple_dim, &ok);
    s->scores = alloc_floats((size_t)o->ctx, &ok);
    for (int t = 0; t < 2; t++) {
        s->rope_cos[t] = alloc_floats((size_t)CHUNK * max_hd / 2, &ok);
        s->rope_sin[t] = alloc_floats((size_t)CHUNK * max_hd / 2, &ok);
    }
    if (!ok) {
        g4_session_free(s);
        g4_fail("out of memory for a session with a %d-token context", o->ctx);
        return NULL;
    }
    return s;
}

void g4_session_free(g4_session *s) {
    if (!s) return;
    for (int l = 0; s->kc && l < s->m->cfg.n_layers; l++) free(s->kc[l]);
    for (int l = 0; s->vc && l < s->m->cfg.n_layers; l++) free(s->vc[l]);
    free(s->kc);
    free(s->vc);
    float *bufs[] = {s->x, s->xn, s->xq, s->q, s->kk, s->vv, s->att, s->proj, s->gate, s->up, s->pli, s->ple_tok,
                     s->plg, s->scores, s->rope_cos[0], s->rope_cos[1], s->rope_sin[0], s->rope_sin[1]};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(s);
}

void g4_session_reset(g4_session *s) { s->pos = 0; }
int g4_session_pos(const g4_session *s) { return s->pos; }
void g4_session_set_trace(g4_session *s, g4_trace_fn fn, void *user) {
    s->trace = fn;
    s->trace_user = user;
}
