/* The audio conformer's chunked local attention core (transformers' Gemma4AudioAttention between
 * the q/k/v projections and `post`), for one sequence. Queries go in blocks of `chunk`; each block
 * sees a context of W = chunk + (context_left - 1) + context_right key positions starting
 * context_left - 1 before it; logits are q.k plus a relative-position term q.r shifted as
 * Transformer-XL's rel_shift (appendix B of arXiv:1901.02860), capped by tanh(x / cap) x cap,
 * masked to the sliding window the model builds (0 <= q - kv < context_left - 1, or a future key
 * within context_right) over valid keys, softmaxed, and applied to v. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "audio/audio.h"

#define INVALID_LOGIT (-1e9f)   /* config attention_invalid_logits_value */

void g4_audio_rel_pos_sinusoids(int hidden, int rows, float *out) {
    int half = hidden / 2;
    /* as torch: inv_timescales exp(i * -log(1e4) / (half - 1)) in float32, position x that */
    float inc = (float)(log(10000.0) / (half > 1 ? half - 1 : 1));
    for (int r = 0; r < rows; r++) {
        float pos = (float)(rows - 1 - r);   /* arange(W // 2, -1, -1) */
        for (int i = 0; i < half; i++) {
            float t = pos * expf((float)i * -inc);
            out[(size_t)r * hidden + i] = sinf(t);
            out[(size_t)r * hidden + half + i] = cosf(t);
        }
    }
}

static float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void g4_audio_local_attention(const float *q, const float *k, const float *v, int T, int H, int D, const float *rel_k,
                              int L, const float *per_dim_scale, const uint8_t *valid, int chunk, int context_left,
                              int context_right, float logit_cap, float *out) {
    const int P = context_left - 1, R = context_right, W = chunk + P + R, HD = H * D;
    const float q_scale = (float)(pow(D, -0.5) / log(2.0)), k_scale = (float)(log(1.0 + exp(1.0)) / log(2.0));
    float *qs = malloc((size_t)T * HD * sizeof *qs), *ks = malloc((size_t)T * HD * sizeof *ks);
    float *sp = malloc((size_t)D * sizeof *sp), *logit = malloc((size_t)W * sizeof *logit);
    for (int d = 0; d < D; d++) sp[d] = log1pf(expf(per_dim_scale[d]));   /* softplus */
    for (size_t i = 0; i < (size_t)T * HD; i++) {
        qs[i] = q[i] * q_scale * sp[i % (size_t)D];
        ks[i] = k[i] * k_scale;
    }
    int blocks = (T + chunk - 1) / chunk;
    for (int u = 0; u < blocks; u++)
        for (int i = 0; i < chunk; i++) {
            int qi = u * chunk + i;
            if (qi >= T) break;   /* the padded query rows are dropped */
            for (int h = 0; h < H; h++) {
                const float *qv = qs + (size_t)qi * HD + h * D;
                float mx = -INFINITY;
                for (int j = 0; j < W; j++) {
                    int kv = u * chunk + j - P;
                    float ac = kv >= 0 && kv < T ? dot(qv, ks + (size_t)kv * HD + h * D, D) : 0.0f;
                    /* rel_shift: the block's [chunk, L] q.r matrix padded to W + 1 columns, read flat */
                    int f = i * W + j, r = f / (W + 1), c = f % (W + 1), qr = u * chunk + r;
                    float bd = c < L && qr < T ? dot(qs + (size_t)qr * HD + h * D, rel_k + (size_t)c * HD + h * D, D) : 0.0f;
                    float x = tanhf((ac + bd) / logit_cap) * logit_cap;
                    int dist = qi - kv;
                    int allowed = kv >= 0 && kv < T && valid[kv] &&
                                  ((dist >= 0 && dist < P) || (dist < 0 && -dist < R));
                    logit[j] = allowed ? x : INVALID_LOGIT;
                    if (logit[j] > mx) mx = logit[j];
                }
                float sum = 0.0f;
                for (int j = 0; j < W; j++) sum += logit[j] = expf(logit[j] - mx);
                float *o = out + (size_t)qi * HD + h * D;
                memset(o, 0, (size_t)D * sizeof *o);
                for (int j = 0; j < W; j++) {
                    int kv = u * chunk + j - P;
                    if (kv < 0 || kv >= T) continue;   /* zero-padded values */
                    float p = logit[j] / sum;
                    for (int d = 0; d < D; d++) o[d] += p * v[(size_t)kv * HD + h * D + d];
                }
            }
        }
    free(qs), free(ks), free(sp), free(logit);
}
