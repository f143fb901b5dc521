/* AVX2 kernels. The file needs no compiler flags: the kernels are compiled for AVX2 through a
 * target pragma and only called after g4_avx2_supported() said yes, so the rest of the program
 * stays baseline x86-64. FMA is deliberately not enabled: the float dots must round the product
 * and the sum separately, exactly like the reference.
 *
 * Both matmuls compute a tile of RO weight rows x RT activation rows at a time: each weight block
 * is unpacked once into registers and used for RT activation rows (prefill reuse), and RO
 * independent accumulator chains hide the add latency when n == 1 (decode). Each output still
 * has its own accumulator with the reference's per-lane order, so the tile shape, the thread
 * count and the row split never change a bit. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "levels.h"
#include "pool.h"
#include "quant/pack.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif

#define INLINE static inline __attribute__((always_inline))
#define MAX_RO 4
#define MAX_RT 4

/* Weight rows per tile for 1..4 activation rows: fewer activation rows, more weight rows, so there
 * are always 4 to 8 independent accumulators and no spills. The 2/4-bit int8 path holds an int16
 * partial sum beside each accumulator, hence its smaller tiles. */
static const int tile_ro[MAX_RT + 1] = {0, 4, 4, 2, 2};
static const int tile_ro_i8_low[MAX_RT + 1] = {0, 4, 2, 1, 1};

/* Rows of a thread's range handled together so the activation group (RT rows) and this chunk of
 * weight rows both stay in L1/L2 while every group of the chunk runs. */
static int chunk_rows(size_t row_bytes) {
    size_t r = 16384 / (row_bytes ? row_bytes : 1);
    return r < MAX_RO ? MAX_RO : r > 4096 ? 4096 : (int)(r & ~(size_t)3);
}

static double macs(const g4_qweight *w, int n) { return (double)w->out * w->in * n; }

/* ------------------------------------------------------------------ int8 x packed codes ---- */

/* The int8 path works on 16-byte weight blocks (64 2-bit, 32 4-bit or 16 8-bit codes) and uses
 * the raw offset-binary fields as the unsigned operand of maddubs:
 *   sum x*(raw - off) = sum x*raw - off*sum x,   off = 2 (2-bit), 8 (4-bit).
 * A raw field is at most 15, so a maddubs pair sum stays within 2*15*128 and cannot saturate.
 * The fields of a block are extracted in bit order, not element order, so the activations are
 * permuted once per call to match ("prepared" rows, zero-padded to whole blocks):
 *   4-bit block: [x0 x2 .. x30 | x1 x3 .. x31]           (low nibbles | high nibbles)
 *   2-bit block: [x0 x4 .. x60 | x1 x5 .. | x2 .. | x3 ..] (field 0 | 1 | 2 | 3)
 * 8-bit codes would saturate maddubs whichever operand is made unsigned (2*255*127 and 2*128*128
 * both exceed 32767), so they go through madd_epi16 on sign-extended values; their prepared rows
 * are the activations as int16. */
typedef struct {
    const g4_qweight *w;
    int n;
    const uint8_t *xp; /* n prepared rows, xstride bytes apart */
    size_t xstride;
    const uint32_t *corr; /* off * sum x per activation row (mod 2^32) */
    int nfull;            /* whole 16-byte blocks per weight row */
    int tail;             /* bytes of the last partial block (0: none) */
    int32_t *acc;
    /* The span of blocks a tile covers: [kb0, kb1), block nfull being the tail. The first span
     * stores its sums, later ones add theirs (int32 sums may be split anywhere). */
    int kb0, kb1, first;
} i8_job;

static size_t i8_block_xbytes(int bits) { return bits == 2 ? 64 : 32; }

INLINE int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* Weight block at p unpacked for maddubs (wa, and wb for 2-bit), or sign-extended (8-bit). */
INLINE void i8_unpack(const uint8_t *p, __m256i *wa, __m256i *wb, const int BITS) {
    __m128i raw = _mm_loadu_si128((const __m128i *)p);
    if (BITS == 8) {
        *wa = _mm256_cvtepi8_epi16(raw);
    } else if (BITS == 4) {
        /* low lane keeps the low nibbles, high lane the high nibbles */
        __m256i b = _mm256_broadcastsi128_si256(raw);
        *wa = _mm256_and_si256(_mm256_srlv_epi32(b, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(15));
    } else {
        __m256i b = _mm256_broadcastsi128_si256(raw);
        *wa = _mm256_and_si256(_mm256_srlv_epi32(b, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2)), _mm256_set1_epi8(3));
        *wb = _mm256_and_si256(_mm256_srlv_epi32(b, _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6)), _mm256_set1_epi8(3));
    }
}

/* Blocks whose maddubs pair sums can be added in int16 before widening: a 4-bit pair sum lies in
 * [-3840, 3810], so 8 fit; a 2-bit block (two pair sums) in [-1536, 1524], so 16 fit. Widening
 * once per group instead of once per block halves the multiply-port work. */
#define I8_GROUP(BITS) ((BITS) == 2 ? 16 : (BITS) == 4 ? 8 : 1)

/* acc[r][t] += the dot of nb blocks of weight row r (from wrow[r]) and prepared activation row t
 * (from xrow[t]). */
INLINE void i8_blocks(__m256i acc[MAX_RO][MAX_RT], const uint8_t *const wrow[MAX_RO], const uint8_t *const xrow[MAX_RT],
                      int nb, const int BITS, const int RO, const int RT) {
    const size_t xb = i8_block_xbytes(BITS);
    const __m256i ones = _mm256_set1_epi16(1);
    if (BITS == 8) {
        for (int b = 0; b < nb; b++) {
            __m256i wa[MAX_RO], unused;
#pragma GCC unroll 4
            for (int r = 0; r < RO; r++) i8_unpack(wrow[r] + (size_t)b * 16, &wa[r], &unused, 8);
#pragma GCC unroll 4
            for (int t = 0; t < RT; t++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(xrow[t] + (size_t)b * xb));
#pragma GCC unroll 4
                for (int r = 0; r < RO; r++) acc[r][t] = _mm256_add_epi32(acc[r][t], _mm256_madd_epi16(wa[r], x));
            }
        }
        return;
    }
    for (int g = 0; g < nb; g += I8_GROUP(BITS)) {
        int ge = nb - g > I8_GROUP(BITS) ? g + I8_GROUP(BITS) : nb;
        __m256i s16[MAX_RO][MAX_RT];
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) {
#pragma GCC unroll 4
            for (int t = 0; t < RT; t++) s16[r][t] = _mm256_setzero_si256();
        }
        for (int b = g; b < ge; b++) {
            __m256i wa[MAX_RO], wb[MAX_RO];
#pragma GCC unroll 4
            for (int r = 0; r < RO; r++) i8_unpack(wrow[r] + (size_t)b * 16, &wa[r], &wb[r], BITS);
#pragma GCC unroll 4
            for (int t = 0; t < RT; t++) {
                const uint8_t *xp = xrow[t] + (size_t)b * xb;
                __m256i x0 = _mm256_loadu_si256((const __m256i *)xp);
#pragma GCC unroll 4
                for (int r = 0; r < RO; r++) s16[r][t] = _mm256_add_epi16(s16[r][t], _mm256_maddubs_epi16(wa[r], x0));
                if (BITS == 2) {
                    __m256i x1 = _mm256_loadu_si256((const __m256i *)(xp + 32));
#pragma GCC unroll 4
                    for (int r = 0; r < RO; r++) s16[r][t] = _mm256_add_epi16(s16[r][t], _mm256_maddubs_epi16(wb[r], x1));
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
        wrow[r] = w->w + (size_t)(o + r) * w->row_bytes + (size_t)j->kb0 * 16;
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
        uint8_t buf[MAX_RO][16];
        const uint8_t *trow[MAX_RO], *xtail[MAX_RT];
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) {
            memset(buf[r], 0, 16);
            memcpy(buf[r], w->w + (size_t)(o + r) * w->row_bytes + (size_t)j->nfull * 16, (size_t)j->tail);
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

/* One function per bit width, each holding every tile shape the row loop asks for. */
#define TILE_SWITCH(FN, BITS)                          \
    switch (ro * 8 + rt) {                             \
    case 1 * 8 + 1: FN(j, o, t, BITS, 1, 1); break;    \
    case 1 * 8 + 2: FN(j, o, t, BITS, 1, 2); break;    \
    case 1 * 8 + 3: FN(j, o, t, BITS, 1, 3); break;    \
    case 1 * 8 + 4: FN(j, o, t, BITS, 1, 4); break;    \
    case 4 * 8 + 1: FN(j, o, t, BITS, 4, 1); break;    \
    case 4 * 8 + 2: FN(j, o, t, BITS, 4, 2); break;    \
    case 2 * 8 + 2: FN(j, o, t, BITS, 2, 2); break;    \
    case 2 * 8 + 3: FN(j, o, t, BITS, 2, 3); break;    \
    case 2 * 8 + 4: FN(j, o, t, BITS, 2, 4); break;    \
    default: abort();                                  \
    }

static void i8_tile_2(const i8_job *j, int o, int t, int ro, int rt) { TILE_SWITCH(i8_tile, 2) }
static void i8_tile_4(const i8_job *j, int o, int t, int ro, int rt) { TILE_SWITCH(i8_tile, 4) }
static void i8_tile_8(const i8_job *j, int o, int t, int ro, int rt) { TILE_SWITCH(i8_tile, 8) }

static void i8_rows(void *ctx, int o0, int o1) {
    const i8_job *j = ctx;
    int bits = j->w->bits;
    void (*tile)(const i8_job *, int, int, int, int) = bits == 2 ? i8_tile_2 : bits == 4 ? i8_tile_4 : i8_tile_8;
    const int *shape = bits == 8 ? tile_ro : tile_ro_i8_low;
    /* With several activation rows, split K so one group's slice of prepared activations (about
     * 16 KB) stays in L1 while a chunk of weight rows runs through it; one row needs no split. */
    int kb_total = j->nfull + (j->tail ? 1 : 0);
    int ks = j->n == 1 ? kb_total : (int)(16384 / (MAX_RT * i8_block_xbytes(bits)));
    if (ks >= kb_total) ks = kb_total;
    int chunk = chunk_rows((size_t)ks * 16);
    i8_job js = *j;
    for (int ob = o0; ob < o1; ob += chunk) {
        int oe = o1 - ob > chunk ? ob + chunk : o1;
        for (int kb = 0; kb < kb_total; kb += ks) {
            js.kb0 = kb;
            js.kb1 = kb_total - kb > ks ? kb + ks : kb_total;
            js.first = kb == 0;
            for (int t = 0; t < j->n;) {
                int rt = j->n - t < MAX_RT ? j->n - t : MAX_RT;
                for (int o = ob; o < oe;) {
                    int ro = oe - o >= shape[rt] ? shape[rt] : 1;
                    tile(&js, o, t, ro, rt);
                    o += ro;
                }
                t += rt;
            }
        }
    }
}

/* One prepared block from `elems` activations at x (fewer than a whole block only at the end of a
 * row: the rest is zero). Returns sum(x) over the block. */
INLINE int32_t i8_prepare_block(const int8_t *x, int elems, uint8_t *out, const int BITS) {
    const int full = BITS == 2 ? 64 : BITS == 4 ? 32 : 16;
    int8_t tmp[64];
    if (elems < full) {
        memset(tmp, 0, sizeof tmp);
        memcpy(tmp, x, (size_t)elems);
        x = tmp;
    }
    if (BITS == 8) {
        _mm256_storeu_si256((__m256i *)out, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x)));
        return 0; /* no offset correction for signed codes */
    }
    /* sum of (x + 128) over each 8 bytes, from which 128 per element is taken back below */
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    __m256i v0 = _mm256_loadu_si256((const __m256i *)x), sums;
    if (BITS == 4) {
        /* per lane [evens | odds], then the two lanes' evens together and odds together */
        const __m256i sh = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                            0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        __m256i p = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v0, sh), 0xD8);
        _mm256_storeu_si256((__m256i *)out, p);
        sums = _mm256_sad_epu8(_mm256_xor_si256(v0, bias), _mm256_setzero_si256());
    } else {
        /* per 16-byte chunk c: dwords [field 0 | 1 | 2 | 3] of c; then a 4x4 dword transpose
         * gathers field f of the chunks 0..3 into 16 consecutive bytes */
        __m256i v1 = _mm256_loadu_si256((const __m256i *)(x + 32));
        const __m256i sh = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        const __m256i idx = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        __m256i a = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v0, sh), idx);
        __m256i b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v1, sh), idx);
        __m256i lo = _mm256_unpacklo_epi64(a, b), hi = _mm256_unpackhi_epi64(a, b);
        _mm256_storeu_si256((__m256i *)out, _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256((__m256i *)(out + 32), _mm256_permute2x128_si256(lo, hi, 0x31));
        sums = _mm256_add_epi64(_mm256_sad_epu8(_mm256_xor_si256(v0, bias), _mm256_setzero_si256()),
                                _mm256_sad_epu8(_mm256_xor_si256(v1, bias), _mm256_setzero_si256()));
    }
    __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
    s2 = _mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2));
    return (int32_t)_mm_cvtsi128_si32(s2) - 128 * full;
}

/* Permutes and pads the activation rows into the block layout described above. */
INLINE void i8_prepare_rows(const int8_t *x, int n, int in, size_t nblk, uint8_t *xp, size_t xstride, uint32_t *corr,
                            const int BITS) {
    const int full = BITS == 2 ? 64 : BITS == 4 ? 32 : 16;
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
    if (n <= 0 || w->out <= 0) return;
    int bits = w->bits;
    if (bits != 2 && bits != 4 && bits != 8) {
        g4_ref_matmul_i8(w, x, n, acc); /* not a valid int weight; let the reference decide */
        return;
    }
    if (w->in <= 0) { /* empty dot products; the block loops below would write nothing */
        memset(acc, 0, sizeof *acc * (size_t)n * (size_t)w->out);
        return;
    }
    size_t pb = g4_packed_row_bytes(bits, (size_t)w->in);
    size_t nblk = (pb + 15) / 16;
    size_t xstride = nblk * i8_block_xbytes(bits);
    /* xstride is a multiple of 32, so on a 32-byte aligned buffer no activation load splits a
     * cache line */
    uint8_t *xp = aligned_alloc(32, (size_t)n * xstride + 32);
    uint32_t *corr = malloc(sizeof *corr * (size_t)n);
    if (!xp || !corr) {
        free(xp);
        free(corr);
        g4_ref_matmul_i8(w, x, n, acc);
        return;
    }
    i8_prepare(x, n, w->in, bits, nblk, xp, xstride, corr);
    i8_job j = {.w = w, .n = n, .xp = xp, .xstride = xstride, .corr = corr,
                .nfull = (int)(pb / 16), .tail = (int)(pb % 16), .acc = acc};
    g4_pool_for(w->out, MAX_RO, macs(w, n), i8_rows, &j);
    free(xp);
    free(corr);
}

/* ------------------------------------------------------------------ float x codes / BF16 --- */

/* Eight consecutive weights starting at element i (a multiple of 8) as floats. LSB-first packing
 * puts element e of the group at bit bits*e of the little-endian word, hence the variable shift.
 * 2-bit codes come from a table lookup: vpermps reads the low 3 bits of each lane, i.e. the field
 * plus one bit of the next, so the table repeats the 4 codes twice and no mask is needed. */
INLINE __m256 load8_w(const uint8_t *row, int i, const int BITS) {
    if (BITS == 16) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
    }
    if (BITS == 8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + i))));
    if (BITS == 2) {
        uint16_t v;
        memcpy(&v, row + i / 4, 2);
        __m256i f = _mm256_srlv_epi32(_mm256_set1_epi32(v), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
        return _mm256_permutevar8x32_ps(_mm256_setr_ps(-2, -1, 0, 1, -2, -1, 0, 1), f);
    }
    uint32_t v;
    memcpy(&v, row + i / 2, 4);
    __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    __m256i f = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)v), sh), _mm256_set1_epi32(15));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(f, _mm256_set1_epi32(8)));
}

/* Sixteen 2-bit weights from element i (a multiple of 16): one 4-byte broadcast feeds both
 * halves. */
INLINE void load16_w2(const uint8_t *row, int i, __m256 *lo, __m256 *hi) {
    uint32_t v;
    memcpy(&v, row + i / 4, 4);
    __m256i b = _mm256_set1_epi32((int)v);
    const __m256 table = _mm256_setr_ps(-2, -1, 0, 1, -2, -1, 0, 1);
    *lo = _mm256_permutevar8x32_ps(table, _mm256_srlv_epi32(b, _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)));
    *hi = _mm256_permutevar8x32_ps(table, _mm256_srlv_epi32(b, _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30)));
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
    if (BITS == 2) {
        /* lanes see elements i..i+7 then i+8..i+15: the reference order */
        for (; i + 16 <= in; i += 16) {
#pragma GCC unroll 4
            for (int r = 0; r < RO; r++) {
                __m256 lo, hi;
                load16_w2(row[r], i, &lo, &hi);
#pragma GCC unroll 4
                for (int t = 0; t < RT; t++) {
                    acc[r][t] = _mm256_add_ps(acc[r][t], _mm256_mul_ps(_mm256_loadu_ps(xt[t] + i), lo));
                    acc[r][t] = _mm256_add_ps(acc[r][t], _mm256_mul_ps(_mm256_loadu_ps(xt[t] + i + 8), hi));
                }
            }
        }
    }
    for (; i + 8 <= in; i += 8) {
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) wf[r] = load8_w(row[r], i, BITS);
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
                if (BITS == 16) {
                    uint32_t u = (uint32_t)(row[r][2 * (i + k)] | row[r][2 * (i + k) + 1] << 8) << 16;
                    memcpy(&tmp[k], &u, 4);
                } else {
                    tmp[k] = (float)g4_packed_code(row[r], BITS, (size_t)(i + k));
                }
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
        for (int t = 0; t < RT; t++) {
            float s = reduce8_ps(acc[r][t]);
            j->y[(size_t)(t0 + t) * w->out + o + r] = BITS == 16 ? s : w->w_scale[o + r] * s;
        }
    }
}

static void f32_tile_2(const f32_job *j, int o, int t, int ro, int rt) { TILE_SWITCH(f32_tile, 2) }
static void f32_tile_4(const f32_job *j, int o, int t, int ro, int rt) { TILE_SWITCH(f32_tile, 4) }
static void f32_tile_8(const f32_job *j, int o, int t, int ro, int rt) { TILE_SWITCH(f32_tile, 8) }
static void f32_tile_16(const f32_job *j, int o, int t, int ro, int rt) { TILE_SWITCH(f32_tile, 16) }

static void f32_rows(void *ctx, int o0, int o1) {
    const f32_job *j = ctx;
    int bits = j->w->bits;
    void (*tile)(const f32_job *, int, int, int, int) =
        bits == 2 ? f32_tile_2 : bits == 4 ? f32_tile_4 : bits == 8 ? f32_tile_8 : f32_tile_16;
    int chunk = chunk_rows(j->w->row_bytes);
    for (int ob = o0; ob < o1; ob += chunk) {
        int oe = o1 - ob > chunk ? ob + chunk : o1;
        for (int t = 0; t < j->n;) {
            int rt = j->n - t < MAX_RT ? j->n - t : MAX_RT;
            for (int o = ob; o < oe;) {
                int ro = oe - o >= tile_ro[rt] ? tile_ro[rt] : 1;
                tile(j, o, t, ro, rt);
                o += ro;
            }
            t += rt;
        }
    }
}

static void avx2_matmul_f32(const g4_qweight *w, const float *x, int n, float *y) {
    if (n <= 0 || w->out <= 0) return;
    if (w->bits != 2 && w->bits != 4 && w->bits != 8 && w->bits != 16) {
        g4_ref_matmul_f32(w, x, n, y);
        return;
    }
    f32_job j = {.w = w, .x = x, .n = n, .y = y};
    g4_pool_for(w->out, MAX_RO, macs(w, n), f32_rows, &j);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const g4_kernels g4_kernels_avx2 = {
    .name = "avx2",
    .matmul_f32 = avx2_matmul_f32,
    .matmul_i8 = avx2_matmul_i8,
};

/* Outside the target region: this runs on CPUs without AVX2. */
int g4_avx2_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
}

#else /* not x86 */

const g4_kernels g4_kernels_avx2 = {
    .name = "avx2",
    .matmul_f32 = g4_ref_matmul_f32,
    .matmul_i8 = g4_ref_matmul_i8,
};

int g4_avx2_supported(void) { return 0; }

#endif
