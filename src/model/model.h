/* The loaded model: config, memory-mapped checkpoint, and every tensor the text decoder needs
 * bound to typed views (weights stay packed in the map; norms and scales are copied to f32). */
#ifndef G4_MODEL_MODEL_H
#define G4_MODEL_MODEL_H

#include "format/config.h"
#include "format/safetensors.h"
#include "g4.h"
#include "kernels/kernels.h"
#include "model/modules.h"

typedef struct {
    int id;         /* index among the model's linears (per-session tables use it) */
    char name[128]; /* module name, e.g. model.language_model.layers.3.mlp.gate_proj */
    g4_qweight w;
    float s_in, s_out; /* static activation scales; 0 = not quantized */
} g4_linear;

/* An embedding table [rows, cols]: packed codes with per-(row, block) scales, or BF16 values
 * (bits == G4_WT_BF16, no scales: a checkpoint without quantized embeddings). */
typedef struct {
    int bits; /* a g4_wtype */
    int rows, cols, nblocks;
    size_t row_bytes;
    const uint8_t *codes;   /* codes, or the BF16 values */
    const g4_tensor *scale; /* F32 or F16 [rows, nblocks], read row by row from the map; NULL for BF16 */
} g4_qembedding;

typedef struct {
    int type;       /* G4_LAYER_SLIDING / G4_LAYER_FULL */
    int head_dim;
    int n_kv_heads;
    int kv_source;  /* layer whose K/V this layer attends to (itself for producers; G4_KV_FROM_TARGET in a drafter) */
    int mlp_dim;
    g4_linear q, k, v, o, gate, up, down, pl_gate, pl_proj; /* k, v unbound on consumers */
    float *ln_in, *ln_post_attn, *ln_pre_ffw, *ln_post_ffw, *ln_post_pli, *q_norm, *k_norm;
    float layer_scalar;
    float k_cache_scale, v_cache_scale; /* producers only; 0 = not quantized */
    float *inv_freq; /* [head_dim / 2] RoPE frequencies (0 = dimension pair not rotated) */
} g4_layer;

struct g4_model {
    char *dir;
    g4_config cfg;
    g4_safetensors st;
    const char *prefix; /* "model.language_model." */
    g4_qembedding embed, embed_ple;
    g4_linear pmp;       /* per_layer_model_projection (BF16) */
    float *ple_norm;     /* per_layer_projection_norm [ple_dim] */
    float *final_norm;   /* norm [hidden] */
    g4_linear lm_head;
    g4_layer *layers;
    int n_linears;       /* ids handed out by bind_linear */
    void *resident;      /* the streamed weights' copy (model.c, resident weights); NULL: mapped */
    size_t resident_len; /* its mapping's length */
    void **owned;        /* f32 copies made at load, and the levels' prepared weights */
    /* The level whose prepared copies of the weights (kernels.h, g4_wprep) the linears carry, NULL
     * for none (a level without the hook, --weights mapped, a drafter). */
    const g4_kernels *prep_level;
    int n_owned, cap_owned;
    /* Whether the checkpoint carries static activation quantization (the mobile recipe: some
     * linear or KV-cache scale is not 0). Without it every --act mode computes float activations,
     * and the per_layer_model_projection quantization, which belongs to the mobile graph, is
     * off. */
    int static_act;
    float embed_scale;   /* f32(sqrt(hidden)) */
    float ple_embed_scale; /* f32(sqrt(ple_dim)) */
    /* The vision tower (vision/tower.c), bound on the first image (a text-only run never pays
     * for it), and how g4_model_free frees it (a pointer, so the library core links without
     * the media sources). */
    void *vision;
    void (*vision_free)(void *);
    /* The audio tower (audio/tower.c), bound on the first audio clip, likewise. */
    void *audio;
    void (*audio_free)(void *);
};

/* The layer's bound linears, in the module table's order (modules.h; consumers have no k/v).
 * Returns how many were written. */
int g4_layer_linears(const g4_layer *L, int producer, const g4_linear *out[G4_LAYER_LINEARS]);

static inline int g4_layer_is_producer(const g4_model *m, int l) { return m->layers[l].kv_source == l; }

/* A drafter's layers attend to the target's K/V (draft.c picks the target layer per attention type). */
#define G4_KV_FROM_TARGET (-2)

/* Binds the linear `module` ([out, in]) of m's checkpoint; its bit width comes from the
 * quantization config (model.c, for the drafter's own linears too). */
int g4_model_bind_linear(g4_model *m, g4_linear *lin, const char *module, int in, int out);
/* The decoder of a gemma4_assistant folder (draft.c adds its projections and embedder); the
 * weights stay mapped. Fails on any other model_type. */
g4_model *g4_model_load_drafter(const char *dir);

#endif
