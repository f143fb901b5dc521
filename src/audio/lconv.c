/* The core of the conformer's light convolution (transformers' Gemma4AudioLightConv1d between
 * linear_start and conv_norm): GLU over the feature halves, then a causal depthwise Conv1d
 * (left padding kernel - 1, no bias). The checkpoint keeps the depthwise weight float. */
#include <math.h>
#include <stdlib.h>

#include "audio/audio.h"
#include "util/err.h"

int g4_audio_glu_depthwise_conv(const float *x, int T, int C, const float *w, int kernel, float *out) {
    float *g = malloc((size_t)T * C * sizeof *g);
    if (!g) return g4_fail("audio: out of memory for the light convolution of %d frames", T);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            const float *row = x + (size_t)t * 2 * C;
            g[(size_t)t * C + c] = row[c] * (1.0f / (1.0f + expf(-row[C + c])));   /* a x sigmoid(b) */
        }
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            float acc = 0.0f;
            for (int k = 0; k < kernel; k++) {
                int ti = t + k - (kernel - 1);
                if (ti >= 0) acc += w[c * kernel + k] * g[(size_t)ti * C + c];
            }
            out[(size_t)t * C + c] = acc;
        }
    free(g);
    return 0;
}
