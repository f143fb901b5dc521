/* Token sampling: greedy, or temperature with top-k, top-p, min-p and a repetition penalty,
 * driven by a seeded PRNG (same seed, same tokens). The processors apply in the order of HF
 * transformers' generate(): repetition penalty, temperature, top-k, top-p, min-p. */
#ifndef G4_GENERATE_SAMPLER_H
#define G4_GENERATE_SAMPLER_H

#include <stdint.h>

#include "g4.h"

typedef struct g4_sampler g4_sampler;

g4_sampler *g4_sampler_new(const g4_sampling *params, int vocab);
/* A sampler of its own parameters and generator that borrows the working buffers of `shared`
 * (three vocab-sized arrays, 5 MB for E2B) instead of allocating them: for many sequences whose
 * tokens one thread picks one after another. shared must outlive it. */
g4_sampler *g4_sampler_new_sharing(const g4_sampling *params, const g4_sampler *shared);
void g4_sampler_free(g4_sampler *s);
/* history[0, n_prompt) of the calls below is the prompt (0 until set): OpenAI's frequency and
 * presence penalties count the tokens after it only. */
void g4_sampler_set_prompt(g4_sampler *s, int n_prompt);
/* Picks the next token from `logits` (left unchanged); `history` are the tokens so far (prompt
 * and generated) for the repetition penalty. */
int32_t g4_sampler_sample(g4_sampler *s, const float *logits, const int32_t *history, int n_history);
/* Sampling from a few candidates instead of every logit (G4_OUTPUT_TOP rows of g4_decode): the number of
 * largest logits a pick depends on (1 at temperature 0, else top-k), or 0 when it depends on all
 * of them (no top-k). */
int g4_sampling_top_needed(const g4_sampling *p, int vocab);
/* The distinct tokens of the repetition-penalty window (none without a penalty) into ids (room
 * for repeat_last_n, or n_history when that is 0); returns their count. */
int g4_sampling_penalized(const g4_sampling *p, const int32_t *history, int n_history, int32_t *ids);
/* The token g4_sampler_sample would pick from the full logits, given candidates ids[0, m) with
 * their exact logits, the top g4_sampling_top_needed among them and every penalized token, and
 * `bound`, which no other logit exceeds. -1 when those cannot decide it (then sample from the
 * full logits); the generator's state moves only when a token is returned. */
int32_t g4_sampler_sample_top(g4_sampler *s, const int32_t *ids, const float *logits, int m, float bound, const int32_t *history,
                              int n_history);
/* 1 when sampling with these parameters is g4_argmax of the logits, whatever the history (greedy
 * without a repetition penalty): a caller may then ask the session for the argmax alone. */
int g4_sampling_is_argmax(const g4_sampling *p);
/* 1 when a pick's processors do not depend on the history (no repetition, frequency or presence
 * penalty): a drafted token then leaves the next one's distribution as it is. */
int g4_sampling_history_free(const g4_sampling *p);

/* Speculative sampling's pieces (stepper.c): the distribution g4_sampler_sample draws from, over
 * the whole vocabulary (probs[vocab], 0 outside the tokens it keeps, summing to 1; the generator
 * does not move); a uniform draw in [0, 1) from the generator; and a token drawn from the
 * unnormalised weights w[vocab] (-1 when none is positive). */
void g4_sampler_distribution(g4_sampler *s, const float *logits, const int32_t *history, int n_history, double *probs);
double g4_sampler_uniform(g4_sampler *s);
int32_t g4_sampler_draw_from(g4_sampler *s, const double *w);

#endif
