/* AVX2 kernels. The file needs no compiler flags: the kernels are compiled for AVX2 through a
 * target pragma (AVX2 and FMA) and only called after avx2_supported() said yes, so the rest
 * of the program stays baseline x86-64. Fused multiply-adds appear only where the reference has
 * fmaf (the attention dots and sums); -ffp-contract=off keeps the compiler from fusing anything
 * else, since elsewhere the reference rounds the product and the sum separately.
 *
 * Both matmuls compute a tile of RO weight rows x RT activation rows at a time: each weight block
 * is unpacked once into registers and used for RT activation rows (prefill reuse), and RO
 * independent accumulator chains hide the add latency when n == 1 (decode). Each output still
 * has its own accumulator with the reference's per-lane order, so the tile shape, the thread
 * count and the row split never change a bit. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "kernels.h"
#include "levels.h"
#include "pool.h"
#include "quant/pack.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

#include "blocks.h"
#include "sweep.h"

#define INLINE static inline __attribute__((always_inline))
#define MAX_RO G4_TILE_MAX_RO
#define MAX_RT G4_TILE_MAX_RT

/* Weight rows of the widest tile for RT = 1..4 activation rows (kernels/sweep.h): fewer activation
 * rows, more weight rows, so there are always 4 to 8 independent accumulators and no spills. The
 * 2/4-bit int8 path holds an int16 partial sum beside each accumulator, hence its smaller tiles;
 * 8-bit codes and BF16 (BITS 16) take the larger ones. */
#define TILE_WIDE(BITS, RT) ((BITS) >= 8 ? ((RT) <= 2 ? 4 : 2) : (RT) == 1 ? 4 : (RT) == 2 ? 2 : 1)
static const int tile_ro[MAX_RT + 1] = G4_TILE_RO(TILE_WIDE, 8);
static const int tile_ro_i8_low[MAX_RT + 1] = G4_TILE_RO(TILE_WIDE, 4);

static double macs(const g4_qweight *w, int n) { return (double)w->out * w->in * n; }

/* ------------------------------------------------------------------ int8 x packed codes ---- */

/* The int8 path works on 32-byte weight blocks (128 2-bit, 64 4-bit or 32 8-bit codes) and uses
 * the raw offset-binary fields as the unsigned operand of maddubs:
 *   sum x*(raw - off) = sum x*raw - off*sum x,   off = 2 (2-bit), 8 (4-bit).
 * A raw field is at most 15, so a maddubs pair sum stays within 2*15*128 and cannot saturate.
 * A block's fields are extracted with one mask (and one 16-bit shift) per field, so a field
 * vector holds byte i's field f for i = 0..31, i.e. elements in bit order, not element order; the
 * activations are permuted once per call to match ("prepared" rows, zero-padded to whole blocks):
 *   4-bit block: [x0 x2 .. x62 | x1 x3 .. x63]                (low nibbles | high nibbles)
 *   2-bit block: [x0 x4 .. x124 | x1 x5 .. | x2 .. | x3 ..]  (field 0 | 1 | 2 | 3)
 * 8-bit codes would saturate maddubs whichever operand is made unsigned (2*255*127 and 2*128*128
 * both exceed 32767), so they go through madd_epi16 on sign-extended values; their prepared rows
 * are the activations as int16. Integer sums are exact in any order, so the tile shape, the block
 * grouping and the thread split never change a result. */
typedef g4_i8_job i8_job;

#define I8_BLOCK 32
static size_t i8_block_xbytes(int bits) { return bits == 2 ? 128 : 64; }

INLINE int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* Field f (0..3 for 2-bit, 0..1 for 4-bit) of every byte of the 32-byte block at p. */
INLINE __m256i i8_field(const uint8_t *p, int f, const int BITS) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    if (f) v = _mm256_srli_epi16(v, f * BITS);
    return _mm256_and_si256(v, _mm256_set1_epi8(BITS == 2 ? 3 : 15));
}

/* Blocks whose maddubs pair sums can be added in int16 before widening: a 4-bit pair sum lies in
 * [-3840, 3810] and a block gives two per lane, so 4 blocks fit; a 2-bit pair sum lies in
 * [-768, 762] and a block gives four, so 8 fit. Widening once per group instead of once per
 * maddubs halves the multiply-port work. */
#define I8_GROUP(BITS) ((BITS) == 2 ? 8 : (BITS) == 4 ? 4 : 1)

/* acc[r][t] += the dot of nb blocks of weight row r (from wrow[r]) and prepared activation row t
 * (from xrow[t]). */
INLINE void i8_blocks(__m256i acc[MAX_RO][MAX_RT], const uint8_t *const wrow[MAX_RO], const uint8_t *const xrow[MAX_RT],
                      int nb, const int BITS, const int RO, const int RT) {
    const size_t xb = i8_block_xbytes(BITS);
    const __m256i ones = _mm256_set1_epi16(1);
    if (BITS == 8) {
        for (int b = 0; b < nb; b++) {
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256i wa[MAX_RO];
#pragma GCC unroll 4
                for (int r = 0; r < RO; r++)
                    wa[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wrow[r] + (size_t)b * I8_BLOCK + 16 * h)));
#pragma GCC unroll 4
                for (int t = 0; t < RT; t++) {
                    __m256i x = _mm256_load_si256((const __m256i *)(xrow[t] + (size_t)b * xb + 32 * h));
#pragma GCC unroll 4
                    for (int r = 0; r < RO; r++) acc[r][t] = _mm256_add_epi32(acc[r][t], _mm256_madd_epi16(wa[r], x));
                }
            }
        }
        return;
    }
    const int fields = BITS == 2 ? 4 : 2;
    for (int g = 0; g < nb; g += I8_GROUP(BITS)) {
        int ge = nb - g > I8_GROUP(BITS) ? g + I8_GROUP(BITS) : nb;
        __m256i s16[MAX_RO][MAX_RT];
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) {
#pragma GCC unroll 4
            for (int t = 0; t < RT; t++) s16[r][t] = _mm256_setzero_si256();
        }
        for (int b = g; b < ge; b++) {
#pragma GCC unroll 4
            for (int f = 0; f < fields; f++) {
                __m256i wf[MAX_RO];
#pragma GCC unroll 4
                for (int r = 0; r < RO; r++) wf[r] = i8_field(wrow[r] + (size_t)b * I8_BLOCK, f, BITS);
#pragma GCC unroll 4
                for (int t = 0; t < RT; t++) {
                    __m256i x = _mm256_load_si256((const __m256i *)(xrow[t] + (size_t)b * xb + 32 * f));
#pragma GCC unroll 4
                    for (int r = 0; r < RO; r++) s16[r][t] = _mm256_add_epi16(s16[r][t], _mm256_maddubs_epi16(wf[r], x));
                }
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) {
#pragma GCC unroll 4
            for (int t = 0; t < RT; t++) acc[r][t] = _mm256_add_epi32(acc[r][t], _mm256_madd_epi16(s16[r][t], ones));
        }
    }
}

INLINE void i8_tile(const i8_job *j, int o, int t0, const int BITS, const int RO, const int RT) {
    const g4_qweight *w = j->w;
    __m256i acc[MAX_RO][MAX_RT];
    const uint8_t *wrow[MAX_RO], *xrow[MAX_RT];
#pragma GCC unroll 4
    for (int r = 0; r < RO; r++) {
        wrow[r] = w->w + (size_t)(o + r) * w->row_bytes + (size_t)j->kb0 * I8_BLOCK;
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) acc[r][t] = _mm256_setzero_si256();
    }
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) xrow[t] = j->xp + (size_t)(t0 + t) * j->xstride + (size_t)j->kb0 * i8_block_xbytes(BITS);
    int full_end = j->kb1 < j->nfull ? j->kb1 : j->nfull;
    i8_blocks(acc, wrow, xrow, full_end - j->kb0, BITS, RO, RT);
    if (j->tail && j->kb1 > j->nfull) {
        /* The last row of a tensor may end anywhere: copy the partial block instead of reading
         * past it. Whatever sits in the copy's padding meets zero activations. */
        uint8_t buf[MAX_RO][I8_BLOCK];
        const uint8_t *trow[MAX_RO], *xtail[MAX_RT];
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) {
            memset(buf[r], 0, I8_BLOCK);
            memcpy(buf[r], w->w + (size_t)(o + r) * w->row_bytes + (size_t)j->nfull * I8_BLOCK, (size_t)j->tail);
            trow[r] = buf[r];
        }
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) xtail[t] = j->xp + (size_t)(t0 + t) * j->xstride + (size_t)j->nfull * i8_block_xbytes(BITS);
        i8_blocks(acc, trow, xtail, 1, BITS, RO, RT);
    }
#pragma GCC unroll 4
    for (int r = 0; r < RO; r++) {
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) {
            int32_t *dst = &j->acc[(size_t)(t0 + t) * w->out + o + r];
            uint32_t v = (uint32_t)hsum_i32(acc[r][t]);
            *dst = (int32_t)(j->first ? v - j->corr[t0 + t] : (uint32_t)*dst + v);
        }
    }
}

/* One function per bit width, each holding every tile shape the sweep asks for. */
G4_I8_TILE_FNS(i8_tile, i8_job, i8_tile, TILE_WIDE)

static void i8_rows(void *ctx, int o0, int o1) {
    const i8_job *j = ctx;
    int bits = j->w->bits;
    g4_i8_sweep(j, o0, o1, I8_BLOCK, i8_block_xbytes(bits), bits == 8 ? tile_ro : tile_ro_i8_low, i8_tile_for(bits));
}

/* One activation row (decode): each weight row is streamed on its own, front to back, so a
 * thread reads one contiguous run of memory; for 4-bit codes two int16 sums (even and odd
 * blocks) keep two add chains in flight (short 2-bit rows have their own form, q2_row1, with two
 * as well), and a prefetch runs I8_PREFETCH bytes ahead of the loads. Interleaving several rows
 * instead (RO > 1) turns one stream into several and measured slower from DRAM. */
#define I8_PREFETCH 2048
/* A prefetch hint some way past p (never faults, so it may run past the end of the weights; the
 * address is formed as an integer since it may lie outside the object). */
INLINE void prefetch_ahead(const uint8_t *p, size_t ahead) {
    _mm_prefetch((const char *)(uintptr_t)((uintptr_t)p + ahead), _MM_HINT_T0);
}
INLINE __m256i i8_row1_pair(const uint8_t *p, const uint8_t *x, __m256i s, const int BITS) {
    const int fields = BITS == 2 ? 4 : 2;
#pragma GCC unroll 4
    for (int f = 0; f < fields; f++)
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(i8_field(p, f, BITS), _mm256_load_si256((const __m256i *)(x + 32 * f))));
    return s;
}

/* The 2-bit row's own form, with one shift per block instead of three: fields 0 and 1 are masked
 * in place, and so are fields 2 and 3 after one shift by 4, so the odd fields come out as 4 raw.
 * Their products go to a second int16 sum, which holds a group of 4 blocks (a pair sum of 4 raw x
 * lies within +-3072, and a block adds two to each lane); each group's int32 lanes are then exact
 * multiples of 4, divided back by a shift. The group is written out straight: the decode rows of
 * E2B's gate, up and lm_head are 12 blocks long, too short for a loop of a few steps to pay.
 * Fewer vector operations per block (14 instead of 15.5, which the vector ports are bound by)
 * decoded 4 % faster per token on E2B. Long rows keep the generic form: on E2B's 2-bit down_proj
 * (96 blocks a row) it streamed 8-12 % faster from memory than this one (decode steps alternating
 * between the two in one process), for reasons no counter here could show. */
#define Q2_ROW_BLOCKS 32
INLINE void q2_block(const uint8_t *p, const uint8_t *x, __m256i *s1, __m256i *s4) {
    const __m256i lo = _mm256_set1_epi8(3), hi = _mm256_set1_epi8(12);
    __m256i v = _mm256_loadu_si256((const __m256i *)p), v4 = _mm256_srli_epi16(v, 4);
    __m256i a = _mm256_maddubs_epi16(_mm256_and_si256(v, lo), _mm256_load_si256((const __m256i *)x));
    __m256i b = _mm256_maddubs_epi16(_mm256_and_si256(v, hi), _mm256_load_si256((const __m256i *)(x + 32)));
    __m256i c = _mm256_maddubs_epi16(_mm256_and_si256(v4, lo), _mm256_load_si256((const __m256i *)(x + 64)));
    __m256i d = _mm256_maddubs_epi16(_mm256_and_si256(v4, hi), _mm256_load_si256((const __m256i *)(x + 96)));
    *s1 = _mm256_add_epi16(*s1, _mm256_add_epi16(a, c));
    *s4 = _mm256_add_epi16(*s4, _mm256_add_epi16(b, d));
}

INLINE __m256i q2_group_sum(__m256i acc, __m256i s1, __m256i s4) {
    const __m256i ones = _mm256_set1_epi16(1);
    return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(s1, ones), _mm256_srai_epi32(_mm256_madd_epi16(s4, ones), 2)));
}

INLINE __m256i q2_row1(const uint8_t *w, const uint8_t *x, int nb) {
    const size_t Q2_XB = i8_block_xbytes(2);
    __m256i acc = _mm256_setzero_si256();
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
        const uint8_t *p = w + (size_t)b * I8_BLOCK, *xb = x + (size_t)b * Q2_XB;
        __m256i s1 = _mm256_setzero_si256(), s4 = _mm256_setzero_si256();
        prefetch_ahead(p, I8_PREFETCH);
        q2_block(p, xb, &s1, &s4);
        q2_block(p + 32, xb + Q2_XB, &s1, &s4);
        prefetch_ahead(p + 64, I8_PREFETCH);
        q2_block(p + 64, xb + 2 * Q2_XB, &s1, &s4);
        q2_block(p + 96, xb + 3 * Q2_XB, &s1, &s4);
        acc = q2_group_sum(acc, s1, s4);
    }
    if (b < nb) {
        __m256i s1 = _mm256_setzero_si256(), s4 = _mm256_setzero_si256();
        for (; b < nb; b++) q2_block(w + (size_t)b * I8_BLOCK, x + (size_t)b * Q2_XB, &s1, &s4);
        acc = q2_group_sum(acc, s1, s4);
    }
    return acc;
}

/* s + the dot of 16 8-bit codes at p and 16 prepared (int16) activations at x. */
INLINE __m256i i8_row1_half8(const uint8_t *p, const uint8_t *x, __m256i s) {
    __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm256_add_epi32(s, _mm256_madd_epi16(wv, _mm256_load_si256((const __m256i *)x)));
}

/* Sum over blocks [0, nb) of one weight row against one prepared activation row. */
INLINE __m256i i8_row1(const uint8_t *w, const uint8_t *x, int nb, const int BITS) {
    if (BITS == 2 && nb <= Q2_ROW_BLOCKS) return q2_row1(w, x, nb);
    const size_t xb = i8_block_xbytes(BITS);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256();
    if (BITS == 8) {
        /* two blocks (one cache line, one prefetch) per step: the loop's own instructions were a
         * third of its issue slots */
        __m256i acc1 = _mm256_setzero_si256();
        int b = 0;
        for (; b + 2 <= nb; b += 2) {
            const uint8_t *p = w + (size_t)b * I8_BLOCK;
            prefetch_ahead(p, I8_PREFETCH);
            acc = i8_row1_half8(p, x + (size_t)b * xb, acc);
            acc1 = i8_row1_half8(p + 16, x + (size_t)b * xb + 32, acc1);
            acc = i8_row1_half8(p + 32, x + (size_t)(b + 1) * xb, acc);
            acc1 = i8_row1_half8(p + 48, x + (size_t)(b + 1) * xb + 32, acc1);
        }
        if (b < nb) {
            const uint8_t *p = w + (size_t)b * I8_BLOCK;
            acc = i8_row1_half8(p, x + (size_t)b * xb, acc);
            acc1 = i8_row1_half8(p + 16, x + (size_t)b * xb + 32, acc1);
        }
        return _mm256_add_epi32(acc, acc1);
    }
    /* I8_GROUP blocks per int16 sum, shared between the two chains (even and odd blocks) */
    const int group = 2 * I8_GROUP(BITS);
    for (int g = 0; g < nb; g += group) {
        int ge = nb - g > group ? g + group : nb;
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        int b = g;
        for (; b + 2 <= ge; b += 2) {
            const uint8_t *p = w + (size_t)b * I8_BLOCK;
            prefetch_ahead(p, I8_PREFETCH);
            s0 = i8_row1_pair(p, x + (size_t)b * xb, s0, BITS);
            s1 = i8_row1_pair(p + I8_BLOCK, x + (size_t)(b + 1) * xb, s1, BITS);
        }
        if (b < ge) s0 = i8_row1_pair(w + (size_t)b * I8_BLOCK, x + (size_t)b * xb, s0, BITS);
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(s0, ones), _mm256_madd_epi16(s1, ones)));
    }
    return acc;
}

INLINE void i8_rows1_bits(const i8_job *j, int o0, int o1, const int BITS) {
    const g4_qweight *w = j->w;
    const uint8_t *x = j->xp;
    const uint32_t corr = j->corr[0];
    for (int o = o0; o < o1; o++) {
        const uint8_t *row = w->w + (size_t)o * w->row_bytes;
        __m256i acc = i8_row1(row, x, j->nfull, BITS);
        if (j->tail) {
            uint8_t buf[I8_BLOCK] = {0};
            memcpy(buf, row + (size_t)j->nfull * I8_BLOCK, (size_t)j->tail);
            acc = _mm256_add_epi32(acc, i8_row1(buf, x + (size_t)j->nfull * i8_block_xbytes(BITS), 1, BITS));
        }
        j->acc[o] = (int32_t)((uint32_t)hsum_i32(acc) - corr);
    }
}

static void i8_rows1(void *ctx, int o0, int o1) {
    const i8_job *j = ctx;
    if (j->w->bits == 2) i8_rows1_bits(j, o0, o1, 2);
    else if (j->w->bits == 4) i8_rows1_bits(j, o0, o1, 4);
    else i8_rows1_bits(j, o0, o1, 8);
}

/* A few activation rows (2 to 4: the digit rows of one float row, g4_matmul_codes_f32): like one
 * row, each weight row streams front to back with a prefetch ahead, its fields extracted once
 * for the RT activation rows. */
INLINE void i8_rowN(const uint8_t *w, const uint8_t *const x[MAX_RT], int nb, __m256i acc[MAX_RT], const int BITS, const int RT) {
    const size_t xb = i8_block_xbytes(BITS);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int g = 0; g < nb; g += I8_GROUP(BITS)) {
        int ge = nb - g > I8_GROUP(BITS) ? g + I8_GROUP(BITS) : nb;
        __m256i s[MAX_RT];
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) s[t] = _mm256_setzero_si256();
        for (int b = g; b < ge; b++) {
            const uint8_t *p = w + (size_t)b * I8_BLOCK;
            prefetch_ahead(p, I8_PREFETCH);
            if (BITS == 8) {
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    __m256i wa = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16 * h)));
#pragma GCC unroll 4
                    for (int t = 0; t < RT; t++)
                        acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(wa, _mm256_load_si256((const __m256i *)(x[t] + (size_t)b * xb + 32 * h))));
                }
                continue;
            }
            const int fields = BITS == 2 ? 4 : 2;
#pragma GCC unroll 4
            for (int f = 0; f < fields; f++) {
                __m256i wf = i8_field(p, f, BITS);
#pragma GCC unroll 4
                for (int t = 0; t < RT; t++)
                    s[t] = _mm256_add_epi16(s[t], _mm256_maddubs_epi16(wf, _mm256_load_si256((const __m256i *)(x[t] + (size_t)b * xb + 32 * f))));
            }
        }
        if (BITS != 8) {
#pragma GCC unroll 4
            for (int t = 0; t < RT; t++) acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(s[t], ones));
        }
    }
}

INLINE void i8_rowsN_bits(const i8_job *j, int o0, int o1, const int BITS, const int RT) {
    const g4_qweight *w = j->w;
    const uint8_t *x[MAX_RT], *xt[MAX_RT];
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) {
        x[t] = j->xp + (size_t)t * j->xstride;
        xt[t] = x[t] + (size_t)j->nfull * i8_block_xbytes(BITS);
    }
    for (int o = o0; o < o1; o++) {
        const uint8_t *row = w->w + (size_t)o * w->row_bytes;
        __m256i acc[MAX_RT];
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) acc[t] = _mm256_setzero_si256();
        i8_rowN(row, x, j->nfull, acc, BITS, RT);
        if (j->tail) {
            uint8_t buf[I8_BLOCK] = {0};
            memcpy(buf, row + (size_t)j->nfull * I8_BLOCK, (size_t)j->tail);
            i8_rowN(buf, xt, 1, acc, BITS, RT);
        }
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) j->acc[(size_t)t * w->out + o] = (int32_t)((uint32_t)hsum_i32(acc[t]) - j->corr[t]);
    }
}

G4_I8_ROWS_FN(i8_rows2, i8_job, i8_rowsN_bits, 2)
G4_I8_ROWS_FN(i8_rows3, i8_job, i8_rowsN_bits, 3)
G4_I8_ROWS_FN(i8_rows4, i8_job, i8_rowsN_bits, 4)

/* One prepared block from `elems` activations at x (fewer than a whole block only at the end of a
 * row: the rest is zero). Returns sum(x) over the block. */
INLINE int32_t i8_prepare_block(const int8_t *x, int elems, uint8_t *out, const int BITS) {
    const int full = BITS == 2 ? 128 : BITS == 4 ? 64 : 32;
    int8_t tmp[128];
    if (elems < full) {
        memset(tmp, 0, sizeof tmp);
        memcpy(tmp, x, (size_t)elems);
        x = tmp;
    }
    if (BITS == 8) {
        _mm256_store_si256((__m256i *)out, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x)));
        _mm256_store_si256((__m256i *)(out + 32), _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + 16))));
        return 0; /* no offset correction for signed codes */
    }
    /* sum of (x + 128) over each 8 bytes, from which 128 per element is taken back below */
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    __m256i sums = _mm256_setzero_si256();
    if (BITS == 4) {
        /* per 16 bytes [evens | odds]; qwords then ordered evens, evens, odds, odds */
        const __m256i sh = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                            0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        __m256i v0 = _mm256_loadu_si256((const __m256i *)x), v1 = _mm256_loadu_si256((const __m256i *)(x + 32));
        __m256i a = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v0, sh), 0xD8);
        __m256i b = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v1, sh), 0xD8);
        _mm256_store_si256((__m256i *)out, _mm256_permute2x128_si256(a, b, 0x20));
        _mm256_store_si256((__m256i *)(out + 32), _mm256_permute2x128_si256(a, b, 0x31));
        sums = _mm256_add_epi64(_mm256_sad_epu8(_mm256_xor_si256(v0, bias), _mm256_setzero_si256()),
                                _mm256_sad_epu8(_mm256_xor_si256(v1, bias), _mm256_setzero_si256()));
    } else {
        /* per 16 bytes: dwords [field 0 | 1 | 2 | 3]; then per vector qwords [field 0 | 1 | 2 | 3]
         * (each 8 bytes: 16 elements' worth of one field), and a 4x4 qword transpose across the
         * four vectors gathers field f of all 128 elements into 32 consecutive bytes */
        const __m256i sh = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        const __m256i idx = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        __m256i v[4], p[4];
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_si256((const __m256i *)(x + 32 * k));
            p[k] = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v[k], sh), idx);
            sums = _mm256_add_epi64(sums, _mm256_sad_epu8(_mm256_xor_si256(v[k], bias), _mm256_setzero_si256()));
        }
        __m256i lo01 = _mm256_unpacklo_epi64(p[0], p[1]), hi01 = _mm256_unpackhi_epi64(p[0], p[1]);
        __m256i lo23 = _mm256_unpacklo_epi64(p[2], p[3]), hi23 = _mm256_unpackhi_epi64(p[2], p[3]);
        _mm256_store_si256((__m256i *)out, _mm256_permute2x128_si256(lo01, lo23, 0x20));
        _mm256_store_si256((__m256i *)(out + 32), _mm256_permute2x128_si256(hi01, hi23, 0x20));
        _mm256_store_si256((__m256i *)(out + 64), _mm256_permute2x128_si256(lo01, lo23, 0x31));
        _mm256_store_si256((__m256i *)(out + 96), _mm256_permute2x128_si256(hi01, hi23, 0x31));
    }
    __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
    s2 = _mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2));
    return (int32_t)_mm_cvtsi128_si32(s2) - 128 * full;
}

/* Permutes and pads the activation rows into the block layout described above. */
INLINE void i8_prepare_rows(const int8_t *x, int n, int in, size_t nblk, uint8_t *xp, size_t xstride, uint32_t *corr,
                            const int BITS) {
    const int full = BITS == 2 ? 128 : BITS == 4 ? 64 : 32;
    for (int t = 0; t < n; t++) {
        const int8_t *xt = x + (size_t)t * in;
        uint8_t *pt = xp + (size_t)t * xstride;
        uint32_t sum = 0;
        for (size_t b = 0; b < nblk; b++) {
            long left = (long)in - (long)b * full;
            int elems = left <= 0 ? 0 : left < full ? (int)left : full;
            sum += (uint32_t)i8_prepare_block(xt + (elems ? b * (size_t)full : 0), elems, pt + b * i8_block_xbytes(BITS), BITS);
        }
        corr[t] = sum * (uint32_t)(BITS == 2 ? 2 : BITS == 4 ? 8 : 0);
    }
}

static void i8_prepare(const int8_t *x, int n, int in, int bits, size_t nblk, uint8_t *xp, size_t xstride, uint32_t *corr) {
    if (bits == 2) i8_prepare_rows(x, n, in, nblk, xp, xstride, corr, 2);
    else if (bits == 4) i8_prepare_rows(x, n, in, nblk, xp, xstride, corr, 4);
    else i8_prepare_rows(x, n, in, nblk, xp, xstride, corr, 8);
}

static void avx2_matmul_i8(const g4_qweight *w, const int8_t *x, int n, int32_t *acc) {
    static const g4_pool_fn rows[5] = {i8_rows, i8_rows1, i8_rows2, i8_rows3, i8_rows4};
    g4_i8_matmul(w, x, n, acc, I8_BLOCK, i8_block_xbytes(w->bits), i8_prepare, rows);
}

/* ------------------------------------------------------------------ float x BF16 ---------- */

/* Float activations against packed codes go through the int8 matmul (g4_matmul_codes_f32); only
 * BF16 weights take a float dot, in the reference's 8-lane order. */

/* Eight BF16 weights from element i as floats. */
INLINE __m256 load8_bf16(const uint8_t *row, int i) {
    __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}

/* g4_reduce8 on the lanes: (a0+a4, a1+a5, a2+a6, a3+a7), then (s0+s2) + (s1+s3). */
INLINE float reduce8_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

typedef struct {
    const g4_qweight *w;
    const float *x;
    int n;
    float *y;
} f32_job;

INLINE void f32_tile(const f32_job *j, int o, int t0, const int BITS, const int RO, const int RT) {
    (void)BITS; /* always 16 */
    const g4_qweight *w = j->w;
    const int in = w->in;
    __m256 acc[MAX_RO][MAX_RT], wf[MAX_RO];
    const uint8_t *row[MAX_RO];
    const float *xt[MAX_RT];
#pragma GCC unroll 4
    for (int r = 0; r < RO; r++) {
        row[r] = w->w + (size_t)(o + r) * w->row_bytes;
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) acc[r][t] = _mm256_setzero_ps();
    }
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) xt[t] = j->x + (size_t)(t0 + t) * in;
    int i = 0;
    for (; i + 8 <= in; i += 8) {
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) wf[r] = load8_bf16(row[r], i);
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) {
            __m256 xv = _mm256_loadu_ps(xt[t] + i);
#pragma GCC unroll 4
            for (int r = 0; r < RO; r++) acc[r][t] = _mm256_add_ps(acc[r][t], _mm256_mul_ps(xv, wf[r]));
        }
    }
    if (i < in) {
        /* Tail: zero weights times zero activations add +0 to each lane, which leaves it as is
         * (a lane that starts at +0 can never become -0), so padding matches the reference. */
        int rem = in - i;
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) {
            float tmp[8] = {0};
            for (int k = 0; k < rem; k++) {
                uint32_t u = (uint32_t)(row[r][2 * (i + k)] | row[r][2 * (i + k) + 1] << 8) << 16;
                memcpy(&tmp[k], &u, 4);
            }
            wf[r] = _mm256_loadu_ps(tmp);
        }
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) {
            float tmp[8] = {0};
            memcpy(tmp, xt[t] + i, sizeof(float) * (size_t)rem);
            __m256 xv = _mm256_loadu_ps(tmp);
#pragma GCC unroll 4
            for (int r = 0; r < RO; r++) acc[r][t] = _mm256_add_ps(acc[r][t], _mm256_mul_ps(xv, wf[r]));
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RO; r++) {
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) j->y[(size_t)(t0 + t) * w->out + o + r] = reduce8_ps(acc[r][t]);
    }
}

G4_TILE_FN(f32_tile_16, f32_job, f32_tile, 16, TILE_WIDE)

static void f32_rows(void *ctx, int o0, int o1) {
    const f32_job *j = ctx;
    g4_tile_sweep(j, j->n, o0, o1, j->w->row_bytes, tile_ro, f32_tile_16);
}

/* ------------------------------------------------------------------ block-scaled codes ---- */

/* Weights with one scale per block of 32 inputs (kernels/blocks.h): tiles of 4 weight rows x up to
 * 4 activation rows, the 4 rows' sums for one block reduced into the 4 lanes of one vector, so the
 * fold acc = acc + scale * D runs on 4 outputs at once in 4 double lanes, each in block order as
 * the reference folds it. A remainder tile of one row repeats it in every lane.
 *   4-bit: two blocks at a time, their 32 code bytes as raw fields (unsigned: the low nibbles,
 *   then the high nibbles) against the pair's digit rows through maddubs (G4_BLOCKS_DIGIT_PAIRS);
 *   digit p's int16 sums widen with weight 256^p, the 4 rows' sums reduce to one vector holding
 *   both blocks, and D = sum raw X - 8 sum X per block (all exact in int32: |D| <= 2^30); the
 *   fold takes block b, then b + 1.
 *   8-bit: the 32 codes sign-extended to int16 against X's int16 halves through madd: H = sum c
 *   hi and L = sum c lo (int32), D = 256 H + L formed in double (exact, |D| < 2^35). */
#define BLOCK_RO 4
#define TILE_BLOCKS(BITS, RT) BLOCK_RO
static const int tile_ro_blocks[MAX_RT + 1] = G4_TILE_RO(TILE_BLOCKS, 4);

/* [sum a, sum b, sum c, sum d] of four 8-lane vectors. */
INLINE __m128i hsum4x8(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

INLINE void blocks_tile(const g4_blocks_job *j, int o, int t0, const int BITS, const int RO, const int RT) {
    const g4_qweight *w = j->w;
    const int nb = j->nb;
    const uint8_t *row[BLOCK_RO];
    const float *sc[BLOCK_RO];
#pragma GCC unroll 4
    for (int r = 0; r < BLOCK_RO; r++) {
        int rr = o + (r < RO ? r : RO - 1);
        row[r] = w->w + (size_t)rr * w->row_bytes;
        sc[r] = w->w_scale + (size_t)rr * nb;
    }
    __m256d acc[MAX_RT];
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) acc[t] = _mm256_setzero_pd();
    const __m256i ones = _mm256_set1_epi16(1), c256 = _mm256_set1_epi16(256);
    /* The tile's rows are one contiguous run of 4 rows (it reads them block by block, four short
     * streams the hardware prefetcher does not follow); the next tile's run is requested as this
     * one is consumed, 128 bytes a step (a prefetch hint never faults past the end). */
    const uint8_t *here = row[0];
    const size_t run = (size_t)RO * w->row_bytes; /* the next tile starts `run` bytes on */
    if (BITS == 4) {
        for (int pr = 0; pr < (nb + 1) / 2; pr++) {
            const int b = 2 * pr, both = b + 1 < nb;
            prefetch_ahead(here, run + (size_t)pr * 128);
            prefetch_ahead(here, run + (size_t)pr * 128 + 64);
            /* the pair's scales, 4 rows each: s_r[b], s_r[b + 1] as one 8-byte load per row */
            __m128 q[BLOCK_RO];
#pragma GCC unroll 4
            for (int r = 0; r < BLOCK_RO; r++) {
                double two;
                float pair2[2] = {sc[r][b], both ? sc[r][b + 1] : 0.0f};
                memcpy(&two, pair2, 8);
                q[r] = _mm_castpd_ps(_mm_set_sd(two));
            }
            __m128 r01 = _mm_unpacklo_ps(q[0], q[1]), r23 = _mm_unpacklo_ps(q[2], q[3]);
            __m256d s0 = _mm256_cvtps_pd(_mm_movelh_ps(r01, r23)), s1 = _mm256_cvtps_pd(_mm_movehl_ps(r23, r01));
            __m256i lo[BLOCK_RO], hi[BLOCK_RO];
#pragma GCC unroll 4
            for (int r = 0; r < BLOCK_RO; r++) {
                const uint8_t *p = row[r] + (size_t)b * 16;
                /* a last block without a partner: its 16 bytes only, the partner's fields 0 */
                __m256i v = both ? _mm256_loadu_si256((const __m256i *)p) : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)p));
                lo[r] = _mm256_and_si256(v, _mm256_set1_epi8(15));
                hi[r] = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15));
            }
#pragma GCC unroll 4
            for (int t = 0; t < RT; t++) {
                const int8_t *xd = g4_blocks_pair_digits_at(j, t0 + t, pr);
                __m256i d[BLOCK_RO];
#pragma GCC unroll 4
                for (int r = 0; r < BLOCK_RO; r++) d[r] = _mm256_setzero_si256();
#pragma GCC unroll 3
                for (int p = 0; p < 3; p++) {
                    __m256i xe = _mm256_loadu_si256((const __m256i *)(xd + 64 * p)), xo = _mm256_loadu_si256((const __m256i *)(xd + 64 * p + 32));
#pragma GCC unroll 4
                    for (int r = 0; r < BLOCK_RO; r++) {
                        /* pair sums of 15 x 128 at most, two of them per int16 lane: no saturation */
                        __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[r], xe), _mm256_maddubs_epi16(hi[r], xo));
                        __m256i s32 = _mm256_madd_epi16(s16, p ? c256 : ones);
                        d[r] = _mm256_add_epi32(d[r], p == 2 ? _mm256_slli_epi32(s32, 8) : s32);
                    }
                }
                /* lanes 0-3: block b of rows 0-3, lanes 4-7: block b + 1 */
                __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]));
                const int32_t *xs = j->xsum + (size_t)(t0 + t) * j->xsum_stride + b;
                h = _mm256_sub_epi32(h, _mm256_set_m128i(_mm_set1_epi32(8 * xs[1]), _mm_set1_epi32(8 * xs[0])));
                acc[t] = _mm256_add_pd(acc[t], _mm256_mul_pd(s0, _mm256_cvtepi32_pd(_mm256_castsi256_si128(h))));
                if (both) acc[t] = _mm256_add_pd(acc[t], _mm256_mul_pd(s1, _mm256_cvtepi32_pd(_mm256_extracti128_si256(h, 1))));
            }
        }
    }
    for (int b = 0; BITS == 8 && b < nb; b++) {
        prefetch_ahead(here, run + (size_t)b * 128);
        prefetch_ahead(here, run + (size_t)b * 128 + 64);
        __m256d s = _mm256_cvtps_pd(_mm_setr_ps(sc[0][b], sc[1][b], sc[2][b], sc[3][b]));
        {
            __m256i clo[BLOCK_RO], chi[BLOCK_RO];
#pragma GCC unroll 4
            for (int r = 0; r < BLOCK_RO; r++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(row[r] + (size_t)b * 32));
                clo[r] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
                chi[r] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
            }
#pragma GCC unroll 4
            for (int t = 0; t < RT; t++) {
                const int16_t *xh = g4_blocks_halves_at(j, t0 + t, b);
                __m256i lo0 = _mm256_loadu_si256((const __m256i *)xh), lo1 = _mm256_loadu_si256((const __m256i *)(xh + 16)),
                        hi0 = _mm256_loadu_si256((const __m256i *)(xh + 32)), hi1 = _mm256_loadu_si256((const __m256i *)(xh + 48));
                __m256i hs[BLOCK_RO], ls[BLOCK_RO];
#pragma GCC unroll 4
                for (int r = 0; r < BLOCK_RO; r++) {
                    hs[r] = _mm256_add_epi32(_mm256_madd_epi16(clo[r], hi0), _mm256_madd_epi16(chi[r], hi1));
                    ls[r] = _mm256_add_epi32(_mm256_madd_epi16(clo[r], lo0), _mm256_madd_epi16(chi[r], lo1));
                }
                __m256d dot = _mm256_add_pd(_mm256_mul_pd(_mm256_cvtepi32_pd(hsum4x8(hs[0], hs[1], hs[2], hs[3])), _mm256_set1_pd(256.0)),
                                            _mm256_cvtepi32_pd(hsum4x8(ls[0], ls[1], ls[2], ls[3])));
                acc[t] = _mm256_add_pd(acc[t], _mm256_mul_pd(s, dot));
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) {
        double a[BLOCK_RO];
        _mm256_storeu_pd(a, acc[t]);
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) g4_blocks_store(j, o + r, t0 + t, a[r]);
    }
}

G4_TILE_FN(blocks_tile_4, g4_blocks_job, blocks_tile, 4, TILE_BLOCKS)
G4_TILE_FN(blocks_tile_8, g4_blocks_job, blocks_tile, 8, TILE_BLOCKS)

static void blocks_rows(void *ctx, int o0, int o1) {
    const g4_blocks_job *j = ctx;
    g4_tile_sweep(j, j->n, o0, o1, j->w->row_bytes, tile_ro_blocks, j->w->bits == 4 ? blocks_tile_4 : blocks_tile_8);
}

void g4_avx2_matmul_f32(const g4_qweight *w, const float *x, int n, float *y) {
    if (n <= 0 || w->out <= 0) return;
    if (w->block > 0 && w->bits != G4_WT_BF16) {
        g4_blocks_matmul(w, x, n, y, G4_BLOCKS_DIGIT_PAIRS, G4_BLOCKS_HALVES, blocks_rows);
        return;
    }
    if (w->bits != G4_WT_BF16) {
        g4_matmul_codes_f32(w, x, n, y, w->bits == 2 || w->bits == 4 || w->bits == 8 ? avx2_matmul_i8 : g4_ref_matmul_i8);
        return;
    }
    f32_job j = {.w = w, .x = x, .n = n, .y = y};
    g4_pool_for(w->out, MAX_RO, macs(w, n), f32_rows, &j);
}

/* ------------------------------------------------------------------ elementwise ------------ */

/* v clamped to [-128, 127] (NaN to 127, as the reference's comparison order gives), then rounded
 * to int32: vcvtps2dq rounds to nearest even in the default MXCSR mode, which is the reference's
 * half-even rule; clamping first is the same as clamping after since the bounds are integers. */
INLINE __m256i quant8(__m256 v) {
    v = _mm256_min_ps(v, _mm256_set1_ps(127.0f)); /* minps returns the second operand for NaN */
    v = _mm256_max_ps(v, _mm256_set1_ps(-128.0f));
    return _mm256_cvtps_epi32(v);
}

/* The quantizer's x / s (or x * (1/s)) of 8 values. */
INLINE __m256 quant_scaled(const g4_quantizer *q, __m256 x) {
    return q->qdiv == G4_QDIV_DIVIDE ? _mm256_div_ps(x, _mm256_set1_ps(q->scale)) : _mm256_mul_ps(x, _mm256_set1_ps(q->inv_scale));
}

/* The vector paths cover the default rules only: half-even rounding and zero point 0. */
static int quant_vectorizable(const g4_quantizer *q) { return q->round == G4_ROUND_EVEN && q->zero_point == 0; }

void g4_avx2_quantize(const g4_quantizer *q, const float *x, size_t n, int8_t *codes) {
    if (!quant_vectorizable(q)) {
        g4_ref_quantize(q, x, n, codes);
        return;
    }
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i c0 = quant8(quant_scaled(q, _mm256_loadu_ps(x + i)));
        __m256i c1 = quant8(quant_scaled(q, _mm256_loadu_ps(x + i + 8)));
        __m256i c2 = quant8(quant_scaled(q, _mm256_loadu_ps(x + i + 16)));
        __m256i c3 = quant8(quant_scaled(q, _mm256_loadu_ps(x + i + 24)));
        /* in range already, so the saturating packs are exact; they interleave 128-bit lanes */
        __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(c0, c1), _mm256_packs_epi32(c2, c3));
        _mm256_storeu_si256((__m256i *)(codes + i), _mm256_permutevar8x32_epi32(b, order));
    }
    g4_ref_quantize(q, x + i, n - i, codes + i);
}

void g4_avx2_fake_quant(const g4_quantizer *q, float *x, size_t n) {
    if (!quant_vectorizable(q) || q->scale == 0) {
        g4_ref_fake_quant(q, x, n);
        return;
    }
    const __m256 s = _mm256_set1_ps(q->scale);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_cvtepi32_ps(quant8(quant_scaled(q, _mm256_loadu_ps(x + i)))), s));
    g4_ref_fake_quant(q, x + i, n - i);
}

void g4_avx2_requant_f32(const int32_t *acc, int n, int out, const float *m32, float s_out, float *y) {
    const __m256 so = _mm256_set1_ps(s_out);
    for (int t = 0; t < n; t++) {
        const int32_t *a = acc + (size_t)t * out;
        float *yt = y + (size_t)t * out;
        int o = 0;
        for (; o + 8 <= out; o += 8) {
            /* (float)acc rounds to nearest even, as vcvtdq2ps does */
            __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(a + o))), _mm256_loadu_ps(m32 + o));
            _mm256_storeu_ps(yt + o, _mm256_mul_ps(_mm256_cvtepi32_ps(quant8(v)), so));
        }
        for (; o < out; o++) yt[o] = g4_dequantize(g4_requantize_f32(a[o], m32[o]), s_out, 0);
    }
}

void g4_avx2_acc_scale(const int32_t *acc, int n, int out, float s_in, const float *w_scale, float *y) {
    const __m256 si = _mm256_set1_ps(s_in);
    for (int t = 0; t < n; t++) {
        const int32_t *a = acc + (size_t)t * out;
        float *yt = y + (size_t)t * out;
        int o = 0;
        for (; o + 8 <= out; o += 8) {
            __m256 m = _mm256_mul_ps(si, _mm256_loadu_ps(w_scale + o));
            _mm256_storeu_ps(yt + o, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(a + o))), m));
        }
        for (; o < out; o++) yt[o] = (float)a[o] * (s_in * w_scale[o]);
    }
}

/* gelu of the 256 values code * scale: a dequantized linear output takes only those values, so
 * one libm tanhf per code serves every element (the element's own call would return the same
 * bits). Tables are kept per scale (its bits) in an open-addressed cache large enough for every
 * gate of a model (E2B has 70 scales: with 128 direct-mapped slots a quarter of them collided and
 * were rebuilt on every token), and copied out under the lock. */
#define GELU_SLOTS 512
#define GELU_PROBES 8
static struct {
    uint32_t key; /* scale bits; 0 = empty (scale 0 never gets a table) */
    float v[256];
} gelu_cache[GELU_SLOTS];
static pthread_mutex_t gelu_mu = PTHREAD_MUTEX_INITIALIZER;

static void gelu_table_for(float scale, float table[256]) {
    uint32_t key;
    memcpy(&key, &scale, 4);
    unsigned home = (key ^ key >> 9 ^ key >> 18) % GELU_SLOTS, slot = home;
    pthread_mutex_lock(&gelu_mu);
    for (int p = 0; p < GELU_PROBES; p++) {
        unsigned at = (home + (unsigned)p) % GELU_SLOTS;
        if (gelu_cache[at].key == key) {
            memcpy(table, gelu_cache[at].v, sizeof gelu_cache[at].v);
            pthread_mutex_unlock(&gelu_mu);
            return;
        }
        if (gelu_cache[at].key == 0) { /* the first free slot on the way: a new scale goes there */
            slot = at;
            break;
        }
    }
    pthread_mutex_unlock(&gelu_mu);
    for (int c = -128; c < 128; c++) table[c + 128] = g4_gelu_tanh((float)c * scale);
    pthread_mutex_lock(&gelu_mu);
    gelu_cache[slot].key = key; /* no free slot within the probes: the home slot is replaced */
    memcpy(gelu_cache[slot].v, table, sizeof gelu_cache[slot].v);
    pthread_mutex_unlock(&gelu_mu);
}

void g4_avx2_gelu_mul(float *g, const float *m, size_t n, float scale) {
    if (!(scale > 0) || !(scale < INFINITY) || n < 64) {
        g4_portable_gelu_mul(g, m, n, scale);
        return;
    }
    float table_buf[256];
    gelu_table_for(scale, table_buf);
    const float *table = table_buf + 128;
    const __m256 s = _mm256_set1_ps(scale), inv = _mm256_set1_ps(1.0f / scale);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(g + i);
        __m256i c = quant8(_mm256_mul_ps(v, inv)); /* a guess at the code, checked below */
        __m256i same = _mm256_cmpeq_epi32(_mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(c), s)), _mm256_castps_si256(v));
        __m256 r = _mm256_mul_ps(_mm256_i32gather_ps(table, c, 4), _mm256_loadu_ps(m + i));
        if (_mm256_movemask_ps(_mm256_castsi256_ps(same)) == 0xFF) {
            _mm256_storeu_ps(g + i, r);
        } else {
            float rv[8];
            int ok = _mm256_movemask_ps(_mm256_castsi256_ps(same));
            _mm256_storeu_ps(rv, r);
            for (int k = 0; k < 8; k++) g[i + k] = ok >> k & 1 ? rv[k] : g4_gelu_tanh(g[i + k]) * m[i + k];
        }
    }
    g4_ref_gelu_mul(g + i, m + i, n - i);
}

/* ------------------------------------------------------------------ attention -------------- */

/* The kernels of the shared attention schedule (kernels/attention.c). Every score, weight and
 * output element is computed exactly as the reference does: the dots in the 8-lane order (one
 * vector lane per reference lane) with fused multiply-adds, and each output element summed over
 * positions in order (one lane per element). Heads
 * that read one KV head are done together, so each K or V row is loaded and converted once for
 * all of them. */


/* Dot of 8-lane accumulator `acc` finished with the head dim's tail (elements hd8 .. hd - 1). */
INLINE float attn_finish(__m256 acc, const float *q, const int8_t *kq, const float *kf, int hd8, int hd) {
    if (hd8 == hd) return reduce8_ps(acc);
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    for (int i = hd8; i < hd; i++) lanes[i & 7] = fmaf(q[i], kq ? (float)kq[i] : kf[i], lanes[i & 7]);
    return g4_reduce8(lanes);
}

/* Eight K or V elements from d as floats: int8 codes (Q8) or f32. */
INLINE __m256 load8_kv(const int8_t *q8, const float *f, int d, const int Q8) {
    return Q8 ? _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q8 + d)))) : _mm256_loadu_ps(f + d);
}

/* Scores of positions [j, j + PJ) (relative to lo) for the H heads at q: PJ x H independent
 * accumulators, so the add latency is hidden and each K row is converted once for the H heads. */
INLINE void attn_scores(const g4_attn *a, const g4_attn_row *c, const float *q, size_t off, int j, int count, float *scores,
                        const int H, const int PJ, const int Q8) {
    const int hd = a->head_dim, hd8 = hd & ~7;
    const int8_t *kq[8];
    const float *kf[8];
    __m256 acc[8][8];
#pragma GCC unroll 8
    for (int p = 0; p < PJ; p++) {
        size_t row = (size_t)(c->lo + j + p) * (size_t)a->kv_width + off;
        kq[p] = Q8 ? c->kq + row : NULL;
        kf[p] = Q8 ? NULL : c->kf + row;
#pragma GCC unroll 8
        for (int h = 0; h < H; h++) acc[p][h] = _mm256_setzero_ps();
    }
    for (int d = 0; d < hd8; d += 8) {
        __m256 k[8];
#pragma GCC unroll 8
        for (int p = 0; p < PJ; p++) k[p] = load8_kv(kq[p], kf[p], d, Q8);
#pragma GCC unroll 8
        for (int h = 0; h < H; h++) {
            __m256 qv = _mm256_loadu_ps(q + (size_t)h * hd + d);
#pragma GCC unroll 8
            for (int p = 0; p < PJ; p++) acc[p][h] = _mm256_fmadd_ps(qv, k[p], acc[p][h]);
        }
    }
#pragma GCC unroll 8
    for (int p = 0; p < PJ; p++) {
#pragma GCC unroll 8
        for (int h = 0; h < H; h++) {
            float dot = attn_finish(acc[p][h], q + (size_t)h * hd, kq[p], kf[p], hd8, hd);
            scores[(size_t)h * count + j + p] = Q8 ? c->k_scale * dot : dot;
        }
    }
}

/* out[h][d .. d + 8 DC) over positions [j0, j1) for the H heads: H x DC accumulators, each V row
 * converted once for the H heads. The first block starts from +0, later ones from out; the last
 * one applies v_scale. */
INLINE void attn_values(const g4_attn_row *c, size_t stride, size_t off, const float *scores, int count, float *out, int hd,
                        int j0, int j1, int d, const int H, const int DC, const int Q8) {
    __m256 o[8][8];
#pragma GCC unroll 8
    for (int h = 0; h < H; h++) {
#pragma GCC unroll 8
        for (int k = 0; k < DC; k++) o[h][k] = j0 ? _mm256_loadu_ps(out + (size_t)h * hd + d + 8 * k) : _mm256_setzero_ps();
    }
    const size_t first = (size_t)(c->lo + j0) * stride + off + (size_t)d;
    const int8_t *vq = Q8 ? c->vq + first : NULL;
    const float *vf = Q8 ? NULL : c->vf + first;
    for (int j = j0; j < j1; j++) {
        __m256 v[8];
#pragma GCC unroll 8
        for (int k = 0; k < DC; k++) v[k] = load8_kv(vq, vf, 8 * k, Q8);
#pragma GCC unroll 8
        for (int h = 0; h < H; h++) {
            __m256 w = _mm256_broadcast_ss(scores + (size_t)h * count + j);
#pragma GCC unroll 8
            for (int k = 0; k < DC; k++) o[h][k] = _mm256_fmadd_ps(w, v[k], o[h][k]);
        }
        if (Q8) vq += stride;
        else vf += stride;
    }
    int last = j1 == count;
#pragma GCC unroll 8
    for (int h = 0; h < H; h++) {
#pragma GCC unroll 8
        for (int k = 0; k < DC; k++) {
            __m256 r = last && Q8 ? _mm256_mul_ps(o[h][k], _mm256_set1_ps(c->v_scale)) : o[h][k];
            _mm256_storeu_ps(out + (size_t)h * hd + d + 8 * k, r);
        }
    }
}

/* PJ positions per score pass and DC 8-wide column groups per value pass: at least 4 independent
 * accumulators for any H, at most 8 (16 registers). */
#define ATTN_PJ(H) ((H) >= 8 ? 1 : (H) >= 4 ? 2 : 4)
#define ATTN_DC(H) ((H) >= 8 ? 1 : (H) >= 4 ? 2 : 4)

INLINE void attn_heads_scores_q(const g4_attn *a, const g4_attn_row *c, const float *q, size_t off, float *scores, int j0,
                                int j1, int count, const int H, const int Q8) {
    int j = j0;
    for (; j + ATTN_PJ(H) <= j1; j += ATTN_PJ(H)) attn_scores(a, c, q, off, j, count, scores, H, ATTN_PJ(H), Q8);
    for (; j < j1; j++) attn_scores(a, c, q, off, j, count, scores, H, 1, Q8);
}

/* Scores of positions [j0, j1) for heads [h0, h0 + H) of row t into scores[h * count + j]. */
INLINE void attn_heads_scores(const g4_attn *a, int t, int h0, float *scores, int j0, int j1, const int H) {
    const g4_attn_row *c = &a->rows[t];
    const int hd = a->head_dim, count = c->hi - c->lo + 1;
    const size_t off = (size_t)(h0 / a->group) * hd;
    const float *q = a->q + (size_t)t * a->n_heads * hd + (size_t)h0 * hd;
    if (c->kq) attn_heads_scores_q(a, c, q, off, scores, j0, j1, count, H, 1);
    else attn_heads_scores_q(a, c, q, off, scores, j0, j1, count, H, 0);
}

INLINE void attn_heads_values_q(const g4_attn_row *c, size_t stride, size_t off, const float *scores, int count, float *out,
                                int hd, int d0, int d1, int j0, int j1, const int H, const int Q8) {
    int d = d0;
    for (; d + 8 * ATTN_DC(H) <= d1; d += 8 * ATTN_DC(H)) attn_values(c, stride, off, scores, count, out, hd, j0, j1, d, H, ATTN_DC(H), Q8);
    for (; d < d1; d += 8) attn_values(c, stride, off, scores, count, out, hd, j0, j1, d, H, 1, Q8);
}

/* out elements [d0, d1) (multiples of 8) of heads [h0, h0 + H) over positions [j0, j1) (see
 * g4_attn_ops.values). */
INLINE void attn_heads_values(const g4_attn *a, int t, int h0, const float *scores, int d0, int d1, int j0, int j1,
                              const int H) {
    const g4_attn_row *c = &a->rows[t];
    const int hd = a->head_dim, count = c->hi - c->lo + 1;
    const size_t off = (size_t)(h0 / a->group) * hd, stride = (size_t)a->kv_width;
    float *out = a->out + (size_t)t * a->n_heads * hd + (size_t)h0 * hd;
    if (c->vq) attn_heads_values_q(c, stride, off, scores, count, out, hd, d0, d1, j0, j1, H, 1);
    else attn_heads_values_q(c, stride, off, scores, count, out, hd, d0, d1, j0, j1, H, 0);
}

/* g4_expf on 8 lanes, operation for operation. */
INLINE __m256 exp8(__m256 x0) {
    __m256 x = _mm256_min_ps(_mm256_max_ps(x0, _mm256_set1_ps(-104.0f)), _mm256_set1_ps(89.0f)); /* NaN: put back below */
    __m256 fn = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(G4_EXP_LOG2E)), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(fn, _mm256_set1_ps(G4_EXP_LN2_HI))),
                             _mm256_mul_ps(fn, _mm256_set1_ps(G4_EXP_LN2_LO)));
    __m256 q = _mm256_set1_ps(G4_EXP_P5);
    q = _mm256_add_ps(_mm256_mul_ps(q, r), _mm256_set1_ps(G4_EXP_P4));
    q = _mm256_add_ps(_mm256_mul_ps(q, r), _mm256_set1_ps(G4_EXP_P3));
    q = _mm256_add_ps(_mm256_mul_ps(q, r), _mm256_set1_ps(G4_EXP_P2));
    q = _mm256_add_ps(_mm256_mul_ps(q, r), _mm256_set1_ps(G4_EXP_P1));
    q = _mm256_add_ps(_mm256_mul_ps(q, r), _mm256_set1_ps(G4_EXP_P0));
    __m256 e = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(q, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
    __m256i n = _mm256_cvtps_epi32(fn), n1 = _mm256_srai_epi32(n, 1), n2 = _mm256_sub_epi32(n, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    e = _mm256_mul_ps(e, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23)));
    e = _mm256_mul_ps(e, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23)));
    return _mm256_blendv_ps(e, x0, _mm256_cmp_ps(x0, x0, _CMP_UNORD_Q));
}

/* The softmax steps (g4_attn_ops): max_ps keeps the running max when a score is NaN. */
static void avx2_softmax_max(const float *sc, int n8, float lanes[8]) {
    __m256 m = _mm256_loadu_ps(lanes);
    for (int i = 0; i < n8; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(sc + i), m);
    _mm256_storeu_ps(lanes, m);
}

static void avx2_softmax_exp(float *sc, int n8, float mx, float lanes[8]) {
    const __m256 vm = _mm256_set1_ps(mx);
    __m256 s = _mm256_loadu_ps(lanes);
    for (int i = 0; i < n8; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + i), vm));
        _mm256_storeu_ps(sc + i, e);
        s = _mm256_add_ps(s, e);
    }
    _mm256_storeu_ps(lanes, s);
}

static void avx2_softmax_div(float *sc, int n8, float sum) {
    const __m256 vs = _mm256_set1_ps(sum);
    for (int i = 0; i < n8; i += 8) _mm256_storeu_ps(sc + i, _mm256_div_ps(_mm256_loadu_ps(sc + i), vs));
}

/* Two query rows' values over f32 V (g4_attn_ops.values_rows2): per element the fused
 * multiply-adds of attn_values in the same order, DC column groups of both rows at once (2 x DC
 * independent sums, each V vector loaded once for the two). */
INLINE void values_rows2_cols(const float *v, size_t stride, const float *s0, const float *s1, float *o0, float *o1, int j0, int j1,
                              const int DC) {
    __m256 a0[4], a1[4];
#pragma GCC unroll 4
    for (int k = 0; k < DC; k++) {
        a0[k] = j0 ? _mm256_loadu_ps(o0 + 8 * k) : _mm256_setzero_ps();
        a1[k] = j0 ? _mm256_loadu_ps(o1 + 8 * k) : _mm256_setzero_ps();
    }
    for (int j = j0; j < j1; j++, v += stride) {
        __m256 w0 = _mm256_broadcast_ss(s0 + j), w1 = _mm256_broadcast_ss(s1 + j);
#pragma GCC unroll 4
        for (int k = 0; k < DC; k++) {
            __m256 x = _mm256_loadu_ps(v + 8 * k);
            a0[k] = _mm256_fmadd_ps(w0, x, a0[k]);
            a1[k] = _mm256_fmadd_ps(w1, x, a1[k]);
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < DC; k++) {
        _mm256_storeu_ps(o0 + 8 * k, a0[k]);
        _mm256_storeu_ps(o1 + 8 * k, a1[k]);
    }
}

static void avx2_values_rows2(const g4_attn *a, int t, int h, const float *sc0, const float *sc1, int j0, int j1) {
    const g4_attn_row *c = &a->rows[t];
    const int hd = a->head_dim;
    const size_t stride = (size_t)a->kv_width, off = (size_t)(h / a->group) * hd;
    float *o0 = a->out + ((size_t)t * a->n_heads + (size_t)h) * hd, *o1 = o0 + (size_t)a->n_heads * hd;
    const float *v = c->vf + (size_t)(c->lo + j0) * stride + off;
    int d = 0;
    for (; d + 32 <= hd; d += 32) values_rows2_cols(v + d, stride, sc0, sc1, o0 + d, o1 + d, j0, j1, 4);
    for (; d < hd; d += 8) values_rows2_cols(v + d, stride, sc0, sc1, o0 + d, o1 + d, j0, j1, 1);
}

G4_ATTN_OPS(avx2_attn_ops, attn_heads_scores, attn_heads_values, avx2_softmax, avx2_values_rows2)

void g4_avx2_attention(const g4_attn *a) { g4_attention_run(a, &avx2_attn_ops); }

/* ------------------------------------------------------------------ softcap --------------- */

/* g4_tanhf on 8 lanes: both branches on every lane, then the reference's choice per lane; each
 * lane's arithmetic is the reference's, operation for operation. */
INLINE __m256 tanh8(__m256 z) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 a = _mm256_andnot_ps(sign, z);
    __m256 z2 = _mm256_mul_ps(a, a), p = _mm256_set1_ps(G4_TANH_Q4);
    p = _mm256_add_ps(_mm256_mul_ps(p, z2), _mm256_set1_ps(G4_TANH_Q3));
    p = _mm256_sub_ps(_mm256_mul_ps(p, z2), _mm256_set1_ps(G4_TANH_Q2N));
    p = _mm256_add_ps(_mm256_mul_ps(p, z2), _mm256_set1_ps(G4_TANH_Q1));
    p = _mm256_sub_ps(_mm256_mul_ps(p, z2), _mm256_set1_ps(G4_TANH_Q0N));
    __m256 small = _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, z2), a), a);
    /* e^(2a), with 2a held below 18 on lanes that will not use it */
    __m256 e = exp8(_mm256_min_ps(_mm256_add_ps(a, a), _mm256_set1_ps(18.0f)));
    __m256 big = _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    __m256 t = _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
    t = _mm256_blendv_ps(t, _mm256_set1_ps(1.0f), _mm256_cmp_ps(a, _mm256_set1_ps(9.0f), _CMP_GE_OQ));
    t = _mm256_or_ps(t, _mm256_and_ps(z, sign)); /* copysign: t >= +0 here */
    return _mm256_blendv_ps(t, z, _mm256_cmp_ps(z, z, _CMP_UNORD_Q)); /* NaN stays NaN */
}

static void softcap_span(float *x, size_t n, float cap) {
    const __m256 c = _mm256_set1_ps(cap);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(c, tanh8(_mm256_div_ps(_mm256_loadu_ps(x + i), c))));
    g4_ref_softcap(x + i, n - i, cap);
}

void g4_avx2_softcap(float *x, size_t n, float cap) { g4_softcap_pooled(x, n, cap, softcap_span, 4.0); }

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* Outside the target region: this runs on CPUs without AVX2. */
static int avx2_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

const g4_kernels g4_kernels_avx2 = {
    .name = "avx2",
    .cpu_needs = "avx2 fma",
    .built = 1,
    .supported = avx2_supported,
    .matmul_f32 = g4_avx2_matmul_f32,
    .matmul_i8 = avx2_matmul_i8,
    .quantize = g4_avx2_quantize,
    .fake_quant = g4_avx2_fake_quant,
    .requant_f32 = g4_avx2_requant_f32,
    .acc_scale = g4_avx2_acc_scale,
    .gelu_mul = g4_avx2_gelu_mul,
    .attention = g4_avx2_attention,
    .softcap = g4_avx2_softcap,
};

#else /* not x86 */

const g4_kernels g4_kernels_avx2 = G4_LEVEL_NOT_BUILT("avx2", "avx2 fma");

#endif
