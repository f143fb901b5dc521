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
#include "pool.h"
#include "quant/pack.h"

#if defined(__x86_64__)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,avxvnni")
#endif

#define INLINE static inline __attribute__((always_inline))
#define BLK 32
#define MAX_RO 4
#define MAX_RT 4

/* Weight rows per tile for 1..4 activation rows: 4 to 8 accumulators, with the rows' field vectors
 * and an activation vector within the 16 registers. */
static const int tile_ro[MAX_RT + 1] = {0, 4, 4, 2, 2};

static double macs(const g4_qweight *w, int n) { return (double)w->out * w->in * n; }

static int fields_of(int bits) { return bits == 2 ? 4 : bits == 4 ? 2 : 1; }
/* Bytes of prepared activations per weight block: one 32-byte vector per field. */
static size_t block_xbytes(int bits) { return (size_t)BLK * (size_t)fields_of(bits); }

typedef struct {
    const g4_qweight *w;
    int n;
    const uint8_t *xp; /* n prepared rows, xstride bytes apart */
    size_t xstride;
    const uint32_t *corr; /* off * sum x per activation row (mod 2^32) */
    int nfull;            /* whole 32-byte blocks per weight row */
    int tail;             /* bytes of the last partial block (0: none) */
    int32_t *acc;
    /* The span of blocks a tile covers: [kb0, kb1), block nfull being the tail. The first span
     * stores its sums, later ones add theirs (int32 sums may be split anywhere). */
    int kb0, kb1, first;
} i8_job;

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

/* ------------------------------------------------------------------ tiles (prefill) -------- */

/* acc[r][t] += the dot of weight block wv[r] and prepared activation block xrow[t] + xoff. */
INLINE void tile_block(__m256i acc[MAX_RO][MAX_RT], const __m256i wv[MAX_RO], const uint8_t *const xrow[MAX_RT], size_t xoff,
                       const int BITS, const int RO, const int RT) {
    const int fields = BITS == 2 ? 4 : BITS == 4 ? 2 : 1;
#pragma GCC unroll 4
    for (int f = 0; f < fields; f++) {
        __m256i wf[MAX_RO];
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) wf[r] = field(wv[r], f, BITS);
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) {
            __m256i x = load_x(xrow[t] + xoff + (size_t)BLK * f);
#pragma GCC unroll 4
            for (int r = 0; r < RO; r++) acc[r][t] = dpbusd(acc[r][t], wf[r], x);
        }
    }
}

/* acc[(t0 + t) * out + o + r] = the tile's sums (less the offset correction on the first span,
 * added to what is there on later ones). */
INLINE void tile_store(const i8_job *j, __m256i acc[MAX_RO][MAX_RT], int o, int t0, const int RO, const int RT) {
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
    __m256i acc[MAX_RO][MAX_RT], wv[MAX_RO];
    const uint8_t *wrow[MAX_RO], *xrow[MAX_RT];
#pragma GCC unroll 4
    for (int r = 0; r < RO; r++) {
        wrow[r] = w->w + (size_t)(o + r) * w->row_bytes;
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) acc[r][t] = _mm256_setzero_si256();
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

/* One function per bit width, each holding every tile shape the row loop asks for. */
#define TILE_SWITCH(BITS)                                \
    switch (ro * 8 + rt) {                               \
    case 1 * 8 + 1: i8_tile(j, o, t, BITS, 1, 1); break; \
    case 1 * 8 + 2: i8_tile(j, o, t, BITS, 1, 2); break; \
    case 1 * 8 + 3: i8_tile(j, o, t, BITS, 1, 3); break; \
    case 1 * 8 + 4: i8_tile(j, o, t, BITS, 1, 4); break; \
    case 4 * 8 + 1: i8_tile(j, o, t, BITS, 4, 1); break; \
    case 4 * 8 + 2: i8_tile(j, o, t, BITS, 4, 2); break; \
    case 2 * 8 + 3: i8_tile(j, o, t, BITS, 2, 3); break; \
    case 2 * 8 + 4: i8_tile(j, o, t, BITS, 2, 4); break; \
    default: abort();                                    \
    }

static void i8_tile_2(const i8_job *j, int o, int t, int ro, int rt) { TILE_SWITCH(2) }
static void i8_tile_4(const i8_job *j, int o, int t, int ro, int rt) { TILE_SWITCH(4) }
static void i8_tile_8(const i8_job *j, int o, int t, int ro, int rt) { TILE_SWITCH(8) }

/* Rows of a thread's range handled together so the activation group (RT rows) and this chunk of
 * weight rows both stay in L1/L2 while every group of the chunk runs. */
static int chunk_rows(size_t row_bytes) {
    size_t r = 16384 / (row_bytes ? row_bytes : 1);
    return r < MAX_RO ? MAX_RO : r > 4096 ? 4096 : (int)(r & ~(size_t)3);
}

static void i8_rows(void *ctx, int o0, int o1) {
    const i8_job *j = ctx;
    int bits = j->w->bits;
    void (*tile)(const i8_job *, int, int, int, int) = bits == 2 ? i8_tile_2 : bits == 4 ? i8_tile_4 : i8_tile_8;
    /* Split K so one group's slice of prepared activations (16 KB) stays in L1 while a chunk of
     * weight rows runs through it. */
    int kb_total = j->nfull + (j->tail ? 1 : 0);
    int ks = (int)(16384 / (MAX_RT * block_xbytes(bits)));
    if (ks >= kb_total) ks = kb_total;
    int chunk = chunk_rows((size_t)ks * BLK);
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
                    int ro = oe - o >= tile_ro[rt] ? tile_ro[rt] : 1;
                    tile(&js, o, t, ro, rt);
                    o += ro;
                }
                t += rt;
            }
        }
    }
}

/* ------------------------------------------------------------------ rows (decode) ---------- */

/* One to four activation rows (decode, and the digit rows of one float row): each weight row is
 * streamed on its own, front to back, with a prefetch I8_PREFETCH bytes ahead, its fields
 * extracted once for the RT activation rows; four rows' sums are reduced together. The prefetch
 * runs 6 KiB ahead as in avx512vnni.c: with avx2.c's 2 KiB this level took 1.00-1.10x the AVX2
 * level's time over one E2B decode step's matmuls on the Zen 5 development machine (bench_kernels
 * decode), with 6 KiB 0.84x. No AVX-VNNI CPU without AVX-512 was at hand to measure. */
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
INLINE void row_block(__m256i acc[8][MAX_RT], __m256i v, const uint8_t *const x[MAX_RT], size_t xoff, int c, const int BITS,
                      const int RT) {
    const int fields = BITS == 2 ? 4 : BITS == 4 ? 2 : 1;
#pragma GCC unroll 4
    for (int f = 0; f < fields; f++) {
        __m256i wf = field(v, f, BITS);
        int set = RT > 1 ? c : c * fields + f;
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) acc[set][t] = dpbusd(acc[set][t], wf, load_x(x[t] + xoff + (size_t)BLK * f));
    }
}

/* sums[t] = the dot of one weight row and prepared activation row x[t] (its int32 lanes). */
INLINE void row_dot(const uint8_t *row, const uint8_t *const x[MAX_RT], int nfull, int tail, __m256i sums[MAX_RT], const int BITS,
                    const int RT) {
    const size_t xb = block_xbytes(BITS);
    const int sets = ROW_SETS(BITS, RT);
    __m256i acc[8][MAX_RT];
#pragma GCC unroll 8
    for (int k = 0; k < sets; k++)
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) acc[k][t] = _mm256_setzero_si256();
    int b = 0;
    for (; b + 2 <= nfull; b += 2) {
        prefetch_ahead(row + (size_t)b * BLK, I8_PREFETCH);
        row_block(acc, load_block(row, b), x, (size_t)b * xb, 0, BITS, RT);
        row_block(acc, load_block(row, b + 1), x, (size_t)(b + 1) * xb, 1, BITS, RT);
    }
    if (b < nfull) row_block(acc, load_block(row, b), x, (size_t)b * xb, 0, BITS, RT);
    if (tail) row_block(acc, load_tail(row, nfull, tail), x, (size_t)nfull * xb, 1, BITS, RT);
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) {
        sums[t] = acc[0][t];
#pragma GCC unroll 8
        for (int k = 1; k < sets; k++) sums[t] = _mm256_add_epi32(sums[t], acc[k][t]);
    }
}

INLINE void i8_rows_few(const i8_job *j, int o0, int o1, const int BITS, const int RT) {
    const g4_qweight *w = j->w;
    const int out = w->out;
    const uint8_t *x[MAX_RT];
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) x[t] = j->xp + (size_t)t * j->xstride;
    int o = o0;
    /* four rows' sums at once where they fit the registers beside the accumulators */
    for (; RT <= 2 && o + 4 <= o1; o += 4) {
        __m256i s[4][MAX_RT];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) row_dot(w->w + (size_t)(o + r) * w->row_bytes, x, j->nfull, j->tail, s[r], BITS, RT);
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) {
            __m128i v = _mm_sub_epi32(hsum4(s[0][t], s[1][t], s[2][t], s[3][t]), _mm_set1_epi32((int32_t)j->corr[t]));
            _mm_storeu_si128((__m128i *)&j->acc[(size_t)t * out + o], v);
        }
    }
    for (; o < o1; o++) {
        __m256i s[MAX_RT];
        row_dot(w->w + (size_t)o * w->row_bytes, x, j->nfull, j->tail, s, BITS, RT);
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) j->acc[(size_t)t * out + o] = (int32_t)(hsum1(s[t]) - j->corr[t]);
    }
}

#define ROWS_FEW(RT)                                                      \
    static void i8_rows_##RT(void *ctx, int o0, int o1) {                 \
        const i8_job *j = ctx;                                            \
        if (j->w->bits == 2) i8_rows_few(j, o0, o1, 2, RT);               \
        else if (j->w->bits == 4) i8_rows_few(j, o0, o1, 4, RT);          \
        else i8_rows_few(j, o0, o1, 8, RT);                               \
    }
ROWS_FEW(1)
ROWS_FEW(2)
ROWS_FEW(3)
ROWS_FEW(4)

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

static void vnni256_matmul_i8(const g4_qweight *w, const int8_t *x, int n, int32_t *acc) {
    if (n <= 0 || w->out <= 0) return;
    int bits = w->bits;
    if (bits != 2 && bits != 4 && bits != 8) {
        g4_ref_matmul_i8(w, x, n, acc); /* not a valid int weight; let the reference decide */
        return;
    }
    if (w->in <= 0) {
        memset(acc, 0, sizeof *acc * (size_t)n * (size_t)w->out);
        return;
    }
    size_t pb = g4_packed_row_bytes(bits, (size_t)w->in);
    size_t nblk = (pb + BLK - 1) / BLK;
    size_t xstride = nblk * block_xbytes(bits); /* a multiple of 32: every activation load is aligned */
    uint8_t *xp = aligned_alloc(64, ((size_t)n * xstride + 127) & ~(size_t)63);
    uint32_t *corr = malloc(sizeof *corr * (size_t)n);
    if (!xp || !corr) {
        free(xp);
        free(corr);
        g4_ref_matmul_i8(w, x, n, acc);
        return;
    }
    prepare(x, n, w->in, bits, nblk, xp, xstride, corr);
    i8_job j = {.w = w, .n = n, .xp = xp, .xstride = xstride, .corr = corr,
                .nfull = (int)(pb / BLK), .tail = (int)(pb % BLK), .acc = acc};
    g4_pool_fn rows = n == 1 ? i8_rows_1 : n == 2 ? i8_rows_2 : n == 3 ? i8_rows_3 : n == 4 ? i8_rows_4 : i8_rows;
    g4_pool_for(w->out, MAX_RO, macs(w, n), rows, &j);
    free(xp);
    free(corr);
}

/* Float activations against packed codes run through this level's int8 matmul
 * (g4_matmul_codes_f32); BF16 weights through the AVX2 level's float dots. */
static void vnni256_matmul_f32(const g4_qweight *w, const float *x, int n, float *y) {
    if (n <= 0 || w->out <= 0) return;
    if (w->bits == 2 || w->bits == 4 || w->bits == 8) g4_matmul_codes_f32(w, x, n, y, vnni256_matmul_i8);
    else g4_avx2_matmul_f32(w, x, n, y);
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

const g4_kernels g4_kernels_avxvnni = {
    .name = "avxvnni",
    .cpu_needs = "avx_vnni avx2 fma",
    .built = 1,
    .supported = avxvnni_supported,
    .matmul_f32 = vnni256_matmul_f32,
    .matmul_i8 = vnni256_matmul_i8,
    .quantize = g4_avx2_quantize,
    .fake_quant = g4_avx2_fake_quant,
    .requant_f32 = g4_avx2_requant_f32,
    .acc_scale = g4_avx2_acc_scale,
    .gelu_mul = g4_avx2_gelu_mul,
    .attention = g4_avx2_attention,
    .softcap = g4_avx2_softcap,
};

#else /* not x86-64 */

const g4_kernels g4_kernels_avxvnni = G4_LEVEL_NOT_BUILT("avxvnni", "avx_vnni avx2 fma");

#endif
