/* Compute kernels. Each operation has one portable reference implementation (kernels/ref.c);
 * the levels (kernels/levels.h: AVX-512 VNNI, AVX-VNNI, AVX2, NEON, portable) sit behind the
 * g4_kernels table and are tested against the reference. Float reductions use a fixed 8-lane
 * order so a vector kernel can reproduce the reference bit for bit (no reassociation: a 1-ulp
 * change can flip an int8 rounding downstream).
 *
 * Every dispatched matmul splits its output rows across a persistent thread pool (kernels/pool.c).
 * Each output element is computed by exactly one thread in the reference order, so results do
 * not depend on the thread count or on the dispatch level. */
#ifndef G4_KERNELS_H
#define G4_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "quant/int8.h"

/* Asks GCC to vectorize a function's loops in portable code (SSE2 / NEON lanes) where -O2 alone
 * would not. Vectorizing never reassociates floating-point operations (no -ffast-math), so it
 * changes no bit: for loops that compute each element on its own or keep explicit lanes. */
#if defined(__GNUC__) && !defined(__clang__)
#define G4_VECTORIZE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define G4_VECTORIZE
#endif

/* How a weight's elements are stored: packed signed codes of 2, 4 or 8 bits (with scales), or
 * BF16 values (no scales). Each value is the element's width in bits, so packing arithmetic can
 * use it as one (the structs keep it in an int: the enum has no negative value, so GCC makes it
 * unsigned, and every width comparison would mix signedness). */
typedef enum { G4_WT_Q2 = 2, G4_WT_Q4 = 4, G4_WT_Q8 = 8, G4_WT_BF16 = 16 } g4_wtype;

struct g4_kernels;

/* A kernel level's own copy of a weight, in the layout its matmul reads best: the per-level
 * weight-preparation hook (g4_kernels.prepare; llama.cpp's "extra buffer types"). Made once per
 * weight when the model binds it, for the level chosen then, and freed with the model. The stored
 * codes stay where they are: the other levels, single-row decode (which the level may hand to a
 * vector kernel), the embedding lookup and any view that is not whole groups of the copy read
 * them, so the copy is extra memory (the level's README section says how much). */
typedef struct {
    const struct g4_kernels *level; /* the level that made it, the only one that reads it */
    const uint8_t *codes;           /* the stored codes it was made from (the whole weight's w) */
    int bits, in, out, block;       /* the whole weight's */
    size_t row_bytes;
    size_t bytes;  /* of data */
    uint8_t *data; /* the level's layout, 64-byte aligned */
} g4_wprep;

/* A weight matrix [out, in] as stored: packed 2/4/8-bit codes with one f32 scale per output row
 * (block == 0) or one per block of `block` inputs (block > 0, in a multiple of it: w_scale[o *
 * in / block + b] scales inputs [b * block, (b + 1) * block) of row o; llama.cpp's Q4_0 and Q8_0
 * layouts, block 32), or BF16 values (bits == G4_WT_BF16, no scales). */
typedef struct {
    int bits; /* a g4_wtype */
    int in, out;
    int block;
    size_t row_bytes;
    const uint8_t *w;
    const float *w_scale;
    /* A level's prepared copy of the whole weight this is (rows of), or NULL. A view of rows
     * (g4_qweight_rows) keeps it: the level finds the view's rows in it from w (g4_wprep_row0),
     * and a weight whose codes were copied elsewhere (w no longer inside prep->codes) is not
     * rows of it, so its copy is not read. */
    const g4_wprep *prep;
} g4_qweight;

/* Scales per output row: 1, or in / block for a block-scaled weight. */
static inline int g4_qweight_row_scales(const g4_qweight *w) { return w->block > 0 ? w->in / w->block : 1; }

/* Rows [o0, o0 + n) of w as a weight of their own (a view: nothing is copied). */
static inline g4_qweight g4_qweight_rows(const g4_qweight *w, int o0, int n) {
    g4_qweight sub = *w;
    sub.out = n;
    sub.w = w->w + (size_t)o0 * w->row_bytes;
    if (w->w_scale) sub.w_scale = w->w_scale + (size_t)o0 * (size_t)g4_qweight_row_scales(w);
    return sub;
}

/* Sum of x[i] * bf16[i] over one BF16 row (little-endian, possibly unaligned), in the fixed 8-lane
 * order. */
float g4_ref_dot_bf16_f32(const float *x, const uint8_t *row, int n);

/* Float activations against packed 2/4/8-bit codes (the lm_head, and every linear with --act
 * float) are not summed in float. Each activation row is first written as a fixed-point image
 * with 22-23 significant bits at the row's largest element, x[i] ~= X[i] * 2^-S,
 * |X[i]| <= 2^G4_FIX_BITS (round half to even), split into G4_FIX_DIGITS balanced int8 digit
 * rows, X = sum_p 256^p d_p. The digit rows' dot products are exact int32 sums (each level's
 * int8 matmul), combined exactly in int64:
 *   y[t][o] = w_scale[o] * (float)(2^-S * sum_p 256^p sum_i d_p[i] * code[o][i]).
 * The only loss is the image's half step per element (2^-S-1, at most max|x| * 2^-22), checked
 * against a long double dot in tests/test_kernels.c; no summation order enters, so every level
 * gives the same bits, and the int8 kernels run it at about 1.7x the speed of f32 dots. A row
 * holding a NaN or an infinity gives NaN for every output. */
#define G4_FIX_DIGITS 3
/* log2 of the fixed-point bound: |X| <= 2^G4_FIX_BITS keeps the top digit within +-65 */
#define G4_FIX_BITS (8 * G4_FIX_DIGITS - 2)

/* The digit rows of one activation row: digits[p * in + i] for p < G4_FIX_DIGITS; returns S, or
 * INT32_MIN when x holds a NaN or an infinity. */
int g4_fix_split_row(const float *x, int in, int8_t *digits);

typedef void (*g4_matmul_i8_fn)(const g4_qweight *w, const int8_t *x, int n, int32_t *acc);
/* y[t][o] for float x against packed codes as described above, the integer dots computed by
 * matmul_i8 (any level's: they are exact, so every level gives the same bits). */
void g4_matmul_codes_f32(const g4_qweight *w, const float *x, int n, float *y, g4_matmul_i8_fn matmul_i8);

/* Greedy decoding's lm_head: out[t] = the index g4_argmax picks in softcap(g4_matmul_codes_f32(w,
 * x[t])) (softcap(y) = cap * g4_tanhf(y / cap), none when cap == 0), found from a coarse image of
 * x[t] that bounds every output and exact dots for the few outputs those bounds leave in the race,
 * so most outputs are never finished. coarse: 1, one int8 row (half the work of 2, but a large
 * outlier in x loosens its bounds), or 2, the two top digit rows (kernels/codes_argmax.c). out[t] = -1
 * where it cannot decide that way (a NaN in x, a scale that is not positive and finite, a near
 * tie, too many candidates, out of memory): the caller then computes that row in full. scratch:
 * g4_codes_f32_argmax_scratch(w, n) bytes kept by the caller (about 1 MB per row for E2B's
 * lm_head, so that decode does not map and clear them every token), or NULL. */
size_t g4_codes_f32_argmax_scratch(const g4_qweight *w, int n);
void g4_codes_f32_argmax(const g4_qweight *w, const float *x, int n, float cap, int coarse, g4_matmul_i8_fn matmul_i8,
                         int32_t *out, void *scratch);

/* Sampling's lm_head, for one row x: what a top-k sampler needs of softcap(g4_matmul_codes_f32(w,
 * x)) without most of the outputs. Returns the number of candidates m: cand[0, m) holds every
 * output among the k largest (k in [1, out]) and every valid id of extra[0, n_extra), vals[c]
 * the exact softcapped value of output cand[c] (bit for bit the full path's), and *bound a value
 * no other output exceeds. -1 where it cannot tell that way (as for the argmax above, or more
 * than max_cand candidates). scratch: g4_codes_f32_argmax_scratch(w, 1) bytes, or NULL. */
int g4_codes_f32_top(const g4_qweight *w, const float *x, float cap, int k, const int32_t *extra, int n_extra, int coarse,
                     g4_matmul_i8_fn matmul_i8, int32_t *cand, float *vals, int max_cand, float *bound, void *scratch);

/* Float activations against block-scaled codes (w->block > 0): the same fixed-point image X of
 * each row, X[i] = x[i] * 2^S (above), and for each output an exact integer dot per block,
 * D_b = sum over the block's inputs of X[i] * code[o][i] (int64), combined in double in block
 * order, one product and one sum rounding per block:
 *   acc = 0;  acc = acc + (double)w_scale[o][b] * (double)D_b  for b = 0, 1, ...;
 *   y[t][o] = (float)(acc * 2^-S).
 * A level may compute the D_b any way it likes (they are exact integers) but must combine them
 * in that order, so every level gives the same bits. A row holding a NaN or an infinity gives
 * NaN. */
void g4_ref_matmul_blocks_f32(const g4_qweight *w, const float *x, int n, float *y);

/* y[t][o] = w_scale[o] * dot(x[t], codes[o]) (fixed point, above), the block-scaled form above,
 * or the BF16 dot, for t < n. */
void g4_ref_matmul_f32(const g4_qweight *w, const float *x, int n, float *y);

/* acc[t][o] = sum_i x[t][i] * code[o][i] in int32 for t < n: int8 activation codes against packed
 * 2/4/8-bit weight codes (the int-mode linear before requantization). */
void g4_ref_matmul_i8(const g4_qweight *w, const int8_t *x, int n, int32_t *acc);

/* The fixed 8-lane reduction used by every float dot product. */
static inline float g4_reduce8(const float a[8]) {
    float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    return (s0 + s2) + (s1 + s3);
}

/* ---- elementwise and attention operations of the forward pass ---- */

/* One query row's view of its sequence's K/V cache: int8 codes with their scales (kq/vq), or f32
 * rows (kf/vf) where kq/vq is NULL; rows are kv_width apart. It attends to positions [lo, hi]. */
typedef struct {
    const int8_t *kq, *vq;
    const float *kf, *vf;
    float k_scale, v_scale;
    int lo, hi;
} g4_attn_row;

/* Causal softmax attention (scale 1) of n query rows [n][n_heads * head_dim] into out (same shape);
 * head h reads KV head h / group, at offset (h / group) * head_dim of each cache row. Per head:
 * score_j = k_scale * dot(q, k_j) (int8) or dot(q, k_j) (f32), the dot in the fixed 8-lane order
 * with fused multiply-adds (acc[i & 7] = fmaf(q[i], k[i], acc[i & 7])); m = max score (a NaN
 * never wins); e_j = g4_expf(score_j - m); sum = g4_reduce8 of 8 lanes, lane (j - lo) mod 8
 * summing its e_j in order (so a vector level keeps the order); out[d] = +0, then
 * out[d] = fmaf(e_j / sum, v_j[d], out[d]) for j = lo .. hi in order; then out[d] *= v_scale
 * (int8 V). */
typedef struct {
    int n, n_heads, head_dim, kv_width, group;
    const float *q;
    float *out;
    const g4_attn_row *rows; /* [n] */
} g4_attn;

/* References of the operations below (kernels/ref.c); the portable level runs them, split over
 * the pool where they are independent per output. */
void g4_ref_quantize(const g4_quantizer *q, const float *x, size_t n, int8_t *codes);
void g4_ref_fake_quant(const g4_quantizer *q, float *x, size_t n);
void g4_ref_requant_f32(const int32_t *acc, int n, int out, const float *m32, float s_out, float *y);
void g4_ref_acc_scale(const int32_t *acc, int n, int out, float s_in, const float *w_scale, float *y);
void g4_ref_gelu_mul(float *g, const float *m, size_t n);
void g4_ref_attention(const g4_attn *a);
/* One head of one row; `scores` holds hi - lo + 1 floats, or is NULL (out of memory: each score is
 * then computed again where it is needed, which gives the same values). */
void g4_ref_attention_head(const g4_attn *a, int t, int h, float *scores);

/* gelu_pytorch_tanh: 0.5 x (1 + tanhf(0.7978845608028654 (x + 0.044715 x^3))) in f32. */
float g4_gelu_tanh(float x);

/* tanh in f32 from + - * / only (no libm, no FMA), so a vector level can give the same bits:
 * z + z^3 P(z^2) below |z| = 0.625 (the Cephes tanhf polynomial), 1 - 2 / (g4_expf(2|z|) + 1)
 * above it (a Cephes-style expf: range reduction by ln 2 in two parts, degree-5 polynomial), +-1
 * from |z| = 9 on (tanh(9) rounds to 1 in f32), NaN for NaN. Within 2 ulp of tanh
 * (tests/test_kernels.c). */
float g4_tanhf(float z);
/* Its constants, shared by every level: z + z^3 (((Q4 z^2 + Q3) z^2 - Q2N) z^2 + Q1) z^2 - Q0N) for
 * |z| < 0.625 (Cephes tanhf), and e^x = 2^n (1 + r + r^2 (P0 + P1 r + ... + P5 r^5)) with
 * n = floor(x LOG2E + 1/2), r = (x - n LN2_HI) - n LN2_LO (Cephes expf, g4_expf). */
#define G4_TANH_Q4 -5.70498872745e-3f
#define G4_TANH_Q3 2.06390887954e-2f
#define G4_TANH_Q2N 5.37397155531e-2f
#define G4_TANH_Q1 1.33314422036e-1f
#define G4_TANH_Q0N 3.33332819422e-1f
#define G4_EXP_P5 1.9875691500e-4f
#define G4_EXP_P4 1.3981999507e-3f
#define G4_EXP_P3 8.3334519073e-3f
#define G4_EXP_P2 4.1665795894e-2f
#define G4_EXP_P1 1.6666665459e-1f
#define G4_EXP_P0 5.0000001201e-1f
#define G4_EXP_LOG2E 1.44269504088896341f
#define G4_EXP_LN2_HI 0.693359375f
#define G4_EXP_LN2_LO -2.12194440e-4f

/* e^x in f32 from + - * and floor only, so a vector level can give the same bits: x held to
 * [-104, 89] (NaN stays NaN), n = floor(x LOG2E + 1/2), r = (x - n LN2_HI) - n LN2_LO, e^r from
 * the polynomial above (as g4_tanhf's exp), times 2^floor(n/2) and then 2^(n - floor(n/2)): both
 * factors are normal, so a result below FLT_MIN is rounded once, as a subnormal. 0 below about
 * -103.3, +inf above about 88.7. Within 1 ulp of expf (tests/test_kernels.c). */
float g4_expf(float x);
/* x[i] = cap * g4_tanhf(x[i] / cap): the final logit softcap. */
void g4_ref_softcap(float *x, size_t n, float cap);

/* One kernel level: its name (as G4_DISPATCH names it), what it needs of the CPU, and its
 * operations. Every level's file defines one (levels.h lists them, best first). */
typedef struct g4_kernels {
    const char *name;
    /* The CPU features the level needs, space-separated under the names the kernel reports
     * (/proc/cpuinfo's flags on x86, HWCAP's on aarch64; "" for none): the tests check the probe
     * below against them, read independently of it. */
    const char *cpu_needs;
    /* Whether this build compiles the level at all (it is for the architecture being built); a
     * level that is not built has no operations. */
    int built;
    /* Whether this CPU and its OS can run the level (asked only when it is built); NULL: any CPU
     * this build runs on. */
    int (*supported)(void);
    void (*matmul_f32)(const g4_qweight *w, const float *x, int n, float *y);
    void (*matmul_i8)(const g4_qweight *w, const int8_t *x, int n, int32_t *acc);
    /* codes[i] = g4_quantize(q, x[i]) */
    void (*quantize)(const g4_quantizer *q, const float *x, size_t n, int8_t *codes);
    /* x[i] = g4_fake_quantize(q, x[i]) */
    void (*fake_quant)(const g4_quantizer *q, float *x, size_t n);
    /* y[t][o] = g4_dequantize(g4_requantize_f32(acc[t][o], m32[o]), s_out, 0) for t < n, o < out */
    void (*requant_f32)(const int32_t *acc, int n, int out, const float *m32, float s_out, float *y);
    /* y[t][o] = (float)acc[t][o] * (s_in * w_scale[o]) */
    void (*acc_scale)(const int32_t *acc, int n, int out, float s_in, const float *w_scale, float *y);
    /* g[i] = g4_gelu_tanh(g[i]) * m[i]. `scale` may name the step of g's values (g[i] ==
     * (float)c * scale for an int8 c, as a dequantized linear output has; 0: unknown): the result
     * is the same either way, but a level may then reuse one gelu per code. */
    void (*gelu_mul)(float *g, const float *m, size_t n, float scale);
    void (*attention)(const g4_attn *a);
    /* x[i] = cap * g4_tanhf(x[i] / cap) */
    void (*softcap)(float *x, size_t n, float cap);
    /* The weight-preparation hook (g4_wprep above); NULL for a level that reads the stored layout,
     * so that nothing is made for it. Returns w's copy in the level's layout (level = this one,
     * made with g4_wprep_new), or NULL where the level takes none for this weight (a format it
     * does not run from a copy) or memory is short: its matmuls then read the stored codes, with
     * the same bits. */
    g4_wprep *(*prepare)(const g4_qweight *w);
} g4_kernels;

/* A g4_wprep of `bytes` of data (64-byte aligned, uninitialized) for the whole weight w, made
 * by `level`; NULL when memory is short. g4_wprep_free frees it (NULL is fine). */
g4_wprep *g4_wprep_new(const g4_kernels *level, const g4_qweight *w, size_t bytes);
void g4_wprep_free(g4_wprep *p);

/* The first row of view w in the copy `level` made of its weight, or -1 when w has no such copy:
 * none, another level's, or w not rows of the weight it was made from (other codes, another
 * shape, rows past its end). Only level's own matmuls call it with level, so a level forced by
 * G4_DISPATCH never reads another level's layout. */
long g4_wprep_row0(const g4_qweight *w, const g4_kernels *level);

/* Every level, best first, whether this build and CPU have it or not (kernels/levels.h holds the
 * one list): g4_kernels_at(i) for i < g4_kernels_count(). Tests and benchmarks iterate it to
 * compare the levels in one process. */
int g4_kernels_count(void);
const g4_kernels *g4_kernels_at(int i);

/* Whether this build and CPU can run level k. */
int g4_kernels_available(const g4_kernels *k);

/* The kernel set chosen for this CPU: the best available level, or the one forced by
 * G4_DISPATCH=NAME (an unknown or unavailable name falls back to the best level with a one-line
 * warning, through g4_set_log's function). */
const g4_kernels *g4_kernels_get(void);

/* The level g4_kernels_get chooses when G4_DISPATCH is unset. */
const g4_kernels *g4_kernels_best(void);

/* The CPU features the levels are chosen by that this CPU has and its OS enables, space-separated
 * under /proc/cpuinfo's names on x86 ("avx2 fma avx_vnni avx512f ...", and os_ymm/os_zmm for the
 * register state XCR0 enables), "asimd" on aarch64: for reports (g4 bench). */
const char *g4_kernels_cpu_flags(void);

/* The level names, best first, as "avx512vnni|avxvnni|...". */
const char *g4_kernels_names(void);

/* The level named `name`, or NULL when there is none or this build or CPU does not have it. */
const g4_kernels *g4_kernels_level(const char *name);

/* Threads the matmuls use, the caller included. n <= 0 restores the default (online CPUs).
 * Not to be called while a matmul runs in another thread. */
void g4_kernels_set_threads(int n);
int g4_kernels_threads(void);
/* Stops and joins the pool threads (also registered with atexit). A later matmul restarts them. */
void g4_kernels_shutdown(void);

#endif
