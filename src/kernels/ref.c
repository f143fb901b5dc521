#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "pool.h"
#include "quant/int8.h"
#include "quant/pack.h"
#include "util/select.h"

float g4_ref_dot_bf16_f32(const float *x, const uint8_t *row, int n) {
    float acc[8] = {0};
    for (int i = 0; i < n; i++) {
        uint32_t u = (uint32_t)(row[2 * i] | row[2 * i + 1] << 8) << 16;
        float w;
        memcpy(&w, &u, 4);
        acc[i & 7] += x[i] * w;
    }
    return g4_reduce8(acc);
}

/* The row's S (|x| * 2^S < 2^G4_FIX_BITS), or INT32_MIN when it holds a NaN or an infinity. */
static int fix_exponent(const float *x, int in) {
    float mx = 0;
    for (int i = 0; i < in; i++) {
        float a = fabsf(x[i]);
        if (!(a <= FLT_MAX)) return INT32_MIN;
        if (a > mx) mx = a;
    }
    int e = 0;
    if (mx > 0) frexpf(mx, &e); /* mx < 2^e */
    return G4_FIX_BITS - e;
}

/* X = x * 2^S rounded half to even: the product is exact in double (a power-of-two scale well
 * inside its range) and llrint rounds in the default mode. */
static int32_t fix_value(float x, double two_s) { return (int32_t)llrint((double)x * two_s); }

/* w_scale * dot * 2^-S for an integer dot (|dot| < 2^53, so exact in double): the scaled dot is
 * exact too, then rounded to f32 once. Monotone in dot when w_scale > 0. */
static float fix_result(double dot, double two_neg_s, float w_scale) { return w_scale * (float)(dot * two_neg_s); }

int g4_fix_split_row(const float *x, int in, int8_t *digits) {
    int S = fix_exponent(x, in);
    if (S == INT32_MIN) return S;
    double two_s = ldexp(1.0, S);
    for (int i = 0; i < in; i++) {
        int32_t X = fix_value(x[i], two_s); /* |X| <= 2^G4_FIX_BITS */
        for (int p = 0; p < G4_FIX_DIGITS - 1; p++) {
            int32_t d = (int32_t)(((uint32_t)X + 128u) & 255u) - 128; /* balanced digit, -128..127 */
            digits[(size_t)p * in + i] = (int8_t)d;
            X = (X - d) / 256; /* exact */
        }
        digits[(size_t)(G4_FIX_DIGITS - 1) * in + i] = (int8_t)X; /* |X| <= 65 */
    }
    return S;
}

/* Out of memory for the digit rows: the same integers, summed one output at a time. */
static void fix_matmul_direct(const g4_qweight *w, const float *x, int n, float *y) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * w->in;
        int S = fix_exponent(xt, w->in);
        double two_s = S == INT32_MIN ? 0 : ldexp(1.0, S), two_neg_s = S == INT32_MIN ? 0 : ldexp(1.0, -S);
        for (int o = 0; o < w->out; o++) {
            const uint8_t *row = w->w + (size_t)o * w->row_bytes;
            int64_t dot = 0;
            for (int i = 0; S != INT32_MIN && i < w->in; i++)
                dot += (int64_t)fix_value(xt[i], two_s) * g4_packed_code(row, w->bits, (size_t)i);
            y[(size_t)t * w->out + o] = S == INT32_MIN ? NAN : fix_result((double)dot, two_neg_s, w->w_scale[o]);
        }
    }
}

/* Activation rows per pass, and the int32 sums one pass keeps (they stay in L2 while they are
 * combined). */
#define FIX_ROWS 8
#define FIX_ACC (1 << 18)

typedef struct {
    const int32_t *acc; /* [nt][G4_FIX_DIGITS][no] */
    const int *S;
    const float *w_scale; /* [no] */
    float *y;             /* row t at y + t * y_stride */
    size_t y_stride;
    int nt, no;
} fix_combine_job;

static void fix_combine(void *ctx, int o0, int o1) {
    const fix_combine_job *j = ctx;
    for (int t = 0; t < j->nt; t++) {
        float *yt = j->y + (size_t)t * j->y_stride;
        const int32_t *at = j->acc + (size_t)t * G4_FIX_DIGITS * j->no;
        if (j->S[t] == INT32_MIN) {
            for (int o = o0; o < o1; o++) yt[o] = NAN;
            continue;
        }
        double two_neg_s = ldexp(1.0, -j->S[t]);
        for (int o = o0; o < o1; o++) {
            int64_t dot = 0;
            for (int p = G4_FIX_DIGITS - 1; p >= 0; p--) dot = dot * 256 + at[(size_t)p * j->no + o];
            yt[o] = fix_result((double)dot, two_neg_s, j->w_scale[o]);
        }
    }
}

void g4_matmul_codes_f32(const g4_qweight *w, const float *x, int n, float *y, g4_matmul_i8_fn matmul_i8) {
    if (n <= 0 || w->out <= 0) return;
    const int D = G4_FIX_DIGITS, in = w->in, rows = n < FIX_ROWS ? n : FIX_ROWS;
    int chunk = FIX_ACC / (D * rows);
    if (chunk > w->out) chunk = w->out;
    int8_t *digits = malloc((size_t)D * rows * (size_t)(in > 0 ? in : 1));
    int32_t *acc = malloc(sizeof *acc * (size_t)D * rows * (size_t)chunk);
    if (!digits || !acc) {
        free(digits);
        free(acc);
        fix_matmul_direct(w, x, n, y);
        return;
    }
    int S[FIX_ROWS];
    for (int t0 = 0; t0 < n; t0 += rows) {
        int nt = n - t0 < rows ? n - t0 : rows;
        for (int t = 0; t < nt; t++) S[t] = g4_fix_split_row(x + (size_t)(t0 + t) * in, in, digits + (size_t)t * D * in);
        for (int o0 = 0; o0 < w->out; o0 += chunk) {
            g4_qweight sub = g4_qweight_rows(w, o0, w->out - o0 < chunk ? w->out - o0 : chunk);
            matmul_i8(&sub, digits, D * nt, acc);
            fix_combine_job j = {acc, S, w->w_scale + o0, y + (size_t)t0 * w->out + o0, (size_t)w->out, nt, sub.out};
            g4_pool_for(sub.out, 64, 8.0 * nt * sub.out, fix_combine, &j);
        }
    }
    free(digits);
    free(acc);
}

/* ---- greedy decoding's argmax over a softcapped float x codes product ---- */

/* A coarse image of the activation row fixes each output's integer dot N to within a known
 * distance. X is the row's fixed-point image (the digit rows' value) and the coarse image is one
 * of two (g4_codes_f32_argmax's `coarse`):
 *   1: one int8 row q = clamp(round(X / 2^u)), u the shift with the smallest sum|r| (a large
 *      outlier may be clamped when that buys a finer step for every other element);
 *   2: the two top digit rows, d1 * 2^8 + d2 * 2^16, leaving the low digit as r.
 * Either leaves an exact remainder r, so N = N' + sum(c * r) with N' the coarse image's dot. With
 * codes c in [-lo, hi], P the sum of the positive remainders and Q that of the negative ones'
 * sizes, sum(c * r) lies in [-(lo P + hi Q), hi P + lo Q]. Every rounding step of fix_result is
 * monotone in N (the scale being positive), so the output lies between f at those two ends of N.
 * An output whose upper end lies below the largest lower end M cannot be the largest, and the few
 * that can are finished exactly from all digit rows. The softcap is monotone too (g4_tanhf is
 * non-decreasing, checked over every float in tests/test_tanh_monotone.c), so a row outside the
 * candidates ends at or below softcap(M); the answer stands when that is strictly below the best
 * candidate's value, which leaves no room for a tie with an earlier index. One int8 row costs the
 * matmul half the work of two digit rows and reads the same weight bytes, but one large outlier
 * in the row can widen its bounds past any use; the two digit rows' bounds stay tight. */
#define ARGMAX_BLOCK 1024
#define ARGMAX_MAX_CANDIDATES 4096
_Static_assert(G4_FIX_DIGITS == 3, "coarse image 2 is digit rows 1 and 2 over digit row 0");

typedef struct {
    const int32_t *acc; /* [nt * R][no]: dots with the coarse rows, for outputs [o_base, o_base + no) */
    const float *w_scale;
    const double *two_neg_s, *coef; /* coef[t * 2 + r]: the weight of coarse row r of activation row t */
    const int64_t *E; /* [nt][2]: how far sum(c * r) may lie above and below zero */
    int nt, R, no, o_base, V, nblk;
    float *ub;           /* [nt][V] upper ends */
    float *lb;           /* [V] lower ends (one row), or NULL */
    float *blk_lo, *blk_hi; /* [nt][nblk] largest lower / upper end per block (NaN: a bad scale) */
} argmax_bound_job;

/* Output o's coarse dot N' (exact in double: integers below 2^53). */
static inline double coarse_dot(const int32_t *a0, const int32_t *a1, double c0, double c1, int o) {
    return a1 ? (double)a0[o] * c0 + (double)a1[o] * c1 : (double)a0[o] * c0;
}

/* ub[o] = the upper end of output o, f(N' + E) (or its lower end, with E below zero).
 * Elementwise and exactly rounded, so vectorizing changes no bit. */
G4_VECTORIZE static void argmax_upper_ends(const int32_t *a0, const int32_t *a1, double c0, double c1, const float *ws, double E,
                                        double two_neg_s, float *ub, int o0, int o1) {
    /* one loop per image, so that each vectorizes without a test per element */
    if (a1)
        for (int o = o0; o < o1; o++) ub[o] = fix_result(coarse_dot(a0, a1, c0, c1, o) + E, two_neg_s, ws[o]);
    else
        for (int o = o0; o < o1; o++) ub[o] = fix_result(coarse_dot(a0, NULL, c0, 0, o) + E, two_neg_s, ws[o]);
}

static void argmax_bounds(void *ctx, int b0, int b1) {
    const argmax_bound_job *j = ctx;
    const int no = j->no;
    const float *ws = j->w_scale + j->o_base;
    for (int t = 0; t < j->nt; t++) {
        const int32_t *a0 = j->acc + (size_t)t * j->R * no, *a1 = j->R == 2 ? a0 + no : NULL;
        const double c0 = j->coef[2 * t], c1 = j->coef[2 * t + 1];
        const double E_hi = (double)j->E[2 * t], E_lo = (double)j->E[2 * t + 1], two_neg_s = j->two_neg_s[t];
        float *ub = j->ub + (size_t)t * j->V + j->o_base;
        for (int b = b0; b < b1; b++) {
            int o0 = b * ARGMAX_BLOCK, o1 = o0 + ARGMAX_BLOCK < no ? o0 + ARGMAX_BLOCK : no, bad = 0;
            float hi_max = -INFINITY;
            int top = o0;
            argmax_upper_ends(a0, a1, c0, c1, ws, E_hi, two_neg_s, ub, o0, o1);
            if (j->lb) argmax_upper_ends(a0, a1, c0, c1, ws, -E_lo, two_neg_s, j->lb + j->o_base, o0, o1);
            for (int o = o0; o < o1; o++) {
                bad |= !(ws[o] > 0 && ws[o] <= FLT_MAX);
                if (ub[o] > hi_max) hi_max = ub[o], top = o;
            }
            /* any output's lower end bounds the largest value from below; the one with the
             * highest upper end gives nearly the best bound at the cost of one */
            float lo_max = fix_result(coarse_dot(a0, a1, c0, c1, top) - E_lo, two_neg_s, ws[top]);
            size_t at = (size_t)t * j->nblk + (size_t)(j->o_base / ARGMAX_BLOCK + b);
            j->blk_lo[at] = bad ? NAN : lo_max;
            j->blk_hi[at] = bad ? NAN : hi_max;
        }
    }
}

/* X rounded to a multiple of 2^u (half up), divided by 2^u and clamped to int8; exact integers. */
static int8_t coarse_code(int32_t X, int u) {
    int64_t t = (int64_t)X + (u ? (int64_t)1 << (u - 1) : 0);
    int64_t q = t >= 0 ? t >> u : -((-t + ((int64_t)1 << u) - 1) >> u); /* floor(t / 2^u) */
    return (int8_t)(q > 127 ? 127 : q < -128 ? -128 : q);
}

/* X less its coarse code's value at shift u: the remainder r (exact). */
static int64_t coarse_remainder(int32_t X, int u) { return (int64_t)X - (int64_t)coarse_code(X, u) * ((int64_t)1 << u); }

/* The sums of the positive remainders (*up) and of the negative remainders' sizes (*down). */
static void remainder_sums(int64_t r, int64_t *up, int64_t *down) {
    if (r > 0) *up += r;
    else *down -= r;
}

/* The coarse row q of a row's fixed-point image X (see above), its shift *u, and its remainder
 * sums. */
static void argmax_coarse_row(const int32_t *X, int in, int8_t *q, int *u, int64_t *up, int64_t *down) {
    int32_t mx = 0;
    for (int i = 0; i < in; i++) {
        int32_t a = X[i] < 0 ? -X[i] : X[i];
        if (a > mx) mx = a;
    }
    int top = 0; /* the smallest shift that clamps nothing */
    while ((mx >> top) > 127) top++;
    int64_t best = -1;
    for (int cand = top > 8 ? top - 8 : 0; cand <= top; cand++) {
        int64_t sum = 0;
        for (int i = 0; i < in; i++) {
            int64_t r = coarse_remainder(X[i], cand);
            sum += r < 0 ? -r : r;
        }
        if (best < 0 || sum < best) best = sum, *u = cand;
    }
    *up = *down = 0;
    for (int i = 0; i < in; i++) {
        q[i] = coarse_code(X[i], *u);
        remainder_sums(coarse_remainder(X[i], *u), up, down);
    }
}

/* y softcapped as the levels' softcap does it (none when cap == 0). */
static float argmax_softcap(float y, float cap) {
    if (cap > 0) g4_ref_softcap(&y, 1, cap);
    return y;
}

/* vals[c] = the softcapped output cand[c], exactly as g4_matmul_codes_f32 and the softcap give
 * it: the candidates' rows side by side through the same exact integer dots. -1: out of memory. */
static int exact_values(const g4_qweight *w, const int8_t *digits, double two_neg_s, float cap, const int32_t *cand, int nc,
                        g4_matmul_i8_fn matmul_i8, float *vals) {
    uint8_t *rows = malloc(w->row_bytes * (size_t)nc);
    int32_t *acc = malloc(sizeof *acc * (size_t)G4_FIX_DIGITS * (size_t)nc);
    float *scale = malloc(sizeof *scale * (size_t)nc);
    int rc = rows && acc && scale ? 0 : -1;
    if (rc == 0) {
        for (int c = 0; c < nc; c++) {
            memcpy(rows + (size_t)c * w->row_bytes, w->w + (size_t)cand[c] * w->row_bytes, w->row_bytes);
            scale[c] = w->w_scale[cand[c]];
        }
        g4_qweight sub = {.bits = w->bits, .in = w->in, .out = nc, .row_bytes = w->row_bytes, .w = rows, .w_scale = scale};
        matmul_i8(&sub, digits, G4_FIX_DIGITS, acc);
        for (int c = 0; c < nc; c++) {
            int64_t dot = 0;
            for (int p = G4_FIX_DIGITS - 1; p >= 0; p--) dot = dot * 256 + acc[(size_t)p * nc + c];
            vals[c] = argmax_softcap(fix_result((double)dot, two_neg_s, scale[c]), cap);
        }
    }
    free(rows);
    free(acc);
    free(scale);
    return rc;
}

/* The answer for row t from its bounds, or -1. digits: the row's G4_FIX_DIGITS digit rows. */
static int32_t argmax_finish(const g4_qweight *w, const int8_t *digits, double two_neg_s, float cap, const float *ub,
                             const float *blk_lo, const float *blk_hi, int nblk, g4_matmul_i8_fn matmul_i8) {
    float M = -INFINITY;
    for (int b = 0; b < nblk; b++) {
        if (isnan(blk_lo[b])) return -1;
        if (blk_lo[b] > M) M = blk_lo[b];
    }
    int32_t *cand = malloc(sizeof *cand * ARGMAX_MAX_CANDIDATES);
    int nc = 0;
    for (int b = 0; cand && b < nblk && nc >= 0; b++) {
        if (!(blk_hi[b] >= M)) continue;
        int o1 = (b + 1) * ARGMAX_BLOCK < w->out ? (b + 1) * ARGMAX_BLOCK : w->out;
        for (int o = b * ARGMAX_BLOCK; o < o1; o++) {
            if (!(ub[o] >= M)) continue;
            if (nc == ARGMAX_MAX_CANDIDATES) {
                nc = -1; /* too close a race to settle cheaply */
                break;
            }
            cand[nc++] = o;
        }
    }
    float *vals = cand && nc > 0 ? malloc(sizeof *vals * (size_t)nc) : NULL;
    int32_t best = -1;
    if (vals && exact_values(w, digits, two_neg_s, cap, cand, nc, matmul_i8, vals) == 0) {
        float best_v = 0;
        for (int c = 0; c < nc; c++)
            if (best < 0 || vals[c] > best_v) best = cand[c], best_v = vals[c];
        if (best >= 0 && !(argmax_softcap(M, cap) < best_v)) best = -1;
    }
    free(cand);
    free(vals);
    return best;
}

/* The call's buffers, carved out of one block (64-byte aligned pieces). */
typedef struct {
    int rows, chunk; /* activation rows per pass; outputs per matmul call */
    int8_t *digits, *coarse;
    int32_t *image; /* one row's fixed-point image */
    int32_t *acc;
    float *ub, *blk;
    float *lb; /* one row's lower ends (g4_codes_f32_top) */
} argmax_bufs;

static size_t argmax_layout(const g4_qweight *w, int n, uint8_t *base, argmax_bufs *b) {
    int rows = n < FIX_ROWS ? n : FIX_ROWS, nblk = (w->out + ARGMAX_BLOCK - 1) / ARGMAX_BLOCK;
    int chunk = FIX_ACC / (2 * rows) / ARGMAX_BLOCK * ARGMAX_BLOCK; /* room for two coarse rows */
    if (chunk < ARGMAX_BLOCK) chunk = ARGMAX_BLOCK;
    size_t sizes[7] = {(size_t)G4_FIX_DIGITS * rows * (size_t)w->in, (size_t)2 * rows * (size_t)w->in, sizeof(int32_t) * (size_t)w->in,
                       sizeof(int32_t) * 2 * rows * (size_t)chunk, sizeof(float) * rows * (size_t)w->out,
                       sizeof(float) * 2 * rows * (size_t)nblk, sizeof(float) * (size_t)w->out};
    void *ptr[7];
    size_t at = 0;
    for (int i = 0; i < 7; i++) {
        ptr[i] = base ? base + at : NULL;
        at += (sizes[i] + 63) & ~(size_t)63;
    }
    *b = (argmax_bufs){rows, chunk, ptr[0], ptr[1], ptr[2], ptr[3], ptr[4], ptr[5], ptr[6]};
    return at;
}

size_t g4_codes_f32_argmax_scratch(const g4_qweight *w, int n) {
    argmax_bufs b;
    return n > 0 && w->out > 0 && w->in > 0 ? argmax_layout(w, n, NULL, &b) + 64 : 0;
}

/* Rows [t0, t0 + nt) of x: their digit rows, coarse images and bounds (ub, blk, and lb when
 * given, for one row). 0 when a row holds a NaN or an infinity (g4_argmax's rules then apply,
 * so the group is handed back). */
static int bounds_pass(const g4_qweight *w, const float *x, int t0, int nt, int R, g4_matmul_i8_fn matmul_i8, const argmax_bufs *b,
                       double two_neg_s[FIX_ROWS], float *lb) {
    const int D = G4_FIX_DIGITS, in = w->in, V = w->out, nblk = (V + ARGMAX_BLOCK - 1) / ARGMAX_BLOCK;
    const int64_t code_hi = ((int64_t)1 << (w->bits - 1)) - 1, code_lo = (int64_t)1 << (w->bits - 1); /* codes in [-code_lo, code_hi] */
    int64_t E[2 * FIX_ROWS];
    double coef[2 * FIX_ROWS];
    for (int t = 0; t < nt; t++) {
        int8_t *dt = b->digits + (size_t)t * D * in;
        int S = g4_fix_split_row(x + (size_t)(t0 + t) * in, in, dt), u = 0;
        if (S == INT32_MIN) return 0;
        two_neg_s[t] = ldexp(1.0, -S);
        int64_t up = 0, down = 0; /* sum of the positive remainders, and of the negative ones' sizes */
        int8_t *ct = b->coarse + (size_t)t * R * in;
        if (R == 1) {
            const float *xt = x + (size_t)(t0 + t) * in;
            const double two_s = ldexp(1.0, S);
            for (int i = 0; i < in; i++) b->image[i] = fix_value(xt[i], two_s); /* what the digit rows split */
            argmax_coarse_row(b->image, in, ct, &u, &up, &down);
            coef[2 * t] = ldexp(1.0, u), coef[2 * t + 1] = 0;
        } else {
            memcpy(ct, dt + in, (size_t)2 * in); /* digit rows 1 and 2; digit row 0 is the remainder */
            for (int i = 0; i < in; i++) remainder_sums(dt[i], &up, &down);
            coef[2 * t] = 256, coef[2 * t + 1] = 65536;
        }
        E[2 * t] = code_hi * up + code_lo * down;
        E[2 * t + 1] = code_lo * up + code_hi * down;
    }
    for (int o0 = 0; o0 < V; o0 += b->chunk) {
        g4_qweight sub = g4_qweight_rows(w, o0, V - o0 < b->chunk ? V - o0 : b->chunk);
        matmul_i8(&sub, b->coarse, R * nt, b->acc);
        argmax_bound_job j = {b->acc, w->w_scale, two_neg_s, coef, E, nt, R, sub.out, o0, V, nblk, b->ub, lb, b->blk, b->blk + (size_t)b->rows * nblk};
        g4_pool_for((sub.out + ARGMAX_BLOCK - 1) / ARGMAX_BLOCK, 1, 8.0 * nt * sub.out, argmax_bounds, &j);
    }
    return 1;
}

static int valid_call(const g4_qweight *w, float cap, int coarse) {
    return w->out > 0 && w->in > 0 && (w->bits == 2 || w->bits == 4 || w->bits == 8) && cap >= 0 && cap <= FLT_MAX &&
           (coarse == 1 || coarse == 2);
}

void g4_codes_f32_argmax(const g4_qweight *w, const float *x, int n, float cap, int coarse, g4_matmul_i8_fn matmul_i8,
                         int32_t *out, void *scratch) {
    for (int t = 0; t < n; t++) out[t] = -1;
    if (n <= 0 || !valid_call(w, cap, coarse)) return;
    const int D = G4_FIX_DIGITS, in = w->in, V = w->out, nblk = (V + ARGMAX_BLOCK - 1) / ARGMAX_BLOCK;
    void *own = scratch ? NULL : malloc(g4_codes_f32_argmax_scratch(w, n));
    uint8_t *base = scratch ? scratch : own;
    if (!base) return;
    argmax_bufs b;
    argmax_layout(w, n, (uint8_t *)(((uintptr_t)base + 63) & ~(uintptr_t)63), &b);
    const int rows = b.rows;
    for (int t0 = 0; t0 < n; t0 += rows) {
        int nt = n - t0 < rows ? n - t0 : rows;
        double two_neg_s[FIX_ROWS];
        if (!bounds_pass(w, x, t0, nt, coarse, matmul_i8, &b, two_neg_s, NULL)) continue;
        for (int t = 0; t < nt; t++)
            out[t0 + t] = argmax_finish(w, b.digits + (size_t)t * D * in, two_neg_s[t], cap, b.ub + (size_t)t * V,
                                        b.blk + (size_t)t * nblk, b.blk + (size_t)rows * nblk + (size_t)t * nblk, nblk, matmul_i8);
    }
    free(own);
}

static int by_value_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y;
}

/* The k-th largest of v[0, n) (1 <= k <= n, no NaN); reorders v. */
static float kth_largest(float *v, int n, int k) {
    g4_select_first(v, (size_t)n, sizeof *v, (size_t)k, by_value_desc);
    return v[k - 1];
}

/* The k-th largest of lb[0, n) (reordering lb). Each block's lower bound blk_lo[b] is lb of one
 * of its outputs, so the k-th largest of those nblk values is a value at least k outputs reach:
 * only the lower ends at or above it can be among the k largest, and the selection runs on them
 * alone (a few hundred instead of every output). */
static float kth_largest_lower_end(float *lb, int n, const float *blk_lo, int nblk, int k) {
    if (k > nblk) return kth_largest(lb, n, k);
    float *heads = malloc(sizeof *heads * (size_t)nblk);
    if (!heads) return kth_largest(lb, n, k);
    memcpy(heads, blk_lo, sizeof *heads * (size_t)nblk);
    float floor_k = kth_largest(heads, nblk, k);
    free(heads);
    int m = 0;
    for (int o = 0; o < n; o++)
        if (lb[o] >= floor_k) lb[m++] = lb[o];
    return kth_largest(lb, m, k);
}

/* Sampling's form of the shortcut above, for one row. The k largest lower ends give T, a value
 * the k-th largest output reaches; an output whose upper end lies below T cannot be among the k
 * largest, so the candidates are the outputs whose upper ends reach T, and the extra ids. */
int g4_codes_f32_top(const g4_qweight *w, const float *x, float cap, int k, const int32_t *extra, int n_extra, int coarse,
                     g4_matmul_i8_fn matmul_i8, int32_t *cand, float *vals, int max_cand, float *bound, void *scratch) {
    if (!valid_call(w, cap, coarse) || k < 1 || k > w->out || n_extra < 0) return -1;
    const int V = w->out, nblk = (V + ARGMAX_BLOCK - 1) / ARGMAX_BLOCK;
    void *own = scratch ? NULL : malloc(g4_codes_f32_argmax_scratch(w, 1));
    uint8_t *base = scratch ? scratch : own;
    if (!base) return -1;
    argmax_bufs b;
    argmax_layout(w, 1, (uint8_t *)(((uintptr_t)base + 63) & ~(uintptr_t)63), &b);
    double two_neg_s[FIX_ROWS];
    int nc = -1;
    if (bounds_pass(w, x, 0, 1, coarse, matmul_i8, &b, two_neg_s, b.lb)) {
        const float *blk_hi = b.blk + (size_t)b.rows * nblk;
        int bad = 0;
        for (int i = 0; i < nblk; i++) bad |= isnan(blk_hi[i]);
        float T = bad ? NAN : kth_largest_lower_end(b.lb, V, b.blk, nblk, k), rest = -INFINITY; /* rest: the largest upper end left out */
        nc = bad ? -1 : 0;
        for (int i = 0; i < nblk && nc >= 0; i++) {
            if (!(blk_hi[i] >= T)) {
                if (blk_hi[i] > rest) rest = blk_hi[i];
                continue;
            }
            int o1 = (i + 1) * ARGMAX_BLOCK < V ? (i + 1) * ARGMAX_BLOCK : V;
            for (int o = i * ARGMAX_BLOCK; o < o1; o++) {
                if (!(b.ub[o] >= T)) {
                    if (b.ub[o] > rest) rest = b.ub[o];
                    continue;
                }
                if (nc == max_cand) {
                    nc = -1; /* too many to finish cheaply */
                    break;
                }
                cand[nc++] = o;
            }
        }
        const int from_blocks = nc;
        for (int e = 0; e < n_extra && nc >= 0; e++) {
            int32_t id = extra[e];
            int dup = id < 0 || id >= V || b.ub[id] >= T; /* out of range, or a candidate already */
            for (int c = from_blocks; c < nc && !dup; c++) dup = cand[c] == id;
            if (dup) continue;
            if (nc == max_cand) nc = -1;
            else cand[nc++] = id;
        }
        if (nc > 0 && exact_values(w, b.digits, two_neg_s[0], cap, cand, nc, matmul_i8, vals) != 0) nc = -1;
        *bound = argmax_softcap(rest, cap);
    }
    free(own);
    return nc;
}

void g4_ref_matmul_f32(const g4_qweight *w, const float *x, int n, float *y) {
    if (w->bits != 16) {
        g4_matmul_codes_f32(w, x, n, y, g4_ref_matmul_i8);
        return;
    }
    for (int o = 0; o < w->out; o++) {
        const uint8_t *row = w->w + (size_t)o * w->row_bytes;
        for (int t = 0; t < n; t++) y[(size_t)t * w->out + o] = g4_ref_dot_bf16_f32(x + (size_t)t * w->in, row, w->in);
    }
}

void g4_ref_matmul_i8(const g4_qweight *w, const int8_t *x, int n, int32_t *acc) {
    for (int o = 0; o < w->out; o++) {
        const uint8_t *row = w->w + (size_t)o * w->row_bytes;
        for (int t = 0; t < n; t++)
            acc[(size_t)t * w->out + o] = g4_dot_packed(x + (size_t)t * w->in, 0, row, w->bits, (size_t)w->in);
    }
}

/* ---- elementwise and attention references ---- */

void g4_ref_quantize(const g4_quantizer *q, const float *x, size_t n, int8_t *codes) { g4_quantize_vec(q, x, n, codes); }

void g4_ref_fake_quant(const g4_quantizer *q, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = g4_fake_quantize(q, x[i]);
}

void g4_ref_requant_f32(const int32_t *acc, int n, int out, const float *m32, float s_out, float *y) {
    for (int t = 0; t < n; t++)
        for (int o = 0; o < out; o++) {
            size_t i = (size_t)t * out + o;
            y[i] = g4_dequantize(g4_requantize_f32(acc[i], m32[o]), s_out, 0);
        }
}

void g4_ref_acc_scale(const int32_t *acc, int n, int out, float s_in, const float *w_scale, float *y) {
    for (int t = 0; t < n; t++)
        for (int o = 0; o < out; o++) {
            size_t i = (size_t)t * out + o;
            y[i] = (float)acc[i] * (s_in * w_scale[o]);
        }
}

float g4_gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

float g4_tanhf(float z) {
    float a = fabsf(z), t;
    if (isnan(z)) return z;
    if (a >= 9.0f) {
        t = 1.0f;
    } else if (a < 0.625f) {
        float z2 = a * a, p = G4_TANH_Q4;
        p = p * z2 + G4_TANH_Q3;
        p = p * z2 - G4_TANH_Q2N;
        p = p * z2 + G4_TANH_Q1;
        p = p * z2 - G4_TANH_Q0N;
        t = ((p * z2) * a) + a;
    } else {
        t = 1.0f - 2.0f / (g4_expf(a + a) + 1.0f);
    }
    return copysignf(t, z);
}

float g4_expf(float x) {
    if (isnan(x)) return x;
    if (x < -104.0f) x = -104.0f;
    if (x > 89.0f) x = 89.0f;
    float fn = floorf(x * G4_EXP_LOG2E + 0.5f);
    float r = (x - fn * G4_EXP_LN2_HI) - fn * G4_EXP_LN2_LO;
    float p = G4_EXP_P5;
    p = p * r + G4_EXP_P4;
    p = p * r + G4_EXP_P3;
    p = p * r + G4_EXP_P2;
    p = p * r + G4_EXP_P1;
    p = p * r + G4_EXP_P0;
    float e = (p * (r * r) + r) + 1.0f;
    int n = (int)fn, n1 = (n < 0 ? n - 1 : n) / 2; /* floor(n / 2): both factors stay normal */
    uint32_t b1 = (uint32_t)(n1 + 127) << 23, b2 = (uint32_t)(n - n1 + 127) << 23;
    float f1, f2;
    memcpy(&f1, &b1, 4);
    memcpy(&f2, &b2, 4);
    return (e * f1) * f2;
}

void g4_ref_softcap(float *x, size_t n, float cap) {
    for (size_t i = 0; i < n; i++) x[i] = cap * g4_tanhf(x[i] / cap);
}

void g4_ref_gelu_mul(float *g, const float *m, size_t n) {
    for (size_t i = 0; i < n; i++) g[i] = g4_gelu_tanh(g[i]) * m[i];
}

/* The attention dots and sums use fused multiply-adds (one rounding per term): a vector level
 * does the same with its FMA instructions. */
static float dot_codes(const float *a, const int8_t *c, int n) {
    float acc[8] = {0};
    for (int i = 0; i < n; i++) acc[i & 7] = fmaf(a[i], (float)c[i], acc[i & 7]);
    return g4_reduce8(acc);
}

static float dot_f32(const float *a, const float *b, int n) {
    float acc[8] = {0};
    for (int i = 0; i < n; i++) acc[i & 7] = fmaf(a[i], b[i], acc[i & 7]);
    return g4_reduce8(acc);
}

/* Score of position j for head h of row t. */
static float attn_score(const g4_attn *a, const g4_attn_row *c, const float *q, int h, int j) {
    size_t row = (size_t)j * a->kv_width + (size_t)(h / a->group) * a->head_dim;
    return c->kq ? c->k_scale * dot_codes(q, c->kq + row, a->head_dim) : dot_f32(q, c->kf + row, a->head_dim);
}

void g4_ref_attention_head(const g4_attn *a, int t, int h, float *scores) {
    const g4_attn_row *c = &a->rows[t];
    int hd = a->head_dim, nh = a->n_heads, lo = c->lo, p = c->hi;
    const float *q = a->q + (size_t)t * nh * hd + (size_t)h * hd;
    size_t off = (size_t)(h / a->group) * hd;
    float mx = -INFINITY, acc[8] = {0};
    /* The softmax of kernels.h (g4_attn), step by step. Without a scores buffer (out of memory) every score is
     * computed again where it is needed: the same function of the same inputs, so the same
     * values. */
    for (int j = lo; j <= p; j++) {
        float sc = attn_score(a, c, q, h, j);
        if (scores) scores[j - lo] = sc;
        if (sc > mx) mx = sc;
    }
    for (int j = lo; j <= p; j++) {
        float e = g4_expf((scores ? scores[j - lo] : attn_score(a, c, q, h, j)) - mx);
        if (scores) scores[j - lo] = e;
        acc[(j - lo) & 7] += e;
    }
    float sum = g4_reduce8(acc);
    float *out = a->out + (size_t)t * nh * hd + (size_t)h * hd;
    memset(out, 0, sizeof *out * (size_t)hd);
    for (int j = lo; j <= p; j++) {
        float w = (scores ? scores[j - lo] : g4_expf(attn_score(a, c, q, h, j) - mx)) / sum;
        size_t row = (size_t)j * a->kv_width + off;
        if (c->vq)
            for (int d = 0; d < hd; d++) out[d] = fmaf(w, (float)c->vq[row + d], out[d]);
        else
            for (int d = 0; d < hd; d++) out[d] = fmaf(w, c->vf[row + d], out[d]);
    }
    if (c->vq)
        for (int d = 0; d < hd; d++) out[d] *= c->v_scale;
}

void g4_ref_attention(const g4_attn *a) {
    int most = 1;
    for (int t = 0; t < a->n; t++)
        if (a->rows[t].hi - a->rows[t].lo + 1 > most) most = a->rows[t].hi - a->rows[t].lo + 1;
    float *scores = malloc(sizeof *scores * (size_t)most); /* NULL: the head recomputes */
    for (int t = 0; t < a->n; t++)
        for (int h = 0; h < a->n_heads; h++) g4_ref_attention_head(a, t, h, scores);
    free(scores);
}
