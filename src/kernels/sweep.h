/* The tile sweep the levels' matmuls share (internal to src/kernels/): a thread's range of weight
 * rows is cut into chunks that stay in cache, and each chunk is covered by tiles of RO weight rows
 * x RT activation rows (RT up to 4: the activation rows left; RO the level's widest tile for that
 * RT while that many rows are left in the chunk, else 1). A level supplies the tile kernel, which
 * holds each output's own accumulators in the reference's order, so the tile shapes, the chunks
 * and the thread split never change a bit. Plain C; a level includes it after its target pragma,
 * so the sweep is compiled for the level's instruction set with the kernels it calls.
 *
 * Tile shapes are constants in the kernel (they size its registers): a level names them with a
 * macro WIDE(BITS, RT), the widest tile's RO for RT activation rows, which makes both the table
 * the sweep reads (G4_TILE_RO) and the switch that instantiates each shape (G4_TILE_SWITCH), so
 * the two cannot disagree. */
#ifndef G4_KERNELS_SWEEP_H
#define G4_KERNELS_SWEEP_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "pool.h"
#include "quant/pack.h"

#define G4_TILE_MAX_RO 4
#define G4_TILE_MAX_RT 4

/* The widest tile's weight rows for 1..4 activation rows (index 0 unused). */
#define G4_TILE_RO(WIDE, BITS) {0, WIDE(BITS, 1), WIDE(BITS, 2), WIDE(BITS, 3), WIDE(BITS, 4)}

/* A tile of `ro` weight rows from o and `rt` activation rows from t of the job. */
typedef void (*g4_tile_fn)(const void *job, int o, int t, int ro, int rt);

/* The body of a g4_tile_fn: FN(j, o, t, BITS, RO, RT) with the shape as constants, one case per
 * shape the sweep asks for (1 or WIDE(BITS, rt) weight rows). */
#define G4_TILE_SWITCH(FN, BITS, WIDE)                          \
    switch (rt * 2 + (ro > 1)) {                                \
    case 1 * 2: FN(j, o, t, BITS, 1, 1); break;                 \
    case 1 * 2 + 1: FN(j, o, t, BITS, WIDE(BITS, 1), 1); break; \
    case 2 * 2: FN(j, o, t, BITS, 1, 2); break;                 \
    case 2 * 2 + 1: FN(j, o, t, BITS, WIDE(BITS, 2), 2); break; \
    case 3 * 2: FN(j, o, t, BITS, 1, 3); break;                 \
    case 3 * 2 + 1: FN(j, o, t, BITS, WIDE(BITS, 3), 3); break; \
    case 4 * 2: FN(j, o, t, BITS, 1, 4); break;                 \
    case 4 * 2 + 1: FN(j, o, t, BITS, WIDE(BITS, 4), 4); break; \
    default: abort();                                           \
    }

/* A g4_tile_fn named NAME over jobs of type JOB: FN's tiles with BITS-bit weights, in every shape
 * WIDE gives. */
#define G4_TILE_FN(NAME, JOB, FN, BITS, WIDE)                         \
    static void NAME(const void *job, int o, int t, int ro, int rt) { \
        const JOB *j = job;                                           \
        G4_TILE_SWITCH(FN, BITS, WIDE)                                \
    }

/* The int8 tile functions NAME_2, NAME_4 and NAME_8 (FN's tiles with 2-, 4- and 8-bit weights)
 * and NAME_for(bits), which picks one. */
#define G4_I8_TILE_FNS(NAME, JOB, FN, WIDE)                                                           \
    G4_TILE_FN(NAME##_2, JOB, FN, 2, WIDE)                                                            \
    G4_TILE_FN(NAME##_4, JOB, FN, 4, WIDE)                                                            \
    G4_TILE_FN(NAME##_8, JOB, FN, 8, WIDE)                                                            \
    static g4_tile_fn NAME##_for(int bits) { return bits == 2 ? NAME##_2 : bits == 4 ? NAME##_4 : NAME##_8; }

/* A g4_pool_fn named NAME over the rows of an int8 job of type JOB: FN(j, o0, o1, BITS, RT) with
 * the job's weight bits as the constant BITS. */
#define G4_I8_ROWS_FN(NAME, JOB, FN, RT)                       \
    static void NAME(void *ctx, int o0, int o1) {              \
        const JOB *j = ctx;                                    \
        if (j->w->bits == 2) FN(j, o0, o1, 2, RT);             \
        else if (j->w->bits == 4) FN(j, o0, o1, 4, RT);        \
        else FN(j, o0, o1, 8, RT);                             \
    }

#define G4_SWEEP_INLINE static inline __attribute__((always_inline))

/* Weight rows of a chunk: enough that the activation group (RT rows) and the chunk's rows, of
 * `row_bytes` each, both stay in L1/L2 while every group runs through the chunk. */
G4_SWEEP_INLINE int g4_tile_chunk_rows(size_t row_bytes) {
    size_t r = 16384 / (row_bytes ? row_bytes : 1);
    return r < G4_TILE_MAX_RO ? G4_TILE_MAX_RO : r > 4096 ? 4096 : (int)(r & ~(size_t)3);
}

/* The tiles of weight rows [ob, oe) x the job's n activation rows. */
G4_SWEEP_INLINE void g4_tile_chunk(const void *job, int n, int ob, int oe, const int shape[], g4_tile_fn tile) {
    for (int t = 0; t < n;) {
        int rt = n - t < G4_TILE_MAX_RT ? n - t : G4_TILE_MAX_RT;
        for (int o = ob; o < oe;) {
            int ro = oe - o >= shape[rt] ? shape[rt] : 1;
            tile(job, o, t, ro, rt);
            o += ro;
        }
        t += rt;
    }
}

/* Weight rows [o0, o1) (of `row_bytes` each) x n activation rows, a chunk at a time. */
G4_SWEEP_INLINE void g4_tile_sweep(const void *job, int n, int o0, int o1, size_t row_bytes, const int shape[], g4_tile_fn tile) {
    int chunk = g4_tile_chunk_rows(row_bytes);
    for (int ob = o0; ob < o1; ob += chunk) g4_tile_chunk(job, n, ob, o1 - ob > chunk ? ob + chunk : o1, shape, tile);
}

/* ---- the x86 levels' int8 matmuls: prepared activations and a split of the blocks ---- */

/* The x86 int8 matmuls take the raw (offset binary) weight fields as the unsigned operand and
 * correct by off * sum x afterwards; the activations are permuted once per call into "prepared"
 * rows that match a weight block's field order (each level's file says how). */
typedef struct {
    const g4_qweight *w;
    int n;
    const uint8_t *xp; /* n prepared rows, xstride bytes apart */
    size_t xstride;
    const uint32_t *corr; /* off * sum x per activation row (mod 2^32) */
    int nfull;            /* whole weight blocks per row */
    int tail;             /* bytes of the last partial block (0: none) */
    int32_t *acc;
    /* The span of blocks a tile covers: [kb0, kb1), block nfull being the tail. The first span
     * stores its sums, later ones add theirs (int32 sums may be split anywhere). */
    int kb0, kb1, first;
} g4_i8_job;

/* Rows [o0, o1) of an int8 matmul with blocks of `block_bytes` weight bytes and `block_xbytes`
 * prepared activation bytes. With several activation rows the blocks are split so that one
 * group's slice of prepared activations (about 16 KB) stays in L1 while a chunk of weight rows
 * runs through it; one row needs no split. */
G4_SWEEP_INLINE void g4_i8_sweep(const g4_i8_job *j, int o0, int o1, size_t block_bytes, size_t block_xbytes, const int shape[],
                                 g4_tile_fn tile) {
    int kb_total = j->nfull + (j->tail ? 1 : 0);
    int ks = j->n == 1 ? kb_total : (int)(16384 / (G4_TILE_MAX_RT * block_xbytes));
    if (ks >= kb_total) ks = kb_total;
    int chunk = g4_tile_chunk_rows((size_t)ks * block_bytes);
    g4_i8_job js = *j;
    for (int ob = o0; ob < o1; ob += chunk) {
        int oe = o1 - ob > chunk ? ob + chunk : o1;
        for (int kb = 0; kb < kb_total; kb += ks) {
            js.kb0 = kb;
            js.kb1 = kb_total - kb > ks ? kb + ks : kb_total;
            js.first = kb == 0;
            g4_tile_chunk(&js, j->n, ob, oe, shape, tile);
        }
    }
}

/* Writes the prepared rows of x [n][in] (nblk blocks each, xstride bytes apart) and their
 * corrections. */
typedef void (*g4_i8_prepare_fn)(const int8_t *x, int n, int in, int bits, size_t nblk, uint8_t *xp, size_t xstride,
                                 uint32_t *corr);

/* An x86 level's matmul_i8: the activations prepared once, then the weight rows split over the
 * pool, rows[n] doing a range for n = 1..4 activation rows (the decode forms) and rows[0] for
 * more. Falls back to the reference for a weight that is not 2/4/8-bit and when memory runs out. */
G4_SWEEP_INLINE void g4_i8_matmul(const g4_qweight *w, const int8_t *x, int n, int32_t *acc, size_t block_bytes,
                                  size_t block_xbytes, g4_i8_prepare_fn prepare, const g4_pool_fn rows[5]) {
    if (n <= 0 || w->out <= 0) return;
    int bits = w->bits;
    if (bits != 2 && bits != 4 && bits != 8) {
        g4_ref_matmul_i8(w, x, n, acc); /* not a valid int weight; let the reference decide */
        return;
    }
    if (w->in <= 0) { /* empty dot products; the block loops would write nothing */
        memset(acc, 0, sizeof *acc * (size_t)n * (size_t)w->out);
        return;
    }
    size_t pb = g4_packed_row_bytes(bits, (size_t)w->in);
    size_t nblk = (pb + block_bytes - 1) / block_bytes;
    /* xstride is a multiple of 32 (a whole vector per field); on a 64-byte aligned buffer every
     * activation load is aligned */
    size_t xstride = nblk * block_xbytes;
    uint8_t *xp = aligned_alloc(64, ((size_t)n * xstride + 127) & ~(size_t)63);
    uint32_t *corr = malloc(sizeof *corr * (size_t)n);
    if (!xp || !corr) {
        free(xp);
        free(corr);
        g4_ref_matmul_i8(w, x, n, acc);
        return;
    }
    prepare(x, n, w->in, bits, nblk, xp, xstride, corr);
    g4_i8_job j = {.w = w, .n = n, .xp = xp, .xstride = xstride, .corr = corr,
                   .nfull = (int)(pb / block_bytes), .tail = (int)(pb % block_bytes), .acc = acc};
    g4_pool_for(w->out, G4_TILE_MAX_RO, (double)w->out * w->in * n, rows[n <= 4 ? n : 0], &j);
    free(xp);
    free(corr);
}

#endif
