/* Token sampling: greedy, or temperature with top-k, top-p, min-p and a repetition penalty,
 * driven by a seeded PRNG (same seed, same tokens). The processors apply in the order of HF
 * transformers' generate(): repetition penalty, temperature, top-k, top-p, min-p. */
#ifndef G4_GENERATE_SAMPLER_H
#define G4_GENERATE_SAMPLER_H

#include <stdint.h>

#include "g4.h"

typedef struct g4_sampler g4_sampler;

g4_sampler *g4_sampler_new(const g4_sampling *params, int vocab);
void g4_sampler_free(g4_sampler *s);
/* Picks the next token from `logits` (left unchanged); `history` are the tokens so far (prompt
 * and generated) for the repetition penalty. */
int32_t g4_sampler_sample(g4_sampler *s, const float *logits, const int32_t *history, int n_history);
/* 1 when sampling with these parameters is g4_argmax of the logits, whatever the history (greedy
 * without a repetition penalty): a caller may then ask the session for the argmax alone. */
int g4_sampling_is_argmax(const g4_sampling *p);

#endif
