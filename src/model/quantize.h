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
} g4_quantize_stats;

/* The quantization_config object the output says it has (a cJSON *, which the caller frees), or
 * NULL when out of memory; `g4 synth --preset e2b-q4_0` writes the same. assistant: for an MTP
 * drafter (gemma4_assistant), whose decoder and tied embedding sit under model. */
void *g4_quantize_config_json(g4_embed_quant embed, int assistant);

/* Writes out_dir (created if needed; not in_dir) from the checkpoint folder in_dir. Returns 0, or
 * -1 with a one-line message in g4_last_error() naming the file, tensor or field; nothing is left
 * at out_dir/model.safetensors on failure. stats may be NULL. */
int g4_quantize_q4_0(const char *in_dir, const char *out_dir, g4_embed_quant embed, g4_quantize_stats *stats);

#endif
