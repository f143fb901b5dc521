/* `g4 quantize --q4_0`: a checkpoint without quantization_config (BF16, such as
 * gemma-4-E2B-it-qat-q4_0-unquantized) rewritten into the block-scaled form of the checkpoint
 * format g4 reads (checkpoint.md's "gemma" layout with block_size 32), so that one loader serves
 * every checkpoint:
 *   - every decoder-layer linear (self_attn q/k/v/o, mlp gate/up/down, per_layer_input_gate,
 *     per_layer_projection): Q4_0 (quant/blockq.h), `X.weight` U8 [out, in / 2] (two codes per
 *     byte, element 2j in the low nibble, code + 8) and `X.weight_scale` F16 [out, in / 32];
 *   - embed_tokens and embed_tokens_per_layer (and an untied lm_head): Q8_0 by default (the
 *     embedding and output type of llama.cpp's QAT Q4_0 recipe), `E.embedding_quantized` I8 and
 *     `E.embedding_scale` F16 [rows, cols / 32]; or Q4_0, or left BF16 (embed);
 *   - a BF16 matrix among those whose rows are not whole blocks of 32: kept BF16 (Q8_0 has
 *     the same blocks), named in modules_to_not_convert, as llama.cpp falls back to a float type;
 *   - everything else (norms, layer scalars, per_layer_model_projection, the vision and audio
 *     towers) copied as it is;
 *   - config.json gains a quantization_config saying so: quant_method "gemma", num_bits 4,
 *     block_size 32, the embeddings' bits in module_quant_configs, and modules_to_not_convert
 *     for what stays float. The folder's other files (tokenizer, generation config) are copied.
 * tests/test_blocks.c checks the output against an independent numpy quantizer
 * (tests/fixtures/tiny-q4_0). */
#ifndef G4_MODEL_QUANTIZE_H
#define G4_MODEL_QUANTIZE_H

#include <stdint.h>

typedef enum { G4_EMBED_Q8_0 = 0, G4_EMBED_Q4_0 = 1, G4_EMBED_BF16 = 2 } g4_embed_quant;

typedef struct {
    int n_quantized, n_copied; /* input tensors */
    uint64_t bytes_in;         /* payload of the input tensors */
    uint64_t file_bytes;       /* size of the written model.safetensors */
    /* The modules (weight names without ".weight") that were to be quantized but stay BF16
     * because their rows are not whole blocks of 32 (Q8_0's blocks are 32 too): copied as they
     * are and listed in modules_to_not_convert. Malloc'd; g4_quantize_stats_free frees them. */
    char **kept_bf16;
    int n_kept_bf16;
} g4_quantize_stats;

/* The quantization_config object the output says it has (a cJSON *, which the caller frees), or
 * NULL when out of memory; `g4 synth --preset e2b-q4_0` writes the same. assistant: for an MTP
 * drafter (gemma4_assistant), whose decoder and tied embedding sit under model. */
void *g4_quantize_config_json(g4_embed_quant embed, int assistant);

/* Writes out_dir (created if needed; not in_dir) from the checkpoint folder in_dir. Returns 0, or
 * -1 with a one-line message in g4_last_error() naming the file, tensor or field; nothing is left
 * at out_dir/model.safetensors on failure. stats may be NULL; when given, free it with
 * g4_quantize_stats_free. A BF16 matrix to be quantized whose rows are not whole blocks of 32 (a
 * 16-wide per_layer_projection) stays BF16 (stats->kept_bf16) instead of failing the checkpoint;
 * an F16 or F32 one is refused (g4 reads float linears as BF16). */
int g4_quantize_q4_0(const char *in_dir, const char *out_dir, g4_embed_quant embed, g4_quantize_stats *stats);
void g4_quantize_stats_free(g4_quantize_stats *stats);

#endif
