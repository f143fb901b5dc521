/* The Gemma 4 audio tower (transformers Gemma4AudioModel + Gemma4MultimodalEmbedder embed_audio):
 * log-mel features -> text-width soft tokens. Internal; the public call is g4_audio_soft_tokens
 * (g4.h). */
#ifndef G4_AUDIO_TOWER_H
#define G4_AUDIO_TOWER_H

#include <stdint.h>

#include "g4.h"

typedef struct g4_audio_tower g4_audio_tower;

/* The model's tower, bound on first use (thread-safe) and kept in the model until g4_model_free.
 * NULL with a one-line error naming the tensor or config field when it cannot be bound. */
const g4_audio_tower *g4_audio_tower_get(const g4_model *m);

/* Runs the tower and embed_audio on T frames of log-mel features (g4_audio_log_mel) with the
 * options' activation mode and the current kernel level: *embd is malloc'd [n_tokens, text
 * hidden], the frames the mask leaves valid after subsampling. 0 or -1 with an error. */
/* What one encode did (g4 bench --audio): its seconds; of them the subsampling convolutions, the
 * linears (the session's profile) and the local attention cores; the multiply-adds of the tower's
 * linears that ran in int8 and in float. */
typedef struct {
    double seconds, subsample_seconds, linear_seconds, attention_seconds, int_macs, float_macs;
} g4_audio_stats;

/* stats may be NULL. */
int g4_audio_encode(const g4_model *m, const g4_audio_tower *at, const g4_options *o, const float *mel, const uint8_t *mask, int T,
                    float **embd, int *n_tokens, g4_audio_stats *stats);

#endif
