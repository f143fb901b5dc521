/* One chunk of batch rows through the target's decoder (forward.c): the plan decode.c makes of it,
 * and the pass that computes it. */
#ifndef G4_MODEL_FORWARD_H
#define G4_MODEL_FORWARD_H

#include <stdint.h>

#include "g4.h"

#define CHUNK 64

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

/* The chunk p plans, through every layer and the final norm, then its outputs (lmhead.h). */
void g4_forward_chunk(g4_session *s, const chunk_plan *p);
/* The target's scaled input embedding of a token (embed_tokens x sqrt(hidden)): a drafter's input. */
void g4_forward_embedding(g4_session *s, int32_t id, float *out);

#endif
