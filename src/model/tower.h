/* What the multimodal towers (vision/tower.c, audio/tower.c) share: memory owned by a tower, its
 * float tensors checked against the shapes the config gives, Gemma4ClippableLinear (a linear and its
 * clamps), and the tower linears run through the text model's linear step in calls sized to the
 * session's scratch. Built with the media sources (MEDIA_SRC). */
#ifndef G4_MODEL_TOWER_H
#define G4_MODEL_TOWER_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "model/layer.h"
#include "model/linear.h"
#include "model/session.h"

/* Buffers a tower owns, freed together. */
typedef struct {
    void **p;
    int n;
} g4_tower_mem;

/* calloc'd bytes owned by mem, or NULL (out of memory). */
/* The tower in *slot, bound by load on first use under one lock for every tower (binding adds
 * linears to the model's count, which an image and a clip bound at once on two threads would
 * both change); a failed load leaves the model as it was and is tried again next time. */
void *g4_tower_get(g4_model *m, void **slot, void (**free_slot)(void *), void *(*load)(g4_model *), void (*free_fn)(void *));
void *g4_tower_alloc(g4_tower_mem *mem, size_t bytes);
void g4_tower_mem_free(g4_tower_mem *mem);

/* The float (BF16/F16/F32) tensor `name` of exactly `shape` (ndim 0: a scalar, stored [] or [1]),
 * copied to f32 in mem. NULL with a one-line error naming the tensor ("... (<tower>)"). */
float *g4_tower_floats(g4_model *m, g4_tower_mem *mem, const char *tower, const char *name, int ndim, const int64_t *shape);
float *g4_tower_vec(g4_model *m, g4_tower_mem *mem, const char *tower, const char *name, int n);

/* A Gemma4ClippableLinear: the linear and, with use_clipped_linears, its input/output clamps
 * (infinite otherwise, and where the checkpoint leaves them open). */
typedef struct {
    g4_linear lin;
    float in_min, in_max, out_min, out_max;
} g4_clip_linear;

/* Binds `module`.linear ([out, in]) and, when `clipped`, `module`.input_min/input_max/output_min/
 * output_max (a NaN clamp refused). 0 or -1 with the error. */
int g4_tower_bind_clippable(g4_model *m, g4_tower_mem *mem, const char *tower, g4_clip_linear *L, const char *module, int in, int out,
                            int clipped);
/* Binds a linear the checkpoint keeps float (modules_to_not_convert); a quantized one is refused. */
int g4_tower_bind_float(g4_model *m, g4_linear *L, const char *module, int in, int out);

/* Adds the multiply-adds linear L ran in session s, in int8 and in float (the session's row counts
 * times in x out), for g4 bench's tower MAC rates. */
void g4_tower_count_macs(const g4_session *s, const g4_linear *L, double *int_macs, double *float_macs);

/* x clamped to [lo, hi] in place (nothing to do when both are infinite). */
void g4_tower_clamp(float *x, size_t n, float lo, float hi);
/* y = linear(x) over n rows through g4_forward_linear, in calls of at most CHUNK rows and no more
 * than the session's scratch (CHUNK x the text model's widest linear) holds at L's width, so a
 * tower wider than the text model runs in smaller calls. */
void g4_tower_linear_rows(g4_session *s, const g4_linear *L, const float *x, int n, float *y);
/* y = clamp(linear(clamp(x))) over n rows; x may be clamped in place. */
void g4_tower_clip_linear(g4_session *s, const g4_clip_linear *L, float *x, int n, float *y);

#endif
