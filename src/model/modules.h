/* The Gemma 4 decoder's modules as data (gemma.cpp's configs-as-data): every tensor the text
 * decoder and the MTP drafter read, by checkpoint name, with its shape from config.json, the part
 * of the model it belongs to, and the bit-width class the published mobile checkpoints give it.
 * One table, read by the binding (model.c), `g4 inspect` (describe.c), `g4 synth` (synth.c) and
 * `g4 quantize` (quantize.c): a module added here is bound, described, synthesized and quantized.
 * Shapes are [out, in] for linears (transformers' nn.Linear), [rows, cols] for embedding tables,
 * [n] for vectors; checkpoint.md §5-§10 and model.md §3 give the names. */
#ifndef G4_MODEL_MODULES_H
#define G4_MODEL_MODULES_H

#include <stddef.h>

#include "format/config.h"

/* A dimension, read from the config (and, in a layer, from its attention type). */
typedef enum {
    G4_DIM_HIDDEN,      /* hidden_size */
    G4_DIM_Q,           /* num_attention_heads x the layer's head size */
    G4_DIM_KV,          /* the layer's K/V heads x its head size */
    G4_DIM_HEAD,        /* the layer's head size (head_dim, or global_head_dim on full layers) */
    G4_DIM_MLP,         /* the layer's MLP width (intermediate_size, twice on KV-shared layers of a double-wide MLP) */
    G4_DIM_PLE,         /* hidden_size_per_layer_input */
    G4_DIM_PLE_ALL,     /* num_hidden_layers x hidden_size_per_layer_input */
    G4_DIM_VOCAB,       /* vocab_size */
    G4_DIM_VOCAB_PLE,   /* vocab_size_per_layer_input */
    G4_DIM_BACKBONE,    /* a drafter's backbone_hidden_size (its target's hidden size) */
    G4_DIM_BACKBONE_X2, /* twice that: the drafter's pre_projection reads [embedding ; hidden state] */
    G4_DIM_CENTROIDS,   /* a drafter's num_centroids */
} g4_dim;

/* Which models and layers carry a module. */
typedef enum {
    G4_PART_ALL,      /* every layer (a drafter's too) */
    G4_PART_PRODUCER, /* a layer that writes its own K/V (bound on producers only; the file may carry it everywhere) */
    G4_PART_PLI,      /* the per-layer-input block: a model with hidden_size_per_layer_input > 0 */
    G4_PART_DRAFTER,  /* a gemma4_assistant's own modules */
} g4_part;

/* The bit width the published mobile checkpoints give a layer linear (checkpoint.md §4): the
 * attention's, the MLP's (which changes with the layer on E2B), or the per-layer-input block's. */
typedef enum { G4_BITS_ATTN, G4_BITS_MLP, G4_BITS_PLI, G4_BITS_OWN } g4_bits_class;

/* A linear (packed codes with scales, or BF16), an embedding table, a float vector (a norm's
 * `.weight`), a float scalar tensor, or a K/V-cache activation scale (a scalar the mobile format
 * requires and other recipes may leave out). */
typedef enum { G4_MOD_LINEAR, G4_MOD_EMBEDDING, G4_MOD_VECTOR, G4_MOD_SCALAR, G4_MOD_CACHE_SCALE } g4_mod_kind;

typedef struct {
    const char *name;   /* under layers.N. for a layer module, under the model's prefix for a global one
                         * ("model.language_model.", a drafter's "model."), or at the top level (top = 1) */
    g4_mod_kind kind;
    g4_dim out, in;     /* a linear's [out, in], an embedding's [rows, cols], a vector's [out] */
    g4_part part;
    g4_bits_class bits; /* layer linears: the published checkpoints' class */
    int kept_float;     /* stays BF16 in every recipe (modules_to_not_convert) */
    int top;            /* named at the top level, not under the prefix (lm_head, a drafter's projections) */
    size_t field;       /* layer modules: the offset of its g4_linear / float * / float in g4_layer (model.h) */
} g4_module;

/* A layer's shape as the config gives it: attention type, head size, K/V heads, MLP width, and
 * whether it writes its own K/V (a drafter's layers never do: they read the target's). */
typedef struct {
    int type, head_dim, n_kv_heads, mlp_dim, producer;
} g4_layer_shape;

g4_layer_shape g4_layer_shape_of(const g4_config *c, int l);
/* A dimension of layer shape ls (NULL for a global module) under config c. */
int g4_dim_size(const g4_config *c, const g4_layer_shape *ls, g4_dim d);
/* Whether a model of config c binds module md on a layer of shape ls (NULL: a global module). */
int g4_module_present(const g4_config *c, const g4_layer_shape *ls, const g4_module *md);

/* The layer modules, in the order `g4 inspect` lists them: the nine linears (q, k, v, o, gate, up,
 * down, per-layer-input gate and projection), then the norms, the layer scalar and the K/V-cache
 * scales. */
#define G4_LAYER_LINEARS 9
extern const g4_module g4_layer_modules[];
extern const int g4_n_layer_modules;

/* The global modules: embeddings, the per-layer-input projection and its norm, the final norm,
 * the lm_head, and a drafter's projections and centroids. */
extern const g4_module g4_global_modules[];
extern const int g4_n_global_modules;

/* The checkpoint's parts beside the decoder (multimodal.md): the vision and audio towers and their
 * embedders into the text model, bound by src/vision and src/audio, never by the decoder's binding.
 * A writer that quantizes the decoder only (g4 quantize) leaves them float: modules_to_not_convert
 * lists them, then the table's kept-float linears. */
extern const char *const g4_media_parts[];
extern const int g4_n_media_parts;

/* A global module by name, or NULL. */
const g4_module *g4_global_module(const char *name);
/* Layer l's module `md` under prefix ("model.language_model." or "model."): out[cap]. */
void g4_layer_module_name(char *out, size_t cap, const char *prefix, int l, const g4_module *md);
/* The global module `md`'s name under prefix (or at the top level). */
void g4_global_module_name(char *out, size_t cap, const char *prefix, const g4_module *md);

#endif
