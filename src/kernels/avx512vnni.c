/* AVX-512 VNNI kernels: the int8 matmuls with 512-bit vpdpbusd; everything else is the AVX2
 * level's (kernels/avx2.c), which this level's CPUs all have. As in avx2.c the file needs no
 * compiler flags: its kernels are compiled for AVX-512 (F, BW, VL, VNNI, VBMI) through a target
 * pragma and only called after avx512vnni_supported() said yes (cpuid, and XCR0 for the ZMM
 * state), so the rest of the program stays baseline x86-64 and runs on AVX2-only CPUs.
 *
 * vpdpbusd multiplies unsigned bytes by signed bytes and adds each group of four products to an
 * int32 lane, exactly and without saturation (vpdpbusds would saturate): the lanes wrap modulo
 * 2^32, as the reference's sums do (g4_dot_packed accumulates in uint32). The weight fields are
 * the unsigned operand, taken raw (offset binary) as the AVX2 level does:
 *   sum x*(raw - off) = sum x*raw - off*sum x,   off = 2 (2-bit), 8 (4-bit), 128 (8-bit),
 * where an 8-bit code c becomes raw = c ^ 0x80 = c + 128 (0..255). Every step is an int32 sum
 * modulo 2^32, so the result is the reference's bit for bit in any order and whatever the tile
 * shape, the block grouping or the thread split; no int16 partial sum is left to overflow, and
 * 8-bit weights need no widening.
 *
 * Weights are read in 64-byte blocks (256 2-bit, 128 4-bit or 64 8-bit codes); the last, partial
 * block of a row is a masked load, so nothing past the row is read. A block's fields are
 * extracted with one mask (and one 16-bit shift) per field, so field vector f holds byte i's
 * field f, and the activations are permuted once per call to match (vpermt2b, VBMI), zero-padded
 * to whole blocks:
 *   2-bit block: [x0 x4 .. x252 | x1 x5 .. | x2 .. | x3 ..]   (field 0 | 1 | 2 | 3)
 *   4-bit block: [x0 x2 .. x126 | x1 x3 .. x127]              (low nibbles | high nibbles)
 *   8-bit block: x0 .. x63
 * Each vector of a prepared block is 64 bytes, one per field, so a field's activations are one
 * aligned load. */
#include <stdlib.h>
#include <string.h>

#include "cpu_x86.h"
#include "kernels.h"
#include "levels.h"
#include "quant/pack.h"

/* The CPU features the level needs (/proc/cpuinfo's names), as the probe below checks them. */
#define NEEDS "avx512f avx512bw avx512vl avx512_vnni avx512vbmi avx2 fma"

#if defined(__x86_64__)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma")
#endif

#define INLINE static inline __attribute__((always_inline))

typedef __m512i vnni_vec;
#define BLK 64
/* Weight rows of the widest prefill tile, for any number of activation rows: 4 x 4 int32
 * accumulators, the 4 rows' field vectors and one activation vector fit the 32 registers. */
#define TILE_WIDE(BITS, RT) 4
/* the decode rows' four weight rows' sums fit beside the accumulators at any RT */
#define FOUR_ROWS_MAX_RT 4

INLINE __m512i vec_zero(void) { return _mm512_setzero_si512(); }
INLINE __m512i vec_add(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }

/* The first `count` bytes of a 64-byte vector (count may be <= 0 or >= 64). */
INLINE __mmask64 byte_mask(long count) {
    return count >= 64 ? ~(__mmask64)0 : count <= 0 ? 0 : ((__mmask64)1 << count) - 1;
}

/* Field f of every byte of block v as the unsigned operand (8-bit: the code + 128). */
INLINE __m512i field(__m512i v, int f, const int BITS) {
    if (BITS == 8) return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
    if (f) v = _mm512_srli_epi16(v, f * BITS);
    return _mm512_and_si512(v, _mm512_set1_epi8(BITS == 2 ? 3 : 15));
}

INLINE __m512i load_block(const uint8_t *row, int b) { return _mm512_loadu_si512((const void *)(row + (size_t)b * BLK)); }

/* The row's last `tail` bytes from block nfull with zeros after them: a masked load reads nothing
 * past the row. */
INLINE __m512i load_tail(const uint8_t *row, int nfull, int tail) {
    return _mm512_maskz_loadu_epi8(byte_mask(tail), row + (size_t)nfull * BLK);
}

INLINE __m512i dpbusd(__m512i acc, __m512i u, __m512i s) { return _mm512_dpbusd_epi32(acc, u, s); }

INLINE __m512i load_x(const uint8_t *p) { return _mm512_load_si512((const void *)p); }

/* The four sums of a0..a3's lanes, in that order. */
INLINE __m128i hsum4(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
    /* 128-bit quarters: pairs of quarters, then the two halves, then the four lanes of each */
    __m512i s01 = _mm512_add_epi32(_mm512_shuffle_i64x2(a0, a1, 0x44), _mm512_shuffle_i64x2(a0, a1, 0xEE));
    __m512i s23 = _mm512_add_epi32(_mm512_shuffle_i64x2(a2, a3, 0x44), _mm512_shuffle_i64x2(a2, a3, 0xEE));
    __m512i s = _mm512_add_epi32(_mm512_shuffle_i64x2(s01, s23, 0x88), _mm512_shuffle_i64x2(s01, s23, 0xDD));
    s = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, (_MM_PERM_ENUM)0x4E));
    s = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, (_MM_PERM_ENUM)0xB1));
    return _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s));
}

INLINE uint32_t hsum1(__m512i a) { return (uint32_t)_mm512_reduce_add_epi32(a); }

#include "vnni.h"

/* ------------------------------------------------------------------ prepared activations --- */

/* vpermt2b indices picking element f of every group of E (2 or 4) over a pair of vectors: (E i +
 * f) mod 128 at byte i. For 4-bit blocks that is the whole field vector; for 2-bit blocks its
 * first 32 bytes come from the block's first pair of vectors and its last 32 (the same indices)
 * from the second. */
static __m512i perm_idx(int E, int f) {
    uint8_t idx[64];
    for (int i = 0; i < 64; i++) idx[i] = (uint8_t)((E * i + f) & 127);
    return _mm512_loadu_si512((const void *)idx);
}

/* The `avail` bytes at p that belong to the row (all 64 when avail >= 64), zeros after them; p is
 * not touched when none do. */
INLINE __m512i load_avail(const int8_t *p, long avail) {
    return avail > 0 ? _mm512_maskz_loadu_epi8(byte_mask(avail), p) : _mm512_setzero_si512();
}

/* One prepared block from `elems` activations at x (fewer than a whole block only at the end of a
 * row: masked loads leave the rest zero). Returns the int32 lanes of sum(x) over it. */
INLINE __m512i prepare_block(const int8_t *x, long elems, uint8_t *out, const __m512i idx[4], __m512i sums, const int BITS) {
    const int vecs = BITS == 2 ? 4 : BITS == 4 ? 2 : 1;
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i v[4];
#pragma GCC unroll 4
    for (int k = 0; k < vecs; k++) {
        v[k] = load_avail(elems > 64L * k ? x + 64 * k : x, elems - 64L * k);
        sums = dpbusd(sums, ones, v[k]);
    }
    if (BITS == 8) {
        _mm512_store_si512((void *)out, v[0]);
    } else if (BITS == 4) {
        _mm512_store_si512((void *)out, _mm512_permutex2var_epi8(v[0], idx[0], v[1]));
        _mm512_store_si512((void *)(out + 64), _mm512_permutex2var_epi8(v[0], idx[1], v[1]));
    } else {
        const __mmask64 upper = ~(__mmask64)0 << 32;
#pragma GCC unroll 4
        for (int f = 0; f < 4; f++) {
            __m512i lo = _mm512_permutex2var_epi8(v[0], idx[f], v[1]), hi = _mm512_permutex2var_epi8(v[2], idx[f], v[3]);
            _mm512_store_si512((void *)(out + 64 * f), _mm512_mask_blend_epi8(upper, lo, hi));
        }
    }
    return sums;
}

INLINE void prepare_rows(const int8_t *x, int n, int in, size_t nblk, uint8_t *xp, size_t xstride, uint32_t *corr, const int BITS) {
    const long per = BITS == 2 ? 256 : BITS == 4 ? 128 : 64; /* elements per block */
    __m512i idx[4];
    for (int f = 0; f < (BITS == 8 ? 0 : BITS == 4 ? 2 : 4); f++) idx[f] = perm_idx(BITS == 4 ? 2 : 4, f);
    for (int t = 0; t < n; t++) {
        const int8_t *xt = x + (size_t)t * in;
        uint8_t *pt = xp + (size_t)t * xstride;
        __m512i sums = _mm512_setzero_si512();
        for (size_t b = 0; b < nblk; b++) {
            long left = (long)in - (long)b * per;
            sums = prepare_block(xt + (left > 0 ? b * (size_t)per : 0), left, pt + b * block_xbytes(BITS), idx, sums, BITS);
        }
        corr[t] = hsum1(sums) * (uint32_t)(BITS == 2 ? 2 : BITS == 4 ? 8 : 128);
    }
}

static void prepare(const int8_t *x, int n, int in, int bits, size_t nblk, uint8_t *xp, size_t xstride, uint32_t *corr) {
    if (bits == 2) prepare_rows(x, n, in, nblk, xp, xstride, corr, 2);
    else if (bits == 4) prepare_rows(x, n, in, nblk, xp, xstride, corr, 4);
    else prepare_rows(x, n, in, nblk, xp, xstride, corr, 8);
}

void g4_avx512vnni_prepare(const int8_t *x, int n, int in, int bits, size_t nblk, uint8_t *xp, size_t xstride, uint32_t *corr) {
    prepare(x, n, in, bits, nblk, xp, xstride, corr);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* Outside the target region: this runs on any CPU. */
static int avx512vnni_supported(void) {
    const g4_x86_cpu *c = g4_x86_cpu_get();
    return c->avx2 && c->fma && c->avx512f && c->avx512bw && c->avx512vl && c->avx512vnni && c->avx512vbmi;
}

const g4_kernels g4_kernels_avx512vnni = G4_VNNI_LEVEL("avx512vnni", NEEDS, avx512vnni_supported);

#else /* not x86-64 */

const g4_kernels g4_kernels_avx512vnni = G4_LEVEL_NOT_BUILT("avx512vnni", NEEDS);

void g4_avx512vnni_prepare(const int8_t *x, int n, int in, int bits, size_t nblk, uint8_t *xp, size_t xstride, uint32_t *corr) {
    (void)x, (void)n, (void)in, (void)bits, (void)nblk, (void)xp, (void)xstride, (void)corr;
    abort(); /* only the AMX level calls it, and it is x86-64 only */
}

#endif
