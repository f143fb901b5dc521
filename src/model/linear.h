/* The linear step (activation-quant.md §2, int8-arithmetic.md §3): y = Q(W Q(x; s_in); s_out) for
 * rows of x, float, fake-quant or true integer as the session's options decide, with the integer
 * linears' per-row requantization tables. Every linear of the forward pass runs through it: the
 * decoder layers (layer.c), the lm_head (lmhead.c), the towers (vision/, audio/), the drafter's
 * layers (float) and the probes (probe.h). */
#ifndef G4_MODEL_LINEAR_H
#define G4_MODEL_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "g4.h"
#include "model.h"

/* y [n][out] = the linear L of x [n][in] (n <= CHUNK), per the session: the step every layer linear
 * takes (counted in the session's per-linear rows, timed as G4_PROF_LINEAR). */
void g4_forward_linear(g4_session *s, const g4_linear *L, const float *x, int n, float *y);
/* Linears reading the same input x (q/k/v, gate/up) into y[i]: in int mode the input is quantized
 * once and its codes shared when the input scales are bit-identical (they are in the checkpoint). */
void g4_linear_group(g4_session *s, const g4_linear *const *L, float *const *y, int count, const float *x, int n);
/* y = W x in float on the session's kernels, with no quantization and no count: a linear of a
 * model other than the session's (the drafter's, numbered in its own model), whose activations stay
 * float. */
void g4_linear_float(const g4_session *s, const g4_linear *L, const float *x, int n, float *y);

/* Q(x; s) = s * clamp(round(x / s), -128, 127) in place, with the session's rounding and
 * division rules; s = 0 is the identity (an uncalibrated point). */
void g4_fake_quant(const g4_session *s, float *x, size_t n, float scale);
/* The int8 codes of x at scale (a K/V cache row). */
void g4_quantize_codes(const g4_session *s, const float *x, size_t n, float scale, int8_t *codes);

/* Every integer linear's per-row tables (the session's rq, rq_f32), freed with the session. */
int g4_requant_tables_build(g4_session *s);
void g4_requant_tables_free(g4_session *s);
/* The table of one more linear (a tower's, bound after the layers): 0 or -1. */
int g4_requant_table_add(g4_session *s, const g4_linear *L);

#endif
