/* g4_tanhf is non-decreasing over every float: the greedy lm_head shortcut (g4_codes_f32_argmax)
 * relies on it to rule out outputs from their bounds. Checked exhaustively over [0, 10] (it is
 * exactly 1 from 9 on, and odd: copysign of the magnitude's result), together with the dispatched
 * level's softcap, which must give the same bits as g4_tanhf on every one of those floats. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/kernels.h"

#define BLOCK 65536

int main(void) {
    const g4_kernels *k = g4_kernels_get();
    const uint32_t last = 0x41200000u; /* 10.0f */
    float *x = malloc(sizeof(float) * BLOCK), *t = malloc(sizeof(float) * BLOCK), *v = malloc(sizeof(float) * BLOCK);
    long decreases = 0, differs = 0, odd = 0;
    float prev = 0.0f;
    for (uint32_t u0 = 0; x && t && v && u0 <= last; u0 += BLOCK) {
        uint32_t n = last - u0 + 1 < BLOCK ? last - u0 + 1 : BLOCK;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t u = u0 + i;
            memcpy(&x[i], &u, 4);
            t[i] = g4_tanhf(x[i]);
            decreases += t[i] < prev;
            prev = t[i];
            if ((u & 0xFFF) == 0) odd += g4_tanhf(-x[i]) != -t[i] || signbit(g4_tanhf(-x[i])) == signbit(t[i]);
        }
        memcpy(v, x, sizeof(float) * n);
        k->softcap(v, n, 1.0f);
        differs += memcmp(v, t, sizeof(float) * n) != 0;
    }
    CHECK(x && t && v, "buffers");
    CHECK(decreases == 0, "g4_tanhf non-decreasing on [0, 10] (%ld decreases)", decreases);
    CHECK(prev == 1.0f && g4_tanhf(INFINITY) == 1.0f, "g4_tanhf(10) = g4_tanhf(inf) = 1");
    CHECK(odd == 0, "g4_tanhf(-x) = -g4_tanhf(x) (%ld exceptions)", odd);
    CHECK(differs == 0, "%s softcap(x, 1) = g4_tanhf(x) on every float of [0, 10] (%ld blocks differ)", k->name, differs);
    free(x);
    free(t);
    free(v);
    return check_report("tanh_monotone");
}
