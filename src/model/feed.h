/* The compatibility forms of g4_decode that the tests use: one sequence's tokens fed through the
 * forward pass ("feed"; "eval" is g4 eval's GSM8K harness alone), or one token of several
 * sequences. Not part of the public API (include/g4.h): libg4.so does not export them. */
#ifndef G4_MODEL_FEED_H
#define G4_MODEL_FEED_H

#include <stdint.h>

#include "g4.h"

/* For sequence 0: g4_session_feed feeds n tokens at its current
 * position; logits: NULL, or room for vocab floats (the last token's logits) or n * vocab floats
 * when all_logits is set. g4_session_feed_argmax gives the last token's greedy token
 * (G4_OUTPUT_ARGMAX). g4_session_feed_top gives the last token's candidates (G4_OUTPUT_TOP):
 * *n_cand, cand, vals and *bound are g4_candidates' n, ids, logits and bound, cand and vals with
 * room for max_cand. g4_session_last_logits gives the full logits of the token the last
 * g4_session_feed_top fed (g4_decode_logits). */
int g4_session_feed(g4_session *s, const int32_t *ids, int n, float *logits, int all_logits);
int g4_session_feed_argmax(g4_session *s, const int32_t *ids, int n, int32_t *next);
int g4_session_feed_top(g4_session *s, const int32_t *ids, int n, int k, const int32_t *extra, int n_extra, int32_t *cand, float *vals,
                        int max_cand, float *bound, int *n_cand);
int g4_session_last_logits(g4_session *s, float *logits);
/* The same for sequence `seq`; and one decoding step of several sequences at once (one token
 * each, distinct sequences, at most 64), with every row's logits (n * vocab floats) or greedy
 * token (next, one per row). */
int g4_session_feed_seq(g4_session *s, int seq, const int32_t *ids, int n, float *logits, int all_logits);
int g4_session_feed_argmax_seq(g4_session *s, int seq, const int32_t *ids, int n, int32_t *next);
int g4_session_feed_batch(g4_session *s, const int *seqs, const int32_t *ids, int n, float *logits);
int g4_session_feed_batch_argmax(g4_session *s, const int *seqs, const int32_t *ids, int n, int32_t *next);

#endif
