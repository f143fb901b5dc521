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
