/* Portable reference of LiteRT's dynamic-range FULLY_CONNECTED: float input x int2/int4/int8
 * per-channel weights -> float output, with the input quantized to int8 per row at run time.
 *
 * This is how LiteRT's CPU paths run a float-input FC with integer weights, i.e. the Gemma 4
 * lm_head (its activation scales are 0), instead of computing it in float
 * (int8-arithmetic.md §3.3, activation-quant.md §7). g4's default keeps the lm_head in float
 * (HF semantics); `--lmhead-dynamic-q8` switches to G4_DYNQ_XNN_QD8, the XNNPACK path that
 * LiteRT's default CPU configuration takes.
 *
 * Every mode is bit-exact against LiteRT 2.3.0 (x86-64) on tests/litert/litert_fc.json except
 * where noted; the rules were derived from LiteRT's recorded outputs, not only from its
 * sources. Same build rules as int8.h: -ffp-contract=off, no -ffast-math. */
#ifndef G4_QUANT_DYNAMIC_H
#define G4_QUANT_DYNAMIC_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    /* XNNPACK delegate (qd8 GEMM): per-row asymmetric int8 with a zero point, multiplier
     * m = 255/(max(0,max) - min(0,min)) in f32, codes lrintf(x*m) + zp (ties-even),
     * output ((f32)acc * (1/m)) * w_scale. LiteRT's default CPU path. */
    G4_DYNQ_XNN_QD8 = 0,
    /* TFLite builtin "hybrid" kernel (optimized and reference resolvers alike): per-row
     * symmetric codes in [-127, 127], round(x * 127/range) ties away from zero, output
     * (f32)acc * (range/127 * w_scale). Weight code -128 is not emulated: LiteRT's x86 SSE
     * dot product gets (-128) * (negative input) wrong, g4 computes it exactly. */
    G4_DYNQ_TFL_HYBRID = 1,
    /* The same kernel with the FC option asymmetric_quantize_inputs: per-row zero point,
     * scale (max(0,max) - min(0,min)) / 255 with the range formed in f32. */
    G4_DYNQ_TFL_HYBRID_ASYM = 2,
} g4_dynq_mode;

const char *g4_dynq_mode_name(g4_dynq_mode mode);

/* One row's quantization: x[i] ~= (code[i] - zero_point) * scale. */
typedef struct {
    float scale;        /* dequantization scale, multiplies the accumulator */
    float inv_scale;    /* what x is multiplied by before rounding (XNNPACK's m; not 1/scale) */
    int32_t zero_point; /* 0 for G4_DYNQ_TFL_HYBRID */
} g4_dynq_row;

/* Quantizes x[0..n) into codes[0..n). n >= 1. A non-finite x has no defined LiteRT result:
 * returns -1 with g4_last_error() set, codes untouched. */
int g4_dynq_quantize_row(g4_dynq_mode mode, const float *x, size_t n, int8_t *codes,
                         g4_dynq_row *row);

/* Float output for one channel from acc = sum_i (code[i] - zero_point) * w[i] (int32, e.g.
 * g4_dot_packed(codes, row->zero_point, ...)) and the channel's weight scale. */
float g4_dynq_output(g4_dynq_mode mode, const g4_dynq_row *row, int32_t acc, float w_scale);

/* y[o] for o in [0, out): one input row x[0..in) against the packed [out, in] weight w
 * (pack.h layout, bits 2, 4 or 8; rows g4_packed_row_bytes(bits, in) apart) with per-row
 * scales w_scale[o]. codes is caller scratch of `in` bytes (it holds the row's int8 codes
 * afterwards). Returns 0, or -1 with the error set (bad bits, non-finite x). */
int g4_dynq_matvec_packed(g4_dynq_mode mode, const float *x, size_t in, const uint8_t *w, int bits,
                          size_t out, const float *w_scale, int8_t *codes, float *y);

#endif
