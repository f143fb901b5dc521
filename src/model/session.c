/* A session: its options resolved into the switches the forward pass reads, its KV cache and
 * buffers, its sequences, and the probes the tests read (probe.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "linear.h"
#include "probe.h"
#include "session.h"
#include "util/err.h"

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
    /* the per_layer_model_projection's scales are the mobile graph's (not in any checkpoint):
     * a checkpoint without static activation quantization runs it in float */
    s->q_pmp = quantized && o->pmp_quant && s->m->static_act;
    const g4_qweight *lw = &s->m->lm_head.w;
    if (o->lmhead_dynamic_q8 && (lw->bits == G4_WT_BF16 || lw->block))
        g4_warn("--lmhead-dynamic-q8 has no effect: the lm_head is %s, not LiteRT's per-row codes", lw->bits == G4_WT_BF16 ? "BF16" : "block-scaled");
    else if (o->lmhead_dynamic_q8 && lm_head_static_input(s))
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

/* The per-linear row counts of probe.h (g4_session_linear_rows). */
static int alloc_linear_counts(g4_session *s) {
    size_t n = (size_t)(s->n_linears > 0 ? s->n_linears : 1);
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
    s->n_linears = m->n_linears;
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
    if (resolve_options(s) || g4_requant_tables_build(s) || alloc_linear_counts(s) || alloc_kv(s) || alloc_scratch(s)) {
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
    g4_requant_tables_free(s);
    free(s->rows_int);
    free(s->rows_float);
    void *bufs[] = {s->logit_row, s->argmax_scratch, s->x, s->xn, s->xq, s->xcodes, s->acc, s->q, s->kk, s->vv, s->att, s->proj, s->gate, s->up, s->pli,
                    s->ple_tok, s->plg, s->pmp_in, s->row_buf, s->rope_cos[0], s->rope_cos[1], s->rope_sin[0], s->rope_sin[1]};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(s);
}

/* A sequence starts over: its cache empty, and its shortcut state (g4_lm_head_coarse) fresh, so that
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
/* The cache is indexed by position: the first n rows of every producer layer's K and V. */
int g4_session_copy_seq(g4_session *s, int from, int to, int n) {
    if (from < 0 || from >= s->n_seq || to < 0 || to >= s->n_seq || from == to)
        return g4_fail("cannot copy sequence %d to %d (the session has %d)", from, to, s->n_seq);
    if (n < 0 || n > s->seq_pos[from]) return g4_fail("sequence %d holds %d tokens: it cannot give %d", from, s->seq_pos[from], n);
    const g4_model *m = s->m;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        if (!g4_layer_is_producer(m, l)) continue;
        const kv_cache *a = kv_of(s, from, l);
        kv_cache *b = kv_of(s, to, l);
        size_t len = (size_t)n * m->layers[l].n_kv_heads * m->layers[l].head_dim;
        if (a->kf) memcpy(b->kf, a->kf, sizeof *a->kf * len);
        if (a->kq) memcpy(b->kq, a->kq, sizeof *a->kq * len);
        if (a->vf) memcpy(b->vf, a->vf, sizeof *a->vf * len);
        if (a->vq) memcpy(b->vq, a->vq, sizeof *a->vq * len);
    }
    s->seq_pos[to] = n;
    s->argmax_hold[to] = 0;
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
    g4_forward_linear(s, L, x, n, y);
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
