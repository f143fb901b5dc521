/* `g4 synth`: writes a random checkpoint folder with the exact on-disk layout of a Gemma 4
 * QAT mobile checkpoint (checkpoint.md §1-§7), so the engine can be run, profiled and tested
 * at full size without downloading the real weights.
 *
 * The tensor list is derived from the generated config.json through the engine's own config
 * parser (g4_config_parse, g4_config_module_bits), so synth and loader agree by construction:
 * a preset changes the config, never the tensor code (except the e2b-drafter preset, whose
 * gemma4_assistant config that parser does not take: its tensor list comes from the preset's
 * shape, and tests/test_synth.c checks it against transformers' state dict). Values are random
 * but sized like the real model's (dequantized weights of RMS about 1/sqrt(in), activation
 * scales 0.01-0.1, norms and layer_scalar near 1, v_cache_scale 6/127, lm_head activation
 * scales 0), and lm_head is a byte copy of embed_tokens as in the published file. Everything
 * is a function of (preset, seed): same inputs, same bytes. */
#ifndef G4_MODEL_SYNTH_H
#define G4_MODEL_SYNTH_H

#include <stdint.h>

typedef struct {
    int n_tensors;       /* in model.safetensors, including the dummy vision/audio ones */
    int n_text_tensors;  /* under model.language_model. or lm_head. (the drafter: all of them) */
    uint64_t text_bytes; /* payload of the text tensors */
    uint64_t file_bytes; /* size of model.safetensors */
} g4_synth_stats;

/* Preset names, NULL-terminated: "e2b" (the real E2B text decoder, 2.1 GB), "e4b", "e2b-q4_0",
 * "e2b-bf16", "tiny" (the shape of the shared tiny-mobile fixture, ~0.4 MB) and "e2b-drafter":
 * E2B's MTP drafter google/gemma-4-E2B-it-assistant (model_type gemma4_assistant, 78 M BF16
 * parameters, 158 MB), from that checkpoint's config.json as summarized in a public Gemma 4 MTP
 * integration guide, shapes cross-checked against transformers 5.17's
 * Gemma4AssistantConfig/Gemma4AssistantForCausalLM. */
extern const char *const g4_synth_presets[];

/* Writes out_dir/{config.json, generation_config.json, tokenizer.json, model.safetensors},
 * creating out_dir (and its parents) if needed. tokenizer_src: a tokenizer.json to copy, or
 * NULL for a generated Gemma-style BPE tokenizer of the model's vocab size. The drafter
 * preset writes only config.json and model.safetensors (it runs on its target's tokenizer)
 * and refuses a tokenizer_src. Returns 0, or -1 with a message in g4_last_error(). */
int g4_synth(const char *preset, const char *out_dir, uint64_t seed, const char *tokenizer_src);
/* Same, and fills *stats (may be NULL). */
int g4_synth_ex(const char *preset, const char *out_dir, uint64_t seed, const char *tokenizer_src, g4_synth_stats *stats);

/* Same, and with towers != 0 also a vision tower and an audio conformer of the real E2B/E4B
 * sizes (multimodal.md §3, §5; the tiny preset: small towers of the same structure) in the mobile
 * layout: 8-bit vision linears, 2-bit audio linears (lconv1d.linear_start 4-bit), each with
 * static int8 activation scales, the float parts BF16, and the real vision_config/audio_config.
 * Only the mobile presets (e2b, e4b, tiny) take towers. */
int g4_synth_towers(const char *preset, const char *out_dir, uint64_t seed, const char *tokenizer_src, int towers, g4_synth_stats *stats);

/* The config.json text a preset writes (malloc'd), or NULL on an unknown preset. */
char *g4_synth_config_json(const char *preset);

/* Writes a small valid Gemma-style tokenizer.json with `vocab` entries: the control tokens at
 * their real ids (those below `vocab`), byte tokens <0x00>..<0xFF> at 238..493, then filler
 * pieces (single characters, then pairs and triples reachable through merges). */
int g4_synth_write_tokenizer(const char *path, int vocab);

#endif
