/* AVX-VNNI kernels: the int8 matmuls with the VEX form of vpdpbusd on 256-bit vectors, for CPUs
 * that have it without AVX-512 (Alder Lake and later client cores, Sierra Forest, Zen 5 client
 * parts with AVX-512 off); everything else is the AVX2 level's (kernels/avx2.c). As there, the
 * file needs no compiler flags: the kernels are compiled for AVX2 + AVX-VNNI through a target
 * pragma and only called after avxvnni_supported() said yes (cpuid, and XCR0 for the YMM
 * state).
 *
 * The arithmetic is kernels/avx512vnni.c's: vpdpbusd multiplies the raw (offset binary) weight
 * fields, unsigned, by the signed activation codes and adds each group of four products to an
 * int32 lane without saturating, so every sum wraps modulo 2^32 as the reference's do;
 *   sum x*(raw - off) = sum x*raw - off*sum x,   off = 2 (2-bit), 8 (4-bit), 128 (8-bit: raw = c ^ 0x80).
 * Against the AVX2 level that replaces vpmaddubsw + vpaddw (and the widening vpmaddwd of the
 * int16 sums) by one instruction per 32 products, and 8-bit codes need no int16 widening.
 *
 * Blocks and prepared activations are the AVX2 level's: 32-byte weight blocks (128 2-bit, 64
 * 4-bit or 32 8-bit codes), fields extracted in bit order, activations permuted to match once
 * per call and zero-padded to whole blocks:
 *   2-bit block: [x0 x4 .. x124 | x1 x5 .. | x2 .. | x3 ..]   (field 0 | 1 | 2 | 3)
 *   4-bit block: [x0 x2 .. x62 | x1 x3 .. x63]                (low nibbles | high nibbles)
 *   8-bit block: x0 .. x31 (bytes, where the AVX2 level widens them to int16)
 * A row's last partial block is copied into a zeroed buffer (AVX2 has no byte-masked loads), so
 * nothing past the row is read. */
#include <stdlib.h>
#include <string.h>

#include "cpu_x86.h"
#include "kernels.h"
#include "levels.h"
#include "quant/pack.h"

/* The CPU features the level needs (/proc/cpuinfo's names), as the probe below checks them. */
#define NEEDS "avx_vnni avx2 fma"

#if defined(__x86_64__)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,avxvnni")
#endif

#define INLINE static inline __attribute__((always_inline))

typedef __m256i vnni_vec;
#define BLK 32
/* Weight rows of the widest prefill tile for RT activation rows: 4 to 8 accumulators, with the
 * rows' field vectors and an activation vector within the 16 registers. */
#define TILE_WIDE(BITS, RT) ((RT) <= 2 ? 4 : 2)
/* the decode rows' four weight rows' sums fit beside the accumulators up to RT = 2 */
#define FOUR_ROWS_MAX_RT 2

INLINE __m256i vec_zero(void) { return _mm256_setzero_si256(); }
INLINE __m256i vec_add(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }

/* Field f of every byte of block v as the unsigned operand (8-bit: the code + 128). */
INLINE __m256i field(__m256i v, int f, const int BITS) {
    if (BITS == 8) return _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
    if (f) v = _mm256_srli_epi16(v, f * BITS);
    return _mm256_and_si256(v, _mm256_set1_epi8(BITS == 2 ? 3 : 15));
}

INLINE __m256i load_block(const uint8_t *row, int b) { return _mm256_loadu_si256((const __m256i *)(row + (size_t)b * BLK)); }

/* The row's last `tail` bytes from block nfull, zero after them. */
INLINE __m256i load_tail(const uint8_t *row, int nfull, int tail) {
    uint8_t buf[BLK] = {0};
    memcpy(buf, row + (size_t)nfull * BLK, (size_t)tail);
    return _mm256_loadu_si256((const __m256i *)buf);
}

INLINE __m256i dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }

INLINE __m256i load_x(const uint8_t *p) { return _mm256_load_si256((const __m256i *)p); }

/* The four sums of a0..a3's lanes, in that order. */
INLINE __m128i hsum4(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
    __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(a0, a1), _mm256_unpackhi_epi32(a0, a1));
    __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(a2, a3), _mm256_unpackhi_epi32(a2, a3));
    __m256i t = _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

INLINE uint32_t hsum1(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return (uint32_t)_mm_cvtsi128_si32(s);
}

#include "vnni.h"

/* ------------------------------------------------------------------ prepared activations --- */

/* One prepared block from `elems` activations at x (fewer than a whole block only at the end of a
 * row: the rest is zero), the permutation of avx2.c's i8_prepare_block. Returns the int32 lanes
 * of sum(x) over it added to sums. */
INLINE __m256i prepare_block(const int8_t *x, int elems, uint8_t *out, __m256i sums, const int BITS) {
    const int full = BITS == 2 ? 128 : BITS == 4 ? 64 : 32;
    const __m256i ones = _mm256_set1_epi8(1);
    int8_t tmp[128];
    if (elems < full) {
        memset(tmp, 0, sizeof tmp);
        memcpy(tmp, x, (size_t)(elems > 0 ? elems : 0));
        x = tmp;
    }
    if (BITS == 8) {
        __m256i v = _mm256_loadu_si256((const __m256i *)x);
        _mm256_store_si256((__m256i *)out, v);
        return dpbusd(sums, ones, v);
    }
    if (BITS == 4) {
        /* per 16 bytes [evens | odds]; qwords then ordered evens, evens, odds, odds */
        const __m256i sh = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                            0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        __m256i v0 = _mm256_loadu_si256((const __m256i *)x), v1 = _mm256_loadu_si256((const __m256i *)(x + 32));
        __m256i a = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v0, sh), 0xD8);
        __m256i b = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v1, sh), 0xD8);
        _mm256_store_si256((__m256i *)out, _mm256_permute2x128_si256(a, b, 0x20));
        _mm256_store_si256((__m256i *)(out + 32), _mm256_permute2x128_si256(a, b, 0x31));
        return dpbusd(dpbusd(sums, ones, v0), ones, v1);
    }
    /* per 16 bytes: dwords [field 0 | 1 | 2 | 3]; then per vector qwords [field 0 | 1 | 2 | 3]
     * (each 8 bytes: 16 elements' worth of one field), and a 4x4 qword transpose across the four
     * vectors gathers field f of all 128 elements into 32 consecutive bytes */
    const __m256i sh = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                        0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i idx = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i p[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(x + 32 * k));
        p[k] = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, sh), idx);
        sums = dpbusd(sums, ones, v);
    }
    __m256i lo01 = _mm256_unpacklo_epi64(p[0], p[1]), hi01 = _mm256_unpackhi_epi64(p[0], p[1]);
    __m256i lo23 = _mm256_unpacklo_epi64(p[2], p[3]), hi23 = _mm256_unpackhi_epi64(p[2], p[3]);
    _mm256_store_si256((__m256i *)out, _mm256_permute2x128_si256(lo01, lo23, 0x20));
    _mm256_store_si256((__m256i *)(out + 32), _mm256_permute2x128_si256(hi01, hi23, 0x20));
    _mm256_store_si256((__m256i *)(out + 64), _mm256_permute2x128_si256(lo01, lo23, 0x31));
    _mm256_store_si256((__m256i *)(out + 96), _mm256_permute2x128_si256(hi01, hi23, 0x31));
    return sums;
}

INLINE void prepare_rows(const int8_t *x, int n, int in, size_t nblk, uint8_t *xp, size_t xstride, uint32_t *corr, const int BITS) {
    const long per = BITS == 2 ? 128 : BITS == 4 ? 64 : 32; /* elements per block */
    for (int t = 0; t < n; t++) {
        const int8_t *xt = x + (size_t)t * in;
        uint8_t *pt = xp + (size_t)t * xstride;
        __m256i sums = _mm256_setzero_si256();
        for (size_t b = 0; b < nblk; b++) {
            long left = (long)in - (long)b * per;
            int elems = left <= 0 ? 0 : left < per ? (int)left : (int)per;
            sums = prepare_block(xt + (elems ? b * (size_t)per : 0), elems, pt + b * block_xbytes(BITS), sums, BITS);
        }
        corr[t] = hsum1(sums) * (uint32_t)(BITS == 2 ? 2 : BITS == 4 ? 8 : 128);
    }
}

static void prepare(const int8_t *x, int n, int in, int bits, size_t nblk, uint8_t *xp, size_t xstride, uint32_t *corr) {
    if (bits == 2) prepare_rows(x, n, in, nblk, xp, xstride, corr, 2);
    else if (bits == 4) prepare_rows(x, n, in, nblk, xp, xstride, corr, 4);
    else prepare_rows(x, n, in, nblk, xp, xstride, corr, 8);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* Outside the target region: this runs on any CPU. */
static int avxvnni_supported(void) {
    const g4_x86_cpu *c = g4_x86_cpu_get();
    return c->avx2 && c->fma && c->avxvnni;
}

const g4_kernels g4_kernels_avxvnni = G4_VNNI_LEVEL("avxvnni", NEEDS, avxvnni_supported);

#else /* not x86-64 */

const g4_kernels g4_kernels_avxvnni = G4_LEVEL_NOT_BUILT("avxvnni", NEEDS);

#endif
