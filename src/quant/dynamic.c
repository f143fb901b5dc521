/* Dynamic-range FC reference; see dynamic.h. Compile with -ffp-contract=off.
 *
 * Each step below is one f32 (or, where LiteRT uses it, f64) operation in LiteRT's order:
 * reordering or fusing any of them changes last bits of the logits, and the test holds this
 * file to LiteRT's outputs bit for bit. */
#include "dynamic.h"

#include <math.h>

#include "int8.h"
#include "pack.h"
#include "util/err.h"

const char *g4_dynq_mode_name(g4_dynq_mode mode) {
    switch (mode) {
    case G4_DYNQ_XNN_QD8: return "xnn_qd8";
    case G4_DYNQ_TFL_HYBRID: return "tfl_hybrid";
    case G4_DYNQ_TFL_HYBRID_ASYM: return "tfl_hybrid_asym";
    }
    return "?";
}

/* Rounded, clamped code. Clamping in float before the conversion keeps the int cast defined
 * whatever the magnitude; the bounds are integers, so clamping before or after rounding gives
 * the same code (XNNPACK clamps first, TFLite after). */
static int8_t to_code(float v, g4_round rule, float lo, float hi) {
    float r = g4_round_f32(v, rule);
    if (r < lo) r = lo;
    if (r > hi) r = hi;
    return (int8_t)(int)r;
}

static void row_min_max(const float *x, size_t n, float *mn, float *mx) {
    float lo = x[0], hi = x[0];
    for (size_t i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
    }
    *mn = lo;
    *mx = hi;
}

/* XNNPACK: xnn_f32_qd8_asymmetric_quantization_params + the f32 -> qs8 convert. The convert
 * multiplies by m itself; only the GEMM epilogue uses 1/m (LiteRT's outputs rule out the
 * variant that re-derives the multiplier as 1/(1/m)). */
static void quantize_xnn_qd8(const float *x, size_t n, float mn, float mx, int8_t *codes,
                             g4_dynq_row *row) {
    float rmin = mn < 0.0f ? mn : 0.0f;
    float rmax = mx > 0.0f ? mx : 0.0f;
    float m = 1.0f;
    if (rmin != rmax) {
        float range = rmax - rmin;
        m = 255.0f / range;
    }
    float dmin = rmin * m, dmax = rmax * m;
    float err_min = -128.0f + dmin, err_max = 127.0f + dmax;
    /* The zero point comes from whichever end of the range loses less to rounding. */
    float zp = err_min + err_max > 0.0f ? -128.0f - dmin : 127.0f - dmax;
    if (zp < -128.0f) zp = -128.0f;
    if (zp > 127.0f) zp = 127.0f;
    int32_t z = (int32_t)g4_round_f32(zp, G4_ROUND_EVEN);
    row->inv_scale = m;
    row->scale = 1.0f / m;
    row->zero_point = z;
    float lo = (float)(-128 - z), hi = (float)(127 - z);
    for (size_t i = 0; i < n; i++) {
        float v = x[i] * m;
        codes[i] = (int8_t)(to_code(v, G4_ROUND_EVEN, lo, hi) + z);
    }
}

/* TFLite SymmetricQuantizeFloats: range/127 and 127/range are two separate f32 divisions,
 * and TfLiteRound is std::round (ties away from zero). */
static void quantize_tfl_symmetric(const float *x, size_t n, float mn, float mx, int8_t *codes,
                                   g4_dynq_row *row) {
    float range = fabsf(mn) > fabsf(mx) ? fabsf(mn) : fabsf(mx);
    row->zero_point = 0;
    if (range == 0.0f) {
        row->scale = 1.0f;
        row->inv_scale = 0.0f;
        for (size_t i = 0; i < n; i++) codes[i] = 0;
        return;
    }
    row->scale = range / 127.0f;
    row->inv_scale = 127.0f / range;
    for (size_t i = 0; i < n; i++)
        codes[i] = to_code(x[i] * row->inv_scale, G4_ROUND_AWAY, -127.0f, 127.0f);
}

/* TFLite AsymmetricQuantizeFloats as this LiteRT build computes it: the range is an f32
 * subtraction (LiteRT's outputs match range/255 rounded from the f32 difference, not from the
 * exact one); the zero point is chosen in double like the portable kernel. The fixture does
 * not separate an f32 from an f64 zero-point computation; both agree away from .5 ties. */
static void quantize_tfl_asymmetric(const float *x, size_t n, float mn, float mx, int8_t *codes,
                                    g4_dynq_row *row) {
    float rmin = mn < 0.0f ? mn : 0.0f;
    float rmax = mx > 0.0f ? mx : 0.0f;
    if (rmin == rmax) {
        row->scale = 1.0f;
        row->inv_scale = 1.0f;
        row->zero_point = 0;
        for (size_t i = 0; i < n; i++) codes[i] = 0;
        return;
    }
    float range = rmax - rmin;
    double scale = (double)range / 255.0;
    double lo_q = (double)rmin / scale, hi_q = (double)rmax / scale;
    double z_min = -128.0 - lo_q, z_max = 127.0 - hi_q;
    double e_min = 128.0 + fabs(lo_q), e_max = 127.0 + fabs(hi_q);
    double z = e_min < e_max ? z_min : z_max;
    int32_t zp = z <= -128.0 ? -128 : z >= 127.0 ? 127 : (int32_t)g4_round_f64(z, G4_ROUND_AWAY);
    row->scale = (float)scale;
    row->inv_scale = 1.0f / row->scale;
    row->zero_point = zp;
    for (size_t i = 0; i < n; i++) {
        float v = (float)zp + x[i] * row->inv_scale;
        codes[i] = to_code(v, G4_ROUND_AWAY, -128.0f, 127.0f);
    }
}

int g4_dynq_quantize_row(g4_dynq_mode mode, const float *x, size_t n, int8_t *codes,
                         g4_dynq_row *row) {
    if (n == 0) return g4_fail("dynamic quantization of an empty row");
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return g4_fail("dynamic quantization: x[%zu] = %g is not finite", i, (double)x[i]);
    float mn, mx;
    row_min_max(x, n, &mn, &mx);
    switch (mode) {
    case G4_DYNQ_XNN_QD8: quantize_xnn_qd8(x, n, mn, mx, codes, row); return 0;
    case G4_DYNQ_TFL_HYBRID: quantize_tfl_symmetric(x, n, mn, mx, codes, row); return 0;
    case G4_DYNQ_TFL_HYBRID_ASYM: quantize_tfl_asymmetric(x, n, mn, mx, codes, row); return 0;
    }
    return g4_fail("unknown dynamic quantization mode %d", (int)mode);
}

/* The trailing + 0.0f is the kernels' bias add (zero here): it turns a -0 product into +0,
 * which LiteRT's outputs show. */
float g4_dynq_output(g4_dynq_mode mode, const g4_dynq_row *row, int32_t acc, float w_scale) {
    float v = (float)acc;
    if (mode == G4_DYNQ_XNN_QD8) {
        /* Row scale first, then the channel scale: two f32 roundings (qd8 GEMM epilogue). */
        v = v * row->scale;
        v = v * w_scale;
    } else {
        /* TFLite folds the two scales into one f32 product before touching the sum. */
        float s = row->scale * w_scale;
        v = v * s;
    }
    return v + 0.0f;
}

int g4_dynq_matvec_packed(g4_dynq_mode mode, const float *x, size_t in, const uint8_t *w, int bits,
                          size_t out, const float *w_scale, int8_t *codes, float *y) {
    if (bits != 2 && bits != 4 && bits != 8)
        return g4_fail("packed weight bits %d: expected 2, 4 or 8", bits);
    g4_dynq_row row;
    if (g4_dynq_quantize_row(mode, x, in, codes, &row)) return -1;
    size_t stride = g4_packed_row_bytes(bits, in);
    for (size_t o = 0; o < out; o++) {
        int32_t acc = g4_dot_packed(codes, row.zero_point, w + o * stride, bits, in);
        y[o] = g4_dynq_output(mode, &row, acc, w_scale[o]);
    }
    return 0;
}
