/* The portable reference kernels: the definition of every operation, one output at a time in the
 * reference order, which every level is tested against bit for bit (tests/test_kernels.c). Nothing
 * here is split over threads or tuned; the portable level (portable.c) runs these over the pool. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codes_f32.h"
#include "kernels.h"
#include "levels.h"
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

/* D_b of kernels.h: the exact dot of block b of a packed row with the fixed-point image X (or,
 * without that buffer, with each X[i] computed again from x: the same integers). */
static int64_t block_dot(const uint8_t *row, int bits, int b, int block, const int32_t *X, const float *x, double two_s) {
    int64_t d = 0;
    for (int i = b * block; i < (b + 1) * block; i++)
        d += (int64_t)(X ? X[i] : fix_value(x[i], two_s)) * g4_packed_code(row, bits, (size_t)i);
    return d;
}

void g4_ref_matmul_blocks_rows(const g4_qweight *w, const float *x, int n, float *y, int o0, int o1) {
    int in = w->in, B = w->block, nb = in / B;
    int32_t *X = malloc(sizeof *X * (size_t)(in > 0 ? in : 1)); /* NULL: block_dot recomputes */
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * in;
        float *yt = y + (size_t)t * w->out;
        int S = g4_fix_exponent(xt, in);
        if (S == INT32_MIN) {
            for (int o = o0; o < o1; o++) yt[o] = NAN;
            continue;
        }
        double two_s = ldexp(1.0, S), two_neg_s = ldexp(1.0, -S);
        for (int i = 0; X && i < in; i++) X[i] = fix_value(xt[i], two_s);
        for (int o = o0; o < o1; o++) {
            const uint8_t *row = w->w + (size_t)o * w->row_bytes;
            const float *scale = w->w_scale + (size_t)o * nb;
            double acc = 0;
            for (int b = 0; b < nb; b++) acc = acc + (double)scale[b] * (double)block_dot(row, w->bits, b, B, X, xt, two_s);
            yt[o] = (float)(acc * two_neg_s);
        }
    }
    free(X);
}

void g4_ref_matmul_blocks_f32(const g4_qweight *w, const float *x, int n, float *y) { g4_ref_matmul_blocks_rows(w, x, n, y, 0, w->out); }

void g4_ref_matmul_f32(const g4_qweight *w, const float *x, int n, float *y) {
    if (w->block > 0 && w->bits != G4_WT_BF16) {
        g4_ref_matmul_blocks_f32(w, x, n, y);
        return;
    }
    if (w->bits != G4_WT_BF16) {
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
