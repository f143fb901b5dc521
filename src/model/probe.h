/* What the tests can see inside a session (internal, not part of include/g4.h): which path each
 * linear took, one linear run by itself exactly as the forward pass runs it, and the int8 K/V
 * cache codes. They exist so that a test can tell an integer linear from its float stand-in and
 * a quantized cache from an f32 one even where the two give nearly the same logits. */
#ifndef G4_MODEL_PROBE_H
#define G4_MODEL_PROBE_H

#include <stdint.h>

#include "g4.h"

/* Token rows the linear named `module` (its checkpoint name, e.g.
 * "model.language_model.layers.3.per_layer_input_gate", or "lm_head") has computed since the
 * session was made: *int_rows through the integer path (int8 input codes x weight codes -> int32
 * accumulators -> requantized), *float_rows through the float one (float or fake-quant). The
 * lm_head's greedy/top-k shortcuts and its --lmhead-dynamic-q8 path are not counted. Returns 0,
 * or -1 when the model binds no linear of that name (a KV-shared layer's k_proj, for one). */
int g4_session_linear_rows(const g4_session *s, const char *module, long long *int_rows, long long *float_rows);

/* Runs the decoder-layer linear `module` on n rows x [n][in] into y [n][out] through the forward
 * pass's own linear step (the session's activation mode, quantization rules and kernels; the call
 * is counted as above). Where the integer path ran, codes [n][in] and acc [n][out] (either may be
 * NULL) receive its int8 input codes and int32 accumulators. n: 1 to 64. Returns 1 when the
 * integer path ran, 0 when the float one did, -1 on error. */
int g4_session_run_linear(g4_session *s, const char *module, const float *x, int n, float *y, int8_t *codes, int32_t *acc);

/* The int8 cache of K (v == 0) or V (v == 1) of producer layer `layer`, sequence `seq`: ctx rows of
 * *width codes (row p = position p), and its scale. NULL when that cache holds f32 values (--kv f32,
 * or a scale of 0) or the layer keeps no cache (a KV consumer). */
const int8_t *g4_session_kv_codes(const g4_session *s, int seq, int layer, int v, float *scale, int *width);

/* Makes the session's later evaluations run on the kernel level named `level` (as G4_DISPATCH names
 * them; every level gives the same bits, so only the speed changes): g4 bench alternates decode
 * steps between levels this way. Returns -1, changing nothing, when this build or CPU lacks it. */
int g4_session_set_kernels(g4_session *s, const char *level);

#endif
