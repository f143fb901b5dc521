/* Collects the tensors a forward pass reports through g4_trace_fn, row by row, so the CLI can
 * write them as .npy (--dump-dir) and the tests can compare them with the goldens. */
#ifndef G4_MODEL_CAPTURE_H
#define G4_MODEL_CAPTURE_H

#include "g4.h"

typedef struct {
    char name[64];
    int row_ndim;
    int row_shape[2];
    int width; /* floats per row */
    int rows;  /* rows captured so far (positions pos0 ..) */
    int pos0;
    int cap;
    float *data;
} g4_captured;

typedef struct {
    int n, cap;
    g4_captured *t;
    int failed; /* out of memory while capturing */
} g4_capture;

/* The g4_trace_fn to register with user = a g4_capture*. */
void g4_capture_trace(void *user, const char *name, int pos0, int n, int row_ndim, const int *row_shape,
                      const float *data);
const g4_captured *g4_capture_get(const g4_capture *c, const char *name);
/* Writes every tensor as DIR/<name>.npy of shape [rows, row_shape...]; the per-layer
 * "hidden_after_layer<L>" tensors are stacked into hidden_after_layer.npy [L, rows, width],
 * and "logits" is written as prefill_logits.npy (the golden names). */
int g4_capture_write_npy(const g4_capture *c, const char *dir);
void g4_capture_free(g4_capture *c);

#endif
