/* Reference int8 arithmetic; see int8.h. Compile with -ffp-contract=off, no -ffast-math.
 * Everything avoids implementation-defined and undefined integer behaviour (right shifts of
 * negative values, signed overflow, out-of-range conversions), so the results are the same
 * on every C11 compiler and under -fsanitize=undefined. */
#include "int8.h"

#include <assert.h>
#include <math.h>

#include "pack.h"
#include "util/err.h"

/* ---------------------------------------------------------------- integer helpers ------- */

/* Two's-complement reinterpretation of a 32-bit pattern, without relying on the
 * implementation-defined unsigned -> signed conversion. */
static int32_t wrap_i32(uint32_t u) {
    return u <= (uint32_t)INT32_MAX ? (int32_t)u : -(int32_t)(~u) - 1;
}

/* Arithmetic (flooring) right shift; `>>` on a negative value is implementation-defined. */
static int32_t asr32(int32_t x, int e) { return x < 0 ? ~(~x >> e) : x >> e; }
static int64_t asr64(int64_t x, int e) { return x < 0 ? ~(~x >> e) : x >> e; }

static int32_t saturate_i32(int64_t v) {
    return v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : (int32_t)v;
}

static int8_t clamp_i8(int64_t v) { return (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v); }

/* x * 2^left with int32 wrap-around, as TFLite's `x * (1 << left_shift)`. */
static int32_t shl_wrap32(int32_t x, int left) {
    return left >= 32 ? 0 : wrap_i32((uint32_t)x << left);
}

/* ---------------------------------------------------------------- rounding -------------- */

/* Tie detection uses exact arithmetic (r - v is exact when |r - v| <= 0.5), so the result
 * does not depend on the current FP rounding mode the way rintf/lrintf do. */
float g4_round_f32(float v, g4_round rule) {
    float r = roundf(v); /* ties away from zero */
    if (rule == G4_ROUND_EVEN && fabsf(r - v) == 0.5f) r = 2.0f * roundf(0.5f * v);
    return r;
}

double g4_round_f64(double v, g4_round rule) {
    double r = round(v);
    if (rule == G4_ROUND_EVEN && fabs(r - v) == 0.5) r = 2.0 * round(0.5 * v);
    return r;
}

/* Rounded value r plus zero point, clamped to int8. Comparing in float before converting
 * keeps huge values and infinities away from the int conversion (undefined out of range);
 * a NaN fails both comparisons' "in range" side and lands on 127. */
static int8_t add_zp_clamp_f32(float r, int32_t zp) {
    if (!(r <= (float)(127 - zp))) return 127;
    if (r < (float)(-128 - zp)) return -128;
    return clamp_i8((int64_t)r + zp);
}

static int8_t add_zp_clamp_f64(double r, int32_t zp) {
    if (!(r <= (double)(127 - zp))) return 127;
    if (r < (double)(-128 - zp)) return -128;
    return clamp_i8((int64_t)r + zp);
}

/* ---------------------------------------------------------------- activation quantizer --- */

int g4_quantizer_init(g4_quantizer *q, float scale, int32_t zero_point, g4_round round,
                      g4_qdiv qdiv) {
    if (!(scale >= 0.0f) || !isfinite(scale))
        return g4_fail("activation scale %g must be 0 or positive and finite", (double)scale);
    if (zero_point < -128 || zero_point > 127)
        return g4_fail("activation zero point %d outside [-128, 127]", (int)zero_point);
    /* G4_QDIV_DEFAULT is an option's "engine chooses", resolved before a quantizer is made */
    if (round != G4_ROUND_EVEN && round != G4_ROUND_AWAY) return g4_fail("unknown rounding rule %d", (int)round);
    if (qdiv != G4_QDIV_RECIPROCAL && qdiv != G4_QDIV_DIVIDE) return g4_fail("unknown quantizer division %d", (int)qdiv);
    q->scale = scale;
    q->inv_scale = 0.0f;
    if (!g4_scale_is_identity(scale)) {
        q->inv_scale = 1.0f / scale; /* one f32 rounding, as XNNPACK's microparams init */
        /* A reciprocal of inf would turn x = 0 into NaN under G4_QDIV_RECIPROCAL. */
        if (!isfinite(q->inv_scale))
            return g4_fail("activation scale %g too small: 1/s overflows f32", (double)scale);
    }
    q->zero_point = zero_point;
    q->round = round;
    q->qdiv = qdiv;
    return 0;
}

/* Clamping after rounding equals XNNPACK's clamp-then-lrintf: rounding is monotonic and the
 * bounds are integers, so both orders give the same code. */
int8_t g4_quantize(const g4_quantizer *q, float x) {
    assert(!g4_quantizer_is_identity(q));
    float v = q->qdiv == G4_QDIV_DIVIDE ? x / q->scale : x * q->inv_scale;
    return add_zp_clamp_f32(g4_round_f32(v, q->round), q->zero_point);
}

void g4_quantize_vec(const g4_quantizer *q, const float *x, size_t n, int8_t *codes) {
    for (size_t i = 0; i < n; i++) codes[i] = g4_quantize(q, x[i]);
}

float g4_fake_quantize(const g4_quantizer *q, float x) {
    if (g4_quantizer_is_identity(q)) return x;
    return g4_dequantize(g4_quantize(q, x), q->scale, q->zero_point);
}

/* ---------------------------------------------------------------- dequantize ------------ */

float g4_dequantize(int32_t code, float scale, int32_t zero_point) {
    return (float)(code - zero_point) * scale;
}

void g4_dequantize_vec(const int8_t *codes, size_t n, float scale, float *y) {
    for (size_t i = 0; i < n; i++) y[i] = g4_dequantize(codes[i], scale, 0);
}

/* ---------------------------------------------------------------- TFLite fixed point ---- */

int g4_quantize_multiplier(double m, int32_t *mult, int *shift) {
    *mult = 0;
    *shift = 0;
    if (!(m >= 0.0) || !isfinite(m))
        return g4_fail("requant multiplier %g must be >= 0 and finite", m);
    if (m == 0.0) return 0;
    int e;
    double q = frexp(m, &e); /* m = q * 2^e, 0.5 <= q < 1 */
    /* q * 2^31 is exact (power-of-two scaling); round() is TFRound, ties away from zero. */
    int64_t q_fixed = (int64_t)round(q * 2147483648.0);
    if (q_fixed == (INT64_C(1) << 31)) { /* q rounded up to 1.0 */
        q_fixed /= 2;
        e += 1;
    }
    if (e < -31) return 0; /* multiplier below 2^-32: TFLite flushes it to zero */
    *mult = (int32_t)q_fixed;
    *shift = e;
    return 0;
}

int g4_quantize_multiplier_single(double m, int32_t *mult, int *shift) {
    if (g4_quantize_multiplier(m, mult, shift)) return -1;
    if (*shift > 30) { /* the single-rounding shift 31 - shift must stay >= 1 */
        *shift = 30;
        *mult = INT32_MAX;
    }
    return 0;
}

int32_t g4_srdhm(int32_t a, int32_t b) {
    if (a == INT32_MIN && b == INT32_MIN) return INT32_MAX; /* the only product >= 2^62 */
    int64_t ab = (int64_t)a * b;
    int64_t nudge = ab >= 0 ? (INT64_C(1) << 30) : 1 - (INT64_C(1) << 30);
    return (int32_t)((ab + nudge) / (INT64_C(1) << 31)); /* C division truncates, as C++ */
}

int32_t g4_rounding_divide_by_pot(int32_t x, int exponent) {
    assert(exponent >= 0 && exponent <= 31);
    uint32_t mask = (UINT32_C(1) << exponent) - 1;
    int32_t remainder = (int32_t)((uint32_t)x & mask);
    int32_t threshold = (int32_t)(mask >> 1) + (x < 0 ? 1 : 0);
    return asr32(x, exponent) + (remainder > threshold ? 1 : 0);
}

int32_t g4_mbqm_double(int32_t x, int32_t mult, int shift) {
    int left = shift > 0 ? shift : 0;
    int right = shift > 0 ? 0 : -shift;
    return g4_rounding_divide_by_pot(g4_srdhm(shl_wrap32(x, left), mult), right);
}

int32_t g4_mbqm_single(int32_t x, int32_t mult, int shift) {
    assert(shift >= -31 && shift <= 30 && mult >= 0);
    int total = 31 - shift; /* 1..62; |x * mult| < 2^62, so the sum below fits int64 */
    int64_t p = (int64_t)x * mult + (INT64_C(1) << (total - 1));
    return saturate_i32(asr64(p, total));
}

int32_t g4_mbqm_neon_4row(int32_t x, int32_t mult, int shift) {
    int left = shift > 0 ? shift : 0;
    int right = shift > 0 ? 0 : -shift;
    assert(right <= 31);
    int32_t v = shl_wrap32(x, left);
    int64_t h; /* vqrdmulh: (2*v*mult + 2^31) >> 32, saturating only for MIN * MIN */
    if (v == INT32_MIN && mult == INT32_MIN)
        h = INT32_MAX;
    else
        h = asr64(2 * (int64_t)v * mult + (INT64_C(1) << 31), 32);
    if (right == 0) return (int32_t)h;
    /* vrshl by -right: add half then shift, in wider precision, so ties go up. */
    return saturate_i32(asr64(h + (INT64_C(1) << (right - 1)), right));
}

/* ---------------------------------------------------------------- requantization -------- */

const char *g4_requant_rule_name(g4_requant_rule mode) {
    switch (mode) {
    case G4_REQUANT_F32: return "f32";
    case G4_REQUANT_F64: return "f64";
    case G4_REQUANT_TFL_DOUBLE: return "tfl_double";
    case G4_REQUANT_TFL_SINGLE: return "tfl_single";
    case G4_REQUANT_TFL_NEON: return "tfl_neon_4row";
    case G4_REQUANT_TFL_REF: return "tfl_ref";
    }
    return "?";
}

static int scale_is_positive_finite(float s) { return s > 0.0f && isfinite(s); }

/* The product is rounded to f32 before the division, exactly XNNPACK's float expression
 * `input_scale * kernel_scale / output_scale`. */
static float requant_scale_f32(float s_x, float s_w, float s_y) {
    float p = s_x * s_w;
    return p / s_y;
}

int g4_requant_init(g4_requant *rq, g4_requant_rule mode, float s_x, float s_w, float s_y,
                    int32_t zero_point) {
    if (!scale_is_positive_finite(s_x) || !scale_is_positive_finite(s_w) ||
        !scale_is_positive_finite(s_y))
        return g4_fail("requant scales s_x=%g s_w=%g s_y=%g must be positive and finite",
                       (double)s_x, (double)s_w, (double)s_y);
    if (zero_point < -128 || zero_point > 127)
        return g4_fail("output zero point %d outside [-128, 127]", (int)zero_point);
    if ((unsigned)mode > G4_REQUANT_TFL_REF)
        return g4_fail("unknown requant mode %d", (int)mode);
    rq->mode = mode;
    rq->scale_f32 = requant_scale_f32(s_x, s_w, s_y);
    rq->s_x = s_x;
    rq->s_w = s_w;
    rq->s_y = s_y;
    rq->zero_point = zero_point;
    /* TFLite forms the real multiplier in double before QuantizeMultiplier. */
    double m = (double)s_x * (double)s_w / (double)s_y;
    /* XNNPACK refuses >= 256; applying the same bound to every mode keeps shift <= 9, far
     * from the ranges where the fixed-point forms stop being defined. */
    if (!(rq->scale_f32 < 256.0f) || !(m < 256.0))
        return g4_fail("requant scale s_x*s_w/s_y = %g must be < 256", m);
    return mode == G4_REQUANT_TFL_SINGLE ? g4_quantize_multiplier_single(m, &rq->mult, &rq->shift)
                                         : g4_quantize_multiplier(m, &rq->mult, &rq->shift);
}

int g4_requant_init_rows(g4_requant *rq, size_t out, g4_requant_rule mode, float s_x,
                         const float *s_w, float s_y, int32_t zero_point) {
    for (size_t o = 0; o < out; o++)
        if (g4_requant_init(&rq[o], mode, s_x, s_w[o], s_y, zero_point))
            return g4_fail_prefix("row %zu: ", o);
    return 0;
}

/* XNNPACK qs8 fp32 epilogue. (float)acc rounds to nearest-even above 2^24, as the kernels'
 * int -> float conversion does. */
static int8_t requant_f32(const g4_requant *rq, int32_t acc) {
    float v = (float)acc;
    v = v * rq->scale_f32;
    return add_zp_clamp_f32(g4_round_f32(v, G4_ROUND_EVEN), rq->zero_point);
}

int8_t g4_requantize_f32(int32_t acc, float scale_f32) {
    float v = (float)acc;
    v = v * scale_f32;
    return add_zp_clamp_f32(g4_round_f32(v, G4_ROUND_EVEN), 0);
}

/* The unit_linear reference: ((acc * s_x) * s_w) / s_y, each step rounded to double. This is
 * deliberately not acc * M with M precomputed: that can differ in the last bit. */
static int8_t requant_f64(const g4_requant *rq, int32_t acc) {
    double y = (double)acc * rq->s_x;
    y = y * rq->s_w;
    y = y / rq->s_y;
    return add_zp_clamp_f64(g4_round_f64(y, G4_ROUND_EVEN), rq->zero_point);
}

/* LiteRT's reference FULLY_CONNECTED (measured against ai-edge-litert 2.3.0, tools/ref):
 * the multiplier (double)s_x * s_w / s_y, one multiply in double, std::round (ties away). */
static int8_t requant_tfl_ref(const g4_requant *rq, int32_t acc) {
    double m = rq->s_x * rq->s_w / rq->s_y;
    return add_zp_clamp_f64(g4_round_f64((double)acc * m, G4_ROUND_AWAY), rq->zero_point);
}

int8_t g4_requantize(const g4_requant *rq, int32_t acc) {
    int32_t y;
    switch (rq->mode) {
    case G4_REQUANT_F32: return requant_f32(rq, acc);
    case G4_REQUANT_F64: return requant_f64(rq, acc);
    case G4_REQUANT_TFL_REF: return requant_tfl_ref(rq, acc);
    case G4_REQUANT_TFL_DOUBLE: y = g4_mbqm_double(acc, rq->mult, rq->shift); break;
    case G4_REQUANT_TFL_SINGLE: y = g4_mbqm_single(acc, rq->mult, rq->shift); break;
    case G4_REQUANT_TFL_NEON: y = g4_mbqm_neon_4row(acc, rq->mult, rq->shift); break;
    default: assert(0 && "unknown requant mode"); return 0;
    }
    return clamp_i8((int64_t)y + rq->zero_point);
}

/* ---------------------------------------------------------------- integer dot / matvec -- */

int32_t g4_dot_packed(const int8_t *x, int32_t x_zero_point, const uint8_t *w_row, int bits,
                      size_t n) {
    /* Unsigned accumulation gives the int32 kernels' wrap-around without signed overflow. */
    uint32_t acc = 0;
    for (size_t j = 0; j < n; j++)
        acc += (uint32_t)(g4_packed_code(w_row, bits, j) * ((int32_t)x[j] - x_zero_point));
    return wrap_i32(acc);
}

static int check_bits(int bits) {
    if (bits == 2 || bits == 4 || bits == 8) return 0;
    return g4_fail("packed weight bits %d: expected 2, 4 or 8", bits);
}

int g4_matvec_packed_acc(const int8_t *x, int32_t x_zero_point, const uint8_t *w, int bits,
                         size_t out, size_t in, const int32_t *bias, int32_t *acc) {
    if (check_bits(bits)) return -1;
    size_t stride = g4_packed_row_bytes(bits, in);
    for (size_t o = 0; o < out; o++) {
        int32_t a = g4_dot_packed(x, x_zero_point, w + o * stride, bits, in);
        acc[o] = bias ? wrap_i32((uint32_t)a + (uint32_t)bias[o]) : a;
    }
    return 0;
}

int g4_matvec_packed(const int8_t *x, int32_t x_zero_point, const uint8_t *w, int bits,
                     size_t out, size_t in, const int32_t *bias, const g4_requant *rq,
                     int8_t *y) {
    if (check_bits(bits)) return -1;
    size_t stride = g4_packed_row_bytes(bits, in);
    for (size_t o = 0; o < out; o++) {
        int32_t a = g4_dot_packed(x, x_zero_point, w + o * stride, bits, in);
        if (bias) a = wrap_i32((uint32_t)a + (uint32_t)bias[o]);
        y[o] = g4_requantize(&rq[o], a);
    }
    return 0;
}
