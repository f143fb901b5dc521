/* The lm_head's outputs for a chunk's rows (lmhead.c): every logit, the greedy token, or the top-k
 * candidates, and each sequence's coarse-image state of the greedy search. */
#ifndef G4_MODEL_LMHEAD_H
#define G4_MODEL_LMHEAD_H

#include "forward.h"

/* Each output group's results for the chunk rows left (chunk row t is row t - shift of the session's
 * xn, which holds them final-normed). */
void g4_lm_head_outputs(g4_session *s, const chunk_plan *p, int shift);
/* The logits of kept row k (g4_decode_logits). */
void g4_lm_head_kept_logits(g4_session *s, int k, float *logits);
/* The coarse image sequence `seq`'s shortcut calls take now (1 or 2), and the update after a call
 * that ran it. */
int g4_lm_head_coarse(const g4_session *s, int seq);
void g4_lm_head_coarse_done(g4_session *s, int seq, int coarse, int unsettled);

#endif
