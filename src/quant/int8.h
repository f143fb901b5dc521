/* Portable reference implementation of g4's int8 arithmetic (int8-arithmetic.md,
 * activation-quant.md §1, §7, §8). One plain-C function per operation; later SIMD kernels
 * are tested against these bit for bit, so every rounding step here is spelled out rather
 * than left to the compiler or the floating-point environment.
 *
 * Build note: compile with -ffp-contract=off and never with -ffast-math. The functions only
 * multiply/divide then round, so there is nothing to contract today, but the SIMD kernels
 * tested against them must not fuse either (a fused a*b+c rounds once instead of twice).
 * f32 expressions assume standard C11 excess-precision semantics (every assignment or cast
 * to float rounds to binary32), which GCC applies under -std=c11.
 *
 * Zero points: the Gemma 4 checkpoint has none (pass 0). They are supported because the
 * LiteRT test vectors (shared/fixtures/int8/vectors.json) use an input zero point, an output
 * zero point and an int32 bias in one FC case. */
#ifndef G4_QUANT_INT8_H
#define G4_QUANT_INT8_H

#include <stddef.h>
#include <stdint.h>

/* The rules (g4_round, g4_qdiv, g4_requant_rule) are the public API's enums: one enum per
 * concept, so the options a caller sets reach the arithmetic without a translation table. */
#include "g4.h"

/* ---------------------------------------------------------------- rounding ------------- */

/* Round to an integral value with the given tie rule, independent of the FP environment. */
float g4_round_f32(float v, g4_round rule);
double g4_round_f64(double v, g4_round rule);

/* ---------------------------------------------------------------- activation quantizer --- */

/* One per quantization point, built once at load time. */
typedef struct {
    float scale;        /* s; 0 means "uncalibrated: identity" (checkpoint.md §6) */
    float inv_scale;    /* 1.0f / s in f32 (0 when s == 0) */
    int32_t zero_point; /* 0 for every Gemma 4 tensor */
    g4_round round;
    g4_qdiv qdiv;
} g4_quantizer;

/* Scale 0 means the tensor is not quantized: the caller passes it through unchanged. */
static inline int g4_scale_is_identity(float scale) { return scale == 0.0f; }
static inline int g4_quantizer_is_identity(const g4_quantizer *q) {
    return g4_scale_is_identity(q->scale);
}

/* scale must be 0 (identity) or positive and finite; zero_point in [-128, 127].
 * Returns 0, or -1 with g4_last_error() set. */
int g4_quantizer_init(g4_quantizer *q, float scale, int32_t zero_point, g4_round round,
                      g4_qdiv qdiv);

/* code = clamp(round(x / s) + zp, -128, 127). Precondition: !g4_quantizer_is_identity(q).
 * NaN input is a caller bug; it yields 127 rather than undefined behaviour. */
int8_t g4_quantize(const g4_quantizer *q, float x);
void g4_quantize_vec(const g4_quantizer *q, const float *x, size_t n, int8_t *codes);

/* Q(x; s) of activation-quant.md §1: dequantize(quantize(x)), or x itself when s == 0. */
float g4_fake_quantize(const g4_quantizer *q, float x);

/* ---------------------------------------------------------------- dequantize ------------ */

/* f32(code - zp) * s, one f32 multiply (equals TFLite's double form bit for bit, §4). */
float g4_dequantize(int32_t code, float scale, int32_t zero_point);
void g4_dequantize_vec(const int8_t *codes, size_t n, float scale, float *y); /* zp = 0 */

/* ---------------------------------------------------------------- TFLite fixed point ---- */

/* TFLite QuantizeMultiplier: m ~= mult * 2^(shift - 31), mult in [2^30, 2^31 - 1], or
 * (0, 0) for m == 0 or m < 2^-32. m must be >= 0 and finite (else -1, error set). */
int g4_quantize_multiplier(double m, int32_t *mult, int *shift);
/* Same, plus the TFLITE_SINGLE_ROUNDING clamp of shift to <= 30. */
int g4_quantize_multiplier_single(double m, int32_t *mult, int *shift);

/* gemmlowp SaturatingRoundingDoublingHighMul: round(a*b / 2^31), ties toward +inf. */
int32_t g4_srdhm(int32_t a, int32_t b);
/* gemmlowp RoundingDivideByPOT, 0 <= exponent <= 31: round(x / 2^e), ties away from 0. */
int32_t g4_rounding_divide_by_pot(int32_t x, int exponent);

/* MultiplyByQuantizedMultiplier, three ways (int8-arithmetic.md §3.1). shift in [-31, 30]
 * for the single-rounding form; results that do not fit int32 saturate (TFLite asserts
 * instead; either way the int8 clamp that follows gives the same code). */
int32_t g4_mbqm_double(int32_t x, int32_t mult, int shift);    /* default TFLite build */
int32_t g4_mbqm_single(int32_t x, int32_t mult, int shift);    /* TFLITE_SINGLE_ROUNDING, ruy */
int32_t g4_mbqm_neon_4row(int32_t x, int32_t mult, int shift); /* vqrdmulh + vrshl */

/* ---------------------------------------------------------------- requantization -------- */

const char *g4_requant_rule_name(g4_requant_rule mode);

/* Per output channel, built once at load time. Every representation is filled in whatever
 * the mode, so a test or a kernel can read the one it needs. */
typedef struct {
    g4_requant_rule mode;
    float scale_f32;      /* (s_x * s_w) / s_y in f32, as XNNPACK forms it */
    double s_x, s_w, s_y; /* F64 evaluates acc*s_x*s_w/s_y left to right at run time */
    int32_t mult;         /* Q31 multiplier of (double)s_x*s_w/s_y (mode's QuantizeMultiplier) */
    int shift;
    int32_t zero_point;   /* output zero point, 0 for Gemma 4 */
} g4_requant;

/* s_x, s_w, s_y positive and finite (a zero scale is the caller's float special case,
 * activation-quant.md §7); zero_point in [-128, 127]; s_x*s_w/s_y < 256 in every mode
 * (XNNPACK's limit). Returns 0, or -1 with the error set. */
int g4_requant_init(g4_requant *rq, g4_requant_rule mode, float s_x, float s_w, float s_y,
                    int32_t zero_point);
/* rq[o] for o in [0, out) from per-row weight scales s_w[o]. */
int g4_requant_init_rows(g4_requant *rq, size_t out, g4_requant_rule mode, float s_x,
                         const float *s_w, float s_y, int32_t zero_point);

/* int32 accumulator -> int8 output code, clamped to [-128, 127]. */
int8_t g4_requantize(const g4_requant *rq, int32_t acc);
/* The f32 rule alone (zero point 0), from its multiplier rq.scale_f32: what g4_requantize does
 * for G4_REQUANT_F32, for kernels that keep only the multipliers. */
int8_t g4_requantize_f32(int32_t acc, float scale_f32);

/* ---------------------------------------------------------------- integer dot / matvec -- */

/* sum_j w[j] * (x[j] - x_zero_point) over one packed weight row (pack.h layout, bits 2, 4
 * or 8), accumulated in int32 with two's-complement wrap-around like the real kernels. */
int32_t g4_dot_packed(const int8_t *x, int32_t x_zero_point, const uint8_t *w_row, int bits,
                      size_t n);

/* acc[o] = dot(x, row o of packed [out, in] weight w) + (bias ? bias[o] : 0).
 * Rows are g4_packed_row_bytes(bits, in) bytes apart. Returns -1 for bad bits. */
int g4_matvec_packed_acc(const int8_t *x, int32_t x_zero_point, const uint8_t *w, int bits,
                         size_t out, size_t in, const int32_t *bias, int32_t *acc);

/* y[o] = g4_requantize(&rq[o], acc[o]). Returns -1 for bad bits. */
int g4_matvec_packed(const int8_t *x, int32_t x_zero_point, const uint8_t *w, int bits,
                     size_t out, size_t in, const int32_t *bias, const g4_requant *rq,
                     int8_t *y);

#endif
