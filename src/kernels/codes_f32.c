/* Float activations against packed codes (kernels.h, G4_FIX_DIGITS): each row's fixed-point image
 * split into int8 digit rows, their exact int32 dots from a level's int8 matmul, combined exactly.
 * Every level's matmul_f32 runs packed weights through this with its own int8 matmul. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "codes_f32.h"
#include "kernels.h"
#include "pool.h"
#include "quant/pack.h"

int g4_fix_split_row(const float *x, int in, int8_t *digits) {
    int S = g4_fix_exponent(x, in);
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
        int S = g4_fix_exponent(xt, w->in);
        double two_s = S == INT32_MIN ? 0 : ldexp(1.0, S), two_neg_s = S == INT32_MIN ? 0 : ldexp(1.0, -S);
        for (int o = 0; o < w->out; o++) {
            const uint8_t *row = w->w + (size_t)o * w->row_bytes;
            int64_t dot = 0;
            for (int i = 0; S != INT32_MIN && i < w->in; i++)
                dot += (int64_t)fix_value(xt[i], two_s) * g4_packed_code(row, w->bits, (size_t)i);
            y[(size_t)t * w->out + o] = S == INT32_MIN ? NAN : fix_result((double)dot, two_neg_s, w->w_scale[o]);
        }
    }
}


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
            yt[o] = fix_result((double)dot, two_neg_s, j->w_scale[o]);
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
            g4_qweight sub = g4_qweight_rows(w, o0, w->out - o0 < chunk ? w->out - o0 : chunk);
            matmul_i8(&sub, digits, D * nt, acc);
            fix_combine_job j = {acc, S, w->w_scale + o0, y + (size_t)t0 * w->out + o0, (size_t)w->out, nt, sub.out};
            g4_pool_for(sub.out, 64, 8.0 * nt * sub.out, fix_combine, &j);
        }
    }
    free(digits);
    free(acc);
}
