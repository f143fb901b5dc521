/* NEON kernels for aarch64 (Advanced SIMD is part of the base ISA there, so no flags and no
 * run-time check). Same tiling as kernels/avx2.c: RO weight rows x RT activation rows per tile,
 * each output with its own accumulator in the reference's lane order, so the tile shape and the
 * thread split never change a bit.
 *
 * int8: weight codes are unpacked to signed int8 (raw field - offset) and multiplied with
 * vmull_s8 into int16, which is exact; products are widened into int32 lanes with vpadalq_s16
 * before an int16 sum could overflow. Only baseline instructions: no SDOT (dotprod extension).
 * float: the 8 reference lanes are two float32x4 accumulators (lanes 0-3 and 4-7), multiplied and
 * added separately (never vfma/vmla, which would round once), except in attention, whose
 * reference is defined with fused multiply-adds (fmaf, here vfmaq_f32). */
#include <string.h>

#include "kernels.h"
#include "levels.h"
#include "pool.h"
#include "quant/pack.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>
#include <stdlib.h>

#include "attention.h"
#include "blocks.h"
#include "sweep.h"

#define INLINE static inline __attribute__((always_inline))
#define MAX_RO G4_TILE_MAX_RO
#define MAX_RT G4_TILE_MAX_RT

/* Weight rows of the widest tile for RT = 1..4 activation rows (kernels/sweep.h): 4 to 8
 * independent accumulator sets. */
#define TILE_WIDE(BITS, RT) ((RT) <= 2 ? 4 : 2)
static const int tile_ro[MAX_RT + 1] = G4_TILE_RO(TILE_WIDE, 8);

static double macs(const g4_qweight *w, int n) { return (double)w->out * w->in * n; }

/* ------------------------------------------------------------------ int8 x packed codes ---- */

/* 16-byte weight blocks (64 2-bit, 32 4-bit or 16 8-bit codes). Fields come out of a block in
 * bit order, so activations are permuted once per call to match, and zero-padded to whole blocks:
 *   4-bit block: [x0 x2 .. x30 | x1 x3 .. x31]     (vld2q_s8's de-interleave)
 *   2-bit block: [x0 x4 .. x60 | x1 x5 .. | .. ]   (vld4q_s8's)
 *   8-bit block: x0 .. x15 */
typedef struct {
    const g4_qweight *w;
    int n;
    const int8_t *xp;
    size_t xstride;
    int nfull, tail;
    int32_t *acc;
} i8_job;

static size_t i8_block_xbytes(int bits) { return bits == 2 ? 64 : bits == 4 ? 32 : 16; }

INLINE void i8_block(int32x4_t acc[MAX_RO][MAX_RT], const uint8_t *const wp[MAX_RO], const int8_t *const xp[MAX_RT],
                     const int BITS, const int RO, const int RT) {
    int8x16_t wf[MAX_RO][4];
#pragma GCC unroll 4
    for (int r = 0; r < RO; r++) {
        uint8x16_t b = vld1q_u8(wp[r]);
        if (BITS == 8) {
            wf[r][0] = vreinterpretq_s8_u8(b);
        } else if (BITS == 4) {
            const int8x16_t off = vdupq_n_s8(8);
            wf[r][0] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(15))), off);
            wf[r][1] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b, 4)), off);
        } else {
            const int8x16_t off = vdupq_n_s8(2);
            const uint8x16_t m = vdupq_n_u8(3);
            wf[r][0] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b, m)), off);
            wf[r][1] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(b, 2), m)), off);
            wf[r][2] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(b, 4), m)), off);
            wf[r][3] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b, 6)), off);
        }
    }
    const int F = BITS == 2 ? 4 : BITS == 4 ? 2 : 1;
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) {
        int8x16_t x[4];
#pragma GCC unroll 4
        for (int f = 0; f < F; f++) x[f] = vld1q_s8(xp[t] + 16 * f);
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) {
            if (BITS == 8) {
                /* two 8-bit products can reach 2 * 16384: widen each half on its own */
                acc[r][t] = vpadalq_s16(acc[r][t], vmull_s8(vget_low_s8(wf[r][0]), vget_low_s8(x[0])));
                acc[r][t] = vpadalq_s16(acc[r][t], vmull_high_s8(wf[r][0], x[0]));
            } else {
                /* at most 2*F products of |code*x| <= 1024 (4-bit) or 256 (2-bit) per int16 lane */
                int16x8_t p = vmull_s8(vget_low_s8(wf[r][0]), vget_low_s8(x[0]));
                p = vmlal_high_s8(p, wf[r][0], x[0]);
#pragma GCC unroll 4
                for (int f = 1; f < F; f++) {
                    p = vmlal_s8(p, vget_low_s8(wf[r][f]), vget_low_s8(x[f]));
                    p = vmlal_high_s8(p, wf[r][f], x[f]);
                }
                acc[r][t] = vpadalq_s16(acc[r][t], p);
            }
        }
    }
}

INLINE void i8_tile(const i8_job *j, int o, int t0, const int BITS, const int RO, const int RT) {
    const g4_qweight *w = j->w;
    const size_t xb = i8_block_xbytes(BITS);
    int32x4_t acc[MAX_RO][MAX_RT];
    const uint8_t *wp[MAX_RO];
    const int8_t *xp[MAX_RT];
#pragma GCC unroll 4
    for (int r = 0; r < RO; r++) {
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) acc[r][t] = vdupq_n_s32(0);
    }
    for (int b = 0; b < j->nfull; b++) {
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) wp[r] = w->w + (size_t)(o + r) * w->row_bytes + (size_t)b * 16;
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) xp[t] = j->xp + (size_t)(t0 + t) * j->xstride + (size_t)b * xb;
        i8_block(acc, wp, xp, BITS, RO, RT);
    }
    if (j->tail) {
        /* copy the partial last block rather than read past the tensor; its padding meets zeros */
        uint8_t buf[MAX_RO][16];
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) {
            memset(buf[r], 0, 16);
            memcpy(buf[r], w->w + (size_t)(o + r) * w->row_bytes + (size_t)j->nfull * 16, (size_t)j->tail);
            wp[r] = buf[r];
        }
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) xp[t] = j->xp + (size_t)(t0 + t) * j->xstride + (size_t)j->nfull * xb;
        i8_block(acc, wp, xp, BITS, RO, RT);
    }
#pragma GCC unroll 4
    for (int r = 0; r < RO; r++) {
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) j->acc[(size_t)(t0 + t) * w->out + o + r] = vaddvq_s32(acc[r][t]);
    }
}

/* One function per bit width, each holding every tile shape the sweep asks for. */
G4_I8_TILE_FNS(i8_tile, i8_job, i8_tile, TILE_WIDE)

static void i8_rows(void *ctx, int o0, int o1) {
    const i8_job *j = ctx;
    int bits = j->w->bits;
    g4_tile_sweep(j, j->n, o0, o1, j->w->row_bytes, tile_ro, i8_tile_for(bits));
}

static void i8_prepare(const int8_t *x, int n, int in, int bits, size_t nblk, int8_t *xp, size_t xstride) {
    const int full = bits == 2 ? 64 : bits == 4 ? 32 : 16;
    for (int t = 0; t < n; t++) {
        const int8_t *xt = x + (size_t)t * in;
        int8_t *pt = xp + (size_t)t * xstride;
        for (size_t b = 0; b < nblk; b++) {
            long left = (long)in - (long)b * full;
            int elems = left <= 0 ? 0 : left < full ? (int)left : full;
            int8_t tmp[64] = {0};
            if (elems) memcpy(tmp, xt + b * (size_t)full, (size_t)elems);
            int8_t *out = pt + b * (size_t)full;
            if (bits == 4) {
                int8x16x2_t v = vld2q_s8(tmp);
                vst1q_s8(out, v.val[0]);
                vst1q_s8(out + 16, v.val[1]);
            } else if (bits == 2) {
                int8x16x4_t v = vld4q_s8(tmp);
                for (int f = 0; f < 4; f++) vst1q_s8(out + 16 * f, v.val[f]);
            } else {
                vst1q_s8(out, vld1q_s8(tmp));
            }
        }
    }
}

static void neon_matmul_i8(const g4_qweight *w, const int8_t *x, int n, int32_t *acc) {
    if (n <= 0 || w->out <= 0) return;
    int bits = w->bits;
    if (bits != 2 && bits != 4 && bits != 8) {
        g4_ref_matmul_i8(w, x, n, acc);
        return;
    }
    size_t pb = g4_packed_row_bytes(bits, (size_t)(w->in > 0 ? w->in : 0));
    size_t nblk = (pb + 15) / 16, xstride = nblk * i8_block_xbytes(bits);
    int8_t *xp = malloc((size_t)n * xstride + 16);
    if (!xp) {
        g4_ref_matmul_i8(w, x, n, acc);
        return;
    }
    i8_prepare(x, n, w->in, bits, nblk, xp, xstride);
    i8_job j = {.w = w, .n = n, .xp = xp, .xstride = xstride, .nfull = (int)(pb / 16), .tail = (int)(pb % 16), .acc = acc};
    g4_pool_for(w->out, MAX_RO, macs(w, n), i8_rows, &j);
    free(xp);
}

/* ------------------------------------------------------------------ float x codes / BF16 --- */

/* BF16 weights i .. i+7 as two float32x4 (elements 0-3, 4-7). Float activations against packed
 * codes go through the int8 matmul (g4_matmul_codes_f32); only BF16 takes a float dot. */
INLINE void load8_bf16(const uint8_t *row, int i, float32x4_t *lo, float32x4_t *hi) {
    uint16x8_t h = vreinterpretq_u16_u8(vld1q_u8(row + 2 * (size_t)i));
    *lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
    *hi = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
}

/* g4_reduce8 of lanes (a0..a3, a4..a7): s = a + b lane-wise, then (s0 + s2) + (s1 + s3). */
INLINE float reduce8(float32x4_t a, float32x4_t b) {
    float32x4_t s = vaddq_f32(a, b);
    float32x2_t t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
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
    float32x4_t acc[MAX_RO][MAX_RT][2], wl[MAX_RO], wh[MAX_RO];
    const uint8_t *row[MAX_RO];
    const float *xt[MAX_RT];
#pragma GCC unroll 4
    for (int r = 0; r < RO; r++) {
        row[r] = w->w + (size_t)(o + r) * w->row_bytes;
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) acc[r][t][0] = acc[r][t][1] = vdupq_n_f32(0.0f);
    }
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) xt[t] = j->x + (size_t)(t0 + t) * in;
    int i = 0;
    for (; i + 8 <= in; i += 8) {
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) load8_bf16(row[r], i, &wl[r], &wh[r]);
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) {
            float32x4_t xl = vld1q_f32(xt[t] + i), xh = vld1q_f32(xt[t] + i + 4);
#pragma GCC unroll 4
            for (int r = 0; r < RO; r++) {
                acc[r][t][0] = vaddq_f32(acc[r][t][0], vmulq_f32(xl, wl[r]));
                acc[r][t][1] = vaddq_f32(acc[r][t][1], vmulq_f32(xh, wh[r]));
            }
        }
    }
    if (i < in) {
        /* zero-padded tail: +0 added to a lane leaves it unchanged (lanes start at +0 and an
         * add never makes -0 from that), so this matches the reference's shorter loop */
        int rem = in - i;
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) {
            float tmp[8] = {0};
            for (int k = 0; k < rem; k++) {
                uint32_t u = (uint32_t)(row[r][2 * (i + k)] | row[r][2 * (i + k) + 1] << 8) << 16;
                memcpy(&tmp[k], &u, 4);
            }
            wl[r] = vld1q_f32(tmp);
            wh[r] = vld1q_f32(tmp + 4);
        }
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) {
            float tmp[8] = {0};
            memcpy(tmp, xt[t] + i, sizeof(float) * (size_t)rem);
            float32x4_t xl = vld1q_f32(tmp), xh = vld1q_f32(tmp + 4);
#pragma GCC unroll 4
            for (int r = 0; r < RO; r++) {
                acc[r][t][0] = vaddq_f32(acc[r][t][0], vmulq_f32(xl, wl[r]));
                acc[r][t][1] = vaddq_f32(acc[r][t][1], vmulq_f32(xh, wh[r]));
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RO; r++) {
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) {
            j->y[(size_t)(t0 + t) * w->out + o + r] = reduce8(acc[r][t][0], acc[r][t][1]);
        }
    }
}

G4_TILE_FN(f32_tile_16, f32_job, f32_tile, 16, TILE_WIDE)

static void f32_rows(void *ctx, int o0, int o1) {
    const f32_job *j = ctx;
    g4_tile_sweep(j, j->n, o0, o1, j->w->row_bytes, tile_ro, f32_tile_16);
}

/* ------------------------------------------------------------------ block-scaled codes ---- */

/* Weights with one scale per block of 32 inputs (kernels/blocks.h): each block's dot D in
 * integers, digit row by digit row (vmull_s8 products are exact in int16; 4-bit codes against
 * the even-odd digit layout sum four products per int16 lane, at most 4 x 8 x 128, while 8-bit
 * codes widen every product into int32 with vpadalq_s16), then the reference's fold acc = acc +
 * scale x D in double, per output in block order. */
#define TILE_BLOCKS(BITS, RT) 4
static const int tile_ro_blocks[MAX_RT + 1] = G4_TILE_RO(TILE_BLOCKS, 4);

/* sum of codes x digits over one block: 4-bit codes as even and odd elements, 8-bit in order. */
INLINE int32_t block_digit_dot(const int8x16_t c[2], const int8_t *xd, const int BITS) {
    int8x16_t x0 = vld1q_s8(xd), x1 = vld1q_s8(xd + 16);
    if (BITS == 4) {
        int16x8_t m = vmull_s8(vget_low_s8(c[0]), vget_low_s8(x0));
        m = vmlal_s8(m, vget_high_s8(c[0]), vget_high_s8(x0));
        m = vmlal_s8(m, vget_low_s8(c[1]), vget_low_s8(x1));
        m = vmlal_s8(m, vget_high_s8(c[1]), vget_high_s8(x1));
        return vaddlvq_s16(m);
    }
    int32x4_t a = vpaddlq_s16(vmull_s8(vget_low_s8(c[0]), vget_low_s8(x0)));
    a = vpadalq_s16(a, vmull_s8(vget_high_s8(c[0]), vget_high_s8(x0)));
    a = vpadalq_s16(a, vmull_s8(vget_low_s8(c[1]), vget_low_s8(x1)));
    a = vpadalq_s16(a, vmull_s8(vget_high_s8(c[1]), vget_high_s8(x1)));
    return vaddvq_s32(a);
}

INLINE void blocks_tile(const g4_blocks_job *j, int o, int t0, const int BITS, const int RO, const int RT) {
    const g4_qweight *w = j->w;
    const int nb = j->nb;
    double acc[MAX_RO][MAX_RT] = {{0}};
    for (int b = 0; b < nb; b++) {
        int8x16_t c[MAX_RO][2];
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) {
            const uint8_t *p = w->w + (size_t)(o + r) * w->row_bytes + (size_t)b * (BITS == 4 ? 16 : 32);
            if (BITS == 4) {
                uint8x16_t v = vld1q_u8(p);
                c[r][0] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15))), vdupq_n_s8(8));
                c[r][1] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
            } else {
                c[r][0] = vld1q_s8((const int8_t *)p);
                c[r][1] = vld1q_s8((const int8_t *)p + 16);
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) {
            const int8_t *xd = g4_blocks_digits_at(j, t0 + t, b);
#pragma GCC unroll 4
            for (int r = 0; r < RO; r++) {
                int64_t d = (int64_t)block_digit_dot(c[r], xd, BITS) + 256 * (int64_t)block_digit_dot(c[r], xd + 32, BITS) +
                            65536 * (int64_t)block_digit_dot(c[r], xd + 64, BITS);
                acc[r][t] = acc[r][t] + (double)w->w_scale[(size_t)(o + r) * nb + b] * (double)d;
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++) {
#pragma GCC unroll 4
        for (int r = 0; r < RO; r++) g4_blocks_store(j, o + r, t0 + t, acc[r][t]);
    }
}

G4_TILE_FN(blocks_tile_4, g4_blocks_job, blocks_tile, 4, TILE_BLOCKS)
G4_TILE_FN(blocks_tile_8, g4_blocks_job, blocks_tile, 8, TILE_BLOCKS)

static void blocks_rows(void *ctx, int o0, int o1) {
    const g4_blocks_job *j = ctx;
    g4_tile_sweep(j, j->n, o0, o1, j->w->row_bytes, tile_ro_blocks, j->w->bits == 4 ? blocks_tile_4 : blocks_tile_8);
}

static void neon_matmul_f32(const g4_qweight *w, const float *x, int n, float *y) {
    if (n <= 0 || w->out <= 0) return;
    if (w->block > 0 && w->bits != G4_WT_BF16) {
        g4_blocks_matmul(w, x, n, y, G4_BLOCKS_DIGITS_EVEN_ODD, G4_BLOCKS_DIGITS, blocks_rows);
        return;
    }
    if (w->bits != G4_WT_BF16) {
        g4_matmul_codes_f32(w, x, n, y, w->bits == 2 || w->bits == 4 || w->bits == 8 ? neon_matmul_i8 : g4_ref_matmul_i8);
        return;
    }
    f32_job j = {.w = w, .x = x, .n = n, .y = y};
    g4_pool_for(w->out, MAX_RO, macs(w, n), f32_rows, &j);
}

/* ------------------------------------------------------------------ attention -------------- */

/* The kernels of the shared attention schedule (kernels/attention.c), as in kernels/avx2.c: the
 * 8 reference lanes are two float32x4 (lanes 0-3 and 4-7) updated with vfmaq_f32, the fused
 * multiply-add the reference's fmaf defines; each output element is one lane summed over
 * positions in order. Heads that read one KV head are done together, so each K or V row is
 * converted once for all of them. */

/* Eight K or V values from element d as two float32x4. */
INLINE void load8_kv(const int8_t *q8, const float *f, int d, float32x4_t *lo, float32x4_t *hi) {
    if (q8) {
        int16x8_t w = vmovl_s8(vld1_s8(q8 + d));
        *lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w)));
        *hi = vcvtq_f32_s32(vmovl_high_s16(w));
    } else {
        *lo = vld1q_f32(f + d);
        *hi = vld1q_f32(f + d + 4);
    }
}

/* A dot's 8 lanes finished with the head dim's tail (elements hd8 .. hd - 1), then reduced. */
INLINE float attn_finish(float32x4_t lo, float32x4_t hi, const float *q, const int8_t *kq, const float *kf, int hd8, int hd) {
    if (hd8 == hd) return reduce8(lo, hi);
    float lanes[8];
    vst1q_f32(lanes, lo);
    vst1q_f32(lanes + 4, hi);
    for (int i = hd8; i < hd; i++) lanes[i & 7] = fmaf(q[i], kq ? (float)kq[i] : kf[i], lanes[i & 7]);
    return g4_reduce8(lanes);
}

/* Scores of positions [j, j + PJ) for the H heads at q. */
INLINE void attn_scores(const g4_attn *a, const g4_attn_row *c, const float *q, size_t off, int j, int count, float *scores,
                        const int H, const int PJ) {
    const int hd = a->head_dim, hd8 = hd & ~7;
    const int8_t *kq[4];
    const float *kf[4];
    float32x4_t lo[4][8], hi[4][8];
#pragma GCC unroll 4
    for (int p = 0; p < PJ; p++) {
        size_t row = (size_t)(c->lo + j + p) * (size_t)a->kv_width + off;
        kq[p] = c->kq ? c->kq + row : NULL;
        kf[p] = c->kq ? NULL : c->kf + row;
#pragma GCC unroll 8
        for (int h = 0; h < H; h++) lo[p][h] = hi[p][h] = vdupq_n_f32(0.0f);
    }
    for (int d = 0; d < hd8; d += 8) {
        float32x4_t kl[4], kh[4];
#pragma GCC unroll 4
        for (int p = 0; p < PJ; p++) load8_kv(kq[p], kf[p], d, &kl[p], &kh[p]);
#pragma GCC unroll 8
        for (int h = 0; h < H; h++) {
            float32x4_t ql = vld1q_f32(q + (size_t)h * hd + d), qh = vld1q_f32(q + (size_t)h * hd + d + 4);
#pragma GCC unroll 4
            for (int p = 0; p < PJ; p++) {
                lo[p][h] = vfmaq_f32(lo[p][h], ql, kl[p]);
                hi[p][h] = vfmaq_f32(hi[p][h], qh, kh[p]);
            }
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < PJ; p++) {
#pragma GCC unroll 8
        for (int h = 0; h < H; h++) {
            float dot = attn_finish(lo[p][h], hi[p][h], q + (size_t)h * hd, kq[p], kf[p], hd8, hd);
            scores[(size_t)h * count + j + p] = kq[p] ? c->k_scale * dot : dot;
        }
    }
}

/* out[h][d .. d + 8 DC) over positions [j0, j1) for the H heads; the first block starts from +0,
 * later ones from out; the last applies v_scale. */
INLINE void attn_values(const g4_attn_row *c, size_t stride, size_t off, const float *scores, int count, float *out, int hd,
                        int j0, int j1, int d, const int H, const int DC) {
    float32x4_t lo[8][2], hi[8][2];
#pragma GCC unroll 8
    for (int h = 0; h < H; h++) {
#pragma GCC unroll 2
        for (int k = 0; k < DC; k++) {
            const float *o = out + (size_t)h * hd + d + 8 * k;
            lo[h][k] = j0 ? vld1q_f32(o) : vdupq_n_f32(0.0f);
            hi[h][k] = j0 ? vld1q_f32(o + 4) : vdupq_n_f32(0.0f);
        }
    }
    for (int j = j0; j < j1; j++) {
        size_t row = (size_t)(c->lo + j) * stride + off;
        float32x4_t vl[2], vh[2];
#pragma GCC unroll 2
        for (int k = 0; k < DC; k++) load8_kv(c->vq ? c->vq + row : NULL, c->vq ? NULL : c->vf + row, d + 8 * k, &vl[k], &vh[k]);
#pragma GCC unroll 8
        for (int h = 0; h < H; h++) {
            float32x4_t w = vdupq_n_f32(scores[(size_t)h * count + j]);
#pragma GCC unroll 2
            for (int k = 0; k < DC; k++) {
                lo[h][k] = vfmaq_f32(lo[h][k], w, vl[k]);
                hi[h][k] = vfmaq_f32(hi[h][k], w, vh[k]);
            }
        }
    }
    int last = j1 == count;
#pragma GCC unroll 8
    for (int h = 0; h < H; h++) {
#pragma GCC unroll 2
        for (int k = 0; k < DC; k++) {
            float *o = out + (size_t)h * hd + d + 8 * k;
            float32x4_t l = lo[h][k], u = hi[h][k];
            if (last && c->vq) {
                l = vmulq_f32(l, vdupq_n_f32(c->v_scale));
                u = vmulq_f32(u, vdupq_n_f32(c->v_scale));
            }
            vst1q_f32(o, l);
            vst1q_f32(o + 4, u);
        }
    }
}

#define ATTN_PJ(H) ((H) >= 8 ? 1 : (H) >= 4 ? 2 : 4)
#define ATTN_DC(H) ((H) >= 4 ? 1 : 2)

INLINE void attn_heads_scores(const g4_attn *a, int t, int h0, float *scores, int j0, int j1, const int H) {
    const g4_attn_row *c = &a->rows[t];
    const int hd = a->head_dim, count = c->hi - c->lo + 1;
    const size_t off = (size_t)(h0 / a->group) * hd;
    const float *q = a->q + (size_t)t * a->n_heads * hd + (size_t)h0 * hd;
    int j = j0;
    for (; j + ATTN_PJ(H) <= j1; j += ATTN_PJ(H)) attn_scores(a, c, q, off, j, count, scores, H, ATTN_PJ(H));
    for (; j < j1; j++) attn_scores(a, c, q, off, j, count, scores, H, 1);
}

/* out elements [d0, d1) (multiples of 8) of heads [h0, h0 + H) over positions [j0, j1) (see
 * g4_attn_ops.values). */
INLINE void attn_heads_values(const g4_attn *a, int t, int h0, const float *scores, int d0, int d1, int j0, int j1,
                              const int H) {
    const g4_attn_row *c = &a->rows[t];
    const int hd = a->head_dim, count = c->hi - c->lo + 1;
    const size_t off = (size_t)(h0 / a->group) * hd, stride = (size_t)a->kv_width;
    float *out = a->out + (size_t)t * a->n_heads * hd + (size_t)h0 * hd;
    int d = d0;
    for (; d + 8 * ATTN_DC(H) <= d1; d += 8 * ATTN_DC(H)) attn_values(c, stride, off, scores, count, out, hd, j0, j1, d, H, ATTN_DC(H));
    for (; d < d1; d += 8) attn_values(c, stride, off, scores, count, out, hd, j0, j1, d, H, 1);
}

/* g4_expf on 4 lanes, operation for operation (mul and add, never fused). */
INLINE float32x4_t exp4(float32x4_t x0) {
    float32x4_t x = vminq_f32(vmaxq_f32(x0, vdupq_n_f32(-104.0f)), vdupq_n_f32(89.0f)); /* NaN: put back below */
    float32x4_t fn = vrndmq_f32(vaddq_f32(vmulq_f32(x, vdupq_n_f32(G4_EXP_LOG2E)), vdupq_n_f32(0.5f)));
    float32x4_t r = vsubq_f32(vsubq_f32(x, vmulq_f32(fn, vdupq_n_f32(G4_EXP_LN2_HI))), vmulq_f32(fn, vdupq_n_f32(G4_EXP_LN2_LO)));
    float32x4_t q = vdupq_n_f32(G4_EXP_P5);
    q = vaddq_f32(vmulq_f32(q, r), vdupq_n_f32(G4_EXP_P4));
    q = vaddq_f32(vmulq_f32(q, r), vdupq_n_f32(G4_EXP_P3));
    q = vaddq_f32(vmulq_f32(q, r), vdupq_n_f32(G4_EXP_P2));
    q = vaddq_f32(vmulq_f32(q, r), vdupq_n_f32(G4_EXP_P1));
    q = vaddq_f32(vmulq_f32(q, r), vdupq_n_f32(G4_EXP_P0));
    float32x4_t e = vaddq_f32(vaddq_f32(vmulq_f32(q, vmulq_f32(r, r)), r), vdupq_n_f32(1.0f));
    int32x4_t n = vcvtq_s32_f32(fn), n1 = vshrq_n_s32(n, 1), n2 = vsubq_s32(n, n1);
    e = vmulq_f32(e, vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, vdupq_n_s32(127)), 23)));
    e = vmulq_f32(e, vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, vdupq_n_s32(127)), 23)));
    return vbslq_f32(vceqq_f32(x0, x0), e, x0);
}

/* The softmax steps (g4_attn_ops) on the 8 lanes as two registers: maxnm keeps the running
 * max when a score is NaN. */
static void neon_softmax_max(const float *sc, int n8, float lanes[8]) {
    float32x4_t m0 = vld1q_f32(lanes), m1 = vld1q_f32(lanes + 4);
    for (int i = 0; i < n8; i += 8) {
        m0 = vmaxnmq_f32(m0, vld1q_f32(sc + i));
        m1 = vmaxnmq_f32(m1, vld1q_f32(sc + i + 4));
    }
    vst1q_f32(lanes, m0);
    vst1q_f32(lanes + 4, m1);
}

static void neon_softmax_exp(float *sc, int n8, float mx, float lanes[8]) {
    const float32x4_t vm = vdupq_n_f32(mx);
    float32x4_t s0 = vld1q_f32(lanes), s1 = vld1q_f32(lanes + 4);
    for (int i = 0; i < n8; i += 8) {
        float32x4_t e0 = exp4(vsubq_f32(vld1q_f32(sc + i), vm)), e1 = exp4(vsubq_f32(vld1q_f32(sc + i + 4), vm));
        vst1q_f32(sc + i, e0);
        vst1q_f32(sc + i + 4, e1);
        s0 = vaddq_f32(s0, e0);
        s1 = vaddq_f32(s1, e1);
    }
    vst1q_f32(lanes, s0);
    vst1q_f32(lanes + 4, s1);
}

static void neon_softmax_div(float *sc, int n8, float sum) {
    const float32x4_t vs = vdupq_n_f32(sum);
    for (int i = 0; i < n8; i += 4) vst1q_f32(sc + i, vdivq_f32(vld1q_f32(sc + i), vs));
}

G4_ATTN_OPS(neon_attn_ops, attn_heads_scores, attn_heads_values, neon_softmax, NULL)

static void neon_attention(const g4_attn *a) { g4_attention_run(a, &neon_attn_ops); }

/* ------------------------------------------------------------------ softcap --------------- */

/* g4_tanhf on 4 lanes: both branches on every lane, then the reference's choice per lane; each
 * lane's arithmetic is the reference's, operation for operation (mul and add, never fused). */
INLINE float32x4_t tanh4(float32x4_t z) {
    float32x4_t a = vabsq_f32(z), z2 = vmulq_f32(a, a), p = vdupq_n_f32(G4_TANH_Q4);
    p = vaddq_f32(vmulq_f32(p, z2), vdupq_n_f32(G4_TANH_Q3));
    p = vsubq_f32(vmulq_f32(p, z2), vdupq_n_f32(G4_TANH_Q2N));
    p = vaddq_f32(vmulq_f32(p, z2), vdupq_n_f32(G4_TANH_Q1));
    p = vsubq_f32(vmulq_f32(p, z2), vdupq_n_f32(G4_TANH_Q0N));
    float32x4_t small = vaddq_f32(vmulq_f32(vmulq_f32(p, z2), a), a);
    float32x4_t e = exp4(vminq_f32(vaddq_f32(a, a), vdupq_n_f32(18.0f))); /* NaN lanes are replaced below */
    float32x4_t big = vsubq_f32(vdupq_n_f32(1.0f), vdivq_f32(vdupq_n_f32(2.0f), vaddq_f32(e, vdupq_n_f32(1.0f))));
    float32x4_t t = vbslq_f32(vcltq_f32(a, vdupq_n_f32(0.625f)), small, big);
    t = vbslq_f32(vcgeq_f32(a, vdupq_n_f32(9.0f)), vdupq_n_f32(1.0f), t);
    /* copysign: t >= +0 here */
    t = vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(t), vandq_u32(vreinterpretq_u32_f32(z), vdupq_n_u32(0x80000000u))));
    return vbslq_f32(vceqq_f32(z, z), t, z); /* NaN stays NaN */
}

static void softcap_span(float *x, size_t n, float cap) {
    const float32x4_t c = vdupq_n_f32(cap);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(x + i, vmulq_f32(c, tanh4(vdivq_f32(vld1q_f32(x + i), c))));
    g4_ref_softcap(x + i, n - i, cap);
}

static void neon_softcap(float *x, size_t n, float cap) { g4_softcap_pooled(x, n, cap, softcap_span, 4.0); }

const g4_kernels g4_kernels_neon = {
    .name = "neon",
    .cpu_needs = "asimd",
    .built = 1, /* every aarch64 CPU has Advanced SIMD: no probe */
    .matmul_f32 = neon_matmul_f32,
    .matmul_i8 = neon_matmul_i8,
    .quantize = g4_ref_quantize,
    .fake_quant = g4_ref_fake_quant,
    .requant_f32 = g4_ref_requant_f32,
    .acc_scale = g4_ref_acc_scale,
    .gelu_mul = g4_portable_gelu_mul,
    .attention = neon_attention,
    .softcap = neon_softcap,
};

#else /* not aarch64 */

const g4_kernels g4_kernels_neon = G4_LEVEL_NOT_BUILT("neon", "asimd");

#endif
