/* The per-row steps of a chunk (norms, quantization, requantization, GELU) split over the pool by
 * rows: with the 64 rows of a prefill chunk they would otherwise run on one thread while the
 * others wait. A decode step's single row stays on the caller. Each row is computed exactly as
 * on its own. Shared by the linear step (linear.c), the layer (layer.c) and the chunk (forward.c). */
#ifndef G4_MODEL_ROWS_H
#define G4_MODEL_ROWS_H

#include <stdint.h>

#include "kernels/pool.h"
#include "model.h"

typedef struct rows_job rows_job;
struct rows_job {
    void (*run)(const rows_job *j, int t0, int t1);
    const g4_session *s;
    const g4_linear *L;
    const g4_layer *layer;
    const void *ctx; /* what else a step reads (layer.c: the layer's rows) */
    float *y;
    const float *x, *w;
    int8_t *codes;
    int width;
    int o0;  /* requant_run: the first output of the slice the sums in s->acc belong to */
    float f; /* eps, scale */
};

static inline void rows_items(void *ctx, int b, int e) {
    const rows_job *j = ctx;
    j->run(j, b, e);
}

/* work: about the multiply-adds of one element */
static inline void for_rows(rows_job *j, int rows, double work) {
    g4_pool_for(rows, 1, (double)rows * j->width * work, rows_items, j);
}

#endif
