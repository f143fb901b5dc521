/* Block quantizers: llama.cpp's Q4_0 and Q8_0 rules, one scale per block of 32 inputs, written
 * from their description (ggml/src/ggml-quants.c, quantize_row_q4_0_ref and quantize_row_q8_0_ref;
 * read, not copied). Q4_0 is the format the Gemma QAT q4_0 checkpoints are trained for ("Q4_0"
 * in their names; the unquantized ones are the float weights before this step). Q8_0 is what
 * llama.cpp's QAT Q4_0 recipe uses for token_embd and output (ggml-org/llama.cpp#15588).
 * Same build rules as the rest: -ffp-contract=off (x * id + 8.5 is two roundings), no
 * -ffast-math. */
#ifndef G4_QUANT_BLOCKQ_H
#define G4_QUANT_BLOCKQ_H

#include <stdint.h>

#define G4_QBLOCK 32

/* Q4_0 of one block x[0..31]: max = the element of largest magnitude (the first of equals, with
 * its sign; +0 for a block of zeros), d = max / -8 and id = 1/d (0 when d is 0) in f32, code[i] =
 * min(15, trunc(x[i] * id + 8.5)) - 8 in -8..7. Returns d; the stored scale is d rounded to
 * float16 (g4_f32_to_f16), and the block dequantizes to code x that scale. */
float g4_q4_0_block(const float *x, int8_t *codes);

/* Q8_0 of one block: d = max|x| / 127, code[i] = roundf(x[i] / d) (x[i] * (1/d), half away from
 * zero) in -127..127, 0 for a block of zeros. Returns d (stored as float16, as Q4_0's). */
float g4_q8_0_block(const float *x, int8_t *codes);

/* IEEE binary16 nearest to f (ties to even), with subnormals; infinity past 65504 (65520 and
 * up), NaN stays NaN. */
uint16_t g4_f32_to_f16(float f);

#endif
