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
                        const float x = in[((size_t)ti * F + fi) * cin + ci], *wr = wt + ((size_t)(ci * 3 + kt) * 3 + kf) * cout;
                        for (int co = 0; co < cout; co++) o[co] += wr[co] * x;
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
