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
#include "util/err.h"

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

/* out[p] = dot(a[p], b[p], n) for np pairs, four at a time: each sum still runs in order from
 * +0 (the same bits as dot), but four independent chains hide the add latency that one alone
 * waits on. */
static void dots(const float *const *a, const float *const *b, int np, int n, float *out) {
    int p = 0;
    for (; p + 4 <= np; p += 4) {
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        const float *a0 = a[p], *a1 = a[p + 1], *a2 = a[p + 2], *a3 = a[p + 3];
        const float *b0 = b[p], *b1 = b[p + 1], *b2 = b[p + 2], *b3 = b[p + 3];
        for (int i = 0; i < n; i++) {
            s0 += a0[i] * b0[i];
            s1 += a1[i] * b1[i];
            s2 += a2[i] * b2[i];
            s3 += a3[i] * b3[i];
        }
        out[p] = s0, out[p + 1] = s1, out[p + 2] = s2, out[p + 3] = s3;
    }
    for (; p < np; p++) out[p] = dot(a[p], b[p], n);
}

int g4_audio_local_attention(const float *q, const float *k, const float *v, int T, int H, int D, const float *rel_k,
                              int L, const float *per_dim_scale, const uint8_t *valid, int chunk, int context_left,
                              int context_right, float logit_cap, float *out) {
    const int P = context_left - 1, R = context_right, W = chunk + P + R, HD = H * D;
    const float q_scale = (float)(pow(D, -0.5) / log(2.0)), k_scale = (float)(log(1.0 + exp(1.0)) / log(2.0));
    float *qs = malloc((size_t)T * HD * sizeof *qs), *ks = malloc((size_t)T * HD * sizeof *ks);
    float *sp = malloc((size_t)D * sizeof *sp), *logit = malloc((size_t)W * sizeof *logit);
    /* per (query, head): the W q.k and W q.r dots, gathered as pairs and summed together */
    const float **pa = malloc((size_t)2 * W * sizeof *pa), **pb = malloc((size_t)2 * W * sizeof *pb);
    float *pd = malloc((size_t)2 * W * sizeof *pd);
    int *slot = malloc((size_t)2 * W * sizeof *slot);
    if (!qs || !ks || !sp || !logit || !pa || !pb || !pd || !slot) {
        free(qs), free(ks), free(sp), free(logit), free(pa), free(pb), free(pd), free(slot);
        return g4_fail("audio: out of memory for the local attention of %d frames", T);
    }
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
                int np = 0;
                for (int j = 0; j < W; j++) {
                    int kv = u * chunk + j - P;
                    /* slot 2j: q.k_kv; 2j + 1: q.r by rel_shift, the block's [chunk, L] q.r matrix padded to
                     * W + 1 columns, read flat; a position outside gives 0 */
                    slot[2 * j] = slot[2 * j + 1] = -1;
                    if (kv >= 0 && kv < T) pa[np] = qv, pb[np] = ks + (size_t)kv * HD + h * D, slot[2 * j] = np++;
                    int f = i * W + j, r = f / (W + 1), c = f % (W + 1), qr = u * chunk + r;
                    if (c < L && qr < T) pa[np] = qs + (size_t)qr * HD + h * D, pb[np] = rel_k + (size_t)c * HD + h * D, slot[2 * j + 1] = np++;
                }
                dots(pa, pb, np, D, pd);
                for (int j = 0; j < W; j++) {
                    int kv = u * chunk + j - P;
                    float ac = slot[2 * j] >= 0 ? pd[slot[2 * j]] : 0.0f, bd = slot[2 * j + 1] >= 0 ? pd[slot[2 * j + 1]] : 0.0f;
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
    free(qs), free(ks), free(sp), free(logit), free(pa), free(pb), free(pd), free(slot);
    return 0;
}
