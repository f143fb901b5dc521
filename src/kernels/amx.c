/* AMX kernels: the int8 matmuls of many activation rows (prefill, batched decode, draft
 * verification, and the digit rows of float activations) on Intel's tile unit (AMX-TILE,
 * AMX-INT8); everything else, and the few-row matmuls below amx_min_rows, the vector levels'.
 * As in avx512vnni.c the file needs no compiler flags: its kernels are compiled for AMX and
 * AVX-512 through a target pragma and only called after amx_supported() said yes (cpuid, XCR0's
 * tile state, and Linux granting the process the tile data, cpu_x86.c), so the binary stays
 * baseline x86-64.
 *
 * TDPBUSD C, A, B adds to each int32 C[m][n] the products of the unsigned bytes A[m][4k + j] and
 * the signed bytes B[k][4n + j] over k < 16, j < 4, without saturating: C wraps modulo 2^32 as the
 * reference's sums do. The weights are the A operand, taken raw (offset binary) field by field
 * exactly as the AVX-512 VNNI level takes them (its comment gives the offsets), so
 *   sum x*(raw - off) = sum x*raw - off*sum x
 * and that level's prepared activations (g4_avx512vnni_prepare: one 64-byte vector per field
 * per 64-byte weight block, zero-padded, with the off*sum x corrections) are the B operand once
 * each group of 16 rows is interleaved four bytes at a time (the tile layout TDPBUSD reads).
 *
 * The weights: where the model prepared the level's copy of a weight when it bound it (the
 * weight-preparation hook, g4_amx_prepare in amx_pack.c: the A tiles in tile order), the tiles
 * load it as it is. Otherwise (`--weights mapped`, a model loaded while another level was chosen,
 * a view that starts inside a 16-row group, memory short) the stored codes are read: a thread
 * unpacks each 16-row group's fields into a scratch of 64-byte tile rows once, front to back, into
 * exactly the bytes the copy holds, and runs every group of 16 activation rows through it. Integer
 * sums are exact in any order, so no tile shape, padding, thread split or weight path changes a
 * bit. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_x86.h"
#include "kernels.h"
#include "levels.h"
#include "pool.h"
#include "quant/int8.h"
#include "quant/pack.h"

/* The CPU features the level needs (/proc/cpuinfo's names): AMX, and the AVX-512 VNNI level's,
 * whose prepared activations and few-row matmuls it uses. */
#define NEEDS "amx_tile amx_int8 avx512f avx512bw avx512vl avx512_vnni avx512vbmi avx2 fma"

#if defined(__x86_64__)
/* Activation rows from which the tiles run, by weight bits; fewer go to the AVX-512 VNNI level.
 * The tiles compute 16 activation rows whatever n is and unpack each 16-row weight group into
 * scratch once per call, so below about a tile's rows the vector kernels, which stream the
 * weights once, are faster. Measured on the device host (Intel Xeon with AMX, 16 cores; 2
 * threads, `bench_kernels rows 2`; README, "The AMX level"): the tiles overtake avx512vnni from 6
 * rows on E2B's 4-bit 1536x6144 (1.38x; 0.62x at 4), from 12 on its 2-bit 12288x1536 (1.26x;
 * 0.93x at 8) and from 16 on the 8-bit 1536x256 (1.07x; 0.97x at 12). */
static int amx_min_rows(int bits) { return bits == 4 ? 6 : bits == 2 ? 12 : 16; }

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx2,fma")
#endif

#define BLK 64     /* weight bytes per block, one tile row */
#define TROWS 16   /* tile rows: weight rows of an A tile, activation rows of a B tile */
#define TBYTES 1024 /* one tile: 16 rows of 64 bytes */

/* ldtilecfg's 64-byte operand (palette 1): tiles 0-3 the int32 sums (2 weight groups x 2
 * activation groups), 4-5 the weight fields, 6-7 the activations; all 16 rows of 64 bytes. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static void load_tile_config(void) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) c.colsb[i] = 64, c.rows[i] = TROWS;
    _tile_loadconfig(&c);
}

static int fields_of(int bits) { return bits == 2 ? 4 : bits == 4 ? 2 : 1; }

typedef struct {
    const g4_qweight *w;
    int n, groups; /* activation rows, and their groups of 16 */
    int q;         /* 64-byte vectors of a prepared row: blocks x fields */
    int nfull, tail;
    const uint8_t *xt; /* [groups][q] B tiles */
    const uint8_t *wt; /* the prepared A tiles of the weight's first group, or NULL: unpack the stored codes */
    const uint32_t *corr;
    const int8_t *x; /* the activation rows themselves, for the out-of-memory path */
    int32_t *acc;
} amx_job;

/* Field f of every byte of block v as the unsigned operand (8-bit: the code + 128), as the
 * AVX-512 VNNI level extracts it. */
static inline __attribute__((always_inline)) __m512i field(__m512i v, int f, const int BITS) {
    if (BITS == 8) return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
    if (f) v = _mm512_srli_epi16(v, f * BITS);
    return _mm512_and_si512(v, _mm512_set1_epi8(BITS == 2 ? 3 : 15));
}

/* The A tiles of weight rows [o, o + 16) (rows at or past `end` zero): ws[(b * fields + f) *
 * 1024 + m * 64] = field f of block b of row o + m; the row's last partial block a masked load,
 * so nothing past a row is read. */
static inline __attribute__((always_inline)) void unpack_group(const amx_job *j, int o, int end, uint8_t *ws, const int BITS) {
    const g4_qweight *w = j->w;
    const int F = BITS == 2 ? 4 : BITS == 4 ? 2 : 1;
    const int nb = j->nfull + (j->tail ? 1 : 0);
    const __mmask64 tail_mask = j->tail ? ((__mmask64)1 << j->tail) - 1 : 0;
    for (int m = 0; m < TROWS; m++) {
        if (o + m >= end) {
            for (int q = 0; q < j->q; q++) _mm512_store_si512((void *)(ws + (size_t)q * TBYTES + (size_t)m * BLK), _mm512_setzero_si512());
            continue;
        }
        const uint8_t *row = w->w + (size_t)(o + m) * w->row_bytes;
        for (int b = 0; b < nb; b++) {
            __m512i v = b < j->nfull ? _mm512_loadu_si512((const void *)(row + (size_t)b * BLK))
                                     : _mm512_maskz_loadu_epi8(tail_mask, row + (size_t)b * BLK);
#pragma GCC unroll 4
            for (int f = 0; f < F; f++)
                _mm512_store_si512((void *)(ws + (size_t)(b * F + f) * TBYTES + (size_t)m * BLK), field(v, f, BITS));
        }
    }
}

/* acc[t][o + m] = tile sums c[m][t - t0] less row t's correction, for the rows and outputs that
 * exist. */
static void store_sums(const amx_job *j, const int32_t c[TROWS][TROWS], int o, int end, int t0) {
    const int out = j->w->out;
    for (int t = t0; t < t0 + TROWS && t < j->n; t++) {
        int32_t *dst = j->acc + (size_t)t * out;
        for (int m = 0; m < TROWS && o + m < end; m++) dst[o + m] = (int32_t)((uint32_t)c[m][t - t0] - j->corr[t]);
    }
}

/* Weight rows [o, o + 32) (two A groups at ws0, ws1) against every activation group, two at a
 * time: four int32 tiles, each A and B tile loaded once per k-step and used twice. */
static void run_pair(const amx_job *j, int o, int end, const uint8_t *ws0, const uint8_t *ws1) {
    int32_t c[4][TROWS][TROWS] __attribute__((aligned(64)));
    const size_t gstride = (size_t)j->q * TBYTES;
    int g = 0;
    for (; g + 2 <= j->groups; g += 2) {
        const uint8_t *x0 = j->xt + (size_t)g * gstride, *x1 = x0 + gstride;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int q = 0; q < j->q; q++) {
            size_t at = (size_t)q * TBYTES;
            _tile_loadd(4, ws0 + at, BLK);
            _tile_loadd(5, ws1 + at, BLK);
            _tile_loadd(6, x0 + at, BLK);
            _tile_loadd(7, x1 + at, BLK);
            _tile_dpbusd(0, 4, 6);
            _tile_dpbusd(1, 4, 7);
            _tile_dpbusd(2, 5, 6);
            _tile_dpbusd(3, 5, 7);
        }
        _tile_stored(0, c[0], BLK);
        _tile_stored(1, c[1], BLK);
        _tile_stored(2, c[2], BLK);
        _tile_stored(3, c[3], BLK);
        store_sums(j, c[0], o, end, g * TROWS);
        store_sums(j, c[1], o, end, (g + 1) * TROWS);
        store_sums(j, c[2], o + TROWS, end, g * TROWS);
        store_sums(j, c[3], o + TROWS, end, (g + 1) * TROWS);
    }
    if (g < j->groups) { /* the last group alone */
        const uint8_t *x0 = j->xt + (size_t)g * gstride;
        _tile_zero(0);
        _tile_zero(2);
        for (int q = 0; q < j->q; q++) {
            size_t at = (size_t)q * TBYTES;
            _tile_loadd(4, ws0 + at, BLK);
            _tile_loadd(5, ws1 + at, BLK);
            _tile_loadd(6, x0 + at, BLK);
            _tile_dpbusd(0, 4, 6);
            _tile_dpbusd(2, 5, 6);
        }
        _tile_stored(0, c[0], BLK);
        _tile_stored(2, c[2], BLK);
        store_sums(j, c[0], o, end, g * TROWS);
        store_sums(j, c[2], o + TROWS, end, g * TROWS);
    }
}

/* Weight rows [o0, o1) of the job, 32 at a time (o0 a multiple of 32: the pool's grain). */
static inline __attribute__((always_inline)) void amx_rows_bits(const amx_job *j, int o0, int o1, uint8_t *ws, const int BITS) {
    const size_t gbytes = (size_t)j->q * TBYTES;
    uint8_t *ws1 = ws + gbytes;
    for (int o = o0; o < o1; o += 2 * TROWS) {
        unpack_group(j, o, o1, ws, BITS);
        unpack_group(j, o + TROWS, o1, ws1, BITS);
        run_pair(j, o, o1, ws, ws1);
    }
}

/* The same from the prepared tiles: group o / 16 and the next (the copy ends in a zero group, so
 * the next always exists). */
static void amx_rows_prepared(const amx_job *j, int o0, int o1) {
    const size_t gbytes = (size_t)j->q * TBYTES;
    for (int o = o0; o < o1; o += 2 * TROWS) {
        const uint8_t *ws0 = j->wt + (size_t)(o / TROWS) * gbytes;
        run_pair(j, o, o1, ws0, ws0 + gbytes);
    }
}

static void amx_rows(void *ctx, int o0, int o1) {
    const amx_job *j = ctx;
    if (j->wt) {
        load_tile_config();
        amx_rows_prepared(j, o0, o1);
        _tile_release();
        return;
    }
    uint8_t *ws = aligned_alloc(64, (size_t)2 * j->q * TBYTES);
    if (!ws) { /* out of memory: the reference's dots, which need none */
        for (int t = 0; t < j->n; t++)
            for (int o = o0; o < o1; o++)
                j->acc[(size_t)t * j->w->out + o] =
                    g4_dot_packed(j->x + (size_t)t * j->w->in, 0, j->w->w + (size_t)o * j->w->row_bytes, j->w->bits, j->w->in);
        return;
    }
    load_tile_config();
    if (j->w->bits == 2) amx_rows_bits(j, o0, o1, ws, 2);
    else if (j->w->bits == 4) amx_rows_bits(j, o0, o1, ws, 4);
    else amx_rows_bits(j, o0, o1, ws, 8);
    _tile_release();
    free(ws);
}

/* The B tiles of activation groups [g0, g1): each group's 16 rows prepared (zeros past n), then
 * interleaved four bytes at a time, xt[g][q][k][t][0..3] = prepared row 16 g + t's bytes 64 q + 4 k
 * .. + 3; and their corrections. Split over the pool, so that a long prompt's preparation does
 * not run on one thread while the others wait. */
typedef struct {
    const int8_t *x;
    int n, in, bits, q;
    size_t nblk, xstride;
    uint8_t *xt;
    uint32_t *corr;
    atomic_int failed; /* a thread could not get its buffer */
} amx_prep;

static void prepare_groups(void *ctx, int g0, int g1) {
    amx_prep *p = ctx;
    uint8_t *xp = aligned_alloc(64, (size_t)TROWS * p->xstride);
    if (!xp) {
        atomic_store(&p->failed, 1);
        return;
    }
    for (int g = g0; g < g1; g++) {
        int rows = p->n - g * TROWS < TROWS ? p->n - g * TROWS : TROWS;
        g4_avx512vnni_prepare(p->x + (size_t)g * TROWS * p->in, rows, p->in, p->bits, p->nblk, xp, p->xstride, p->corr + (size_t)g * TROWS);
        memset(xp + (size_t)rows * p->xstride, 0, (size_t)(TROWS - rows) * p->xstride);
        for (int v = 0; v < p->q; v++) {
            uint32_t *dst = (uint32_t *)(void *)(p->xt + ((size_t)g * p->q + v) * TBYTES);
            for (int t = 0; t < TROWS; t++) {
                const uint8_t *src = xp + (size_t)t * p->xstride + (size_t)v * BLK;
                for (int k = 0; k < TROWS; k++) memcpy(&dst[k * TROWS + t], src + 4 * k, 4);
            }
        }
    }
    free(xp);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* Outside the target region: this runs on any CPU. */
static int amx_supported(void) {
    const g4_x86_cpu *c = g4_x86_cpu_get();
    return c->amx_tile && c->amx_int8 && g4_kernels_available(&g4_kernels_avx512vnni) && g4_x86_amx_granted();
}

/* The level's weight-preparation hook: a copy in tile order (g4_amx_prepare) of the 8-bit weights
 * alone, whose copy is the size of their codes, so it adds no bytes a call reads and saves the
 * per-call unpack: 1.19-1.30x on E2B's 1536x256 q8 at 1-64 rows, 1.03x at 128-512 (`bench_kernels
 * rows 2` on the device host; README, "The AMX level"). A 4-bit copy is twice and a 2-bit one four
 * times the codes' bytes, and there the larger reads cost more than the unpack saves (0.78-0.96x
 * at 1-128 rows; 1.00x and 1.13x at 512), so those stay in their stored layout. */
static g4_wprep *amx_prepare(const g4_qweight *w) { return w->bits == 8 ? g4_amx_prepare(w) : NULL; }

void g4_amx_matmul_i8_tiles(const g4_qweight *w, const int8_t *x, int n, int32_t *acc) {
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
    size_t nblk = (pb + BLK - 1) / BLK, xstride = nblk * BLK * (size_t)fields_of(bits);
    int groups = (n + TROWS - 1) / TROWS, q = (int)(nblk * (size_t)fields_of(bits));
    uint8_t *xt = aligned_alloc(64, (size_t)groups * (size_t)q * TBYTES);
    uint32_t *corr = malloc(sizeof *corr * (size_t)groups * TROWS);
    amx_prep p = {.x = x, .n = n, .in = w->in, .bits = bits, .q = q, .nblk = nblk, .xstride = xstride, .xt = xt, .corr = corr};
    if (xt && corr) g4_pool_for(groups, 1, (double)n * w->in * 8, prepare_groups, &p);
    if (!xt || !corr || atomic_load(&p.failed)) {
        free(xt);
        free(corr);
        g4_kernels_avx512vnni.matmul_i8(w, x, n, acc);
        return;
    }
    amx_job j = {.w = w, .n = n, .groups = groups, .q = q, .nfull = (int)(pb / BLK), .tail = (int)(pb % BLK), .xt = xt,
                 .wt = g4_amx_prepared_tiles(w), .corr = corr, .x = x, .acc = acc};
    g4_pool_for(w->out, 2 * TROWS, (double)w->out * w->in * n, amx_rows, &j);
    free(xt);
    free(corr);
}

/* Per shape: the tiles from amx_min_rows(bits) activation rows, the AVX-512 VNNI level below
 * (single-row decode included: on the device host it took 0.87-0.89 of avx2's time for one row
 * of E2B's 4- and 2-bit shapes, bench_kernels rows, at the read bandwidth's roofline). */
static void amx_matmul_i8(const g4_qweight *w, const int8_t *x, int n, int32_t *acc) {
    if (n >= amx_min_rows(w->bits)) g4_amx_matmul_i8_tiles(w, x, n, acc);
    else g4_kernels_avx512vnni.matmul_i8(w, x, n, acc);
}

/* Float activations against packed codes run through the int8 matmul above (three digit rows
 * per activation row, g4_matmul_codes_f32); BF16 and block-scaled weights through the AVX2
 * level's kernels. */
static void amx_matmul_f32(const g4_qweight *w, const float *x, int n, float *y) {
    if (n <= 0 || w->out <= 0) return;
    if (w->block == 0 && (w->bits == 2 || w->bits == 4 || w->bits == 8)) g4_matmul_codes_f32(w, x, n, y, amx_matmul_i8);
    else g4_avx2_matmul_f32(w, x, n, y);
}

const g4_kernels g4_kernels_amx = {.name = "amx", .cpu_needs = NEEDS, .built = 1, .supported = amx_supported,
                                   .matmul_f32 = amx_matmul_f32, .matmul_i8 = amx_matmul_i8, .quantize = g4_avx2_quantize,
                                   .fake_quant = g4_avx2_fake_quant, .requant_f32 = g4_avx2_requant_f32,
                                   .acc_scale = g4_avx2_acc_scale, .gelu_mul = g4_avx2_gelu_mul, .attention = g4_avx2_attention,
                                   .softcap = g4_avx2_softcap, .prepare = amx_prepare};

#else /* not x86-64 */

const g4_kernels g4_kernels_amx = G4_LEVEL_NOT_BUILT("amx", NEEDS);

void g4_amx_matmul_i8_tiles(const g4_qweight *w, const int8_t *x, int n, int32_t *acc) { g4_ref_matmul_i8(w, x, n, acc); }

#endif
