/* The MTP drafter: a Gemma 4 assistant (transformers' models/gemma4_assistant,
 * Gemma4AssistantForCausalLM) loaded against its target, and one draft step for a batch of rows,
 * read top to bottom:
 *
 *   x  = pre_projection([target embed_tokens(token) x sqrt(H) ; h])        (2 Hb -> Hd)
 *   each layer, the target's layer function (layer.c: input norm, q_proj, q_norm, RoPE at the row's
 *   position p, o_proj, post-attention norm, MLP, post-feedforward norm, layer_scalar), except that
 *   it has no K/V of its own: it attends to the target's cache of the last K/V-producing target layer of its type,
 *   positions [0, p - 1] (full) or [p - 1 - W, p - 1] (sliding: transformers' bidirectional window
 *   |q - kv| <= W, flipped onto the past, keeps W + 1 positions)
 *   xf = final norm(x); logits = tied embedding . xf (no softcap), through the centroid-selected
 *   tokens when use_ordered_embeddings; h' = post_projection(xf)                 (Hd -> Hb)
 *
 * p is the position of the token drafted from (it is not in the cache yet), the same for every
 * step of a round: SinglePositionMultiTokenCandidateGenerator keeps position_ids constant and
 * feeds each step's drafted token and h' to the next. The drafter computes float activations
 * (a checkpoint's static activation scales, if it has any, are not applied): its drafts only
 * decide which tokens the target verifies, never which tokens come out. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "g4.h"
#include "layer.h"
#include "linear.h"
#include "session.h"
#include "util/err.h"

struct g4_draft {
    g4_model *m;           /* the decoder: layers, final norm, tied embedding (the lm_head) */
    const g4_model *target;
    g4_linear pre, post, centroids;
    int src[2];            /* the target layer each attention type reads (G4_LAYER_SLIDING, G4_LAYER_FULL) */
    /* use_ordered_embeddings: the lm_head's rows in token_ordering order, so that each centroid's
     * tokens are contiguous rows (one matmul per selected centroid), and the order itself */
    int32_t *order;
    uint8_t *sorted_rows;
    float *sorted_scales;
    g4_qweight sorted;
    int per_centroid;
};

/* ---- loading ---- */

/* The last K/V-producing target layer of attention type `type`, or -1 (the layer transformers
 * stores in shared_kv_states for that type). */
static int target_source(const g4_model *t, int type) {
    int first_shared = t->cfg.n_layers - t->cfg.n_kv_shared;
    for (int l = first_shared - 1; l >= 0; l--)
        if (t->layers[l].type == type) return l;
    return -1;
}

/* Whether the drafter's shapes fit the target's: the hidden size it was trained on, the
 * vocabulary, and per layer the target K/V it reads (head size, K/V heads). */
static int check_fits(g4_draft *d) {
    const g4_model *m = d->m, *t = d->target;
    const g4_config *c = &m->cfg;
    if (c->backbone_hidden != t->cfg.hidden)
        return g4_fail("%s/config.json: backbone_hidden_size %d does not match the target's hidden_size %d (%s)", m->dir,
                       c->backbone_hidden, t->cfg.hidden, t->dir);
    if (c->vocab != t->cfg.vocab)
        return g4_fail("%s/config.json: text_config.vocab_size %d does not match the target's %d (%s)", m->dir, c->vocab, t->cfg.vocab,
                       t->dir);
    for (int type = 0; type < 2; type++) d->src[type] = target_source(t, type);
    for (int l = 0; l < c->n_layers; l++) {
        const g4_layer *L = &m->layers[l];
        int s = d->src[L->type];
        const char *kind = L->type == G4_LAYER_FULL ? "full_attention" : "sliding_attention";
        if (s < 0) return g4_fail("%s/config.json: layer %d is %s, a type no K/V-producing layer of the target has", m->dir, l, kind);
        const g4_layer *T = &t->layers[s];
        if (L->head_dim != T->head_dim || L->n_kv_heads != T->n_kv_heads)
            return g4_fail("%s/config.json: layer %d (%s) has head_dim %d with %d K/V heads; the target's layer %d it reads has %d "
                           "with %d",
                           m->dir, l, kind, L->head_dim, L->n_kv_heads, s, T->head_dim, T->n_kv_heads);
    }
    if (c->ordered_embeddings && c->vocab % c->n_centroids)
        return g4_fail("%s/config.json: vocab_size %d is not a multiple of num_centroids %d", m->dir, c->vocab, c->n_centroids);
    return 0;
}

/* masked_embedding.token_ordering [vocab] (I64 as transformers saves it, or I32): each centroid's
 * tokens, vocab / num_centroids of them in a row; then the lm_head rows in that order. */
static int bind_ordering(g4_draft *d) {
    g4_model *m = d->m;
    const g4_config *c = &m->cfg;
    const char *name = "masked_embedding.token_ordering";
    const g4_tensor *t = g4_st_find(&m->st, name);
    if (!t) return g4_fail("%s: tensor %s missing from the checkpoint (use_ordered_embeddings is true)", m->dir, name);
    int wide = t->dtype == G4_DT_I64;
    if ((!wide && t->dtype != G4_DT_I32) || t->ndim != 1 || t->shape[0] != c->vocab) {
        char sh[96];
        return g4_fail("%s: tensor %s: expected I64 [%d], found %s %s", g4_st_path(&m->st, t), name, c->vocab, g4_dtype_name(t->dtype),
                       g4_shape_str(t, sh, sizeof sh));
    }
    size_t V = (size_t)c->vocab;
    const g4_qweight *w = &m->lm_head.w;
    int scales = w->w_scale ? g4_qweight_row_scales(w) : 0;
    d->order = malloc(sizeof *d->order * V);
    d->sorted_rows = malloc(w->row_bytes * V);
    d->sorted_scales = scales ? malloc(sizeof *d->sorted_scales * V * (size_t)scales) : NULL;
    if (!d->order || !d->sorted_rows || (scales && !d->sorted_scales)) return g4_fail("%s: out of memory", m->dir);
    for (size_t i = 0; i < V; i++) {
        int64_t v = 0;
        const uint8_t *b = t->data + i * (wide ? 8 : 4);
        for (int k = wide ? 7 : 3; k >= 0; k--) v = v * 256 + b[k];
        if (!wide && v >= 2147483648LL) v -= 4294967296LL;
        if (v < 0 || v >= c->vocab)
            return g4_fail("%s: tensor %s: element %zu is %lld, outside the vocabulary (0..%d)", g4_st_path(&m->st, t), name, i, (long long)v,
                           c->vocab - 1);
        d->order[i] = (int32_t)v;
        memcpy(d->sorted_rows + i * w->row_bytes, w->w + (size_t)v * w->row_bytes, w->row_bytes);
        if (scales) memcpy(d->sorted_scales + i * scales, w->w_scale + (size_t)v * scales, sizeof *d->sorted_scales * scales);
    }
    d->sorted = *w;
    d->sorted.w = d->sorted_rows;
    d->sorted.w_scale = d->sorted_scales;
    d->per_centroid = c->vocab / c->n_centroids;
    return 0;
}

g4_draft *g4_draft_load(const char *dir, const g4_model *target) {
    g4_draft *d = calloc(1, sizeof *d);
    if (!d) {
        g4_fail("%s: out of memory", dir);
        return NULL;
    }
    d->target = target;
    int rc = (d->m = g4_model_load_drafter(dir)) ? 0 : -1;
    if (rc == 0) {
        const g4_config *c = &d->m->cfg;
        int Hd = c->hidden, Hb = c->backbone_hidden;
        rc = check_fits(d);
        if (rc == 0) rc = g4_model_bind_linear(d->m, &d->pre, "pre_projection", 2 * Hb, Hd);
        if (rc == 0) rc = g4_model_bind_linear(d->m, &d->post, "post_projection", Hd, Hb);
        if (rc == 0 && c->ordered_embeddings) rc = g4_model_bind_linear(d->m, &d->centroids, "masked_embedding.centroids", Hd, c->n_centroids);
        if (rc == 0 && c->ordered_embeddings) rc = bind_ordering(d);
    }
    if (rc != 0) {
        g4_draft_free(d);
        return NULL;
    }
    return d;
}

void g4_draft_free(g4_draft *d) {
    if (!d) return;
    g4_model_free(d->m);
    free(d->order);
    free(d->sorted_rows);
    free(d->sorted_scales);
    free(d);
}

/* ---- the working state ---- */

struct g4_drafter {
    const g4_draft *d;
    g4_session *s; /* the target's: its kernels, K/V caches and embedding reader */
    int max_q;     /* the widest query projection */
    float *in, *x, *xn, *q, *att, *proj, *gate, *up;
    float *cs[2], *sn[2]; /* [type][row][head_dim / 2]: each attention type's RoPE at the step's positions */
    float *cent, *sel; /* centroid logits [rows][C]; the selected tokens' logits [rows][top_k * per_centroid] */
    int *top;          /* [top_k] the selected centroids of one row */
};

#define ROWS CHUNK

g4_drafter *g4_drafter_new(const g4_draft *d, g4_session *target) {
    if (g4_session_model(target) != d->target) {
        g4_fail("the drafter was loaded for %s, not for the session's model %s", d->target->dir, g4_session_model(target)->dir);
        return NULL;
    }
    g4_drafter *dr = calloc(1, sizeof *dr);
    if (!dr) {
        g4_fail("out of memory for the drafter");
        return NULL;
    }
    const g4_config *c = &d->m->cfg;
    size_t Hd = (size_t)c->hidden, Hb = (size_t)c->backbone_hidden, mlp = 0, hd = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const g4_layer *L = &d->m->layers[l];
        if ((size_t)L->mlp_dim > mlp) mlp = (size_t)L->mlp_dim;
        if ((size_t)L->head_dim > hd) hd = (size_t)L->head_dim;
    }
    dr->d = d;
    dr->s = target;
    dr->max_q = c->n_heads * (int)hd;
    size_t R = ROWS, sel = c->ordered_embeddings ? (size_t)c->centroid_top_k * (size_t)d->per_centroid : 0;
    dr->in = malloc(sizeof(float) * R * 2 * Hb);
    dr->x = malloc(sizeof(float) * R * Hd);
    dr->xn = malloc(sizeof(float) * R * Hd);
    dr->q = malloc(sizeof(float) * R * (size_t)dr->max_q);
    dr->att = malloc(sizeof(float) * R * (size_t)dr->max_q);
    dr->proj = malloc(sizeof(float) * R * Hd);
    dr->gate = malloc(sizeof(float) * R * mlp);
    dr->up = malloc(sizeof(float) * R * mlp);
    for (int type = 0; type < 2; type++) {
        dr->cs[type] = malloc(sizeof(float) * R * hd / 2);
        dr->sn[type] = malloc(sizeof(float) * R * hd / 2);
    }
    dr->cent = c->ordered_embeddings ? malloc(sizeof(float) * R * (size_t)c->n_centroids) : NULL;
    dr->sel = c->ordered_embeddings ? malloc(sizeof(float) * R * sel) : NULL;
    dr->top = c->ordered_embeddings ? malloc(sizeof(int) * (size_t)c->centroid_top_k) : NULL;
    if (!dr->in || !dr->x || !dr->xn || !dr->q || !dr->att || !dr->proj || !dr->gate || !dr->up || !dr->cs[0] || !dr->cs[1] || !dr->sn[0] || !dr->sn[1] ||
        (c->ordered_embeddings && (!dr->cent || !dr->sel || !dr->top))) {
        g4_drafter_free(dr);
        g4_fail("out of memory for the drafter");
        return NULL;
    }
    return dr;
}

void g4_drafter_free(g4_drafter *dr) {
    if (!dr) return;
    float *bufs[] = {dr->in, dr->x, dr->xn, dr->q, dr->att, dr->proj, dr->gate, dr->up, dr->cs[0], dr->cs[1], dr->sn[0], dr->sn[1], dr->cent, dr->sel};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(dr->top);
    free(dr);
}

const g4_session *g4_drafter_session(const g4_drafter *dr) { return dr->s; }

/* ---- one step ---- */

static void matmul(const g4_drafter *dr, const g4_linear *L, const float *x, int n, float *y) { g4_linear_float(dr->s, L, x, n, y); }

/* The drafter's rows through its layers: its own buffers, float linears, and each layer's K/V from
 * the target layer its attention type reads (g4_layer_rows.target_kv); no trace, no profile. */
static g4_layer_rows layer_rows(g4_drafter *dr, int n, const int *seqs, const int *pos) {
    return (g4_layer_rows){.s = dr->s, .m = dr->d->m, .n = n, .seq = seqs, .pos = pos, .x = dr->x, .xn = dr->xn, .q = dr->q,
                           .att = dr->att, .proj = dr->proj, .gate = dr->gate, .up = dr->up,
                           .rope_cos = {dr->cs[0], dr->cs[1]}, .rope_sin = {dr->sn[0], dr->sn[1]}, .target_kv = dr->d->src,
                           .float_linears = 1};
}

/* The k largest of v[0, n) (the first on ties), largest first: torch.topk's selection. */
static void top_k(const float *v, int n, int k, int *out) {
    for (int j = 0; j < k; j++) out[j] = -1;
    for (int i = 0; i < n; i++) {
        int at = k;
        while (at > 0 && (out[at - 1] < 0 || v[i] > v[out[at - 1]])) at--;
        if (at == k) continue;
        memmove(out + at + 1, out + at, sizeof *out * (size_t)(k - 1 - at));
        out[at] = i;
    }
}

/* Gemma4AssistantMaskedEmbedder for row t of xn: the top_k centroids' tokens get their logits,
 * every other token the smallest of them - 1. Writes the greedy token (the first largest in
 * vocabulary order, as an argmax over the full row) and, when logits is not NULL, the full row. */
static int32_t masked_logits(g4_drafter *dr, int t, float *logits) {
    const g4_draft *d = dr->d;
    const g4_config *c = &d->m->cfg;
    int K = c->centroid_top_k, per = d->per_centroid, Hd = c->hidden;
    const float *xf = dr->xn + (size_t)t * Hd, *cent = dr->cent + (size_t)t * c->n_centroids;
    float *sel = dr->sel + (size_t)t * K * per;
    top_k(cent, c->n_centroids, K, dr->top);
    for (int j = 0; j < K; j++) {
        g4_qweight rows = g4_qweight_rows(&d->sorted, dr->top[j] * per, per);
        dr->s->k->matmul_f32(&rows, xf, 1, sel + (size_t)j * per);
    }
    int32_t best = -1;
    float best_v = 0, lowest = INFINITY;
    for (int j = 0; j < K * per; j++) {
        int32_t id = d->order[dr->top[j / per] * per + j % per];
        float v = sel[j];
        if (v < lowest) lowest = v;
        if (best < 0 || v > best_v || (v == best_v && id < best)) best = id, best_v = v;
    }
    if (logits) {
        for (int i = 0; i < c->vocab; i++) logits[i] = lowest - 1.0f;
        for (int j = 0; j < K * per; j++) logits[d->order[dr->top[j / per] * per + j % per]] = sel[j];
    }
    return best < 0 ? 0 : best;
}

int g4_drafter_step(g4_drafter *dr, int n, const int *seqs, const int32_t *tokens, float *hidden, int32_t *next, float *logits) {
    const g4_draft *d = dr->d;
    const g4_model *m = d->m;
    const g4_config *c = &m->cfg;
    int Hd = c->hidden, Hb = c->backbone_hidden, V = c->vocab, pos[ROWS];
    if (n < 1 || n > ROWS) return g4_fail("a draft step takes 1 to %d rows, not %d", ROWS, n);
    for (int t = 0; t < n; t++) {
        int p = g4_session_seq_pos(dr->s, seqs[t]);
        if (p < 0) return g4_fail("sequence %d does not exist (the session has %d)", seqs[t], g4_session_n_seq(dr->s));
        if (p == 0) return g4_fail("sequence %d is empty: a draft continues from the target's K/V", seqs[t]);
        if (tokens[t] < 0 || tokens[t] >= V) return g4_fail("token id %d is outside the vocabulary (0..%d)", tokens[t], V - 1);
        pos[t] = p;
    }
    /* pre_projection of [the target's scaled embedding ; the hidden state] */
    for (int t = 0; t < n; t++) {
        float *in = dr->in + (size_t)t * 2 * Hb;
        g4_forward_embedding(dr->s, tokens[t], in);
        memcpy(in + Hb, hidden + (size_t)t * Hb, sizeof *in * (size_t)Hb);
    }
    matmul(dr, &d->pre, dr->in, n, dr->x);
    g4_rope_tables(m, pos, n, dr->cs, dr->sn);
    g4_layer_rows io = layer_rows(dr, n, seqs, pos);
    for (int l = 0; l < c->n_layers; l++) g4_decoder_layer(&io, l);
    g4_forward_rmsnorm_rows(dr->xn, dr->x, m->final_norm, n, Hd, (float)c->rms_eps);
    matmul(dr, &d->post, dr->xn, n, hidden);
    if (c->ordered_embeddings) {
        matmul(dr, &d->centroids, dr->xn, n, dr->cent);
        for (int t = 0; t < n; t++) next[t] = masked_logits(dr, t, logits ? logits + (size_t)t * V : NULL);
        return 0;
    }
    /* the tied embedding as the lm_head: every row in one pass into the caller's room, or one row at
     * a time into a scratch row */
    if (logits) matmul(dr, &m->lm_head, dr->xn, n, logits);
    for (int t = 0; t < n; t++) {
        float *row = logits ? logits + (size_t)t * V : dr->s->logit_row;
        if (!row && !(row = dr->s->logit_row = malloc(sizeof *row * (size_t)dr->s->m->cfg.vocab)))
            return g4_fail("out of memory for a row of logits");
        if (!logits) matmul(dr, &m->lm_head, dr->xn + (size_t)t * Hd, 1, row);
        next[t] = g4_argmax(row, V);
    }
    return 0;
}

int g4_model_hidden_size(const g4_model *m) { return m->cfg.hidden; }
