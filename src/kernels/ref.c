#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "pool.h"
#include "quant/int8.h"
#include "quant/pack.h"

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

/* w_scale * dot * 2^-S: the scaled dot is exact in double (|dot| < 2^53), then rounded to f32 once. */
static float fix_result(int64_t dot, double two_neg_s, float w_scale) { return w_scale * (float)((double)dot * two_neg_s); }

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
            y[(size_t)t * w->out + o] = S == INT32_MIN ? NAN : fix_result(dot, two_neg_s, w->w_scale[o]);
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
            yt[o] = fix_result(dot, two_neg_s, j->w_scale[o]);
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
            g4_qweight sub = *w;
            sub.out = w->out - o0 < chunk ? w->out - o0 : chunk;
            sub.w = w->w + (size_t)o0 * w->row_bytes;
            matmul_i8(&sub, digits, D * nt, acc);
            fix_combine_job j = {acc, S, w->w_scale + o0, y + (size_t)t0 * w->out + o0, (size_t)w->out, nt, sub.out};
            g4_pool_for(sub.out, 64, 8.0 * nt * sub.out, fix_combine, &j);
        }
    }
    free(digits);
    free(acc);
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

/* e^x for x in [0, 18] (the only range g4_tanhf asks for): x = n ln2 + r, |r| <= ln2 / 2, e^r
 * from the Cephes expf polynomial, times 2^n built in the exponent bits. */
static float tanh_exp(float x) {
    int n = (int)(x * G4_EXP_LOG2E + 0.5f); /* x >= 0: truncation is floor */
    float fn = (float)n;
    float r = (x - fn * G4_EXP_LN2_HI) - fn * G4_EXP_LN2_LO;
    float p = G4_EXP_P5;
    p = p * r + G4_EXP_P4;
    p = p * r + G4_EXP_P3;
    p = p * r + G4_EXP_P2;
    p = p * r + G4_EXP_P1;
    p = p * r + G4_EXP_P0;
    float e = (p * (r * r) + r) + 1.0f;
    uint32_t bits = (uint32_t)(n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, 4);
    return e * two_n;
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
        t = 1.0f - 2.0f / (tanh_exp(a + a) + 1.0f);
    }
    return copysignf(t, z);
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
    float mx = -INFINITY, sum = 0;
    /* Without a scores buffer (out of memory) every score is computed again where it is needed:
     * the same function of the same inputs, so the same values. */
    for (int j = lo; j <= p; j++) {
        float sc = attn_score(a, c, q, h, j);
        if (scores) scores[j - lo] = sc;
        if (sc > mx) mx = sc;
    }
    for (int j = lo; j <= p; j++) {
        float e = expf((scores ? scores[j - lo] : attn_score(a, c, q, h, j)) - mx);
        if (scores) scores[j - lo] = e;
        sum += e;
    }
    float *out = a->out + (size_t)t * nh * hd + (size_t)h * hd;
    memset(out, 0, sizeof *out * (size_t)hd);
    for (int j = lo; j <= p; j++) {
        float w = (scores ? scores[j - lo] : expf(attn_score(a, c, q, h, j) - mx)) / sum;
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
