/* config.json of a Gemma 4 checkpoint: the text decoder's shape (text_config, or the top level
 * for a text-only config) and the "gemma" quantization_config (checkpoint.md §3-§4).
 * Everything the engine needs is read here; nothing about E2B is assumed. */
#ifndef G4_FORMAT_CONFIG_H
#define G4_FORMAT_CONFIG_H

#include <stdint.h>

enum { G4_LAYER_SLIDING = 0, G4_LAYER_FULL = 1 };

typedef struct {
    double theta;
    double partial_rotary_factor; /* 1 for "default" */
    int proportional;             /* rope_type "proportional" */
} g4_rope_config;

typedef struct {
    char *pattern; /* Python regex, as written in the file */
    void *code;    /* compiled pcre2_code* */
    int bits;
    int block_size; /* -1: the config's block_size */
} g4_quant_pattern;

/* What the checkpoint's quantization_config says: none at all (a plain BF16 checkpoint such as
 * gemma-4-E2B-it or -qat-q4_0-unquantized: every weight BF16, no activation quantization), or
 * quant_method "gemma": packed codes with one scale per output row (the mobile format) or, with
 * block_size > 0, one scale per block of block_size inputs (what `g4 quantize --q4_0` writes). */
enum { G4_QUANT_NONE = 0, G4_QUANT_GEMMA = 1 };

typedef struct {
    int method; /* G4_QUANT_* */
    int num_bits;
    int block_size; /* 0: one scale per output row; else inputs per scale */
    int quantize_embeddings;
    int n_patterns;
    g4_quant_pattern *patterns; /* file order, which decides precedence */
    int n_not_convert;
    char **not_convert;
    void **not_convert_code; /* pcre2 for re.match(k + "\\.") and re.match(k) */
    void **not_convert_code_dot;
} g4_quant_config;

#define G4_MAX_STOP_IDS 16

typedef struct {
    int hidden;          /* hidden_size */
    int n_layers;        /* num_hidden_layers */
    int n_heads;         /* num_attention_heads */
    int n_kv_heads;      /* num_key_value_heads (sliding layers) */
    int n_global_kv_heads; /* num_global_key_value_heads, or n_kv_heads when null */
    int head_dim;        /* sliding layers */
    int global_head_dim; /* full layers */
    int intermediate;    /* intermediate_size */
    int double_wide_mlp; /* use_double_wide_mlp: KV-shared layers use 2 x intermediate */
    int n_kv_shared;     /* num_kv_shared_layers */
    int ple_dim;         /* hidden_size_per_layer_input */
    int vocab;           /* vocab_size */
    int vocab_ple;       /* vocab_size_per_layer_input */
    int sliding_window;
    int max_positions;
    double rms_eps;
    double final_softcap; /* 0 = none */
    int tie_word_embeddings;
    int *layer_types; /* [n_layers], G4_LAYER_* */
    g4_rope_config rope[2];
    int bos_id, pad_id;
    int n_stop_ids;
    int stop_ids[G4_MAX_STOP_IDS];
    /* Sampling defaults of generation_config.json (has_sampling = 0: none given, or do_sample false). */
    int has_sampling;
    double temperature, top_p;
    int top_k;
    g4_quant_config quant;
    /* A gemma4_assistant (MTP drafter) config: the top level's fields (text_config is its decoder,
     * whose every layer reads the target's K/V, with no per-layer inputs). */
    int assistant;         /* model_type "gemma4_assistant" */
    int backbone_hidden;   /* backbone_hidden_size: the target's hidden size */
    int ordered_embeddings; /* use_ordered_embeddings: logits through the centroid-selected tokens */
    int n_centroids;       /* num_centroids */
    int centroid_top_k;    /* centroid_intermediate_top_k */
} g4_config;

/* Parses dir/config.json (and dir/generation_config.json for stop ids when present). */
int g4_config_load(g4_config *cfg, const char *dir);
/* Parses config.json text; `path` names the file in messages. */
int g4_config_parse(g4_config *cfg, const char *json_text, const char *path);
void g4_config_free(g4_config *cfg);

/* Bit width of a module (dotted name), by modules_to_not_convert and module_quant_configs
 * with Python re semantics. Returns 0 for "not converted" (stays float), and for every module
 * of a checkpoint without quantization_config. */
int g4_config_module_bits(const g4_config *cfg, const char *module);
/* Inputs per weight scale of a converted module (its pattern's block_size, else the config's):
 * 0 for one scale per output row. */
int g4_config_module_block(const g4_config *cfg, const char *module);

#endif
