/* A session's state (struct g4_session) and what the files of the forward pass share of it
 * (internal to src/model/):
 *   session.c   options, the session and its buffers, sequences, the test probes (probe.h)
 *   decode.c    g4_decode: batches cut into chunks, each row's output request; the compatibility forms
 *   forward.c   the layer math of one chunk: embeddings, decoder layers, final norm (model.md §5-§7)
 *   lmhead.c    the chunk's outputs: logits, and the greedy and top-k shortcuts' search
 *   requant.c   the integer linears' per-row requantization tables
 *   profile.c   time per operation class (g4 bench)
 * Activations are fp32 [n tokens][width] row-major; a call processes up to CHUNK tokens at a
 * time, so prefill and decode run the same code. Quantization points follow
 * activation-quant.md §2; which ones are active is decided once, in the session options. */
#ifndef G4_MODEL_SESSION_H
#define G4_MODEL_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "quant/int8.h"

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
    int n_linears; /* the model's linears when the session was made: the per-linear tables' length (a
                    * tower bound later, vision/tower.c, gets a session of its own) */
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
    int *argmax_hold; /* [n_seq] shortcut calls left that use two digit rows (g4_lm_head_coarse) */
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

static inline kv_cache *kv_of(const g4_session *s, int seq, int layer) { return &s->kv[(size_t)seq * s->m->cfg.n_layers + layer]; }

/* True integer path: int8 input codes x packed weight codes -> int32 -> requantized. */
static inline int runs_int(const g4_session *s, const g4_linear *L) {
    return s->o.act == G4_ACT_INT && s->q_linear && L->s_in != 0 && L->w.bits != G4_WT_BF16;
}

/* Whether the session quantizes the lm_head input with a static scale (point G3): an lm_head
 * with an input_activation_scale, with the linear points on. The published checkpoint's scale
 * is 0, so its lm_head input stays float. */
static inline int lm_head_static_input(const g4_session *s) { return s->q_linear && s->m->lm_head.s_in != 0; }

/* ---- profiling (profile.c) ---- */

/* Seconds on a monotonic clock. */
double g4_prof_clock(void);

/* Profiling brackets: PROF_BEGIN starts a clock when profiling is on, PROF_END charges the
 * elapsed time to an operation class. */
#define PROF_BEGIN(s) double prof_t0_ = (s)->profiling ? g4_prof_clock() : 0
#define PROF_END(s, op) \
    do { \
        if ((s)->profiling) (s)->prof[op] += g4_prof_clock() - prof_t0_; \
    } while (0)

/* ---- one chunk of batch rows: decode.c plans it, forward.c computes it, lmhead.c gives its
 * outputs ---- */

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
    int32_t ids[CHUNK];         /* the token, or the pad id of an embedding row (its per-layer-input lookup) */
    const float *embd[CHUNK];   /* an embedding row's input embedding, NULL for a token row */
} chunk_plan;

static inline g4_batch_row *chunk_row(const chunk_plan *p, int t) { return &p->rows[p->at[t]]; }

/* forward.c: the chunk p plans, through every layer and the final norm, then its outputs
 * (g4_lm_head_outputs). */
void g4_forward_chunk(g4_session *s, const chunk_plan *p);
/* forward.c: y = Q(W Q(x; s_in); s_out) for n rows of x: the linear step every layer linear takes
 * (float, fake-quant or true integer, per the session). */
void g4_forward_linear(g4_session *s, const g4_linear *L, const float *x, int n, float *y);
/* forward.c: rmsnorm of n values (w NULL: no weight), rotate-half RoPE of one head, and the
 * target's scaled input embedding of a token (embed_tokens x sqrt(hidden)): what draft.c shares. */
void g4_forward_rmsnorm(float *y, const float *x, const float *w, int n, float eps);
/* forward.c: rmsnorm over each of `rows` vectors of `width`; x += rmsnorm(y) row by row (y normed
 * in place). */
void g4_forward_rmsnorm_rows(float *y, const float *x, const float *w, int rows, int width, float eps);
void g4_forward_add_normed(float *x, float *y, const float *w, int rows, int width, float eps);
void g4_forward_rope(float *x, const float *cs, const float *sn, int hd);
void g4_forward_embedding(g4_session *s, int32_t id, float *out);
/* forward.c: the lm_head of rows [first, n) of xn into logits, softcapped. */
void g4_forward_lm_head_logits(g4_session *s, int n, int first, float *logits);

/* lmhead.c: each output group's results for the chunk rows left (chunk row t is row t - shift of
 * xn, which holds them final-normed). */
void g4_lm_head_outputs(g4_session *s, const chunk_plan *p, int shift);
/* lmhead.c: the logits of kept row k (g4_decode_logits). */
void g4_lm_head_kept_logits(g4_session *s, int k, float *logits);
/* lmhead.c: the coarse image sequence `seq`'s shortcut calls take now (1 or 2), and the update
 * after a call that ran it. */
int g4_lm_head_coarse(const g4_session *s, int seq);
void g4_lm_head_coarse_done(g4_session *s, int seq, int coarse, int unsettled);

/* requant.c: every integer linear's per-row tables (s->rq, s->rq_f32), freed with the session;
 * and n rows of int32 sums of L's outputs [o0, o0 + width) into floats through them. */
int g4_requant_tables_build(g4_session *s);
void g4_requant_tables_free(g4_session *s);
/* The table of one more linear (a tower's, bound after the layers): 0 or -1. */
int g4_requant_table_add(g4_session *s, const g4_linear *L);
void g4_requant_apply(const g4_session *s, const g4_linear *L, const int32_t *acc, int n, int width, int o0, float *y);

#endif
