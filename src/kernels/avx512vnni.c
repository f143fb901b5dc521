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
#include "pool.h"
#include "quant/pack.h"

#if defined(__x86_64__)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma")
#endif

#define INLINE static inline __attribute__((always_inline))
#define BLK 64
#define MAX_RO 4
#define MAX_RT 4

/* Weight rows per tile for 1..4 activation rows: 4 x 4 int32 accumulators, the 4 rows' field
 * vectors and one activation vector fit the 32 registers. */
static const int tile_ro[MAX_RT + 1] = {0, 4, 4, 4, 4};

static double macs(const g4_qweight *w, int n) { return (double)w->out * w->in * n; }

/* Fields per byte, and bytes of prepared activations per weight block (one 64-byte vector per
 * field). */
static int fields_of(int bits) { return bits == 2 ? 4 : bits == 4 ? 2 : 1; }
static size_t block_xbytes(int bits) { return (size_t)BLK * (size_t)fields_of(bits); }

/* The first `count` bytes of a 64-byte vector (count may be <= 0 or >= 64). */
INLINE __mmask64 byte_mask(long count) {
    return count >= 64 ? ~(__mmask64)0 : count <= 0 ? 0 : ((__mmask64)1 << count) - 1;
}

typedef struct {
    const g4_qweight *w;
    int n;
    const uint8_t *xp; /* n prepared rows, xstride bytes apart */
    size_t xstride;
    const uint32_t *corr; /* off * sum x per activation row (mod 2^32) */
    int nfull;            /* whole 64-byte blocks per weight row */
    int tail;             /* bytes of the last partial block (0: none) */
    int32_t *acc;
    /* The span of blocks a tile covers: [kb0, kb1), block nfull being the tail. The first span
     * stores its sums, later ones add theirs (int32 sums may be split anywhere). */
    int kb0, kb1, first;
} i8_job;

/* Field f of every byte of block v as the unsigned operand (8-bit: the code + 128). */
INLINE __m512i field(__m512i v, int f, const int BITS) {
    if (BITS == 8) return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
    if (f) v = _mm512_srli_epi16(v, f * BITS);
    return _mm512_and_si512(v, _mm512_set1_epi8(BITS == 2 ? 3 : 15));
}

/* Weight block b of a row: whole, or the row's last `tail` bytes with zeros after them (a masked
 * load reads nothing past the row). */
INLINE __m512i load_block(const uint8_t *row, int b, __mmask64 m, const int FULL) {
    const uint8_t *p = row + (size_t)b * BLK;
    return FULL ? _mm512_loadu_si512((const void *)p) : _mm512_maskz_loadu_epi8(m, p);
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

/* ------------------------------------------------------------------ tiles (prefill) -------- */

/* acc[r][t] += the dot of weight block wv[r] and prepared activation block xrow[t] + xoff. */
INLINE void tile_block(__m512i acc[MAX_RO][MAX_RT], const __m512i wv[MAX_RO], const uint8_t *const xrow[MAX_RT], size_t xoff,
                       const int BITS, const int RO, const int RT) {
    const int fields = BITS == 2 ? 4 : BITS == 4 ? 2 : 1;
#pragma GCC unroll 4
    for (int f = 0; f < fields; f++) {
        __m512i wf[MAX_RO];
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) wf[r] = field(wv[r], f, BITS);
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) {
            __m512i x = load_x(xrow[t] + xoff + (size_t)BLK * f);
#pragma GCC unroll 4
            for (int r = 0; r < RO; r++) acc[r][t] = dpbusd(acc[r][t], wf[r], x);
        }
    }
}

/* acc[(t0 + t) * out + o + r] = the tile's sums (less the offset correction on the first span,
 * added to what is there on later ones). */
INLINE void tile_store(const i8_job *j, __m512i acc[MAX_RO][MAX_RT], int o, int t0, const int RO, const int RT) {
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
    __m512i acc[MAX_RO][MAX_RT], wv[MAX_RO];
    const uint8_t *wrow[MAX_RO], *xrow[MAX_RT];
#pragma GCC unroll 4
    for (int r = 0; r < RO; r++) {
        wrow[r] = w->w + (size_t)(o + r) * w->row_bytes;
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) acc[r][t] = _mm512_setzero_si512();
    }
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) xrow[t] = j->xp + (size_t)(t0 + t) * j->xstride;
    int full_end = j->kb1 < j->nfull ? j->kb1 : j->nfull;
    for (int b = j->kb0; b < full_end; b++) {
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) wv[r] = load_block(wrow[r], b, 0, 1);
        tile_block(acc, wv, xrow, (size_t)b * xb, BITS, RO, RT);
    }
    if (j->tail && j->kb1 > j->nfull) {
        const __mmask64 m = byte_mask(j->tail);
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) wv[r] = load_block(wrow[r], j->nfull, m, 0);
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
    case 4 * 8 + 3: i8_tile(j, o, t, BITS, 4, 3); break; \
    case 4 * 8 + 4: i8_tile(j, o, t, BITS, 4, 4); break; \
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
 * streamed on its own, front to back, with a prefetch I8_PREFETCH bytes ahead (as in avx2.c:
 * interleaving rows turns one stream into several, which measured slower from DRAM), and its
 * fields are extracted once for the RT activation rows. Four rows' sums are then reduced
 * together. With one activation row, two blocks a step keep several add chains in flight.
 * The prefetch runs 6 KiB ahead, not avx2.c's 2 KiB: over one E2B decode step's 276 matmuls
 * (bench_kernels decode, 2 threads, distances alternating in one process, 40 rounds) 6 KiB took
 * 0.83 and 0.87 of 2 KiB's time in two runs on the Zen 5 development machine, and was the fastest
 * of 1, 2, 3, 4, 5, 6, 8, 12 and 16 KiB in each of three runs. */
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
INLINE void row_block(__m512i acc[8][MAX_RT], __m512i v, const uint8_t *const x[MAX_RT], size_t xoff, int c, const int BITS,
                      const int RT) {
    const int fields = BITS == 2 ? 4 : BITS == 4 ? 2 : 1;
#pragma GCC unroll 4
    for (int f = 0; f < fields; f++) {
        __m512i wf = field(v, f, BITS);
        int set = RT > 1 ? c : c * fields + f;
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) acc[set][t] = dpbusd(acc[set][t], wf, load_x(x[t] + xoff + (size_t)BLK * f));
    }
}

/* sums[t] = the dot of one weight row and prepared activation row x[t] (its int32 lanes). */
INLINE void row_dot(const uint8_t *row, const uint8_t *const x[MAX_RT], int nfull, int tail, __m512i sums[MAX_RT], const int BITS,
                    const int RT) {
    const size_t xb = block_xbytes(BITS);
    const int sets = ROW_SETS(BITS, RT);
    __m512i acc[8][MAX_RT];
#pragma GCC unroll 8
    for (int k = 0; k < sets; k++)
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) acc[k][t] = _mm512_setzero_si512();
    int b = 0;
    for (; b + 2 <= nfull; b += 2) {
        prefetch_ahead(row + (size_t)b * BLK, I8_PREFETCH);
        prefetch_ahead(row + (size_t)b * BLK + BLK, I8_PREFETCH);
        row_block(acc, load_block(row, b, 0, 1), x, (size_t)b * xb, 0, BITS, RT);
        row_block(acc, load_block(row, b + 1, 0, 1), x, (size_t)(b + 1) * xb, 1, BITS, RT);
    }
    if (b < nfull) row_block(acc, load_block(row, b, 0, 1), x, (size_t)b * xb, 0, BITS, RT);
    if (tail) row_block(acc, load_block(row, nfull, byte_mask(tail), 0), x, (size_t)nfull * xb, 1, BITS, RT);
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) {
        sums[t] = acc[0][t];
#pragma GCC unroll 8
        for (int k = 1; k < sets; k++) sums[t] = _mm512_add_epi32(sums[t], acc[k][t]);
    }
}

INLINE void i8_rows_few(const i8_job *j, int o0, int o1, const int BITS, const int RT) {
    const g4_qweight *w = j->w;
    const int out = w->out;
    const uint8_t *x[MAX_RT];
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) x[t] = j->xp + (size_t)t * j->xstride;
    int o = o0;
    for (; o + 4 <= o1; o += 4) {
        __m512i s[4][MAX_RT];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) row_dot(w->w + (size_t)(o + r) * w->row_bytes, x, j->nfull, j->tail, s[r], BITS, RT);
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) {
            __m128i v = _mm_sub_epi32(hsum4(s[0][t], s[1][t], s[2][t], s[3][t]), _mm_set1_epi32((int32_t)j->corr[t]));
            _mm_storeu_si128((__m128i *)&j->acc[(size_t)t * out + o], v);
        }
    }
    for (; o < o1; o++) {
        __m512i s[MAX_RT];
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

static void vnni512_matmul_i8(const g4_qweight *w, const int8_t *x, int n, int32_t *acc) {
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
    size_t xstride = nblk * block_xbytes(bits); /* a multiple of 64: every activation load is aligned */
    uint8_t *xp = aligned_alloc(64, (size_t)n * xstride + 64);
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
static void vnni512_matmul_f32(const g4_qweight *w, const float *x, int n, float *y) {
    if (n <= 0 || w->out <= 0) return;
    if (w->bits == 2 || w->bits == 4 || w->bits == 8) g4_matmul_codes_f32(w, x, n, y, vnni512_matmul_i8);
    else g4_avx2_matmul_f32(w, x, n, y);
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

const g4_kernels g4_kernels_avx512vnni = {
    .name = "avx512vnni",
    .cpu_needs = "avx512f avx512bw avx512vl avx512_vnni avx512vbmi avx2 fma",
    .built = 1,
    .supported = avx512vnni_supported,
    .matmul_f32 = vnni512_matmul_f32,
    .matmul_i8 = vnni512_matmul_i8,
    .quantize = g4_avx2_quantize,
    .fake_quant = g4_avx2_fake_quant,
    .requant_f32 = g4_avx2_requant_f32,
    .acc_scale = g4_avx2_acc_scale,
    .gelu_mul = g4_avx2_gelu_mul,
    .attention = g4_avx2_attention,
    .softcap = g4_avx2_softcap,
};

#else /* not x86-64 */

const g4_kernels g4_kernels_avx512vnni = G4_LEVEL_NOT_BUILT("avx512vnni", "avx512f avx512bw avx512vl avx512_vnni avx512vbmi avx2 fma");

#endif
