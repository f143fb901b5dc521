/* The Gemma 4 decoder layer (model.md §6), one function for the target's forward pass (forward.c)
 * and the MTP drafter's (draft.c), with what sets them apart given as data: whose layers, which
 * buffers and rows, where a layer's K/V come from (its own cache, an earlier layer's, or the
 * target's: g4_layer.kv_source), and whether its linears run in the session's activation mode or
 * in float. Also the elementwise steps the layer, the chunk and the towers share. */
#ifndef G4_MODEL_LAYER_H
#define G4_MODEL_LAYER_H

#include <stdint.h>

#include "g4.h"
#include "model.h"

/* The rows one layer call computes, and how. */
typedef struct g4_layer_rows g4_layer_rows;
struct g4_layer_rows {
    g4_session *s;      /* the kernels, the linear step and the K/V caches: the target's session */
    const g4_model *m;  /* whose layers: the session's model, or a drafter's */
    int n;              /* rows, at most CHUNK */
    const int *seq, *pos; /* [n] each row's sequence and position */
    /* the residual stream [n][hidden] and the scratch of a layer (session.c / draft.c size them) */
    float *x, *xn, *q, *kk, *vv, *att, *proj, *gate, *up, *plg;
    const float *pli;             /* [n][n_layers][ple_dim]: the per-layer inputs (a model with the block) */
    const float *rope_cos[2], *rope_sin[2]; /* [type][row][head_dim / 2] at pos (g4_rope_tables) */
    /* A drafter's layers read the target's K/V (kv_source G4_KV_FROM_TARGET): from the target layer
     * target_kv[type], at the positions before the row's own (which is not cached yet), with the
     * sliding window's W + 1 positions (transformers' bidirectional window |q - kv| <= W flipped
     * onto the past). NULL for a target. */
    const int *target_kv;
    int float_linears; /* linears in float, uncounted (g4_linear_float): a drafter's, which never quantizes */
    int observe;       /* the session's trace and profile see this layer (the target's forward pass) */
    /* Finishes layer l's per-layer inputs when they are computed in the background (forward.c);
     * NULL when they are ready. */
    void (*pli_ready)(g4_session *s, int l);
};

/* Layer l of io->m on io's rows: x = layer(x) in place. */
void g4_decoder_layer(const g4_layer_rows *io, int l);

/* cos/sin of position x frequency for each attention type of m (every layer of a type has the
 * same frequencies), for n rows at pos: cos[type][t * head_dim / 2 + j]. */
void g4_rope_tables(const g4_model *m, const int *pos, int n, float *const cos[2], float *const sin[2]);

/* Reports n rows (from position pos[0]) of a tensor whose rows have shape {d0} or {d0, d1} to the
 * session's trace, if any. */
void g4_trace_rows(const g4_session *s, const char *name, int pos0, int n, int d0, int d1, const float *data);

/* rmsnorm of n values (w NULL: no weight); over each of `rows` vectors of `width`; x += rmsnorm(y)
 * row by row (y normed in place); rotate-half RoPE of one head: the elementwise steps (all fp32,
 * no quantization) that the layer, the chunk (forward.c) and the towers share. */
void g4_forward_rmsnorm(float *y, const float *x, const float *w, int n, float eps);
void g4_forward_rmsnorm_rows(float *y, const float *x, const float *w, int rows, int width, float eps);
void g4_forward_add_normed(float *x, float *y, const float *w, int rows, int width, float eps);
void g4_forward_rope(float *x, const float *cs, const float *sn, int hd);

#endif
