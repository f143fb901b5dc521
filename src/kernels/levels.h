/* The kernel levels dispatch.c chooses from (internal to src/kernels/). Each level file defines
 * its table unconditionally and says at run time whether this build and CPU can use it. */
#ifndef G4_KERNELS_LEVELS_H
#define G4_KERNELS_LEVELS_H

#include "kernels.h"

extern const g4_kernels g4_kernels_portable;

/* The portable level's kernels (kernels/dispatch.c): the references split over the pool. A level
 * this build or CPU cannot have (AVX2 off x86, NEON off aarch64) uses the same table under its
 * own name, so its symbol always links. */
void g4_portable_matmul_f32(const g4_qweight *w, const float *x, int n, float *y);
void g4_portable_matmul_i8(const g4_qweight *w, const int8_t *x, int n, int32_t *acc);
#define G4_PORTABLE_KERNELS(NAME)                                                                        \
    {.name = NAME, .matmul_f32 = g4_portable_matmul_f32, .matmul_i8 = g4_portable_matmul_i8,              \
     .quantize = g4_ref_quantize, .fake_quant = g4_ref_fake_quant, .requant_f32 = g4_ref_requant_f32,     \
     .acc_scale = g4_ref_acc_scale, .gelu_mul = g4_portable_gelu_mul, .attention = g4_portable_attention, \
     .softcap = g4_portable_softcap}

/* The portable level's gelu_mul, attention and softcap (kernels/dispatch.c), for levels without their own. */
void g4_portable_gelu_mul(float *g, const float *m, size_t n, float scale);
void g4_portable_attention(const g4_attn *a);
void g4_portable_softcap(float *x, size_t n, float cap);
/* The softcap split over the pool, span(x, n, cap) doing each piece; work: per element, in
 * multiply-adds. */
void g4_softcap_pooled(float *x, size_t n, float cap, void (*span)(float *x, size_t n, float cap), double work_per_item);
/* An attention job's size in multiply-adds, for g4_pool_for. */
double g4_attention_work(const g4_attn *a);

/* x86: AVX2 (kernels/avx2.c). On other targets the table's functions are the portable ones and
 * g4_avx2_supported() is 0. */
extern const g4_kernels g4_kernels_avx2;
int g4_avx2_supported(void);

/* The AVX2 level's kernels (kernels/avx2.c; x86 only), which the VNNI levels reuse for everything
 * but the int8 matmuls. matmul_f32 runs float x codes through the AVX2 int8 matmul, so a level
 * calls it for BF16 weights only. */
void g4_avx2_matmul_f32(const g4_qweight *w, const float *x, int n, float *y);
void g4_avx2_quantize(const g4_quantizer *q, const float *x, size_t n, int8_t *codes);
void g4_avx2_fake_quant(const g4_quantizer *q, float *x, size_t n);
void g4_avx2_requant_f32(const int32_t *acc, int n, int out, const float *m32, float s_out, float *y);
void g4_avx2_acc_scale(const int32_t *acc, int n, int out, float s_in, const float *w_scale, float *y);
void g4_avx2_gelu_mul(float *g, const float *m, size_t n, float scale);
void g4_avx2_attention(const g4_attn *a);
void g4_avx2_softcap(float *x, size_t n, float cap);

/* x86-64: AVX-512 VNNI (kernels/avx512vnni.c: F, BW, VL, VNNI and VBMI, with the OS saving the ZMM
 * state) and AVX-VNNI (kernels/avxvnni.c: the VEX form of vpdpbusd on 256-bit vectors, for CPUs
 * without AVX-512). Elsewhere their tables are the portable ones and the checks say 0. */
extern const g4_kernels g4_kernels_avx512vnni;
int g4_avx512vnni_supported(void);
extern const g4_kernels g4_kernels_avxvnni;
int g4_avxvnni_supported(void);

/* aarch64: NEON (kernels/neon.c), always present on aarch64, 0 elsewhere. */
extern const g4_kernels g4_kernels_neon;
int g4_neon_supported(void);

#endif
