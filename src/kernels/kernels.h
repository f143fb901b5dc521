/* Compute kernels. Each operation has one portable reference implementation here (kernels/ref.c);
 * faster variants (AVX2, NEON) sit behind the g4_kernels dispatch table and are tested against
 * the reference. Float reductions use a fixed 8-lane order so a vector kernel can reproduce the
 * reference bit for bit (no reassociation: a 1-ulp change can flip an int8 rounding downstream).
 *
 * Every dispatched matmul splits its output rows across a persistent thread pool (kernels/pool.c).
 * Each output element is computed by exactly one thread in the reference order, so results do
 * not depend on the thread count or on the dispatch level. */
#ifndef G4_KERNELS_H
#define G4_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* A weight matrix [out, in] as stored: packed 2/4/8-bit codes with one f32 scale per output row,
 * or BF16 values (bits == 16, no scales). */
typedef struct {
    int bits;
    int in, out;
    size_t row_bytes;
    const uint8_t *w;
    const float *w_scale;
} g4_qweight;

/* Sum of x[i] * code[i] over one packed row, in the fixed 8-lane order. */
float g4_ref_dot_codes_f32(const float *x, const uint8_t *row, int bits, int n);
/* Sum of x[i] * bf16[i] over one BF16 row (little-endian, possibly unaligned), same order. */
float g4_ref_dot_bf16_f32(const float *x, const uint8_t *row, int n);
/* y[t][o] = w_scale[o] * sum_i x[t][i] * code[o][i]  (or the BF16 dot), for t < n. */
void g4_ref_matmul_f32(const g4_qweight *w, const float *x, int n, float *y);

/* acc[t][o] = sum_i x[t][i] * code[o][i] in int32 for t < n: int8 activation codes against packed
 * 2/4/8-bit weight codes (the int-mode linear before requantization). */
void g4_ref_matmul_i8(const g4_qweight *w, const int8_t *x, int n, int32_t *acc);

/* The fixed 8-lane reduction used by every float dot product. */
static inline float g4_reduce8(const float a[8]) {
    float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    return (s0 + s2) + (s1 + s3);
}

typedef struct {
    const char *name;
    void (*matmul_f32)(const g4_qweight *w, const float *x, int n, float *y);
    void (*matmul_i8)(const g4_qweight *w, const int8_t *x, int n, int32_t *acc);
} g4_kernels;

/* The kernel set chosen for this CPU: the best supported level, or the one forced by
 * G4_DISPATCH=portable|avx2|neon (an unknown or unsupported value falls back to the best level
 * with a one-line warning on stderr). */
const g4_kernels *g4_kernels_get(void);

/* The kernel set of one level by name ("portable", "avx2", "neon"), or NULL when this build or
 * CPU does not have it. Tests and benchmarks use it to compare levels in one process. */
const g4_kernels *g4_kernels_level(const char *name);

/* Threads the matmuls use, the caller included. n <= 0 restores the default (online CPUs).
 * Not to be called while a matmul runs in another thread. */
void g4_kernels_set_threads(int n);
int g4_kernels_threads(void);
/* Stops and joins the pool threads (also registered with atexit). A later matmul restarts them. */
void g4_kernels_shutdown(void);

#endif
