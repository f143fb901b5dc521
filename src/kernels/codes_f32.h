/* The fixed-point image behind float activations x packed codes (kernels.h, G4_FIX_DIGITS), the
 * parts the full product (codes_f32.c) and the lm_head's argmax and top-k search (codes_argmax.c)
 * share. Internal to src/kernels/. */
#ifndef G4_KERNELS_CODES_F32_H
#define G4_KERNELS_CODES_F32_H

#include <float.h>
#include <math.h>
#include <stdint.h>

#include "kernels.h"

/* The row's S (|x| * 2^S < 2^G4_FIX_BITS), or INT32_MIN when it holds a NaN or an infinity. */
static inline int g4_fix_exponent(const float *x, int in) {
    float mx = 0;
    for (int i = 0; i < in; i++) {
        float a = fabsf(x[i]);
        if (!(a <= FLT_MAX)) return INT32_MIN;
        if (a > mx) mx = a;
    }
    int e = 0;
    if (mx > 0) frexpf(mx, &e); /* mx < 2^e */
    return G4_FIX_BITS - e;
}

/* X = x * 2^S rounded half to even: the product is exact in double (a power-of-two scale well
 * inside its range) and llrint rounds in the default mode. */
static inline int32_t fix_value(float x, double two_s) { return (int32_t)llrint((double)x * two_s); }

/* w_scale * dot * 2^-S for an integer dot (|dot| < 2^53, so exact in double): the scaled dot is
 * exact too, then rounded to f32 once. Monotone in dot when w_scale > 0. */
static inline float fix_result(double dot, double two_neg_s, float w_scale) { return w_scale * (float)(dot * two_neg_s); }

/* Activation rows per pass, and the int32 sums one pass keeps (they stay in L2 while they are
 * combined). */
#define FIX_ROWS 8
#define FIX_ACC (1 << 18)

#endif
