#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "quant/int8.h"
#include "quant/pack.h"

float g4_ref_dot_codes_f32(const float *x, const uint8_t *row, int bits, int n) {
    float acc[8] = {0};
    for (int i = 0; i < n; i++) acc[i & 7] += x[i] * (float)g4_packed_code(row, bits, (size_t)i);
    return g4_reduce8(acc);
}

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

void g4_ref_matmul_f32(const g4_qweight *w, const float *x, int n, float *y) {
    for (int o = 0; o < w->out; o++) {
        const uint8_t *row = w->w + (size_t)o * w->row_bytes;
        for (int t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * w->in;
            float *yt = y + (size_t)t * w->out;
            if (w->bits == 16) yt[o] = g4_ref_dot_bf16_f32(xt, row, w->in);
            else yt[o] = w->w_scale[o] * g4_ref_dot_codes_f32(xt, row, w->bits, w->in);
        }
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

void g4_ref_gelu_mul(float *g, const float *m, size_t n) {
    for (size_t i = 0; i < n; i++) g[i] = g4_gelu_tanh(g[i]) * m[i];
}

static float dot_codes(const float *a, const int8_t *c, int n) {
    float acc[8] = {0};
    for (int i = 0; i < n; i++) acc[i & 7] += a[i] * (float)c[i];
    return g4_reduce8(acc);
}

static float dot_f32(const float *a, const float *b, int n) {
    float acc[8] = {0};
    for (int i = 0; i < n; i++) acc[i & 7] += a[i] * b[i];
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
            for (int d = 0; d < hd; d++) out[d] += w * (float)c->vq[row + d];
        else
            for (int d = 0; d < hd; d++) out[d] += w * c->vf[row + d];
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
