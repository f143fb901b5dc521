/* The block-scaled matmul of float activations (kernels.h, g4_ref_matmul_blocks_f32) as the SIMD
 * levels run it (internal to src/kernels/): each activation row's fixed-point image X is prepared
 * once per call in the layout the level's tiles read, the output rows are split over the pool and
 * swept in tiles (sweep.h), and every tile computes each block's dot D_b exactly in integers and
 * folds acc = acc + (double)scale * (double)D_b in block order, as the reference does, so the
 * level gives the reference's bits whatever its tile shapes and thread split. The tiles cover
 * llama.cpp's layouts, blocks of 32 with 4-bit or 8-bit codes; other block-scaled weights run the
 * portable level's kernel. Plain C: a level includes it after its target pragma. */
#ifndef G4_KERNELS_BLOCKS_H
#define G4_KERNELS_BLOCKS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codes_f32.h"
#include "kernels.h"
#include "levels.h"
#include "pool.h"
#include "sweep.h"

#define G4_BLOCK_TILE 32

/* How a level wants X: three balanced int8 digits per element, X = d0 + 256 d1 + 65536 d2 (|d2| <=
 * 65), each digit row of a block 32 bytes, either in element order or with the even elements first
 * (x0 x2 .. x30 x1 x3 .. x31, the order of a 4-bit block's low then high nibbles); the same digits
 * for a pair of blocks b, b + 1 (b even) in 64 bytes per digit, the even elements of b then of
 * b + 1, then their odd elements (the low and high nibbles of the pair's 32 code bytes; a last
 * block without a partner is paired with zeros); or two int16 halves, X = lo + 256 hi with lo in
 * -128..127, each 32 int16 in element order. */
enum { G4_BLOCKS_DIGITS, G4_BLOCKS_DIGITS_EVEN_ODD, G4_BLOCKS_DIGIT_PAIRS, G4_BLOCKS_HALVES };

typedef struct {
    const g4_qweight *w;
    int n, nb;         /* activation rows; blocks per row (in / 32) */
    const uint8_t *xp; /* the prepared rows, xstride bytes apart: int8 [nb][3][32] (digit layouts) or int16 [nb][2][32] */
    size_t xstride;
    const int32_t *xsum; /* [n][xsum_stride]: the sum of X over each block, for raw-field offsets */
    int xsum_stride;
    const int *S;          /* [n]: the row's exponent, INT32_MIN for a row holding a NaN or an infinity */
    float *y;
} g4_blocks_job;

/* Output o of activation row t from its folded sum. */
static inline void g4_blocks_store(const g4_blocks_job *j, int o, int t, double acc) {
    int S = j->S[t];
    j->y[(size_t)t * j->w->out + o] = S == INT32_MIN ? NAN : (float)(acc * ldexp(1.0, -S));
}

/* The digits of X (g4_fix_split_row's balanced decomposition). */
static inline void g4_blocks_digits(int32_t X, int8_t d[3]) {
    for (int p = 0; p < 2; p++) {
        int32_t v = (int32_t)(((uint32_t)X + 128u) & 255u) - 128;
        d[p] = (int8_t)v;
        X = (X - v) / 256; /* exact */
    }
    d[2] = (int8_t)X;
}

/* Activation row t's image into the job's buffers in `layout`; returns its exponent. */
static inline int g4_blocks_prepare_row(const float *x, int in, int layout, int8_t *digits, int16_t *halves, int32_t *xsum) {
    int S = g4_fix_exponent(x, in);
    int nb = in / G4_BLOCK_TILE;
    double two_s = S == INT32_MIN ? 0 : ldexp(1.0, S);
    for (int b = 0; b < nb; b++) {
        int32_t sum = 0;
        for (int k = 0; k < G4_BLOCK_TILE; k++) {
            int32_t X = S == INT32_MIN ? 0 : fix_value(x[b * G4_BLOCK_TILE + k], two_s);
            sum += X;
            if (layout == G4_BLOCKS_HALVES) {
                int16_t *h = halves + (size_t)b * 2 * G4_BLOCK_TILE;
                int32_t lo = (int32_t)(((uint32_t)X + 128u) & 255u) - 128;
                h[k] = (int16_t)lo;
                h[G4_BLOCK_TILE + k] = (int16_t)((X - lo) / 256); /* |hi| <= 2^14 + 1 */
                continue;
            }
            int8_t d[3];
            g4_blocks_digits(X, d);
            if (layout == G4_BLOCKS_DIGIT_PAIRS) {
                size_t at = (size_t)(b / 2) * 3 * 2 * G4_BLOCK_TILE + (size_t)(k & 1) * G4_BLOCK_TILE + (size_t)(b & 1) * 16 + (size_t)k / 2;
                for (int p = 0; p < 3; p++) digits[at + (size_t)p * 2 * G4_BLOCK_TILE] = d[p];
                continue;
            }
            int pos = layout == G4_BLOCKS_DIGITS ? k : (k & 1) * (G4_BLOCK_TILE / 2) + k / 2;
            for (int p = 0; p < 3; p++) digits[((size_t)b * 3 + p) * G4_BLOCK_TILE + pos] = d[p];
        }
        if (xsum) xsum[b] = sum; /* |sum| <= 32 * 2^22 */
    }
    if (layout == G4_BLOCKS_DIGIT_PAIRS && nb % 2) { /* the last block's missing partner: zeros */
        size_t at = (size_t)(nb / 2) * 3 * 2 * G4_BLOCK_TILE + 16;
        for (int p = 0; p < 3; p++)
            for (int h = 0; h < 2; h++) memset(digits + at + (size_t)p * 2 * G4_BLOCK_TILE + (size_t)h * G4_BLOCK_TILE, 0, 16);
        if (xsum) xsum[nb] = 0;
    }
    return S;
}

/* Whether the level's tiles take w: blocks of 32 with 4-bit or 8-bit codes. */
static inline int g4_blocks_tiled(const g4_qweight *w) { return w->block == G4_BLOCK_TILE && (w->bits == 4 || w->bits == 8) && w->in > 0; }

/* A level's block-scaled matmul_f32: the activations prepared in layout(bits), then rows (a
 * g4_pool_fn over a g4_blocks_job) over the pool. Weights the tiles do not cover, and a call that
 * cannot get its buffers, take the portable kernel (the same bits). */
static inline void g4_blocks_matmul(const g4_qweight *w, const float *x, int n, float *y, int layout4, int layout8, g4_pool_fn rows) {
    if (n <= 0 || w->out <= 0) return;
    if (!g4_blocks_tiled(w)) {
        g4_portable_matmul_blocks_f32(w, x, n, y);
        return;
    }
    int layout = w->bits == 4 ? layout4 : layout8, nb = w->in / G4_BLOCK_TILE;
    int nbx = layout == G4_BLOCKS_DIGIT_PAIRS ? (nb + 1) / 2 * 2 : nb; /* blocks a row holds, the pairs' padding included */
    size_t per_row = (size_t)nbx * (layout == G4_BLOCKS_HALVES ? 2 * 2 : 3) * G4_BLOCK_TILE; /* a multiple of 32 */
    uint8_t *buf = aligned_alloc(64, ((size_t)n * per_row + 63) & ~(size_t)63);
    int32_t *xsum = malloc(sizeof *xsum * (size_t)n * (size_t)nbx);
    int *S = malloc(sizeof *S * (size_t)n);
    if (!buf || !xsum || !S) {
        free(buf);
        free(xsum);
        free(S);
        g4_portable_matmul_blocks_f32(w, x, n, y);
        return;
    }
    for (int t = 0; t < n; t++)
        S[t] = g4_blocks_prepare_row(x + (size_t)t * w->in, w->in, layout, (int8_t *)(buf + (size_t)t * per_row),
                                     (int16_t *)(void *)(buf + (size_t)t * per_row), xsum + (size_t)t * nbx);
    g4_blocks_job j = {.w = w, .n = n, .nb = nb, .xp = buf, .xstride = per_row, .xsum = xsum, .xsum_stride = nbx, .S = S, .y = y};
    g4_pool_for(w->out, G4_TILE_MAX_RO, (double)w->out * w->in * n * 3.0, rows, &j);
    free(buf);
    free(xsum);
    free(S);
}

/* The int16 halves (lo[32], hi[32]) of activation row t, block b. */
static inline const int16_t *g4_blocks_halves_at(const g4_blocks_job *j, int t, int b) {
    return (const int16_t *)(const void *)(j->xp + (size_t)t * j->xstride) + (size_t)b * 2 * G4_BLOCK_TILE;
}

/* The three digit rows (64 bytes each) of activation row t, blocks 2 pair and 2 pair + 1. */
static inline const int8_t *g4_blocks_pair_digits_at(const g4_blocks_job *j, int t, int pair) {
    return (const int8_t *)(j->xp + (size_t)t * j->xstride) + (size_t)pair * 3 * 2 * G4_BLOCK_TILE;
}

/* The three digit rows (32 bytes each) of activation row t, block b. */
static inline const int8_t *g4_blocks_digits_at(const g4_blocks_job *j, int t, int b) {
    return (const int8_t *)(j->xp + (size_t)t * j->xstride) + (size_t)b * 3 * G4_BLOCK_TILE;
}

#endif
