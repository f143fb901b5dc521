/* The kernel levels (internal to src/kernels/ and the bench). */
#ifndef G4_KERNELS_LEVELS_H
#define G4_KERNELS_LEVELS_H

#include "kernels.h"

/* Every level, best first: the one list that dispatch (g4_kernels_best, G4_DISPATCH), the tests,
 * the benchmarks and `make dispatch-test` (which reads these lines) go through. LEVEL(name) stands
 * for g4_kernels_<name>, which the level's own file defines on every target: on a target it is
 * not for, as G4_LEVEL_NOT_BUILT. Adding a level is its file, its line here and its entry in
 * sources.mk. */
#define G4_KERNEL_LEVELS(LEVEL) \
    LEVEL(amx)                  \
    LEVEL(avx512vnni)           \
    LEVEL(avxvnni)              \
    LEVEL(avx2)                 \
    LEVEL(neon)                 \
    LEVEL(portable)

#define G4_DECLARE_LEVEL(name) extern const g4_kernels g4_kernels_##name;
G4_KERNEL_LEVELS(G4_DECLARE_LEVEL)
#undef G4_DECLARE_LEVEL

/* A level this build does not compile (another architecture's): named, so that G4_DISPATCH can
 * say it is not there, and never offered. */
#define G4_LEVEL_NOT_BUILT(NAME, NEEDS) {.name = NAME, .cpu_needs = NEEDS, .built = 0}

/* Outputs [o0, o1) of g4_ref_matmul_blocks_f32 (y keeps its [n][out] layout): the reference the
 * portable level splits over the pool. */
void g4_ref_matmul_blocks_rows(const g4_qweight *w, const float *x, int n, float *y, int o0, int o1);

/* The portable level's kernels (kernels/portable.c): the references split over the pool. The
 * other levels use the ones they have no faster form of. */
void g4_portable_matmul_f32(const g4_qweight *w, const float *x, int n, float *y);
void g4_portable_matmul_blocks_f32(const g4_qweight *w, const float *x, int n, float *y);
void g4_portable_matmul_i8(const g4_qweight *w, const int8_t *x, int n, int32_t *acc);
void g4_portable_gelu_mul(float *g, const float *m, size_t n, float scale);
void g4_portable_attention(const g4_attn *a);
void g4_portable_softcap(float *x, size_t n, float cap);
/* The softcap split over the pool, span(x, n, cap) doing each piece; work: per element, in
 * multiply-adds. */
void g4_softcap_pooled(float *x, size_t n, float cap, void (*span)(float *x, size_t n, float cap), double work_per_item);
/* An attention job's size in multiply-adds, for g4_pool_for. */
double g4_attention_work(const g4_attn *a);

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

/* The AVX-512 VNNI level's prepared activations (kernels/avx512vnni.c, vnni.h's prepare): x [n][in]
 * as one 64-byte vector per field per 64-byte weight block of `bits`-bit codes, nblk blocks a row,
 * xstride bytes apart, and corr[t] = off * sum x[t] (mod 2^32). The AMX level's B tiles are made
 * from them. */
void g4_avx512vnni_prepare(const int8_t *x, int n, int in, int bits, size_t nblk, uint8_t *xp, size_t xstride, uint32_t *corr);

/* The AMX level's tile matmul for any number of activation rows (kernels/amx.c; its matmul_i8
 * runs it from amx_min_rows(bits) rows): for the tests, which check every shape edge of the tiles. Only
 * on a CPU where the amx level is available. */
void g4_amx_matmul_i8_tiles(const g4_qweight *w, const int8_t *x, int n, int32_t *acc);

/* The AMX level's prepared weights (kernels/amx_pack.c, plain C on every target; the layout is
 * described there): its prepare entry, g4_amx_prepare, repacks a weight once into the A tiles
 * tdpbusd reads, groups of 16 rows of q = g4_amx_tile_vectors tiles of G4_AMX_TILE_BYTES. */
#define G4_AMX_TILE_BYTES 1024
size_t g4_amx_tile_vectors(int bits, int in);
/* The tiles of weight rows [o, o + 16) into dst (q tiles; rows at or past w->out zero). */
void g4_amx_pack_group(const g4_qweight *w, int o, uint8_t *dst);
/* w's copy, or NULL: block-scaled, BF16 or empty weights, or memory short. */
g4_wprep *g4_amx_prepare(const g4_qweight *w);
/* The tiles of view w's first group in the amx level's copy of its weight, or NULL: no such copy,
 * or w starts inside a group (the tiles then unpack the stored codes, as without the hook). */
const uint8_t *g4_amx_prepared_tiles(const g4_qweight *w);
/* Code of element i of weight row o read back from the copy p (for the tests). */
int g4_amx_prepared_code(const g4_wprep *p, int o, int i);

#endif
