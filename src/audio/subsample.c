/* The audio tower's subsampling stage (transformers' Gemma4AudioSubSampleConvProjectionLayer): a
 * frame-masked input, Conv2d 3x3 stride 2 padding 1 without bias over (time, frequency), LayerNorm
 * over the channels (weight, no bias), ReLU; the mask keeps every second frame. The checkpoint
 * keeps these convolutions float (checkpoint.md section 3), so they run in float in every mode. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "audio/audio.h"
#include "util/err.h"

int g4_audio_subsampled_len(int n) { return (n + 2 - 3) / 2 + 1; }

/* o[c] += w[c] x for c < n, each element on its own (any vector width gives the same bits); in
 * blocks of 8 that GCC's -O2 straight-line vectorizer takes. */
static void axpy_row(float *restrict o, const float *restrict w, float x, int n) {
    int c = 0;
    for (; c + 8 <= n; c += 8) {
        o[c] += w[c] * x, o[c + 1] += w[c + 1] * x, o[c + 2] += w[c + 2] * x, o[c + 3] += w[c + 3] * x;
        o[c + 4] += w[c + 4] * x, o[c + 5] += w[c + 5] * x, o[c + 6] += w[c + 6] * x, o[c + 7] += w[c + 7] * x;
    }
    for (; c < n; c++) o[c] += w[c] * x;
}

int g4_audio_subsample_layer(const float *in, const uint8_t *mask, int T, int F, int cin, const float *w,
                             const float *norm_w, int cout, float eps, float *out, uint8_t *mask_out) {
    int T2 = g4_audio_subsampled_len(T), F2 = g4_audio_subsampled_len(F);
    /* The weights laid out [ci][kt][kf][co]: each input value then meets all cout weights in one
     * contiguous, branch-free row (E2B's second layer: 128 x 9 rows of 32, a third of a 10 s
     * clip's encode when each output walked the [co][ci][kt][kf] weights with its own bounds
     * checks). Every output still sums its products in the (ci, kt, kf) order, from +0, so the
     * bits are those of the direct loop. */
    float *wt = malloc(sizeof *wt * (size_t)cout * cin * 9);
    if (!wt) return g4_fail("audio: out of memory for a %d x %d subsampling convolution", cin, cout);
    for (int co = 0; co < cout; co++)
        for (int ci = 0; ci < cin; ci++)
            for (int k = 0; k < 9; k++) wt[((size_t)ci * 9 + k) * cout + co] = w[((size_t)co * cin + ci) * 9 + k];
    for (int t = 0; t < T2; t++) {
        for (int f = 0; f < F2; f++) {
            float *o = out + ((size_t)t * F2 + f) * cout;
            for (int co = 0; co < cout; co++) o[co] = 0.0f;
            for (int ci = 0; ci < cin; ci++)
                for (int kt = 0; kt < 3; kt++) {
                    int ti = 2 * t + kt - 1;
                    /* zero padding outside, and masked frames enter as zeros */
                    if (ti < 0 || ti >= T || !mask[ti]) continue;
                    for (int kf = 0; kf < 3; kf++) {
                        int fi = 2 * f + kf - 1;
                        if (fi < 0 || fi >= F) continue;
                        axpy_row(o, wt + ((size_t)(ci * 3 + kt) * 3 + kf) * cout, in[((size_t)ti * F + fi) * cin + ci], cout);
                    }
                }
            /* LayerNorm over the channels: biased variance, as torch's */
            float mean = 0.0f, var = 0.0f;
            for (int co = 0; co < cout; co++) mean += o[co];
            mean /= (float)cout;
            for (int co = 0; co < cout; co++) var += (o[co] - mean) * (o[co] - mean);
            var /= (float)cout;
            float inv = 1.0f / sqrtf(var + eps);
            for (int co = 0; co < cout; co++) {
                float v = (o[co] - mean) * inv * norm_w[co];
                o[co] = v > 0.0f ? v : 0.0f;
            }
        }
        mask_out[t] = mask[2 * t];
    }
    free(wt);
    return 0;
}
