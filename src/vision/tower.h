/* The Gemma 4 vision tower (transformers Gemma4VisionModel + Gemma4MultimodalEmbedder
 * embed_vision): patches -> text-width soft tokens. Internal; the public call is
 * g4_image_soft_tokens (g4.h). */
#ifndef G4_VISION_TOWER_H
#define G4_VISION_TOWER_H

#include "g4.h"
#include "vision/image.h"

typedef struct g4_vision_tower g4_vision_tower;

/* The model's tower, bound on first use (thread-safe) and kept in the model until
 * g4_model_free. NULL with an error naming the tensor or config field when it cannot be bound. */
const g4_vision_tower *g4_vision_tower_get(const g4_model *m);

/* The tower's geometry from vision_config. */
int g4_vision_patch_size(const g4_vision_tower *vt);
int g4_vision_pooling(const g4_vision_tower *vt);
int g4_vision_default_soft_tokens(const g4_vision_tower *vt);

/* What one encode did (g4 bench --image): its seconds, the seconds in the tower's linears (the
 * session's profile), and the multiply-adds of the tower linears that ran in int8. */
typedef struct {
    double seconds, linear_seconds, attention_seconds, int_macs, float_macs;
} g4_vision_stats;

/* Runs the tower and embed_vision on the patches of one image with the options' activation
 * mode (float, fake, int through the text model's linear step) and the current kernel level:
 * *embd is malloc'd [n_tokens, text hidden]. stats may be NULL. 0 or -1 with an error. */
int g4_vision_encode(const g4_model *m, const g4_vision_tower *vt, const g4_options *o, const g4_image_patches *p, float **embd,
                     int *n_tokens, g4_vision_stats *stats);

#endif
