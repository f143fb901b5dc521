/* Checkpoints without static activation quantization against transformers' float goldens
 * (tests/fixtures/gen/gen_tiny_bf16.py): tiny-bf16, a plain BF16 Gemma 4 (no quantization_config,
 * BF16 embeddings, the lm_head tied to embed_tokens, vision/audio towers and dead consumer K/V in
 * the file), and tiny-q4_0, the same model quantized to Q4_0 (block-scaled int4 linears, Q8_0
 * embeddings and tied lm_head) with goldens of the plain model holding its dequantized weights.
 * Bounds: the fixture README's float mode (1e-4 absolute on every tensor, generated ids exact); the
 * generator measured float64 within 2e-5 of its float32 goldens. Every --act mode must give the
 * same bits, since nothing in these checkpoints is quantized at run time. */
#define _DEFAULT_SOURCE /* realpath, mkdtemp, symlink */
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "model/feed.h"

#define FLOAT_BOUND 1e-4

static void compare(const char *fx, const char *what, const float *got, const float *want, int64_t n, double bound) {
    double d = max_abs_diff(got, want, n);
    CHECK(d <= bound, "%s: %s max|diff| %.3g > %.3g", fx, what, d, bound);
    printf("ok %s %-26s max|diff| %.3g (bound %.3g)\n", fx, what, d, bound);
}

static g4_options act_options(g4_act_mode act) {
    g4_options o;
    g4_options_default(&o);
    o.act = act;
    o.ctx = 64;
    return o;
}

/* Every prefill tensor the goldens hold, captured from one session. */
static void check_prefill(const char *fx, const g4_model *m, const g4_safetensors *gs, const int32_t *ids, int n) {
    g4_options o = act_options(G4_ACT_FLOAT);
    g4_session *s = g4_session_new(m, &o);
    g4_capture cap = {0};
    int V = g4_model_vocab_size(m);
    float *logits = malloc(sizeof *logits * (size_t)n * V);
    g4_session_set_trace(s, g4_capture_trace, &cap);
    CHECK(g4_session_feed(s, ids, n, logits, 1) == 0, "%s", g4_last_error());
    const char *names[] = {"inputs_embeds", "per_layer_inputs_token", "per_layer_inputs", "final_norm"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        int64_t numel;
        const float *want = golden_f32(gs, names[i], &numel);
        const g4_captured *got = g4_capture_get(&cap, names[i]);
        CHECK(got && (int64_t)got->rows * got->width == numel, "%s: %s missing or wrong size", fx, names[i]);
        if (got && (int64_t)got->rows * got->width == numel) compare(fx, names[i], got->data, want, numel, FLOAT_BOUND);
    }
    int compared_kv = 0;
    for (int l = 0; l < 64; l++)
        for (int v = 0; v < 2; v++) {
            char name[32];
            snprintf(name, sizeof name, "%s_layer%d", v ? "v" : "k", l);
            if (!g4_st_find(gs, name)) continue;
            int64_t numel;
            const float *want = golden_f32(gs, name, &numel);
            const g4_captured *got = g4_capture_get(&cap, name);
            CHECK(got && (int64_t)got->rows * got->width == numel, "%s: %s missing or wrong size", fx, name);
            if (got && (int64_t)got->rows * got->width == numel) compare(fx, name, got->data, want, numel, FLOAT_BOUND);
            compared_kv++;
        }
    CHECK(compared_kv > 0, "%s: the goldens hold no K/V", fx);
    int64_t numel;
    const float *hidden = golden_f32(gs, "hidden_after_layer", &numel);
    const g4_captured *e = g4_capture_get(&cap, "inputs_embeds");
    int layers = e ? (int)(numel / ((int64_t)n * e->width)) : 0;
    CHECK(layers > 0, "%s: no layers in hidden_after_layer", fx);
    for (int l = 0; l < layers; l++) {
        char name[64];
        snprintf(name, sizeof name, "hidden_after_layer%d", l);
        const g4_captured *got = g4_capture_get(&cap, name);
        CHECK(got != NULL, "%s missing", name);
        if (got) compare(fx, name, got->data, hidden + (int64_t)l * got->rows * got->width, (int64_t)got->rows * got->width, FLOAT_BOUND);
    }
    const float *want = golden_f32(gs, "prefill_logits", &numel);
    CHECK(numel == (int64_t)n * V, "prefill_logits size");
    compare(fx, "prefill_logits", logits, want, numel, FLOAT_BOUND);
    g4_capture_free(&cap);
    free(logits);
    g4_session_free(s);
}

/* Greedy generation free-running, and the step logits teacher-forced on the golden ids. */
static void check_generation(const char *fx, const g4_model *m, const g4_safetensors *gs, const int32_t *ids, int n, const int32_t *gold,
                             int n_gold) {
    g4_options o = act_options(G4_ACT_FLOAT);
    g4_session *s = g4_session_new(m, &o);
    int V = g4_model_vocab_size(m);
    float *logits = malloc(sizeof *logits * (size_t)n_gold * V);
    CHECK(g4_session_feed(s, ids, n, logits, 0) == 0, "%s", g4_last_error());
    for (int i = 0; i + 1 < n_gold; i++)
        CHECK(g4_session_feed(s, &gold[i], 1, logits + (size_t)(i + 1) * V, 0) == 0, "%s", g4_last_error());
    int64_t numel;
    const float *want = golden_f32(gs, "step_logits", &numel);
    CHECK(numel == (int64_t)n_gold * V, "step_logits size");
    compare(fx, "step_logits (teacher-forced)", logits, want, numel, FLOAT_BOUND);
    g4_session_reset(s);
    int32_t next = -1, same = 0;
    CHECK(g4_session_feed_argmax(s, ids, n, &next) == 0, "%s", g4_last_error());
    for (int i = 0; i < n_gold; i++) {
        if (same == i && next == gold[i]) same++;
        if (i + 1 < n_gold) CHECK(g4_session_feed_argmax(s, &next, 1, &next) == 0, "%s", g4_last_error());
    }
    CHECK(same == n_gold, "%s: free-running greedy matches the golden ids for %d of %d steps", fx, same, n_gold);
    printf("ok %s greedy ids identical for %d of %d steps\n", fx, same, n_gold);
    free(logits);
    g4_session_free(s);
}

/* Nothing is quantized at run time: --act fake and int (with their defaults: int8 KV cache,
 * per_layer_model_projection quantization) give the float mode's bits, resident and mapped. */
static void check_act_modes_equal(const char *fx, const char *dir, const g4_model *m, const int32_t *ids, int n) {
    int V = g4_model_vocab_size(m);
    float *ref = malloc(sizeof *ref * (size_t)n * V), *got = malloc(sizeof *got * (size_t)n * V);
    g4_model *mapped = g4_model_load_mapped(dir);
    CHECK(mapped != NULL, "%s", g4_last_error());
    for (int act = G4_ACT_FLOAT; act <= G4_ACT_INT && mapped; act++) {
        g4_options o = act_options((g4_act_mode)act);
        g4_session *s = g4_session_new(act == G4_ACT_FLOAT ? m : mapped, &o);
        CHECK(s && g4_session_feed(s, ids, n, act == G4_ACT_FLOAT ? ref : got, 1) == 0, "%s", g4_last_error());
        if (act != G4_ACT_FLOAT)
            CHECK(memcmp(ref, got, sizeof *ref * (size_t)n * V) == 0, "%s: --act %d (mapped weights) differs from --act float", fx, act);
        g4_session_free(s);
    }
    printf("ok %s --act float, fake and int give the same logits bit for bit (resident and mapped weights)\n", fx);
    g4_model_free(mapped);
    free(ref);
    free(got);
}

static void check_fixture(const char *dir, const char *fx) {
    char path[4096];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    cJSON *golden = read_json(path);
    int n, n_gold;
    int32_t *ids = json_ids(cJSON_GetObjectItem(golden, "input_ids"), &n);
    int32_t *gold = json_ids(cJSON_GetObjectItem(golden, "generated_ids"), &n_gold);
    g4_safetensors gs;
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    if (g4_st_open_file(&gs, path) != 0) {
        fprintf(stderr, "%s\n", g4_last_error());
        exit(2);
    }
    g4_model *m = g4_model_load(dir);
    CHECK(m != NULL, "load %s: %s", dir, g4_last_error());
    if (m) {
        check_prefill(fx, m, &gs, ids, n);
        check_generation(fx, m, &gs, ids, n, gold, n_gold);
        check_act_modes_equal(fx, dir, m, ids, n);
    }
    g4_model_free(m);
    g4_st_close(&gs);
    free(ids);
    free(gold);
    cJSON_Delete(golden);
}

/* The fixture's tensors are what its README says: no lm_head tensor (tied), BF16 embeddings in
 * tiny-bf16, block-scaled codes with F16 scales in tiny-q4_0. */
static void check_layout(void) {
    g4_safetensors st;
    CHECK(g4_st_open_file(&st, "tests/fixtures/tiny-bf16/model.safetensors") == 0, "%s", g4_last_error());
    CHECK(!g4_st_find(&st, "lm_head.weight"), "tiny-bf16 has an lm_head tensor");
    const g4_tensor *e = g4_st_find(&st, "model.language_model.embed_tokens.weight");
    CHECK(e && e->dtype == G4_DT_BF16, "tiny-bf16: embed_tokens.weight is not BF16");
    g4_st_close(&st);
    CHECK(g4_st_open_file(&st, "tests/fixtures/tiny-q4_0/model.safetensors") == 0, "%s", g4_last_error());
    const g4_tensor *w = g4_st_find(&st, "model.language_model.layers.0.mlp.down_proj.weight");
    const g4_tensor *s = g4_st_find(&st, "model.language_model.layers.0.mlp.down_proj.weight_scale");
    CHECK(w && s && w->dtype == G4_DT_U8 && s->dtype == G4_DT_F16 && s->ndim == 2 && s->shape[1] * 32 == w->shape[1] * 2,
          "tiny-q4_0: down_proj is not 4-bit codes with one F16 scale per 32 inputs");
    g4_st_close(&st);
}

/* A copy of fixture `src` in a temp folder with `from` replaced by `to` in its config.json (once),
 * its model.safetensors linked; loading it must fail with a one-line message holding `needle`. */
static void expect_refusal(const char *src, const char *from, const char *to, const char *needle) {
    char dir[] = "/tmp/g4_bf16_XXXXXX", path[4096], target[4096];
    if (!mkdtemp(dir)) exit(2);
    snprintf(path, sizeof path, "%s/config.json", src);
    char *cfg = slurp(path), *at = strstr(cfg, from);
    CHECK(at != NULL, "%s/config.json has no %s", src, from);
    if (!at) {
        free(cfg);
        return;
    }
    size_t n = strlen(cfg) + strlen(to) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(at - cfg), cfg, to, at + strlen(from));
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file_or_exit(path, out, strlen(out));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!realpath(src, target)) exit(2);
    strncat(target, "/model.safetensors", sizeof target - strlen(target) - 1);
    if (symlink(target, path) != 0) exit(2);
    g4_model *m = g4_model_load(dir);
    CHECK(!m && strstr(g4_last_error(), needle) && !strchr(g4_last_error(), '\n'), "%s -> %s: %s", from, to, m ? "loaded" : g4_last_error());
    if (!m) printf("ok refused (%s -> %s): %s\n", from, to, g4_last_error());
    g4_model_free(m);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
    free(cfg);
    free(out);
}

/* What the block-scaled and plain formats refuse, each naming the field or tensor. */
static void check_refusals(void) {
    expect_refusal("tests/fixtures/tiny-q4_0", "\"block_size\": 32", "\"block_size\": 64",
                   "config.json: model.language_model.embed_tokens has 32 columns, not a multiple of its block_size 64");
    expect_refusal("tests/fixtures/tiny-q4_0", "\"block_size\": 32", "\"block_size\": 16", "tensor model.language_model.embed_tokens.embedding_scale: expected F32 or F16 [256, 2], found F16 [256, 1]");
    expect_refusal("tests/fixtures/tiny-q4_0", "\"quant_method\": \"gemma\"", "\"quant_method\": \"bitsandbytes\"",
                   "quant_method \"bitsandbytes\" is not implemented");
    /* the plain checkpoint read as the quantized format: its BF16 linears are not packed codes */
    expect_refusal("tests/fixtures/tiny-bf16", "\"architectures\"", "\"quantization_config\": {\"quant_method\": \"gemma\", \"num_bits\": 4}, \"architectures\"",
                   "expected U8 [");
    expect_refusal("tests/fixtures/tiny-bf16", "\"num_kv_shared_layers\": 4", "\"num_kv_shared_layers\": 4, \"per_layer_config\": {\"4\": {\"head_dim\": 64}}",
                   "different shapes");
}

int main(void) {
    if (!check_dispatch_level()) return check_report("bf16");
    check_layout();
    check_refusals();
    check_fixture("tests/fixtures/tiny-bf16", "bf16");
    check_fixture("tests/fixtures/tiny-q4_0", "q4_0");
    return check_report("bf16");
}
