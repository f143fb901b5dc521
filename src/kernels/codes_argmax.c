/* Greedy decoding's and sampling's lm_head (kernels.h: g4_codes_f32_argmax, g4_codes_f32_top):
 * the largest outputs of a softcapped float x codes product found from bounds, most outputs
 * never finished. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codes_f32.h"
#include "kernels.h"
#include "pool.h"
#include "util/select.h"

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
