#define _POSIX_C_SOURCE 200809L
#include "synth.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/config.h"
#include "format/safetensors_write.h"
#include "model/modules.h"
#include "model/quantize.h"
#include "quant/blockq.h"
#include "quant/pack.h"
#include "util/err.h"
#include "util/file.h"

/* ---- presets ---- */

/* How a preset's weights are stored: the mobile checkpoints' bit widths (checkpoint.md §3-§4; E4B:
 * every MLP 4-bit and a 2-bit per-layer table), or what `g4 quantize --q4_0` makes of the BF16
 * checkpoint (model/quantize.h: Q4_0 linears, Q8_0 embeddings, the lm_head tied to embed_tokens,
 * no activation scales), or that BF16 checkpoint itself (gemma-4-E2B-it's layout: no
 * quantization_config, BF16 everywhere, the lm_head tied), or the MTP drafter (below). */
enum { LAYOUT_MOBILE_E2B, LAYOUT_MOBILE_E4B, LAYOUT_Q4_0, LAYOUT_BF16, LAYOUT_DRAFTER };

typedef struct {
    const char *name;
    int hidden, n_layers, n_heads, n_kv_heads, head_dim, global_head_dim, intermediate, n_kv_shared, ple_dim, vocab,
        sliding_window;
    int full_every;  /* layer i is full attention when i % full_every == full_every - 1 */
    int double_wide; /* use_double_wide_mlp */
    int layout;
    /* LAYOUT_MOBILE_E2B: the module_quant_configs key that keeps the producer layers' MLPs at 4
     * bits; it names the producer range, so it is the one pattern that differs between its presets. */
    const char *mlp4_pattern;
    /* LAYOUT_DRAFTER: the target's hidden size (pre_projection reads 2x that) and the masked
     * embedding's centroid count and top-k */
    int backbone_hidden, n_centroids, centroid_top_k;
} preset_t;

/* The E4B text shape is transformers' conversion script's (src/transformers/models/gemma4/
 * convert_gemma4_weights.py, variant gemma-4-e4b: hidden 2560, intermediate 4 x 2560, 42 layers
 * of (5 sliding + 1 full) x 7, 8 heads, 2 KV heads, global head_dim 512, 18 KV-shared layers, no
 * double-wide MLP), which NVIDIA's Megatron-Bridge E4B recipe repeats; its mobile bit widths are
 * the same script's quantized branch (E4B: all MLPs and attention 4-bit, embed_tokens,
 * embed_tokens_per_layer and lm_head 2-bit, the per-layer gate and projection 8-bit). */
static const preset_t presets[] = {
    {"e2b", 1536, 35, 8, 1, 256, 512, 6144, 20, 256, 262144, 512, 5, 1, LAYOUT_MOBILE_E2B,
     "language_model\\.layers\\.(\\d|1[0-4])\\.mlp\\.", 0, 0, 0},
    {"e4b", 2560, 42, 8, 2, 256, 512, 10240, 18, 256, 262144, 512, 6, 0, LAYOUT_MOBILE_E4B, NULL, 0, 0, 0},
    {"e2b-q4_0", 1536, 35, 8, 1, 256, 512, 6144, 20, 256, 262144, 512, 5, 1, LAYOUT_Q4_0, NULL, 0, 0, 0},
    {"e2b-bf16", 1536, 35, 8, 1, 256, 512, 6144, 20, 256, 262144, 512, 5, 1, LAYOUT_BF16, NULL, 0, 0, 0},
    {"tiny", 64, 10, 2, 1, 16, 32, 96, 4, 16, 512, 8, 5, 1, LAYOUT_MOBILE_E2B, "language_model\\.layers\\.[0-5]\\.mlp\\.", 0, 0, 0},
    /* The MTP drafter of E2B, google/gemma-4-E2B-it-assistant (Gemma4AssistantForCausalLM):
     * google/gemma-4-E2B-it-assistant config.json as summarized in a public Gemma 4 MTP
     * integration guide; shapes cross-checked against transformers 5.17's
     * Gemma4AssistantConfig/Gemma4AssistantForCausalLM. A 4-layer decoder of width 256 (3
     * sliding + 1 full layer, every layer KV-shared: it reads the target's caches, so there
     * are no k/v projections), no per-layer embeddings, no softcap, lm_head tied to
     * embed_tokens, ~78 M parameters in BF16. */
    {"e2b-drafter", 256, 4, 4, 1, 256, 512, 2048, 4, 0, 262144, 512, 4, 0, LAYOUT_DRAFTER, NULL, 1536, 2048, 32},
};

const char *const g4_synth_presets[] = {"e2b", "e4b", "e2b-q4_0", "e2b-bf16", "tiny", "e2b-drafter", NULL};

static const preset_t *find_preset(const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (name && strcmp(presets[i].name, name) == 0) return &presets[i];
    g4_fail("unknown preset \"%s\" (e2b, e4b, e2b-q4_0, e2b-bf16, tiny, e2b-drafter)", name ? name : "");
    return NULL;
}

/* ---- random numbers ----
 * A counter-based stream (the splitmix64 sequence read at position i) rather than a stateful
 * generator: any chunk of any tensor can be produced independently, so the streaming writer
 * needs no state between calls and lm_head can replay embed_tokens' stream exactly. */

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t stream_at(uint64_t key, uint64_t i) { return mix64(key + (i + 1) * 0x9E3779B97F4A7C15ull); }

/* Key of a named stream: tensors and scalar draws get independent streams by name, so adding
 * a tensor to a preset never changes the values of the others. */
static uint64_t key_of(uint64_t seed, const char *name) {
    uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001B3ull;
    return mix64(mix64(seed) ^ h);
}

static float unit_f(uint64_t r) { return (float)(r >> 40) * 0x1p-24f; } /* [0, 1) */

static float draw(uint64_t seed, const char *tag, float lo, float hi) {
    return lo + (hi - lo) * unit_f(stream_at(key_of(seed, tag), 0));
}

/* ---- config.json ---- */

/* Python's repr of a float (what json.dumps writes), so the file reads like an HF config:
 * "30.0", "1e-06", "1000000.0". */
static cJSON *py_float(double v) {
    char buf[40];
    if (v == floor(v) && fabs(v) < 1e16) {
        snprintf(buf, sizeof buf, "%.1f", v);
    } else {
        for (int p = 1; p <= 17; p++) {
            snprintf(buf, sizeof buf, "%.*g", p, v);
            if (strtod(buf, NULL) == v) break;
        }
    }
    return cJSON_CreateRaw(buf);
}

static cJSON *int_list(const int *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static cJSON *bits_entry(int bits) {
    cJSON *o = cJSON_CreateObject();
    if (o) cJSON_AddNumberToObject(o, "num_bits", bits);
    return o;
}

/* quantization_config of the published mobile checkpoint (checkpoint.md §3; E4B: the patterns of
 * the preset table's source): keys in sorted order, which is the order HF writes and the order
 * that decides regex precedence; or g4 quantize's, for the Q4_0 layout. */
static cJSON *quant_config(const preset_t *p) {
    if (p->layout == LAYOUT_Q4_0) return g4_quantize_config_json(G4_EMBED_Q8_0, 0);
    int e4b = p->layout == LAYOUT_MOBILE_E4B;
    const struct {
        const char *pattern;
        int bits;
    } all[] = {
        {"^lm_head$", 2},
        {"audio_tower(?!.*lconv1d\\.linear_start)", 2},
        {"audio_tower\\.layers\\.\\d+\\.lconv1d\\.linear_start\\.", 4},
        {"language_model\\.embed_tokens$", 2},
        {"language_model\\.embed_tokens_per_layer$", e4b ? 2 : 4},
        {e4b ? NULL : p->mlp4_pattern, 4},
        {"language_model\\.layers\\.\\d+\\.mlp\\.", e4b ? 4 : 2},
        {"language_model\\.layers\\.\\d+\\.per_layer_input_gate$", 8},
        {"language_model\\.layers\\.\\d+\\.per_layer_projection$", 8},
        {"language_model\\.layers\\.\\d+\\.self_attn\\.", 4},
        {"vision_tower", 8},
    };
    struct {
        const char *pattern;
        int bits;
    } pats[sizeof all / sizeof all[0]];
    size_t n_pats = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i].pattern) pats[n_pats].pattern = all[i].pattern, pats[n_pats++].bits = all[i].bits;
    /* the towers' float modules, as the published file lists them; then the decoder's (modules.h) */
    static const char *const not_convert[] = {"model.vision_tower.patch_embedder", "model.audio_tower.subsample_conv_projection",
                                              "model.audio_tower.output_proj",     "relative_k_proj",
                                              "model.embed_audio",                 "model.embed_vision"};
    cJSON *q = cJSON_CreateObject(), *m = cJSON_CreateObject(), *nc = cJSON_CreateArray();
    for (size_t i = 0; i < n_pats; i++) cJSON_AddItemToObject(m, pats[i].pattern, bits_entry(pats[i].bits));
    for (size_t i = 0; i < sizeof not_convert / sizeof not_convert[0]; i++)
        cJSON_AddItemToArray(nc, cJSON_CreateString(not_convert[i]));
    for (int i = 0; i < g4_n_global_modules; i++)
        if (g4_global_modules[i].kind == G4_MOD_LINEAR && g4_global_modules[i].kept_float)
            cJSON_AddItemToArray(nc, cJSON_CreateString(g4_global_modules[i].name));
    cJSON_AddItemToObject(q, "module_quant_configs", m);
    cJSON_AddItemToObject(q, "modules_to_not_convert", nc);
    cJSON_AddNumberToObject(q, "num_bits", 4);
    cJSON_AddStringToObject(q, "quant_method", "gemma");
    cJSON_AddBoolToObject(q, "quantize_embeddings", 1);
    return q;
}

static cJSON *rope_entry(double theta, const char *type, double partial) {
    cJSON *o = cJSON_CreateObject();
    if (partial > 0) cJSON_AddItemToObject(o, "partial_rotary_factor", py_float(partial));
    cJSON_AddItemToObject(o, "rope_theta", py_float(theta));
    cJSON_AddStringToObject(o, "rope_type", type);
    return o;
}

/* The BF16 checkpoints and the drafter tie lm_head to embed_tokens; the mobile converter unties. */
static int tied(const preset_t *p) { return p->layout >= LAYOUT_Q4_0; }

/* text_config with the field set and values of the real E2B (checkpoint.md §3, model.md §1);
 * keys sorted as HF writes them. The drafter's is the same field set with its own values (its
 * source lists no attention_bias, attention_dropout, initializer_range, moe_intermediate_size,
 * num_experts, top_k_experts, use_bidirectional_attention or use_cache: those are written with
 * the values transformers 5.17's Gemma4TextConfig.to_dict gives them for that config). */
static cJSON *text_config(const preset_t *p) {
    cJSON *t = cJSON_CreateObject();
    cJSON_AddBoolToObject(t, "attention_bias", 0);
    cJSON_AddItemToObject(t, "attention_dropout", py_float(0.0));
    cJSON_AddBoolToObject(t, "attention_k_eq_v", 0);
    cJSON_AddNumberToObject(t, "bos_token_id", 2);
    cJSON_AddStringToObject(t, "dtype", "bfloat16");
    cJSON_AddBoolToObject(t, "enable_moe_block", 0);
    cJSON_AddNumberToObject(t, "eos_token_id", 1);
    if (p->layout == LAYOUT_DRAFTER) cJSON_AddNullToObject(t, "final_logit_softcapping");
    else cJSON_AddItemToObject(t, "final_logit_softcapping", py_float(30.0));
    cJSON_AddNumberToObject(t, "global_head_dim", p->global_head_dim);
    cJSON_AddNumberToObject(t, "head_dim", p->head_dim);
    cJSON_AddStringToObject(t, "hidden_activation", "gelu_pytorch_tanh");
    cJSON_AddNumberToObject(t, "hidden_size", p->hidden);
    cJSON_AddNumberToObject(t, "hidden_size_per_layer_input", p->ple_dim);
    cJSON_AddItemToObject(t, "initializer_range", py_float(0.02));
    cJSON_AddNumberToObject(t, "intermediate_size", p->intermediate);
    cJSON *lt = cJSON_CreateArray();
    for (int i = 0; i < p->n_layers; i++)
        cJSON_AddItemToArray(lt, cJSON_CreateString(i % p->full_every == p->full_every - 1 ? "full_attention" : "sliding_attention"));
    cJSON_AddItemToObject(t, "layer_types", lt);
    cJSON_AddNumberToObject(t, "max_position_embeddings", 131072);
    cJSON_AddStringToObject(t, "model_type", "gemma4_text");
    cJSON_AddNullToObject(t, "moe_intermediate_size");
    cJSON_AddNumberToObject(t, "num_attention_heads", p->n_heads);
    cJSON_AddNullToObject(t, "num_experts");
    cJSON_AddNullToObject(t, "num_global_key_value_heads");
    cJSON_AddNumberToObject(t, "num_hidden_layers", p->n_layers);
    cJSON_AddNumberToObject(t, "num_key_value_heads", p->n_kv_heads);
    cJSON_AddNumberToObject(t, "num_kv_shared_layers", p->n_kv_shared);
    cJSON_AddNumberToObject(t, "pad_token_id", 0);
    cJSON_AddItemToObject(t, "rms_norm_eps", py_float(1e-6));
    cJSON *rp = cJSON_CreateObject();
    cJSON_AddItemToObject(rp, "full_attention", rope_entry(1000000.0, "proportional", 0.25));
    cJSON_AddItemToObject(rp, "sliding_attention", rope_entry(10000.0, "default", 0));
    cJSON_AddItemToObject(t, "rope_parameters", rp);
    cJSON_AddNumberToObject(t, "sliding_window", p->sliding_window);
    cJSON_AddBoolToObject(t, "tie_word_embeddings", tied(p));
    cJSON_AddNullToObject(t, "top_k_experts");
    cJSON_AddNullToObject(t, "use_bidirectional_attention");
    cJSON_AddBoolToObject(t, "use_cache", 1);
    cJSON_AddBoolToObject(t, "use_double_wide_mlp", p->double_wide);
    cJSON_AddNumberToObject(t, "vocab_size", p->vocab);
    cJSON_AddNumberToObject(t, "vocab_size_per_layer_input", p->ple_dim ? p->vocab : 0);
    return t;
}

/* Placeholder tower configs: the synthetic towers are a handful of dummy tensors that exist
 * only so the loader's skipping is exercised; they describe no runnable tower. */
static cJSON *tower_config(const char *model_type) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "dtype", "bfloat16");
    cJSON_AddNumberToObject(o, "hidden_size", 32);
    cJSON_AddStringToObject(o, "model_type", model_type);
    cJSON_AddNumberToObject(o, "num_attention_heads", 2);
    cJSON_AddNumberToObject(o, "num_hidden_layers", 1);
    return o;
}

/* The drafter's top level (Gemma4AssistantConfig): the fields of the source above, plus dtype and
 * transformers_version as the other presets write them; keys sorted. */
static cJSON *drafter_config(const preset_t *p) {
    cJSON *r = cJSON_CreateObject();
    cJSON *arch = cJSON_CreateArray();
    cJSON_AddItemToArray(arch, cJSON_CreateString("Gemma4AssistantForCausalLM"));
    cJSON_AddItemToObject(r, "architectures", arch);
    cJSON_AddNumberToObject(r, "backbone_hidden_size", p->backbone_hidden);
    cJSON_AddNumberToObject(r, "centroid_intermediate_top_k", p->centroid_top_k);
    cJSON_AddStringToObject(r, "dtype", "bfloat16");
    cJSON_AddStringToObject(r, "model_type", "gemma4_assistant");
    cJSON_AddNumberToObject(r, "num_centroids", p->n_centroids);
    cJSON_AddItemToObject(r, "text_config", text_config(p));
    cJSON_AddBoolToObject(r, "tie_word_embeddings", 1);
    cJSON_AddStringToObject(r, "transformers_version", "5.17.0");
    cJSON_AddBoolToObject(r, "use_ordered_embeddings", 1);
    return r;
}

static cJSON *vision_config(const preset_t *p);
static cJSON *audio_config(const preset_t *p);

static char *config_json(const char *preset, int towers);

char *g4_synth_config_json(const char *preset) { return config_json(preset, 0); }

/* config.json; with towers, the real vision_config and audio_config of the preset's towers
 * (the towers block below) in place of the placeholders. */
static char *config_json(const char *preset, int towers) {
    const preset_t *p = find_preset(preset);
    if (!p) return NULL;
    if (p->layout == LAYOUT_DRAFTER) {
        cJSON *d = drafter_config(p);
        char *text = d ? cJSON_Print(d) : NULL;
        cJSON_Delete(d);
        if (!text) g4_fail("synth: out of memory building config.json");
        return text;
    }
    static const int eos[] = {1, 106};
    cJSON *r = cJSON_CreateObject();
    cJSON *arch = cJSON_CreateArray();
    cJSON_AddItemToArray(arch, cJSON_CreateString("Gemma4ForConditionalGeneration"));
    cJSON_AddItemToObject(r, "architectures", arch);
    cJSON_AddItemToObject(r, "audio_config", towers ? audio_config(p) : tower_config("gemma4_audio"));
    cJSON_AddNumberToObject(r, "audio_token_id", 258881);
    cJSON_AddNumberToObject(r, "boa_token_id", 256000);
    cJSON_AddNumberToObject(r, "boi_token_id", 255999);
    cJSON_AddStringToObject(r, "dtype", "bfloat16");
    cJSON_AddNumberToObject(r, "eoa_token_index", 258883);
    cJSON_AddNumberToObject(r, "eoi_token_id", 258882);
    cJSON_AddItemToObject(r, "eos_token_id", int_list(eos, 2));
    cJSON_AddNumberToObject(r, "image_token_id", 258880);
    cJSON_AddItemToObject(r, "initializer_range", py_float(0.02));
    cJSON_AddStringToObject(r, "model_type", "gemma4");
    if (p->layout != LAYOUT_BF16) cJSON_AddItemToObject(r, "quantization_config", quant_config(p));
    cJSON_AddItemToObject(r, "text_config", text_config(p));
    cJSON_AddBoolToObject(r, "tie_word_embeddings", tied(p));
    cJSON_AddStringToObject(r, "transformers_version", "5.17.0");
    cJSON_AddNumberToObject(r, "video_token_id", 258884);
    cJSON_AddItemToObject(r, "vision_config", towers ? vision_config(p) : tower_config("gemma4_vision"));
    cJSON_AddNumberToObject(r, "vision_soft_tokens_per_image", 280);
    char *text = cJSON_Print(r);
    cJSON_Delete(r);
    if (!text) g4_fail("synth: out of memory building config.json");
    return text;
}

/* generation_config.json of the Gemma 4 family (checkpoint.md §1, model.md §10); suppressed
 * ids outside a small preset's vocabulary are left out. */
static char *generation_config_json(int vocab) {
    static const int eos[] = {1, 106, 50}, suppress[] = {258883, 258882};
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "bos_token_id", 2);
    cJSON_AddBoolToObject(r, "do_sample", 1);
    cJSON_AddItemToObject(r, "eos_token_id", int_list(eos, 3));
    cJSON_AddNumberToObject(r, "pad_token_id", 0);
    int n_sup = 0;
    for (int i = 0; i < 2; i++) n_sup += suppress[i] < vocab;
    if (n_sup == 2) cJSON_AddItemToObject(r, "suppress_tokens", int_list(suppress, 2));
    cJSON_AddItemToObject(r, "temperature", py_float(1.0));
    cJSON_AddNumberToObject(r, "top_k", 64);
    cJSON_AddItemToObject(r, "top_p", py_float(0.95));
    cJSON_AddStringToObject(r, "transformers_version", "5.17.0");
    char *text = cJSON_Print(r);
    cJSON_Delete(r);
    if (!text) g4_fail("synth: out of memory building generation_config.json");
    return text;
}

/* ---- tensor plan ---- */

enum { GEN_CODES, GEN_UNIFORM, GEN_PERMUTATION };

/* How one tensor's bytes are produced. */
typedef struct {
    int kind;
    int bits;      /* GEN_CODES: code width (padding fields of a row are set to code 0) */
    int64_t cols;  /* GEN_CODES: logical values per row */
    uint64_t key;  /* stream; lm_head shares embed_tokens' keys so its bytes are a copy */
    float lo, hi;  /* GEN_UNIFORM: element range; lo == hi gives that exact value */
    const int64_t *perm; /* GEN_PERMUTATION: the I64 values (the plan's perm) */
} gen_t;

typedef struct {
    g4_stw w;
    gen_t *gen; /* parallel to w.t */
    int cap;
    uint64_t seed;
    const char *path; /* for messages */
    int64_t *perm;    /* owned: the drafter's token_ordering */
} plan_t;

static int plan_add(plan_t *p, const char *name, g4_dtype dt, int ndim, const int64_t *shape, gen_t g) {
    if (p->w.n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 256;
        gen_t *ng = realloc(p->gen, sizeof *ng * (size_t)cap);
        if (!ng) return g4_fail("%s: out of memory", p->path);
        p->gen = ng;
        p->cap = cap;
    }
    if (g4_stw_add(&p->w, name, dt, ndim, shape) != 0) return -1;
    p->gen[p->w.n - 1] = g;
    return 0;
}

static int add_const(plan_t *p, const char *name, float v) {
    return plan_add(p, name, G4_DT_F32, 0, NULL, (gen_t){.kind = GEN_UNIFORM, .lo = v, .hi = v});
}

static int add_uniform(plan_t *p, const char *name, g4_dtype dt, int ndim, const int64_t *shape, float lo, float hi) {
    return plan_add(p, name, dt, ndim, shape, (gen_t){.kind = GEN_UNIFORM, .key = key_of(p->seed, name), .lo = lo, .hi = hi});
}

/* Codes are uniform random fields with the most negative code replaced by 0 (fill_codes), a
 * symmetric, zero-mean distribution: plain uniform fields have mean -1/2, which would give
 * every weight matrix and embedding table a shared rank-1 component that swamps a random
 * model's signal (the tiny preset then decodes one token forever). RMS of those codes: */
static double code_rms(int bits) {
    double s = 0;
    int half = 1 << (bits - 1);
    for (int c = -half + 1; c < half; c++) s += (double)c * c;
    return sqrt(s / (2.0 * half));
}

static int check_bits(const plan_t *p, const char *module, int bits) {
    if (bits != 2 && bits != 4 && bits != 8)
        return g4_fail("%s: config gives %s %d bits; synth writes 2, 4 or 8", p->path, module, bits);
    return 0;
}

/* Codes [rows, packed(cols)] plus per-(row, block) scales [rows, nblocks], as the
 * quantized embeddings and linears store them: F32, or F16 for the block-scaled layout (block >
 * 0: nblocks = cols / block, as g4 quantize writes them). Scales make one dequantized block have
 * RMS about `rms` (times a +-25 % spread). Returns the gens, for lm_head to replay. */
static int add_codes_and_scales(plan_t *p, const char *codes_name, const char *scale_name, int bits, int64_t rows,
                                int64_t cols, int64_t nblocks, int block, double rms, gen_t *codes_gen, gen_t *scale_gen) {
    if (block > 0) nblocks = cols / block;
    int64_t cshape[2] = {rows, (int64_t)g4_packed_row_bytes(bits, (size_t)cols)}, sshape[2] = {rows, nblocks};
    gen_t cg = {.kind = GEN_CODES, .bits = bits, .cols = cols, .key = key_of(p->seed, codes_name)};
    float base = (float)(rms / code_rms(bits));
    gen_t sg = {.kind = GEN_UNIFORM, .key = key_of(p->seed, scale_name), .lo = 0.75f * base, .hi = 1.25f * base};
    if (codes_gen) *codes_gen = cg;
    if (scale_gen) *scale_gen = sg;
    if (plan_add(p, codes_name, bits == 8 ? G4_DT_I8 : G4_DT_U8, 2, cshape, cg) != 0) return -1;
    return plan_add(p, scale_name, block > 0 ? G4_DT_F16 : G4_DT_F32, 2, sshape, sg);
}

/* A float linear's weight [out, in], BF16: uniform +-a has RMS 1/sqrt(in). */
static int add_bf16_linear(plan_t *p, const char *name, int64_t in, int64_t out) {
    float a = (float)sqrt(3.0 / (double)in);
    return add_uniform(p, name, G4_DT_BF16, 2, (int64_t[]){out, in}, -a, a);
}

/* A linear [out, in] as the loader binds it (model.c bind_linear): BF16 when the config leaves
 * it unconverted, else packed codes, row scales and the two activation scales. */
static int add_linear(plan_t *p, const g4_config *c, const char *module, int in, int out, float s_in, float s_out) {
    char n1[192], n2[192];
    int bits = g4_config_module_bits(c, module);
    snprintf(n1, sizeof n1, "%s.weight", module);
    if (bits == 0) return add_bf16_linear(p, n1, in, out);
    if (check_bits(p, module, bits) != 0) return -1;
    snprintf(n2, sizeof n2, "%s.weight_scale", module);
    int block = g4_config_module_block(c, module);
    if (add_codes_and_scales(p, n1, n2, bits, out, in, 1, block, 1.0 / sqrt((double)in), NULL, NULL) != 0) return -1;
    if (block > 0) return 0; /* the block-scaled layout has no activation scales */
    snprintf(n1, sizeof n1, "%s.input_activation_scale", module);
    snprintf(n2, sizeof n2, "%s.output_activation_scale", module);
    return add_const(p, n1, s_in) || add_const(p, n2, s_out) ? -1 : 0;
}

/* Activation scale of layer l's tensor `what`, drawn in [lo, hi). q/k/v (and gate/up) read one
 * shared draw, because the real checkpoint's are bit-identical and the loader warns otherwise. */
static float act(const plan_t *p, int l, const char *what, float lo, float hi) {
    char tag[96];
    snprintf(tag, sizeof tag, "act:layers.%d.%s", l, what);
    return draw(p->seed, tag, lo, hi);
}

/* The static activation scales drawn for each layer linear of the module table (modules.h), by its
 * name: the input's and the output's draw (tag and range). q/k/v (and gate/up) read one shared
 * input draw, because the real checkpoint's are bit-identical and the loader warns otherwise. */
static const struct {
    const char *module, *in;
    float in_lo, in_hi;
    const char *out;
    float out_lo, out_hi;
} act_draws[] = {
    {"self_attn.q_proj", "attn_in", 0.02f, 0.05f, "q_out", 0.02f, 0.05f},
    {"self_attn.k_proj", "attn_in", 0.02f, 0.05f, "k_out", 0.02f, 0.05f},
    {"self_attn.v_proj", "attn_in", 0.02f, 0.05f, "v_out", 0.02f, 0.05f},
    {"self_attn.o_proj", "o_in", 0.01f, 0.03f, "o_out", 0.01f, 0.03f},
    {"mlp.gate_proj", "mlp_in", 0.02f, 0.05f, "gate_out", 0.02f, 0.05f},
    {"mlp.up_proj", "mlp_in", 0.02f, 0.05f, "up_out", 0.02f, 0.05f},
    {"mlp.down_proj", "down_in", 0.02f, 0.05f, "down_out", 0.01f, 0.03f},
    {"per_layer_input_gate", "plg_in", 0.03f, 0.1f, "plg_out", 0.02f, 0.05f},
    {"per_layer_projection", "plp_in", 0.02f, 0.06f, "plp_out", 0.02f, 0.04f},
};

/* Layer l's linear md, with its activation scales (a table entry missing: an error, not a guess). */
static int add_layer_linear(plan_t *p, const g4_config *c, int l, const g4_layer_shape *ls, const g4_module *md, const char *name) {
    for (size_t i = 0; i < sizeof act_draws / sizeof *act_draws; i++)
        if (strcmp(act_draws[i].module, md->name) == 0)
            return add_linear(p, c, name, g4_dim_size(c, ls, md->in), g4_dim_size(c, ls, md->out),
                              act(p, l, act_draws[i].in, act_draws[i].in_lo, act_draws[i].in_hi),
                              act(p, l, act_draws[i].out, act_draws[i].out_lo, act_draws[i].out_hi));
    return g4_fail("%s: synth has no activation scales for %s", p->path, md->name);
}

/* Layer l's tensors, from the module table. A target's file carries every layer's k/v projections
 * and KV-cache scales: on KV-shared layers they are dead weight, as in the published file
 * (checkpoint.md §7), while k_norm is a producer's only; a drafter's layers have none of them. */
static int add_layer(plan_t *p, const g4_config *c, int l) {
    char name[192];
    const char *pre = c->assistant ? "model." : "model.language_model.";
    g4_layer_shape ls = g4_layer_shape_of(c, l);
    /* Attention has no 1/sqrt(d) scaling (model.md §6), so unit q/k norm gains would give
     * scores of RMS ~sqrt(hd) and a one-hot softmax; gains of hd^-1/4 keep scores O(1). */
    float g = (float)pow(ls.head_dim, -0.25);
    /* KV-cache scales on every layer of the mobile layout (none in the block-scaled one, which
     * quantizes no activation); a consumer's own pair is never used and deliberately differs
     * from its producer's, as in the tiny fixture. K after k_norm has RMS ~g. */
    int cache_scales = c->quant.method == G4_QUANT_GEMMA && c->quant.block_size == 0;
    for (int i = 0; i < g4_n_layer_modules; i++) {
        const g4_module *md = &g4_layer_modules[i];
        int dead_weight = md->part == G4_PART_PRODUCER && md->kind != G4_MOD_VECTOR && !c->assistant;
        if (!g4_module_present(c, &ls, md) && !dead_weight) continue;
        g4_layer_module_name(name, sizeof name, pre, l, md);
        int dim = g4_dim_size(c, &ls, md->out), rc = 0;
        if (md->kind == G4_MOD_LINEAR) {
            rc = add_layer_linear(p, c, l, &ls, md, name);
        } else if (md->kind == G4_MOD_VECTOR) {
            float lo = md->out == G4_DIM_HEAD ? 0.9f * g : 0.9f, hi = md->out == G4_DIM_HEAD ? 1.1f * g : 1.1f;
            strcat(name, ".weight");
            rc = add_uniform(p, name, G4_DT_BF16, 1, (int64_t[]){dim}, lo, hi);
        } else if (md->kind == G4_MOD_SCALAR) { /* layer_scalar: the published drafter's are 0.04-0.43 */
            rc = add_uniform(p, name, G4_DT_BF16, 1, (int64_t[]){1}, c->assistant ? 0.04f : 0.9f, c->assistant ? 0.43f : 1.0f);
        } else if (md->kind == G4_MOD_CACHE_SCALE && cache_scales) {
            int v = strcmp(md->name, "self_attn.v_cache_scale") == 0;
            rc = add_const(p, name, v ? (float)(6.0 / 127.0) : g * act(p, l, "k_cache", 0.025f, 0.035f));
        }
        if (rc != 0) return -1;
    }
    return 0;
}

/* A few tensors of the vision and audio towers (names as in the real file's families), which
 * a text engine must skip; their values mean nothing. The mobile layout quantizes the vision
 * linears (8-bit); the block-scaled one leaves the towers BF16, as g4 quantize does. */
static int add_dummy_towers(plan_t *p, int hidden, int quantized) {
    const char *q = "model.vision_tower.encoder.layers.0.self_attn.q_proj.linear";
    char a[160], b[160];
    snprintf(a, sizeof a, "%s.weight", q);
    snprintf(b, sizeof b, "%s.weight_scale", q);
    if (!quantized) {
        if (add_uniform(p, a, G4_DT_BF16, 2, (int64_t[]){32, 32}, -0.1f, 0.1f) != 0) return -1;
    } else {
        if (add_codes_and_scales(p, a, b, 8, 32, 32, 1, 0, 1.0 / sqrt(32.0), NULL, NULL) != 0) return -1;
        snprintf(a, sizeof a, "%s.input_activation_scale", q);
        snprintf(b, sizeof b, "%s.output_activation_scale", q);
        if (add_const(p, a, 0.03f) || add_const(p, b, 0.03f)) return -1;
    }
    /* a 3-D tensor and a 0-D BF16 one: shapes the text model never uses */
    if (add_uniform(p, "model.vision_tower.patch_embedder.input_proj.weight", G4_DT_BF16, 2, (int64_t[]){32, 48}, -0.1f, 0.1f) ||
        add_uniform(p, "model.embed_vision.embedding_projection.weight", G4_DT_BF16, 2, (int64_t[]){hidden, 32}, -0.1f, 0.1f) ||
        add_uniform(p, "model.audio_tower.layers.0.lconv1d.depthwise_conv1d.weight", G4_DT_BF16, 3, (int64_t[]){32, 1, 5}, -0.1f,
                    0.1f) ||
        add_uniform(p, "model.audio_tower.layers.0.feed_forward1.ffw_layer_1.input_max", G4_DT_BF16, 0, NULL, 4.0f, 8.0f))
        return -1;
    return 0;
}

/* An embedding table of the module table: BF16 `.weight` in a plain checkpoint (uniform +-a has RMS
 * a / sqrt(3): RMS 1 after the x sqrt(dim) of model.md §5), else codes and one scale per (row,
 * block), a block being one layer's slice of the per-layer table; embed_tokens' gens go to
 * codes/scale, for the lm_head to replay. */
static int add_embedding(plan_t *p, const g4_config *c, const g4_module *md, const char *name, gen_t *codes, gen_t *scale) {
    char a[192], b[192];
    int64_t rows = g4_dim_size(c, NULL, md->out), cols = g4_dim_size(c, NULL, md->in);
    int blocks = md->in == G4_DIM_PLE_ALL ? c->n_layers : 1, width = (int)(cols / blocks);
    if (c->quant.method == G4_QUANT_NONE) {
        double ae = sqrt(3.0 / width);
        snprintf(a, sizeof a, "%s.weight", name);
        return add_uniform(p, a, G4_DT_BF16, 2, (int64_t[]){rows, cols}, (float)-ae, (float)ae);
    }
    int bits = g4_config_module_bits(c, name);
    if (check_bits(p, name, bits) != 0) return -1;
    snprintf(a, sizeof a, "%s.embedding_quantized", name);
    snprintf(b, sizeof b, "%s.embedding_scale", name);
    int main_table = md->in != G4_DIM_PLE_ALL;
    return add_codes_and_scales(p, a, b, bits, rows, cols, blocks, g4_config_module_block(c, name), 1.0 / sqrt((double)width),
                                main_table ? codes : NULL, main_table ? scale : NULL);
}

/* The model-level modules of the table (modules.h) that config c binds, under the decoder's
 * prefix: the embeddings, the per-layer-input projection (float in every recipe) and its norm, the
 * final norm. The lm_head and a drafter's projections (named at the top level) come after the
 * layers. */
static int add_globals(plan_t *p, const g4_config *c, gen_t *codes, gen_t *scale) {
    const char *pre = c->assistant ? "model." : "model.language_model.";
    for (int i = 0; i < g4_n_global_modules; i++) {
        const g4_module *md = &g4_global_modules[i];
        char name[160];
        if (md->top || !g4_module_present(c, NULL, md)) continue;
        g4_global_module_name(name, sizeof name, pre, md);
        int rc = 0;
        if (md->kind == G4_MOD_EMBEDDING) {
            rc = add_embedding(p, c, md, name, codes, scale);
        } else if (md->kind == G4_MOD_LINEAR) {
            rc = add_linear(p, c, name, g4_dim_size(c, NULL, md->in), g4_dim_size(c, NULL, md->out), 0, 0);
        } else {
            strcat(name, ".weight");
            rc = add_uniform(p, name, G4_DT_BF16, 1, (int64_t[]){g4_dim_size(c, NULL, md->out)}, 0.9f, 1.1f);
        }
        if (rc != 0) return -1;
    }
    return 0;
}

static int build_plan(plan_t *p, const g4_config *c) {
    char name[160], a[192], b[192];
    int H = c->hidden;
    if (c->quant.method != G4_QUANT_NONE && !c->quant.quantize_embeddings) return g4_fail("%s: synth needs quantize_embeddings", p->path);
    /* main embedding: RMS 1 after the x sqrt(H) of model.md §5; PLE table: RMS 1 after the x sqrt(P) */
    gen_t ecodes, escale;
    if (add_globals(p, c, &ecodes, &escale) != 0) return -1;
    for (int l = 0; l < c->n_layers; l++)
        if (add_layer(p, c, l) != 0) return -1;
    /* BF16 throughout: the lm_head tied. Else the converter copies embed_tokens (codes and scales)
     * into the lm_head, so replay their streams; its activation scales are exactly 0 (uncalibrated)
     * as in the real file */
    if (c->quant.method == G4_QUANT_NONE || c->tie_word_embeddings) return 0;
    g4_global_module_name(name, sizeof name, "", g4_global_module("lm_head"));
    g4_global_module_name(a, sizeof a, "model.language_model.", g4_global_module("embed_tokens"));
    int lb = g4_config_module_bits(c, name), eb = g4_config_module_bits(c, a);
    if (lb != eb) return g4_fail("%s: lm_head (%d bits) must match embed_tokens (%d bits) to be its copy", p->path, lb, eb);
    snprintf(a, sizeof a, "%s.weight", name);
    snprintf(b, sizeof b, "%s.weight_scale", name);
    if (plan_add(p, a, eb == 8 ? G4_DT_I8 : G4_DT_U8, 2, (int64_t[]){c->vocab, (int64_t)g4_packed_row_bytes(eb, (size_t)H)}, ecodes) ||
        plan_add(p, b, G4_DT_F32, 2, (int64_t[]){c->vocab, 1}, escale))
        return -1;
    snprintf(a, sizeof a, "%s.input_activation_scale", name);
    snprintf(b, sizeof b, "%s.output_activation_scale", name);
    return add_const(p, a, 0) || add_const(p, b, 0) ? -1 : 0;
}

/* The drafter (Gemma4AssistantForCausalLM's state dict as save_pretrained writes it: BF16, the
 * tied lm_head.weight left out): the decoder under model., the two projections between it and
 * the target's hidden size, and the masked embedding, whose token_ordering (I64) is a
 * permutation of the vocabulary: viewed as [n_centroids, vocab / n_centroids], the tokens of
 * each centroid. Every layer is KV-shared (it attends to the target's K/V), so no layer has
 * k_proj, v_proj, k_norm or KV-cache scales. Value ranges as the BF16 preset's, except
 * layer_scalar, drawn in the 0.04-0.43 range the published drafter's take. */
static int build_drafter_plan(plan_t *p, const preset_t *d, const g4_config *c) {
    int64_t V = d->vocab;
    if (add_globals(p, c, NULL, NULL) != 0) return -1; /* its embedding and final norm */
    for (int l = 0; l < c->n_layers; l++)
        if (add_layer(p, c, l) != 0) return -1;
    /* the drafter's own linears (modules.h: G4_PART_DRAFTER), BF16 */
    for (int i = 0; i < g4_n_global_modules; i++) {
        const g4_module *md = &g4_global_modules[i];
        char name[160];
        if (md->part != G4_PART_DRAFTER) continue;
        g4_global_module_name(name, sizeof name, "model.", md);
        strcat(name, ".weight");
        if (add_bf16_linear(p, name, g4_dim_size(c, NULL, md->in), g4_dim_size(c, NULL, md->out)) != 0) return -1;
    }
    /* Fisher-Yates, swap i's partner drawn from the tensor's stream at position i */
    if (V % d->n_centroids) return g4_fail("%s: vocab %lld is not a multiple of %d centroids", p->path, (long long)V, d->n_centroids);
    if (!(p->perm = malloc(sizeof *p->perm * (size_t)V))) return g4_fail("%s: out of memory", p->path);
    const char *ord = "masked_embedding.token_ordering";
    uint64_t key = key_of(p->seed, ord);
    for (int64_t i = 0; i < V; i++) p->perm[i] = i;
    for (int64_t i = V - 1; i > 0; i--) {
        int64_t j = (int64_t)(((stream_at(key, (uint64_t)i) >> 32) * (uint64_t)(i + 1)) >> 32); /* uniform in [0, i] */
        int64_t t = p->perm[i];
        p->perm[i] = p->perm[j];
        p->perm[j] = t;
    }
    return plan_add(p, ord, G4_DT_I64, 1, (int64_t[]){V}, (gen_t){.kind = GEN_PERMUTATION, .key = key, .perm = p->perm});
}

/* ---- tensor bytes ---- */

/* Lanes of `x` (one per `bits`-wide field) that are zero, as the field's lowest bit. */
static uint64_t zero_fields(uint64_t x, int bits) {
    uint64_t any = x, low = bits == 2 ? 0x5555555555555555ull : bits == 4 ? 0x1111111111111111ull : 0x0101010101010101ull;
    for (int k = 1; k < bits; k++) any |= x >> k;
    return ~any & low;
}

/* Uniform fields except that the most negative code becomes 0: offset-binary raw 0 becomes
 * raw 2^(b-1) for 2/4 bits, two's-complement 0x80 becomes 0x00 for 8 bits. */
static uint64_t symmetric_codes(uint64_t r, int bits) {
    if (bits == 8) return r & ~(zero_fields(r ^ 0x8080808080808080ull, 8) << 7);
    return r | zero_fields(r, bits) << (bits - 1);
}

static void fill_codes(const gen_t *g, const g4_stw_tensor *t, uint64_t off, uint8_t *buf, size_t n) {
    /* off is a multiple of G4_STW_CHUNK, hence of 8: one stream word per 8 bytes */
    for (size_t i = 0; i < n; i += 8) {
        uint64_t r = symmetric_codes(stream_at(g->key, (off + i) / 8), g->bits);
        for (size_t k = 0; k < 8 && i + k < n; k++) buf[i + k] = (uint8_t)(r >> (8 * k));
    }
    /* a row whose width is not a whole number of bytes ends in padding fields holding code 0
     * (checkpoint.md §6); none of the presets' shapes needs it */
    int per = 8 / g->bits;
    uint64_t row_bytes = (uint64_t)t->shape[1];
    int pad = (int)(row_bytes * (uint64_t)per - (uint64_t)g->cols);
    if (g->bits == 8 || pad <= 0 || row_bytes == 0) return;
    unsigned mask = (1u << g->bits) - 1, zero = 1u << (g->bits - 1);
    for (uint64_t r = off / row_bytes;; r++) {
        uint64_t last = (r + 1) * row_bytes - 1;
        if (last >= off + n) break;
        if (last < off) continue;
        unsigned v = buf[last - off];
        for (int f = per - pad; f < per; f++) v = (v & ~(mask << (f * g->bits))) | zero << (f * g->bits);
        buf[last - off] = (uint8_t)v;
    }
}

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1); /* round to nearest even; values here are finite */
    return (uint16_t)(u >> 16);
}

static void fill_uniform(const gen_t *g, const g4_stw_tensor *t, uint64_t off, uint8_t *buf, size_t n) {
    size_t es = g4_dtype_size(t->dtype);
    uint64_t e0 = off / es;
    for (size_t k = 0; k < n / es; k++) {
        float v = g->lo == g->hi ? g->lo : g->lo + (g->hi - g->lo) * unit_f(stream_at(g->key, e0 + k));
        uint32_t u;
        if (t->dtype == G4_DT_BF16) u = f32_to_bf16(v);
        else if (t->dtype == G4_DT_F16) u = g4_f32_to_f16(v);
        else memcpy(&u, &v, 4);
        for (size_t b = 0; b < es; b++) buf[k * es + b] = (uint8_t)(u >> (8 * b));
    }
}

static int fill(void *user, int index, const g4_stw_tensor *t, uint64_t off, uint8_t *buf, size_t n) {
    const gen_t *g = &((const plan_t *)user)->gen[index];
    if (g->kind == GEN_CODES) fill_codes(g, t, off, buf, n);
    else if (g->kind == GEN_PERMUTATION && t->dtype == G4_DT_I64)
        for (size_t k = 0; k < n / 8; k++) /* little-endian, as safetensors stores it */
            for (int b = 0; b < 8; b++) buf[k * 8 + b] = (uint8_t)((uint64_t)g->perm[off / 8 + k] >> (8 * b));
    else if (t->dtype == G4_DT_F32 || t->dtype == G4_DT_BF16 || t->dtype == G4_DT_F16) fill_uniform(g, t, off, buf, n);
    else return g4_fail("no generator for dtype %s", g4_dtype_name(t->dtype));
    return 0;
}

/* ---- towers (g4 synth --towers) ----
 * A vision tower and an audio conformer of the real sizes (multimodal.md §3, §5: E2B and E4B
 * share them), in the mobile layout (checkpoint.md §3, multimodal.md §6): the vision linears
 * 8-bit, the audio linears 2-bit with lconv1d.linear_start 4-bit, each with static int8
 * activation scales; the patch embedder, position table, subsampling convolutions,
 * relative_k_proj, output_proj and both embedders float. No clamp tensors: the mobile checkpoint
 * has none (use_clipped_linears false). The tiny preset gets towers of the same structure at
 * sizes a test runs in seconds. Values as the text model's: weights of RMS about 1/sqrt(in),
 * norms near 1, activation scales 0.02-0.05. */

typedef struct {
    const char *preset;
    int v_hidden, v_layers, v_heads, v_head_dim, v_mlp, v_patch, v_pool, v_pos;
    int a_hidden, a_layers, a_heads, a_ch0, a_ch1, a_kernel, a_chunk, a_ctx_left, a_out;
} tower_shape_t;

/* a_ch0 is 128 in every preset: the tower's input projection reads 32 x a_ch1 values per
 * frame, which 128 mel bins give only with 128 first-layer channels (audio/tower.c). */
static const tower_shape_t tower_shapes[] = {
    {"e2b", 768, 16, 12, 64, 3072, 16, 3, 10240, 1024, 12, 8, 128, 32, 5, 12, 13, 1536},
    {"e4b", 768, 16, 12, 64, 3072, 16, 3, 10240, 1024, 12, 8, 128, 32, 5, 12, 13, 1536},
    {"tiny", 32, 2, 2, 16, 64, 4, 3, 64, 32, 2, 2, 128, 4, 5, 4, 5, 64},
};

static const tower_shape_t *tower_shape_of(const preset_t *p) {
    for (size_t i = 0; i < sizeof tower_shapes / sizeof tower_shapes[0]; i++)
        if (strcmp(tower_shapes[i].preset, p->name) == 0) return &tower_shapes[i];
    return NULL;
}

/* vision_config as transformers 5.17's Gemma4VisionConfig.to_dict writes it; keys sorted. */
static cJSON *vision_config(const preset_t *p) {
    const tower_shape_t *t = tower_shape_of(p);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "attention_bias", 0);
    cJSON_AddItemToObject(o, "attention_dropout", py_float(0.0));
    cJSON_AddStringToObject(o, "dtype", "bfloat16");
    cJSON_AddNumberToObject(o, "head_dim", t->v_head_dim);
    cJSON_AddStringToObject(o, "hidden_activation", "gelu_pytorch_tanh");
    cJSON_AddNumberToObject(o, "hidden_size", t->v_hidden);
    cJSON_AddItemToObject(o, "initializer_range", py_float(0.02));
    cJSON_AddNumberToObject(o, "intermediate_size", t->v_mlp);
    cJSON_AddNumberToObject(o, "max_position_embeddings", 131072);
    cJSON_AddStringToObject(o, "model_type", "gemma4_vision");
    cJSON_AddNumberToObject(o, "num_attention_heads", t->v_heads);
    cJSON_AddNumberToObject(o, "num_hidden_layers", t->v_layers);
    cJSON_AddNumberToObject(o, "num_key_value_heads", t->v_heads);
    cJSON_AddNumberToObject(o, "patch_size", t->v_patch);
    cJSON_AddNumberToObject(o, "pooling_kernel_size", t->v_pool);
    cJSON_AddNumberToObject(o, "position_embedding_size", t->v_pos);
    cJSON_AddItemToObject(o, "rms_norm_eps", py_float(1e-6));
    cJSON_AddItemToObject(o, "rope_parameters", rope_entry(100.0, "axial", 0));
    cJSON_AddBoolToObject(o, "standardize", 0);
    cJSON_AddBoolToObject(o, "use_clipped_linears", 0);
    return o;
}

/* audio_config as transformers 5.17's Gemma4AudioConfig.to_dict writes it; keys sorted. */
static cJSON *audio_config(const preset_t *p) {
    const tower_shape_t *t = tower_shape_of(p);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "attention_chunk_size", t->a_chunk);
    cJSON_AddNumberToObject(o, "attention_context_left", t->a_ctx_left);
    cJSON_AddNumberToObject(o, "attention_context_right", 0);
    cJSON_AddItemToObject(o, "attention_invalid_logits_value", py_float(-1e9));
    cJSON_AddItemToObject(o, "attention_logit_cap", py_float(50.0));
    cJSON_AddNumberToObject(o, "conv_kernel_size", t->a_kernel);
    cJSON_AddStringToObject(o, "dtype", "bfloat16");
    cJSON_AddItemToObject(o, "gradient_clipping", py_float(1e10));
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddNumberToObject(o, "hidden_size", t->a_hidden);
    cJSON_AddItemToObject(o, "initializer_range", py_float(0.02));
    cJSON_AddStringToObject(o, "model_type", "gemma4_audio");
    cJSON_AddNumberToObject(o, "num_attention_heads", t->a_heads);
    cJSON_AddNumberToObject(o, "num_hidden_layers", t->a_layers);
    cJSON_AddNumberToObject(o, "output_proj_dims", t->a_out);
    cJSON_AddItemToObject(o, "residual_weight", py_float(0.5));
    cJSON_AddItemToObject(o, "rms_norm_eps", py_float(1e-6));
    cJSON_AddItemToObject(o, "subsampling_conv_channels", int_list((const int[]){t->a_ch0, t->a_ch1}, 2));
    cJSON_AddBoolToObject(o, "use_clipped_linears", 0);
    return o;
}

/* Activation scale `what` of tower module `mod`, drawn in [lo, hi) from its own stream. */
static float tower_act(const plan_t *p, const char *mod, const char *what, float lo, float hi) {
    char tag[320];
    snprintf(tag, sizeof tag, "act:%s.%s", mod, what);
    return draw(p->seed, tag, lo, hi);
}

/* A tower linear `prefix``name`.linear [out, in], quantized as the config says, its scales drawn
 * per module. */
static int add_tower_linear(plan_t *p, const g4_config *c, const char *prefix, const char *name, int in, int out) {
    char mod[256];
    snprintf(mod, sizeof mod, "%s%s.linear", prefix, name);
    return add_linear(p, c, mod, in, out, tower_act(p, mod, "in", 0.02f, 0.05f), tower_act(p, mod, "out", 0.02f, 0.05f));
}

static int add_norm(plan_t *p, const char *prefix, const char *name, int n, float gain) {
    char full[224];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    return add_uniform(p, full, G4_DT_BF16, 1, (int64_t[]){n}, 0.9f * gain, 1.1f * gain);
}

static int add_vision_tower(plan_t *p, const g4_config *c, const tower_shape_t *t) {
    const char *vt = "model.vision_tower.";
    int H = t->v_hidden, hd = t->v_head_dim, QD = t->v_heads * hd, pd = 3 * t->v_patch * t->v_patch;
    char pre[160];
    /* the position table: x and y rows summed, so each of RMS ~0.7 */
    if (add_linear(p, c, "model.vision_tower.patch_embedder.input_proj", pd, H, 0, 0) ||
        add_uniform(p, "model.vision_tower.patch_embedder.position_embedding_table", G4_DT_BF16, 3, (int64_t[]){2, t->v_pos, H}, -1.2f,
                    1.2f))
        return -1;
    /* scale 1.0 attention (no 1/sqrt(d)): q/k norm gains of hd^-1/4 keep scores O(1), as for the text layers */
    float g = (float)pow(hd, -0.25);
    for (int l = 0; l < t->v_layers; l++) {
        snprintf(pre, sizeof pre, "%sencoder.layers.%d.", vt, l);
        if (add_tower_linear(p, c, pre, "self_attn.q_proj", H, QD) || add_tower_linear(p, c, pre, "self_attn.k_proj", H, QD) ||
            add_tower_linear(p, c, pre, "self_attn.v_proj", H, QD) || add_tower_linear(p, c, pre, "self_attn.o_proj", QD, H) ||
            add_tower_linear(p, c, pre, "mlp.gate_proj", H, t->v_mlp) || add_tower_linear(p, c, pre, "mlp.up_proj", H, t->v_mlp) ||
            add_tower_linear(p, c, pre, "mlp.down_proj", t->v_mlp, H) || add_norm(p, pre, "input_layernorm.weight", H, 1) ||
            add_norm(p, pre, "post_attention_layernorm.weight", H, 1) || add_norm(p, pre, "pre_feedforward_layernorm.weight", H, 1) ||
            add_norm(p, pre, "post_feedforward_layernorm.weight", H, 1) || add_norm(p, pre, "self_attn.q_norm.weight", hd, g) ||
            add_norm(p, pre, "self_attn.k_norm.weight", hd, g))
            return -1;
    }
    return add_linear(p, c, "model.embed_vision.embedding_projection", H, c->hidden, 0, 0);
}

static int add_audio_tower(plan_t *p, const g4_config *c, const tower_shape_t *t) {
    const char *at = "model.audio_tower.";
    int H = t->a_hidden, hd = H / t->a_heads;
    char pre[160], ff[192];
    float a0 = (float)sqrt(3.0 / 9.0), a1 = (float)sqrt(3.0 / (9.0 * t->a_ch0)), ak = (float)sqrt(3.0 / t->a_kernel);
    if (add_uniform(p, "model.audio_tower.subsample_conv_projection.layer0.conv.weight", G4_DT_BF16, 4, (int64_t[]){t->a_ch0, 1, 3, 3},
                    -a0, a0) ||
        add_norm(p, at, "subsample_conv_projection.layer0.norm.weight", t->a_ch0, 1) ||
        add_uniform(p, "model.audio_tower.subsample_conv_projection.layer1.conv.weight", G4_DT_BF16, 4,
                    (int64_t[]){t->a_ch1, t->a_ch0, 3, 3}, -a1, a1) ||
        add_norm(p, at, "subsample_conv_projection.layer1.norm.weight", t->a_ch1, 1) ||
        add_linear(p, c, "model.audio_tower.subsample_conv_projection.input_proj_linear", 32 * t->a_ch1, H, 0, 0))
        return -1;
    for (int l = 0; l < t->a_layers; l++) {
        snprintf(pre, sizeof pre, "%slayers.%d.", at, l);
        for (int f = 1; f <= 2; f++) {
            snprintf(ff, sizeof ff, "%sfeed_forward%d.", pre, f);
            if (add_tower_linear(p, c, ff, "ffw_layer_1", H, 4 * H) || add_tower_linear(p, c, ff, "ffw_layer_2", 4 * H, H) ||
                add_norm(p, ff, "pre_layer_norm.weight", H, 1) || add_norm(p, ff, "post_layer_norm.weight", H, 1))
                return -1;
        }
        char rel[224];
        snprintf(rel, sizeof rel, "%sself_attn.relative_k_proj", pre);
        if (add_tower_linear(p, c, pre, "self_attn.q_proj", H, H) || add_tower_linear(p, c, pre, "self_attn.k_proj", H, H) ||
            add_tower_linear(p, c, pre, "self_attn.v_proj", H, H) || add_tower_linear(p, c, pre, "self_attn.post", H, H) ||
            add_linear(p, c, rel, H, H, 0, 0) || add_norm(p, pre, "self_attn.per_dim_scale", hd, 0) ||
            add_norm(p, pre, "norm_pre_attn.weight", H, 1) || add_norm(p, pre, "norm_post_attn.weight", H, 1) ||
            add_tower_linear(p, c, pre, "lconv1d.linear_start", H, 2 * H) || add_tower_linear(p, c, pre, "lconv1d.linear_end", H, H) ||
            add_norm(p, pre, "lconv1d.pre_layer_norm.weight", H, 1) || add_norm(p, pre, "lconv1d.conv_norm.weight", H, 1) ||
            add_norm(p, pre, "norm_out.weight", H, 1))
            return -1;
        snprintf(rel, sizeof rel, "%slconv1d.depthwise_conv1d.weight", pre);
        if (add_uniform(p, rel, G4_DT_BF16, 3, (int64_t[]){H, 1, t->a_kernel}, -ak, ak)) return -1;
    }
    if (add_linear(p, c, "model.audio_tower.output_proj", H, t->a_out, 0, 0) ||
        add_uniform(p, "model.audio_tower.output_proj.bias", G4_DT_BF16, 1, (int64_t[]){t->a_out}, -0.1f, 0.1f))
        return -1;
    return add_linear(p, c, "model.embed_audio.embedding_projection", t->a_out, c->hidden, 0, 0);
}

static int add_towers(plan_t *p, const g4_config *c, const tower_shape_t *t) {
    return add_vision_tower(p, c, t) || add_audio_tower(p, c, t) ? -1 : 0;
}

/* ---- tokenizer.json ---- */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p == '\t') fputs("\\t", f);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

#define SPACE_MARK "\xE2\x96\x81" /* U+2581, what the normalizer turns " " into */

/* Control tokens at their Gemma 4 ids (chat-and-tokenizer.md §B, model.md §10). */
static const struct {
    int id;
    const char *text;
    int special;
} controls[] = {
    {0, "<pad>", 1},         {1, "<eos>", 1},           {2, "<bos>", 1},          {3, "<unk>", 1},
    {4, "<mask>", 0},        {5, "[multimodal]", 0},    {46, "<|tool>", 1},       {47, "<tool|>", 1},
    {48, "<|tool_call>", 1}, {49, "<tool_call|>", 1},   {50, "<|tool_response>", 1}, {51, "<tool_response|>", 1},
    {52, "<|\"|>", 1},       {98, "<|think|>", 1},      {100, "<|channel>", 1},   {101, "<channel|>", 1},
    {105, "<|turn>", 1},     {106, "<turn|>", 1},       {255999, "<|image>", 1},  {256000, "<|audio>", 1},
    {258880, "<|image|>", 1}, {258881, "<|audio|>", 1}, {258882, "<image|>", 1},  {258883, "<audio|>", 1},
    {258884, "<|video|>", 1},
};
#define N_CONTROLS (int)(sizeof controls / sizeof controls[0])
#define FIRST_PIECE 494 /* after the byte tokens 238..493 */

/* The fixed entry at `id` (control, reserved, whitespace run or byte token), or NULL for an id
 * that takes a filler piece. *special tells whether it is a special added token. */
static const char *fixed_token(int id, char *buf, size_t cap, int *special, int *added) {
    *special = 0;
    *added = 1;
    for (int i = 0; i < N_CONTROLS; i++)
        if (controls[i].id == id) {
            *special = controls[i].special;
            return controls[i].text;
        }
    if (id >= 238 && id < FIRST_PIECE) {
        *added = 0;
        snprintf(buf, cap, "<0x%02X>", id - 238);
        return buf;
    }
    if (id >= FIRST_PIECE) return NULL;
    if (id >= 107 && id <= 137) { /* runs of 1-31 newlines */
        memset(buf, '\n', (size_t)(id - 106));
        buf[id - 106] = 0;
        return buf;
    }
    if (id >= 138 && id <= 167) { /* runs of 2-31 spaces */
        buf[0] = 0;
        for (int k = 0; k < id - 136; k++) strcat(buf, SPACE_MARK);
        return buf;
    }
    snprintf(buf, cap, "<unused%d>", id - 6);
    return buf;
}

typedef struct {
    char text[16]; /* up to three characters of at most 3 bytes */
    int left, right; /* piece indices merged into this one, or -1 for a single character */
} piece_t;

/* dst = a + b; pieces are at most three 3-byte characters, far below the buffer size. */
static void join_piece(piece_t *dst, const piece_t *a, const piece_t *b) {
    size_t na = strlen(a->text), nb = strlen(b->text);
    if (na + nb >= sizeof dst->text) nb = sizeof dst->text - 1 - na;
    memcpy(dst->text, a->text, na);
    memcpy(dst->text + na, b->text, nb);
    dst->text[na + nb] = 0;
}

/* Filler pieces: single characters, then pairs (diagonal order, so a small vocabulary gets
 * pairs of the most common characters), then pair+character triples. Every multi-character
 * piece is reachable by one merge of two earlier pieces, so the merges are valid BPE. */
static piece_t *make_pieces(int n) {
    static const char *const ascii =
        "etaoinsrhldcumfpgwybvkxjqzETAOINSRHLDCUMFPGWYBVKXJQZ0123456789.,'\"-!?:;()[]{}<>/\\|@#$%^&*_+=~`";
    piece_t *pc = calloc((size_t)(n ? n : 1), sizeof *pc);
    if (!pc) return NULL;
    int nc = n >= 95 * 3 ? 95 : (n * 2 / 3 > 0 ? n * 2 / 3 : 1), k = 0;
    for (; k < nc && k < n; k++) {
        if (k == 0) strcpy(pc[k].text, SPACE_MARK);
        else pc[k].text[0] = ascii[k - 1], pc[k].text[1] = 0;
        pc[k].left = pc[k].right = -1;
    }
    int first_pair = k;
    for (int s = 0; s <= 2 * (nc - 1) && k < n; s++)
        for (int i = s < nc ? 0 : s - nc + 1; i <= s && i < nc && k < n; i++) {
            int j = s - i;
            if (i == 0 && j == 0) continue; /* two spaces: already the whitespace-run token 138 */
            join_piece(&pc[k], &pc[i], &pc[j]);
            pc[k].left = i;
            pc[k].right = j;
            k++;
        }
    int end_pair = k;
    for (int pi = first_pair; pi < end_pair && k < n; pi++)
        for (int c = 0; c < nc && k < n; c++) {
            join_piece(&pc[k], &pc[pi], &pc[c]);
            pc[k].left = pi;
            pc[k].right = c;
            k++;
        }
    if (k < n) {
        free(pc);
        return NULL;
    }
    return pc;
}

int g4_synth_write_tokenizer(const char *path, int vocab) {
    if (vocab < FIRST_PIECE + 1 || vocab > (1 << 20))
        return g4_fail("%s: a synthetic tokenizer needs a vocabulary of %d to %d entries, not %d", path, FIRST_PIECE + 1, 1 << 20,
                       vocab);
    int n_fixed_high = 0;
    for (int i = 0; i < N_CONTROLS; i++) n_fixed_high += controls[i].id >= FIRST_PIECE && controls[i].id < vocab;
    int n_pieces = vocab - FIRST_PIECE - n_fixed_high;
    piece_t *pc = make_pieces(n_pieces);
    if (!pc) return g4_fail("%s: out of memory (or vocabulary too large) building the tokenizer", path);
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(pc);
        return g4_fail("%s: cannot create: %s", path, strerror(errno));
    }
    char buf[128];
    int special, added;
    fputs("{\n\"version\": \"1.0\",\n\"truncation\": null,\n\"padding\": null,\n\"added_tokens\": [", f);
    int first = 1;
    for (int id = 0; id < vocab; id++) {
        const char *t = fixed_token(id, buf, sizeof buf, &special, &added);
        if (!t || !added) continue;
        fprintf(f, "%s\n{\"id\": %d, \"content\": ", first ? "" : ",", id);
        json_str(f, t);
        fprintf(f, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": %s}",
                special ? "true" : "false");
        first = 0;
    }
    /* pipeline of the real Gemma 4 tokenizer.json (chat-and-tokenizer.md §A) */
    fputs("\n],\n"
          "\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"" SPACE_MARK "\"},\n"
          "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"MergedWithPrevious\", "
          "\"invert\": false},\n"
          "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<bos>\", "
          "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [{\"SpecialToken\": {\"id\": "
          "\"<bos>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": "
          "\"<bos>\", \"type_id\": 1}}, {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}], \"special_tokens\": {\"<bos>\": "
          "{\"id\": \"<bos>\", \"ids\": [2], \"tokens\": [\"<bos>\"]}}},\n"
          "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"" SPACE_MARK
          "\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}]},\n"
          "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\", \"continuing_subword_prefix\": null, "
          "\"end_of_word_suffix\": null, \"fuse_unk\": true, \"byte_fallback\": true, \"ignore_merges\": false,\n"
          "\"vocab\": {",
          f);
    int next = 0;
    for (int id = 0; id < vocab; id++) {
        const char *t = fixed_token(id, buf, sizeof buf, &special, &added);
        if (!t) t = pc[next++].text;
        fputs(id ? ",\n" : "\n", f);
        json_str(f, t);
        fprintf(f, ": %d", id);
    }
    fputs("\n},\n\"merges\": [", f);
    first = 1;
    for (int i = 0; i < n_pieces; i++) {
        if (pc[i].left < 0) continue;
        fputs(first ? "\n[" : ",\n[", f);
        json_str(f, pc[pc[i].left].text);
        fputs(", ", f);
        json_str(f, pc[pc[i].right].text);
        fputc(']', f);
        first = 0;
    }
    fputs("\n]}\n}\n", f);
    free(pc);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        remove(path);
        return g4_fail("%s: write failed", path);
    }
    return 0;
}

/* ---- files and folders ---- */

static int is_text_tensor(const char *name) {
    return strncmp(name, "model.language_model.", 21) == 0 || strncmp(name, "lm_head.", 8) == 0;
}

static void fill_stats(g4_synth_stats *stats, const g4_stw *w, uint64_t file_bytes, int all_text) {
    if (!stats) return;
    memset(stats, 0, sizeof *stats);
    stats->n_tensors = w->n;
    stats->file_bytes = file_bytes;
    for (int i = 0; i < w->n; i++)
        if (all_text || is_text_tensor(w->t[i].name)) {
            stats->n_text_tensors++;
            stats->text_bytes += w->t[i].nbytes;
        }
}

/* The drafter's folder: config.json and model.safetensors only (it runs on its target's
 * tokenizer, and its generation settings are the target's). */
static int synth_drafter(const preset_t *pr, const char *out_dir, uint64_t seed, const char *tokenizer_src, g4_synth_stats *stats) {
    if (tokenizer_src)
        return g4_fail("synth preset %s writes no tokenizer.json (a drafter runs on its target's), so --tokenizer does not apply",
                       pr->name);
    char cfg_path[4096], st_path[4096];
    if (g4_path_join(cfg_path, sizeof cfg_path, out_dir, "config.json") ||
        g4_path_join(st_path, sizeof st_path, out_dir, "model.safetensors") || g4_make_dirs(out_dir))
        return -1;
    char *cfg_text = g4_synth_config_json(pr->name);
    if (!cfg_text) return -1;
    plan_t plan = {.seed = seed, .path = st_path};
    g4_stw_init(&plan.w);
    uint64_t file_bytes = 0;
    /* the tensor list comes from the parsed config, as for a target */
    g4_config cfg;
    int rc = g4_config_parse(&cfg, cfg_text, cfg_path);
    if (rc != 0) g4_fail_prefix("synth preset %s: ", pr->name);
    if (rc == 0) {
        rc = build_drafter_plan(&plan, pr, &cfg);
        g4_config_free(&cfg);
    }
    if (rc == 0) rc = g4_stw_write(&plan.w, st_path, fill, &plan, &file_bytes);
    if (rc == 0) rc = g4_write_text(cfg_path, cfg_text);
    if (rc == 0) fill_stats(stats, &plan.w, file_bytes, 1);
    free(cfg_text);
    free(plan.gen);
    free(plan.perm);
    g4_stw_free(&plan.w);
    return rc;
}

int g4_synth_ex(const char *preset, const char *out_dir, uint64_t seed, const char *tokenizer_src, g4_synth_stats *stats) {
    return g4_synth_towers(preset, out_dir, seed, tokenizer_src, 0, stats);
}

int g4_synth_towers(const char *preset, const char *out_dir, uint64_t seed, const char *tokenizer_src, int towers, g4_synth_stats *stats) {
    const preset_t *pr = find_preset(preset);
    if (!pr) return -1;
    if (towers && !tower_shape_of(pr))
        return g4_fail("synth preset %s: towers are written for the mobile layouts (e2b, e4b, tiny) only", preset);
    if (!out_dir) return g4_fail("synth: no output folder");
    if (pr->layout == LAYOUT_DRAFTER) return synth_drafter(pr, out_dir, seed, tokenizer_src, stats);
    char cfg_path[4096], st_path[4096], gen_path[4096], tok_path[4096];
    if (g4_path_join(cfg_path, sizeof cfg_path, out_dir, "config.json") ||
        g4_path_join(st_path, sizeof st_path, out_dir, "model.safetensors") ||
        g4_path_join(gen_path, sizeof gen_path, out_dir, "generation_config.json") ||
        g4_path_join(tok_path, sizeof tok_path, out_dir, "tokenizer.json") || g4_make_dirs(out_dir))
        return -1;
    /* a bad --tokenizer must fail before gigabytes are written, not after */
    if (tokenizer_src) {
        FILE *t = fopen(tokenizer_src, "rb");
        if (!t) return g4_fail("%s: cannot open: %s", tokenizer_src, strerror(errno));
        fclose(t);
    }
    char *cfg_text = config_json(preset, towers);
    if (!cfg_text) return -1;
    /* the tensor list comes from the parsed config, exactly as the loader will see it */
    g4_config cfg;
    int rc = g4_config_parse(&cfg, cfg_text, cfg_path);
    if (rc != 0) {
        free(cfg_text);
        return g4_fail_prefix("synth preset %s: ", preset);
    }
    plan_t plan = {.seed = seed, .path = st_path};
    g4_stw_init(&plan.w);
    uint64_t file_bytes = 0;
    rc = build_plan(&plan, &cfg);
    if (rc == 0)
        rc = towers ? add_towers(&plan, &cfg, tower_shape_of(pr))
                    : add_dummy_towers(&plan, cfg.hidden, cfg.quant.method == G4_QUANT_GEMMA && cfg.quant.block_size == 0);
    if (rc == 0) rc = g4_stw_write(&plan.w, st_path, fill, &plan, &file_bytes);
    if (rc == 0) rc = g4_write_text(cfg_path, cfg_text);
    char *gen_text = rc == 0 ? generation_config_json(cfg.vocab) : NULL;
    if (rc == 0) rc = gen_text ? g4_write_text(gen_path, gen_text) : -1;
    if (rc == 0) rc = tokenizer_src ? g4_copy_file(tokenizer_src, tok_path) : g4_synth_write_tokenizer(tok_path, cfg.vocab);
    if (rc == 0) fill_stats(stats, &plan.w, file_bytes, 0);
    free(gen_text);
    free(cfg_text);
    free(plan.gen);
    g4_stw_free(&plan.w);
    g4_config_free(&cfg);
    return rc;
}

int g4_synth(const char *preset, const char *out_dir, uint64_t seed, const char *tokenizer_src) {
    return g4_synth_ex(preset, out_dir, seed, tokenizer_src, NULL);
}
