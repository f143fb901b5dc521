/* The decoder's module table (modules.h). */
#include "modules.h"

#include <stdio.h>
#include <string.h>

#include "model.h"

#define LIN(nm, o, i, part, bits, f) {nm, G4_MOD_LINEAR, o, i, part, bits, 0, 0, offsetof(g4_layer, f)}
#define VEC(nm, o, part, f) {nm, G4_MOD_VECTOR, o, 0, part, G4_BITS_OWN, 1, 0, offsetof(g4_layer, f)}
#define SCALAR(nm, kind, part, f) {nm, kind, 0, 0, part, G4_BITS_OWN, 1, 0, offsetof(g4_layer, f)}

const g4_module g4_layer_modules[] = {
    LIN("self_attn.q_proj", G4_DIM_Q, G4_DIM_HIDDEN, G4_PART_ALL, G4_BITS_ATTN, q),
    LIN("self_attn.k_proj", G4_DIM_KV, G4_DIM_HIDDEN, G4_PART_PRODUCER, G4_BITS_ATTN, k),
    LIN("self_attn.v_proj", G4_DIM_KV, G4_DIM_HIDDEN, G4_PART_PRODUCER, G4_BITS_ATTN, v),
    LIN("self_attn.o_proj", G4_DIM_HIDDEN, G4_DIM_Q, G4_PART_ALL, G4_BITS_ATTN, o),
    LIN("mlp.gate_proj", G4_DIM_MLP, G4_DIM_HIDDEN, G4_PART_ALL, G4_BITS_MLP, gate),
    LIN("mlp.up_proj", G4_DIM_MLP, G4_DIM_HIDDEN, G4_PART_ALL, G4_BITS_MLP, up),
    LIN("mlp.down_proj", G4_DIM_HIDDEN, G4_DIM_MLP, G4_PART_ALL, G4_BITS_MLP, down),
    LIN("per_layer_input_gate", G4_DIM_PLE, G4_DIM_HIDDEN, G4_PART_PLI, G4_BITS_PLI, pl_gate),
    LIN("per_layer_projection", G4_DIM_HIDDEN, G4_DIM_PLE, G4_PART_PLI, G4_BITS_PLI, pl_proj),
    VEC("input_layernorm", G4_DIM_HIDDEN, G4_PART_ALL, ln_in),
    VEC("post_attention_layernorm", G4_DIM_HIDDEN, G4_PART_ALL, ln_post_attn),
    VEC("pre_feedforward_layernorm", G4_DIM_HIDDEN, G4_PART_ALL, ln_pre_ffw),
    VEC("post_feedforward_layernorm", G4_DIM_HIDDEN, G4_PART_ALL, ln_post_ffw),
    VEC("post_per_layer_input_norm", G4_DIM_HIDDEN, G4_PART_PLI, ln_post_pli),
    VEC("self_attn.q_norm", G4_DIM_HEAD, G4_PART_ALL, q_norm),
    VEC("self_attn.k_norm", G4_DIM_HEAD, G4_PART_PRODUCER, k_norm),
    SCALAR("layer_scalar", G4_MOD_SCALAR, G4_PART_ALL, layer_scalar),
    SCALAR("self_attn.k_cache_scale", G4_MOD_CACHE_SCALE, G4_PART_PRODUCER, k_cache_scale),
    SCALAR("self_attn.v_cache_scale", G4_MOD_CACHE_SCALE, G4_PART_PRODUCER, v_cache_scale),
};
const int g4_n_layer_modules = (int)(sizeof g4_layer_modules / sizeof *g4_layer_modules);

_Static_assert(G4_LAYER_LINEARS == 9, "g4_layer_linears (model.h) returns up to nine linears");

const g4_module g4_global_modules[] = {
    {"embed_tokens", G4_MOD_EMBEDDING, G4_DIM_VOCAB, G4_DIM_HIDDEN, G4_PART_ALL, G4_BITS_OWN, 0, 0, 0},
    {"embed_tokens_per_layer", G4_MOD_EMBEDDING, G4_DIM_VOCAB_PLE, G4_DIM_PLE_ALL, G4_PART_PLI, G4_BITS_OWN, 0, 0, 0},
    /* BF16 in every recipe: modules_to_not_convert (activation-quant.md §6) */
    {"per_layer_model_projection", G4_MOD_LINEAR, G4_DIM_PLE_ALL, G4_DIM_HIDDEN, G4_PART_PLI, G4_BITS_OWN, 1, 0, 0},
    {"per_layer_projection_norm", G4_MOD_VECTOR, G4_DIM_PLE, 0, G4_PART_PLI, G4_BITS_OWN, 1, 0, 0},
    {"norm", G4_MOD_VECTOR, G4_DIM_HIDDEN, 0, G4_PART_ALL, G4_BITS_OWN, 1, 0, 0},
    /* its own tensors, or tied to embed_tokens (model.c, bind_lm_head) */
    {"lm_head", G4_MOD_LINEAR, G4_DIM_VOCAB, G4_DIM_HIDDEN, G4_PART_ALL, G4_BITS_OWN, 0, 1, 0},
    {"pre_projection", G4_MOD_LINEAR, G4_DIM_HIDDEN, G4_DIM_BACKBONE_X2, G4_PART_DRAFTER, G4_BITS_OWN, 0, 1, 0},
    {"post_projection", G4_MOD_LINEAR, G4_DIM_BACKBONE, G4_DIM_HIDDEN, G4_PART_DRAFTER, G4_BITS_OWN, 0, 1, 0},
    /* with use_ordered_embeddings (draft.c) */
    {"masked_embedding.centroids", G4_MOD_LINEAR, G4_DIM_CENTROIDS, G4_DIM_HIDDEN, G4_PART_DRAFTER, G4_BITS_OWN, 0, 1, 0},
};
const int g4_n_global_modules = (int)(sizeof g4_global_modules / sizeof *g4_global_modules);

const char *const g4_media_parts[] = {"model.vision_tower", "model.audio_tower", "model.embed_vision", "model.embed_audio"};
const int g4_n_media_parts = (int)(sizeof g4_media_parts / sizeof *g4_media_parts);

g4_layer_shape g4_layer_shape_of(const g4_config *c, int l) {
    g4_layer_shape s;
    s.type = c->layer_types[l];
    s.head_dim = s.type == G4_LAYER_FULL ? c->global_head_dim : c->head_dim;
    s.n_kv_heads = s.type == G4_LAYER_FULL ? c->n_global_kv_heads : c->n_kv_heads;
    /* the last num_kv_shared_layers read an earlier layer's K/V; a drafter's every layer the target's */
    s.producer = !c->assistant && l < c->n_layers - c->n_kv_shared;
    s.mlp_dim = c->intermediate * (c->double_wide_mlp && !s.producer ? 2 : 1);
    return s;
}

int g4_dim_size(const g4_config *c, const g4_layer_shape *ls, g4_dim d) {
    switch (d) {
    case G4_DIM_HIDDEN: return c->hidden;
    case G4_DIM_Q: return c->n_heads * ls->head_dim;
    case G4_DIM_KV: return ls->n_kv_heads * ls->head_dim;
    case G4_DIM_HEAD: return ls->head_dim;
    case G4_DIM_MLP: return ls->mlp_dim;
    case G4_DIM_PLE: return c->ple_dim;
    case G4_DIM_PLE_ALL: return c->n_layers * c->ple_dim;
    case G4_DIM_VOCAB: return c->vocab;
    case G4_DIM_VOCAB_PLE: return c->vocab_ple;
    case G4_DIM_BACKBONE: return c->backbone_hidden;
    case G4_DIM_BACKBONE_X2: return 2 * c->backbone_hidden;
    case G4_DIM_CENTROIDS: return c->n_centroids;
    }
    return 0;
}

int g4_module_present(const g4_config *c, const g4_layer_shape *ls, const g4_module *md) {
    switch (md->part) {
    case G4_PART_ALL: return 1;
    case G4_PART_PRODUCER: return ls && ls->producer;
    case G4_PART_PLI: return c->ple_dim > 0;
    case G4_PART_DRAFTER: return c->assistant;
    }
    return 0;
}

const g4_module *g4_global_module(const char *name) {
    for (int i = 0; i < g4_n_global_modules; i++)
        if (strcmp(g4_global_modules[i].name, name) == 0) return &g4_global_modules[i];
    return NULL;
}

void g4_layer_module_name(char *out, size_t cap, const char *prefix, int l, const g4_module *md) {
    snprintf(out, cap, "%slayers.%d.%s", prefix, l, md->name);
}

void g4_global_module_name(char *out, size_t cap, const char *prefix, const g4_module *md) {
    snprintf(out, cap, "%s%s", md->top ? "" : prefix, md->name);
}
