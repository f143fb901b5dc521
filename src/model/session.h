/* A session's state (struct g4_session), which the files of the forward pass read (internal to
 * src/model/). They call one another in one direction only (decode -> forward -> layer, lmhead ->
 * linear; session -> linear), each through its own header:
 *   session.c   options, the session and its buffers, sequences, the test probes (probe.h)
 *   decode.c    g4_decode: batches cut into chunks, each row's output request; the compatibility forms
 *   forward.c   one chunk (forward.h): embeddings and per-layer inputs, the layers, final norm (model.md §5, §7)
 *   layer.c     the decoder layer (layer.h), the target's and the drafter's (model.md §6)
 *   lmhead.c    the chunk's outputs (lmhead.h): logits, and the greedy and top-k shortcuts' search
 *   linear.c    the linear step and the integer linears' requantization tables (linear.h)
 *   profile.c   time per operation class (g4 bench)
 * Activations are fp32 [n tokens][width] row-major; a call processes up to CHUNK tokens at a
 * time, so prefill and decode run the same code. Quantization points follow
 * activation-quant.md §2; which ones are active is decided once, in the session options. */
#ifndef G4_MODEL_SESSION_H
#define G4_MODEL_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "forward.h"
#include "model.h"
#include "quant/int8.h"

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

#endif
