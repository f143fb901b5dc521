#include "blockq.h"

#include <math.h>
#include <string.h>

float g4_q4_0_block(const float *x, int8_t *codes) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < G4_QBLOCK; i++)
        if (amax < fabsf(x[i])) { /* strict: the first of equal magnitudes keeps its sign */
            amax = fabsf(x[i]);
            max = x[i];
        }
    float d = max / -8.0f; /* the largest element maps to code -8 exactly */
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < G4_QBLOCK; i++) {
        float v = x[i] * id + 8.5f; /* in [0, 16.5] up to rounding: truncation rounds half up */
        int q = v > 0.0f ? (int)v : 0;
        codes[i] = (int8_t)((q > 15 ? 15 : q) - 8);
    }
    return d;
}

float g4_q8_0_block(const float *x, int8_t *codes) {
    float amax = 0.0f;
    for (int i = 0; i < G4_QBLOCK; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < G4_QBLOCK; i++) codes[i] = (int8_t)roundf(x[i] * id);
    return d;
}

uint16_t g4_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up round to infinity */
    if (a < 0x38800000u) { /* below 2^-14: a multiple of the subnormal step 2^-24, rounded to even */
        float v;
        memcpy(&v, &a, 4);
        return (uint16_t)(sign | (uint16_t)nearbyint((double)v * 16777216.0)); /* exact product; 1024 is the smallest normal */
    }
    uint32_t h = ((a >> 23) - 112u) << 10 | (a & 0x7fffffu) >> 13, rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* a carry moves into the exponent, as it should */
    return (uint16_t)(sign | h);
}
