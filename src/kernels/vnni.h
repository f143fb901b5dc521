/* The int8 matmul of the two VNNI levels (kernels/avx512vnni.c, kernels/avxvnni.c), written once
 * over their vector width. Internal: a level file includes it inside its target pragma, after
 * defining
 *   vnni_vec                 its integer vector (__m512i, __m256i), BLK bytes wide
 *   BLK                      the weight block: one vector of packed codes
 *   TILE_WIDE(BITS, RT)      the widest prefill tile's weight rows (kernels/sweep.h)
 *   FOUR_ROWS_MAX_RT         the most activation rows for which the decode rows reduce four
 *                            weight rows' sums at once (registers permitting)
 *   vec_zero, vec_add        zero, and int32 lane sums
 *   field(v, f, BITS)        field f of every byte of block v, as vpdpbusd's unsigned operand
 *   load_block(row, b)       whole block b of a weight row
 *   load_tail(row, nfull, tail)  the row's last `tail` bytes from block nfull, zeros after them
 *                            (reading nothing past the row)
 *   dpbusd(acc, u, s)        acc + the int32 sums of four u x s byte products per lane
 *   load_x(p)                one aligned vector of prepared activations
 *   hsum1(a), hsum4(a0..a3)  the sum of a's lanes; the four sums of a0..a3's lanes, in order
 * and, anywhere in the file, prepare(): its prepared activations (g4_i8_prepare_fn), one vector
 * per field per block, so that field f of block b of row t lies at t * xstride + b *
 * block_xbytes(bits) + BLK * f. It defines vnni_matmul_i8 and vnni_matmul_f32 for the level's
 * table.
 *
 * The arithmetic (the level files say more): vpdpbusd multiplies the raw (offset binary) weight
 * fields by the signed activation codes and adds each group of four products to an int32 lane
 * without saturating, so every sum wraps modulo 2^32 as the reference's do; the offset comes off
 * once per row, sum x*(raw - off) = sum x*raw - off*sum x. Integer sums are exact in any order:
 * no tile shape, set of chains or thread split changes a bit. */
#ifndef G4_KERNELS_VNNI_H
#define G4_KERNELS_VNNI_H

#include "sweep.h"

#define MAX_RO G4_TILE_MAX_RO
#define MAX_RT G4_TILE_MAX_RT

typedef g4_i8_job i8_job;

static const int tile_ro[MAX_RT + 1] = G4_TILE_RO(TILE_WIDE, 8);

/* Fields per byte, and bytes of prepared activations per weight block (one vector per field). */
static int fields_of(int bits) { return bits == 2 ? 4 : bits == 4 ? 2 : 1; }
static size_t block_xbytes(int bits) { return (size_t)BLK * (size_t)fields_of(bits); }

static void prepare(const int8_t *x, int n, int in, int bits, size_t nblk, uint8_t *xp, size_t xstride, uint32_t *corr);

/* ------------------------------------------------------------------ tiles (prefill) -------- */

/* acc[r][t] += the dot of weight block wv[r] and prepared activation block xrow[t] + xoff. */
INLINE void tile_block(vnni_vec acc[MAX_RO][MAX_RT], const vnni_vec wv[MAX_RO], const uint8_t *const xrow[MAX_RT], size_t xoff,
                       const int BITS, const int RO, const int RT) {
    const int fields = BITS == 2 ? 4 : BITS == 4 ? 2 : 1;
#pragma GCC unroll 4
    for (int f = 0; f < fields; f++) {
        vnni_vec wf[MAX_RO];
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) wf[r] = field(wv[r], f, BITS);
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) {
            vnni_vec x = load_x(xrow[t] + xoff + (size_t)BLK * f);
#pragma GCC unroll 4
            for (int r = 0; r < RO; r++) acc[r][t] = dpbusd(acc[r][t], wf[r], x);
        }
    }
}

/* acc[(t0 + t) * out + o + r] = the tile's sums (less the offset correction on the first span,
 * added to what is there on later ones). */
INLINE void tile_store(const i8_job *j, vnni_vec acc[MAX_RO][MAX_RT], int o, int t0, const int RO, const int RT) {
    const int out = j->w->out;
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) {
        int32_t *dst = &j->acc[(size_t)(t0 + t) * out + o];
        if (RO == 4) {
            __m128i v = hsum4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]);
            v = j->first ? _mm_sub_epi32(v, _mm_set1_epi32((int32_t)j->corr[t0 + t])) : _mm_add_epi32(v, _mm_loadu_si128((const __m128i *)dst));
            _mm_storeu_si128((__m128i *)dst, v);
        } else {
#pragma GCC unroll 4
            for (int r = 0; r < RO; r++) {
                uint32_t v = hsum1(acc[r][t]);
                dst[r] = (int32_t)(j->first ? v - j->corr[t0 + t] : (uint32_t)dst[r] + v);
            }
        }
    }
}

INLINE void i8_tile(const i8_job *j, int o, int t0, const int BITS, const int RO, const int RT) {
    const g4_qweight *w = j->w;
    const size_t xb = block_xbytes(BITS);
    vnni_vec acc[MAX_RO][MAX_RT], wv[MAX_RO];
    const uint8_t *wrow[MAX_RO], *xrow[MAX_RT];
#pragma GCC unroll 4
    for (int r = 0; r < RO; r++) {
        wrow[r] = w->w + (size_t)(o + r) * w->row_bytes;
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) acc[r][t] = vec_zero();
    }
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) xrow[t] = j->xp + (size_t)(t0 + t) * j->xstride;
    int full_end = j->kb1 < j->nfull ? j->kb1 : j->nfull;
    for (int b = j->kb0; b < full_end; b++) {
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) wv[r] = load_block(wrow[r], b);
        tile_block(acc, wv, xrow, (size_t)b * xb, BITS, RO, RT);
    }
    if (j->tail && j->kb1 > j->nfull) {
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) wv[r] = load_tail(wrow[r], j->nfull, j->tail);
        tile_block(acc, wv, xrow, (size_t)j->nfull * xb, BITS, RO, RT);
    }
    tile_store(j, acc, o, t0, RO, RT);
}

/* One function per bit width, each holding every tile shape the sweep asks for. */
G4_I8_TILE_FNS(i8_tile, i8_job, i8_tile, TILE_WIDE)

static void i8_rows(void *ctx, int o0, int o1) {
    const i8_job *j = ctx;
    int bits = j->w->bits;
    g4_i8_sweep(j, o0, o1, BLK, block_xbytes(bits), tile_ro, i8_tile_for(bits));
}

/* ------------------------------------------------------------------ rows (decode) ---------- */

/* One to four activation rows (decode, and the digit rows of one float row): each weight row is
 * streamed on its own, front to back, with a prefetch I8_PREFETCH bytes ahead (as in avx2.c:
 * interleaving rows turns one stream into several, which measured slower from DRAM), and its
 * fields are extracted once for the RT activation rows. Four rows' sums are then reduced
 * together. With one activation row, two blocks a step keep several add chains in flight.
 * The prefetch runs 6 KiB ahead, not avx2.c's 2 KiB: over one E2B decode step's 276 matmuls
 * (bench_kernels decode, 2 threads, distances alternating in one process, 40 rounds) 6 KiB took
 * 0.83 and 0.87 of 2 KiB's time in two runs on the Zen 5 development machine with 64-byte
 * blocks, and was the fastest of 1, 2, 3, 4, 5, 6, 8, 12 and 16 KiB in each of three runs; with
 * 32-byte blocks (AVX-VNNI) 2 KiB took 1.00-1.10x the AVX2 level's time there, 6 KiB 0.84x. No
 * AVX-VNNI CPU without AVX-512 was at hand to measure. */
#define I8_PREFETCH 6144
INLINE void prefetch_ahead(const uint8_t *p, size_t ahead) {
    _mm_prefetch((const char *)(uintptr_t)((uintptr_t)p + ahead), _MM_HINT_T0);
}

/* acc[set][t] += weight block v against prepared activation row x[t] (at xoff). c (0 or 1) is the
 * block's parity: with several activation rows, odd and even blocks add to two sets (RT chains
 * each); with one row each field of each parity has a set of its own (up to 8 chains), since a
 * single chain of vpdpbusd, one per field, would be bound by its latency (4-5 cycles) rather than
 * by the loads. */
#define ROW_SETS(BITS, RT) ((RT) > 1 ? 2 : 2 * ((BITS) == 2 ? 4 : (BITS) == 4 ? 2 : 1))
INLINE void row_block(vnni_vec acc[8][MAX_RT], vnni_vec v, const uint8_t *const x[MAX_RT], size_t xoff, int c, const int BITS,
                      const int RT) {
    const int fields = BITS == 2 ? 4 : BITS == 4 ? 2 : 1;
#pragma GCC unroll 4
    for (int f = 0; f < fields; f++) {
        vnni_vec wf = field(v, f, BITS);
        int set = RT > 1 ? c : c * fields + f;
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) acc[set][t] = dpbusd(acc[set][t], wf, load_x(x[t] + xoff + (size_t)BLK * f));
    }
}

/* sums[t] = the dot of one weight row and prepared activation row x[t] (its int32 lanes). Two
 * blocks a step, with a prefetch for each 64-byte line they hold. */
INLINE void row_dot(const uint8_t *row, const uint8_t *const x[MAX_RT], int nfull, int tail, vnni_vec sums[MAX_RT], const int BITS,
                    const int RT) {
    const size_t xb = block_xbytes(BITS);
    const int sets = ROW_SETS(BITS, RT);
    vnni_vec acc[8][MAX_RT];
#pragma GCC unroll 8
    for (int k = 0; k < sets; k++)
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) acc[k][t] = vec_zero();
    int b = 0;
    for (; b + 2 <= nfull; b += 2) {
#pragma GCC unroll 2
        for (size_t line = 0; line < 2 * BLK; line += 64) prefetch_ahead(row + (size_t)b * BLK + line, I8_PREFETCH);
        row_block(acc, load_block(row, b), x, (size_t)b * xb, 0, BITS, RT);
        row_block(acc, load_block(row, b + 1), x, (size_t)(b + 1) * xb, 1, BITS, RT);
    }
    if (b < nfull) row_block(acc, load_block(row, b), x, (size_t)b * xb, 0, BITS, RT);
    if (tail) row_block(acc, load_tail(row, nfull, tail), x, (size_t)nfull * xb, 1, BITS, RT);
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) {
        sums[t] = acc[0][t];
#pragma GCC unroll 8
        for (int k = 1; k < sets; k++) sums[t] = vec_add(sums[t], acc[k][t]);
    }
}

INLINE void i8_rows_few(const i8_job *j, int o0, int o1, const int BITS, const int RT) {
    const g4_qweight *w = j->w;
    const int out = w->out;
    const uint8_t *x[MAX_RT];
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) x[t] = j->xp + (size_t)t * j->xstride;
    int o = o0;
    for (; RT <= FOUR_ROWS_MAX_RT && o + 4 <= o1; o += 4) {
        vnni_vec s[4][MAX_RT];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) row_dot(w->w + (size_t)(o + r) * w->row_bytes, x, j->nfull, j->tail, s[r], BITS, RT);
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) {
            __m128i v = _mm_sub_epi32(hsum4(s[0][t], s[1][t], s[2][t], s[3][t]), _mm_set1_epi32((int32_t)j->corr[t]));
            _mm_storeu_si128((__m128i *)&j->acc[(size_t)t * out + o], v);
        }
    }
    for (; o < o1; o++) {
        vnni_vec s[MAX_RT];
        row_dot(w->w + (size_t)o * w->row_bytes, x, j->nfull, j->tail, s, BITS, RT);
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) j->acc[(size_t)t * out + o] = (int32_t)(hsum1(s[t]) - j->corr[t]);
    }
}

G4_I8_ROWS_FN(i8_rows_1, i8_job, i8_rows_few, 1)
G4_I8_ROWS_FN(i8_rows_2, i8_job, i8_rows_few, 2)
G4_I8_ROWS_FN(i8_rows_3, i8_job, i8_rows_few, 3)
G4_I8_ROWS_FN(i8_rows_4, i8_job, i8_rows_few, 4)

/* ------------------------------------------------------------------ the level's matmuls ---- */

static void vnni_matmul_i8(const g4_qweight *w, const int8_t *x, int n, int32_t *acc) {
    static const g4_pool_fn rows[5] = {i8_rows, i8_rows_1, i8_rows_2, i8_rows_3, i8_rows_4};
    g4_i8_matmul(w, x, n, acc, BLK, block_xbytes(w->bits), prepare, rows);
}

/* Float activations against packed codes run through this level's int8 matmul
 * (g4_matmul_codes_f32); BF16 and block-scaled weights through the AVX2 level's kernels. */
static void vnni_matmul_f32(const g4_qweight *w, const float *x, int n, float *y) {
    if (n <= 0 || w->out <= 0) return;
    if (w->block == 0 && (w->bits == 2 || w->bits == 4 || w->bits == 8)) g4_matmul_codes_f32(w, x, n, y, vnni_matmul_i8);
    else g4_avx2_matmul_f32(w, x, n, y);
}

/* The level's table (outside the target region: it is only data): the matmuls above, everything
 * else the AVX2 level's, which every VNNI CPU has. */
#define G4_VNNI_LEVEL(NAME, NEEDS, SUPPORTED)                                                                    \
    {.name = NAME, .cpu_needs = NEEDS, .built = 1, .supported = SUPPORTED, .matmul_f32 = vnni_matmul_f32,        \
     .matmul_i8 = vnni_matmul_i8, .quantize = g4_avx2_quantize, .fake_quant = g4_avx2_fake_quant,                \
     .requant_f32 = g4_avx2_requant_f32, .acc_scale = g4_avx2_acc_scale, .gelu_mul = g4_avx2_gelu_mul,           \
     .attention = g4_avx2_attention, .softcap = g4_avx2_softcap}

#endif
