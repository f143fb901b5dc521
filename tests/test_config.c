/* config.json parsing and the bit-width rules of checkpoint.md §4 (Python re semantics via
 * PCRE2): the real E2B pattern set in its on-disk (sorted) order, precedence by leftmost match
 * then list order, and modules_to_not_convert. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <unistd.h>

#include "format/config.h"
#include "testutil.h"

static const char *e2b_quant =
    "\"quantization_config\": {\"quant_method\": \"gemma\", \"num_bits\": 4, \"quantize_embeddings\": true,"
    "\"module_quant_configs\": {"
    "\"^lm_head$\": {\"num_bits\": 2},"
    "\"audio_tower(?!.*lconv1d\\\\.linear_start)\": {\"num_bits\": 2},"
    "\"audio_tower\\\\.layers\\\\.\\\\d+\\\\.lconv1d\\\\.linear_start\\\\.\": {\"num_bits\": 4},"
    "\"language_model\\\\.embed_tokens$\": {\"num_bits\": 2},"
    "\"language_model\\\\.embed_tokens_per_layer$\": {\"num_bits\": 4},"
    "\"language_model\\\\.layers\\\\.(\\\\d|1[0-4])\\\\.mlp\\\\.\": {\"num_bits\": 4},"
    "\"language_model\\\\.layers\\\\.\\\\d+\\\\.mlp\\\\.\": {\"num_bits\": 2},"
    "\"language_model\\\\.layers\\\\.\\\\d+\\\\.per_layer_input_gate$\": {\"num_bits\": 8},"
    "\"language_model\\\\.layers\\\\.\\\\d+\\\\.per_layer_projection$\": {\"num_bits\": 8},"
    "\"language_model\\\\.layers\\\\.\\\\d+\\\\.self_attn\\\\.\": {\"num_bits\": 4},"
    "\"vision_tower\": {\"num_bits\": 8}},"
    "\"modules_to_not_convert\": [\"model.vision_tower.patch_embedder\", \"model.audio_tower.subsample_conv_projection\","
    "\"model.audio_tower.output_proj\", \"relative_k_proj\", \"model.embed_audio\", \"model.embed_vision\","
    "\"per_layer_model_projection\"]}";

static const char *text_fields =
    "\"hidden_size\": 1536, \"num_hidden_layers\": 5, \"num_attention_heads\": 8, \"num_key_value_heads\": 1,"
    "\"head_dim\": 256, \"global_head_dim\": 512, \"intermediate_size\": 6144, \"hidden_size_per_layer_input\": 256,"
    "\"vocab_size\": 262144, \"rms_norm_eps\": 1e-6, \"hidden_activation\": \"gelu_pytorch_tanh\", \"sliding_window\": 512,"
    "\"num_kv_shared_layers\": 2, \"use_double_wide_mlp\": true, \"final_logit_softcapping\": 30.0, \"eos_token_id\": 1,"
    "\"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"full_attention\"],"
    "\"rope_parameters\": {\"full_attention\": {\"partial_rotary_factor\": 0.25, \"rope_theta\": 1000000.0, \"rope_type\": \"proportional\"},"
    "\"sliding_attention\": {\"rope_theta\": 10000.0, \"rope_type\": \"default\"}}";

static int parse(g4_config *c, const char *quant, const char *extra_top) {
    char buf[8192];
    snprintf(buf, sizeof buf, "{\"eos_token_id\": [1, 106], %s \"text_config\": {%s}, %s}", extra_top, text_fields, quant);
    return g4_config_parse(c, buf, "config.json");
}

static void test_e2b_bits(void) {
    g4_config c;
    CHECK(parse(&c, e2b_quant, "") == 0, "%s", g4_last_error());
    struct { const char *module; int bits; } cases[] = {
        {"lm_head", 2},
        {"model.language_model.embed_tokens", 2},
        {"model.language_model.embed_tokens_per_layer", 4},
        {"model.language_model.layers.0.mlp.gate_proj", 4},
        {"model.language_model.layers.9.mlp.down_proj", 4},
        {"model.language_model.layers.10.mlp.up_proj", 4},
        {"model.language_model.layers.14.mlp.down_proj", 4},
        {"model.language_model.layers.15.mlp.gate_proj", 2},
        {"model.language_model.layers.34.mlp.down_proj", 2},
        {"model.language_model.layers.3.self_attn.q_proj", 4},
        {"model.language_model.layers.20.self_attn.o_proj", 4},
        {"model.language_model.layers.7.per_layer_input_gate", 8},
        {"model.language_model.layers.7.per_layer_projection", 8},
        {"model.language_model.per_layer_model_projection", 0}, /* endswith a not-convert key */
        {"model.vision_tower.patch_embedder.input_proj", 0},    /* re.match(key + "\\.") */
        {"model.vision_tower.encoder.layers.0.mlp.gate_proj", 8},
        {"model.audio_tower.layers.0.lconv1d.linear_start", 4}, /* lookahead excludes the 2-bit rule */
        {"model.audio_tower.layers.0.lconv1d.linear_end", 2},
        {"model.audio_tower.layers.0.self_attn.relative_k_proj", 0},
        {"model.language_model.something_else", 4}, /* no pattern: num_bits */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int b = g4_config_module_bits(&c, cases[i].module);
        CHECK(b == cases[i].bits, "%s: %d bits, expected %d", cases[i].module, b, cases[i].bits);
    }
    CHECK_EQ_INT(c.n_layers, 5);
    CHECK_EQ_INT(c.layer_types[4], G4_LAYER_FULL);
    CHECK(c.rope[G4_LAYER_FULL].proportional && c.rope[G4_LAYER_FULL].partial_rotary_factor == 0.25, "rope");
    CHECK_EQ_INT(c.n_global_kv_heads, 1);
    CHECK_EQ_INT(c.n_stop_ids, 2);
    g4_config_free(&c);
}

/* With the two MLP patterns in the other order, layers 0-14 would decode as 2-bit (checkpoint.md §4). */
static void test_order_matters(void) {
    const char *q = "\"quantization_config\": {\"quant_method\": \"gemma\", \"num_bits\": 4, \"module_quant_configs\": {"
                    "\"language_model\\\\.layers\\\\.\\\\d+\\\\.mlp\\\\.\": {\"num_bits\": 2},"
                    "\"language_model\\\\.layers\\\\.(\\\\d|1[0-4])\\\\.mlp\\\\.\": {\"num_bits\": 4}}}";
    g4_config c;
    CHECK(parse(&c, q, "") == 0, "%s", g4_last_error());
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.layers.3.mlp.gate_proj"), 2);
    g4_config_free(&c);
}

/* re.search over one alternation: the leftmost match wins even when a later-listed pattern. */
static void test_leftmost_wins(void) {
    const char *q = "\"quantization_config\": {\"quant_method\": \"gemma\", \"num_bits\": 4, \"module_quant_configs\": {"
                    "\"mlp\": {\"num_bits\": 2}, \"layers\": {\"num_bits\": 8}}}";
    g4_config c;
    CHECK(parse(&c, q, "") == 0, "%s", g4_last_error());
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.layers.3.mlp.up_proj"), 8);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.mlp.layers"), 2);
    g4_config_free(&c);
}

static void test_text_only_and_errors(void) {
    char buf[8192];
    g4_config c;
    snprintf(buf, sizeof buf, "{%s, %s}", text_fields, e2b_quant);
    CHECK(g4_config_parse(&c, buf, "config.json") == 0, "text-only config: %s", g4_last_error());
    g4_config_free(&c);
    /* no quantization_config: a plain checkpoint, every module float (BF16 on disk) */
    CHECK(parse(&c, "\"x\": 1", "") == 0, "%s", g4_last_error());
    CHECK_EQ_INT(c.quant.method, G4_QUANT_NONE);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.layers.0.mlp.gate_proj"), 0);
    CHECK_EQ_INT(g4_config_module_bits(&c, "lm_head"), 0);
    CHECK_EQ_INT(g4_config_module_block(&c, "model.language_model.layers.0.mlp.gate_proj"), 0);
    g4_config_free(&c);
    CHECK(parse(&c, "\"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4}", "") != 0 &&
              strstr(g4_last_error(), "quant_method \"awq\" is not implemented"),
          "%s", g4_last_error());
    CHECK(parse(&c, "\"quantization_config\": {\"bits\": 4}", "") != 0 && strstr(g4_last_error(), "quant_method missing"), "%s",
          g4_last_error());
    CHECK(parse(&c, "\"quantization_config\": {\"quant_method\": \"gemma\", \"num_bits\": 4, \"block_size\": 33}", "") != 0 &&
              strstr(g4_last_error(), "block_size 33"),
          "%s", g4_last_error());
    const char *bad_regex = "\"quantization_config\": {\"quant_method\": \"gemma\", \"num_bits\": 4, \"module_quant_configs\": {"
                            "\"(?<!\": {\"num_bits\": 2}}}";
    CHECK(parse(&c, bad_regex, "") != 0 && strstr(g4_last_error(), "invalid regex"), "%s", g4_last_error());
    CHECK(g4_config_parse(&c, "[1, 2]", "config.json") != 0 && strstr(g4_last_error(), "not a JSON object"), "array");
    CHECK(g4_config_parse(&c, "", "config.json") != 0, "empty");
}

/* block_size: the config's for every converted module, a pattern's own where it gives one, none
 * (one scale per output row) for the mobile format; not-converted modules stay float. */
static void test_block_size(void) {
    const char *q = "\"quantization_config\": {\"quant_method\": \"gemma\", \"num_bits\": 4, \"block_size\": 32,"
                    "\"quantize_embeddings\": true, \"module_quant_configs\": {"
                    "\"language_model\\\\.embed_tokens$\": {\"num_bits\": 8},"
                    "\"language_model\\\\.layers\\\\.0\\\\.mlp\\\\.\": {\"num_bits\": 4, \"block_size\": 64}},"
                    "\"modules_to_not_convert\": [\"per_layer_model_projection\"]}";
    g4_config c;
    CHECK(parse(&c, q, "") == 0, "%s", g4_last_error());
    CHECK_EQ_INT(c.quant.block_size, 32);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.embed_tokens"), 8);
    CHECK_EQ_INT(g4_config_module_block(&c, "model.language_model.embed_tokens"), 32);
    CHECK_EQ_INT(g4_config_module_block(&c, "model.language_model.layers.0.mlp.up_proj"), 64);
    CHECK_EQ_INT(g4_config_module_block(&c, "model.language_model.layers.1.mlp.up_proj"), 32);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.per_layer_model_projection"), 0);
    CHECK_EQ_INT(g4_config_module_block(&c, "model.language_model.per_layer_model_projection"), 0);
    g4_config_free(&c);
    CHECK(parse(&c, e2b_quant, "") == 0, "%s", g4_last_error());
    CHECK_EQ_INT(g4_config_module_block(&c, "model.language_model.layers.3.self_attn.q_proj"), 0);
    g4_config_free(&c);
}

/* per_layer_config (what transformers 5.17 writes instead of global_head_dim): its overrides set
 * the full-attention layers' shape, must agree within a type, and name only head_dim and
 * num_key_value_heads; without it and without global_head_dim the full layers take transformers'
 * default 512. */
static void test_per_layer_config(void) {
    char buf[8192];
    g4_config c;
    const char *five = "\"hidden_size\": 64, \"num_hidden_layers\": 5, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
                       "\"head_dim\": 16, \"intermediate_size\": 96, \"hidden_size_per_layer_input\": 16, \"vocab_size\": 512,"
                       "\"rms_norm_eps\": 1e-6, \"hidden_activation\": \"gelu_pytorch_tanh\", \"sliding_window\": 8,"
                       "\"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\"],"
                       "\"rope_parameters\": {\"full_attention\": {\"partial_rotary_factor\": 0.25, \"rope_theta\": 1000000.0, \"rope_type\": "
                       "\"proportional\"}, \"sliding_attention\": {\"rope_theta\": 10000.0, \"rope_type\": \"default\"}}";
    snprintf(buf, sizeof buf, "{%s, \"per_layer_config\": {\"2\": {\"head_dim\": 32}, \"4\": {\"head_dim\": 32, \"num_key_value_heads\": 2}}}",
             five);
    CHECK(g4_config_parse(&c, buf, "config.json") != 0 && strstr(g4_last_error(), "different shapes (layer 4"), "%s", g4_last_error());
    snprintf(buf, sizeof buf, "{%s, \"global_head_dim\": 64, \"per_layer_config\": {\"2\": {\"head_dim\": 32}, \"4\": {\"head_dim\": 32}}}", five);
    CHECK(g4_config_parse(&c, buf, "config.json") == 0, "%s", g4_last_error());
    CHECK_EQ_INT(c.global_head_dim, 32); /* per_layer_config wins over global_head_dim, as in transformers */
    CHECK_EQ_INT(c.head_dim, 16);
    CHECK_EQ_INT(c.n_global_kv_heads, 1);
    g4_config_free(&c);
    snprintf(buf, sizeof buf, "{%s, \"per_layer_config\": {\"2\": {\"head_dim\": 32, \"rope_theta\": 5.0}, \"4\": {\"head_dim\": 32}}}", five);
    CHECK(g4_config_parse(&c, buf, "config.json") != 0 && strstr(g4_last_error(), "per_layer_config.2.rope_theta is not implemented"), "%s",
          g4_last_error());
    snprintf(buf, sizeof buf, "{%s, \"per_layer_config\": {\"7\": {\"head_dim\": 32}}}", five);
    CHECK(g4_config_parse(&c, buf, "config.json") != 0 && strstr(g4_last_error(), "\"7\" is not a layer index"), "%s", g4_last_error());
    snprintf(buf, sizeof buf, "{%s}", five);
    CHECK(g4_config_parse(&c, buf, "config.json") == 0, "%s", g4_last_error());
    CHECK_EQ_INT(c.global_head_dim, 512);
    g4_config_free(&c);
}

/* text_fields with its first `from` replaced by `to`, parsed. */
static int parse_edited(g4_config *c, const char *from, const char *to) {
    char fields[4096], buf[8192];
    const char *at = strstr(text_fields, from);
    if (!at) return 1;
    snprintf(fields, sizeof fields, "%.*s%s%s", (int)(at - text_fields), text_fields, to, at + strlen(from));
    snprintf(buf, sizeof buf, "{\"eos_token_id\": [1, 106], \"text_config\": {%s}, %s}", fields, e2b_quant);
    return g4_config_parse(c, buf, "config.json");
}

/* Float fields that the forward pass takes through float arithmetic are refused outside bounds
 * that keep it finite (an eps of 1e300 or a softcap that rounds to inf gave NaN logits, issue 33),
 * each with one line naming config.json and the field; values at the bounds load. */
static void test_float_ranges(void) {
    struct {
        const char *from, *to, *msg;
    } bad[] = {
        {"\"rms_norm_eps\": 1e-6", "\"rms_norm_eps\": 1e300", "config.json: text_config.rms_norm_eps 1e+300: expected a number in [1e-12, 1]"},
        {"\"rms_norm_eps\": 1e-6", "\"rms_norm_eps\": 1e-300", "text_config.rms_norm_eps 1e-300: expected"},
        {"\"rms_norm_eps\": 1e-6", "\"rms_norm_eps\": 0", "text_config.rms_norm_eps 0: expected"},
        {"\"rms_norm_eps\": 1e-6", "\"rms_norm_eps\": 1e999", "text_config.rms_norm_eps must be a number"},
        {"\"final_logit_softcapping\": 30.0", "\"final_logit_softcapping\": 1e300",
         "config.json: text_config.final_logit_softcapping 1e+300: expected a number in [0.001, 1e+06]"},
        {"\"final_logit_softcapping\": 30.0", "\"final_logit_softcapping\": -1", "text_config.final_logit_softcapping -1: expected"},
        {"\"rope_theta\": 1000000.0", "\"rope_theta\": 1e39",
         "config.json: text_config.rope_parameters.full_attention.rope_theta 1e+39: expected a number in [1, 1e+12]"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 0", "text_config.rope_parameters.sliding_attention.rope_theta 0: expected"},
        {"\"partial_rotary_factor\": 0.25", "\"partial_rotary_factor\": 1e300", "partial_rotary_factor must be in (0, 1]"},
    };
    g4_config c;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = parse_edited(&c, bad[i].from, bad[i].to);
        CHECK(rc != 0 && strstr(g4_last_error(), bad[i].msg) && !strchr(g4_last_error(), '\n'), "%s: %s", bad[i].to, g4_last_error());
        if (rc == 0) g4_config_free(&c);
    }
    const char *edge[][2] = {
        {"\"rms_norm_eps\": 1e-6", "\"rms_norm_eps\": 1"},
        {"\"rms_norm_eps\": 1e-6", "\"rms_norm_eps\": 1e-12"},
        {"\"final_logit_softcapping\": 30.0", "\"final_logit_softcapping\": null"},
        {"\"final_logit_softcapping\": 30.0", "\"final_logit_softcapping\": 1e6"},
        {"\"rope_theta\": 1000000.0", "\"rope_theta\": 1e12"},
    };
    for (size_t i = 0; i < sizeof edge / sizeof *edge; i++) {
        CHECK(parse_edited(&c, edge[i][0], edge[i][1]) == 0, "%s: %s", edge[i][1], g4_last_error());
        g4_config_free(&c);
    }
}

/* generation_config.json's temperature takes g4_sampling_check's bound: one that is not a finite
 * number >= 0 (1e999 parses as inf) is refused with the file named, not used (it gave garbage). */
static void test_generation_config_temperature(void) {
    char dir[] = "/tmp/g4_test_config_XXXXXX", path[256], cfg[8192];
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp failed");
        return;
    }
    snprintf(cfg, sizeof cfg, "{\"eos_token_id\": [1, 106], \"text_config\": {%s}, %s}", text_fields, e2b_quant);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file_or_exit(path, cfg, strlen(cfg));
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    const char *bad[] = {"{\"temperature\": 1e999}", "{\"temperature\": -0.5}"};
    const char *msg[] = {"generation_config.json: temperature inf: expected a finite number >= 0",
                         "generation_config.json: temperature -0.5: expected a finite number >= 0"};
    g4_config c;
    for (int i = 0; i < 2; i++) {
        write_file_or_exit(path, bad[i], strlen(bad[i]));
        int rc = g4_config_load(&c, dir);
        CHECK(rc != 0 && strstr(g4_last_error(), msg[i]), "%s: %s", bad[i], g4_last_error());
        if (rc == 0) g4_config_free(&c);
    }
    const char *good = "{\"temperature\": 0.7, \"top_k\": 64}";
    write_file_or_exit(path, good, strlen(good));
    CHECK(g4_config_load(&c, dir) == 0 && c.has_sampling && fabs(c.temperature - 0.7) < 1e-12, "%s", g4_last_error());
    g4_config_free(&c);
    remove(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    remove(path);
    rmdir(dir);
}

int main(void) {
    test_per_layer_config();
    test_block_size();
    test_e2b_bits();
    test_order_matters();
    test_leftmost_wins();
    test_text_only_and_errors();
    test_float_ranges();
    test_generation_config_temperature();
    return check_report("config");
}
