/* The forward pass against the tiny-mobile goldens from HF transformers, in each of the three
 * fixture modes, with the comparison bounds of the fixture README ("Suggested comparison"). */
#include "testutil.h"

typedef struct {
    const char *mode;    /* golden.json key */
    const char *file;    /* golden safetensors */
    g4_act_mode act;
    int kv_quant, pmp_quant;
    int ids_must_match;  /* leading generated ids that must be identical */
    double embeds, pli, kv, final_norm, logits_max, logits_p99;
    int per_layer_noise; /* hidden_after_layer bound: 2 x worst perturbation run of golden.json */
} mode_spec;

static const mode_spec modes[] = {
    {"float", "golden_float.safetensors", G4_ACT_FLOAT, 0, 0, 16, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4, 0},
    {"fakequant-hf", "golden_fakequant_hf.safetensors", G4_ACT_FAKE, 0, 0, 8, 1e-6, 1e-4, 0.1388, 0.4586, 2.2100, 0.9503, 1},
    {"fakequant-full", "golden_fakequant_full.safetensors", G4_ACT_FAKE, 1, 1, 16, 1e-6, 0.05, 0.2835, 0.3626, 2.5533, 1.1824, 1},
};

static cJSON *golden;

/* Per-layer hidden-state bounds: 2 x the largest deviation over the mode's perturbation runs. */
static double hidden_bound(const mode_spec *ms, int layer) {
    if (!ms->per_layer_noise) return 1e-4;
    const cJSON *rob = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(golden, "modes"), ms->mode), "robustness");
    double worst = 0;
    for (const cJSON *run = rob->child; run; run = run->next) {
        double v = cJSON_GetArrayItem(cJSON_GetObjectItem(run, "hidden_after_layer_max_abs_diff"), layer)->valuedouble;
        if (v > worst) worst = v;
    }
    return fmax(2 * worst, 1e-4);
}

static void compare(const char *mode, const char *what, const float *got, const float *want, int64_t n, double bound) {
    double d = max_abs_diff(got, want, n);
    CHECK(d <= bound, "%s: %s max|diff| %.3g > %.3g", mode, what, d, bound);
    printf("ok %s %-26s max|diff| %.3g (bound %.3g)\n", mode, what, d, bound);
}

static g4_options options_for(const mode_spec *ms) {
    g4_options o;
    g4_options_default(&o);
    o.act = ms->act;
    o.kv_quant = ms->kv_quant;
    o.pmp_quant = ms->pmp_quant;
    o.ctx = 64;
    return o;
}

static void check_prefill_tensors(const mode_spec *ms, const g4_model *m, const g4_safetensors *gs, const int32_t *ids, int n) {
    g4_options o = options_for(ms);
    g4_session *s = g4_session_new(m, &o);
    g4_capture cap = {0};
    int V = g4_model_vocab_size(m);
    float *logits = malloc(sizeof *logits * (size_t)n * V);
    g4_session_set_trace(s, g4_capture_trace, &cap);
    CHECK(g4_session_eval(s, ids, n, logits, 1) == 0, "%s", g4_last_error());
    struct { const char *name; double bound; } plain[] = {
        {"inputs_embeds", ms->embeds}, {"per_layer_inputs_token", ms->embeds},
        {"per_layer_inputs", ms->pli}, {"final_norm", ms->final_norm},
    };
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++) {
        int64_t numel;
        const float *want = golden_f32(gs, plain[i].name, &numel);
        const g4_captured *got = g4_capture_get(&cap, plain[i].name);
        CHECK(got && (int64_t)got->rows * got->width == numel, "%s: %s missing or wrong size", ms->mode, plain[i].name);
        if (got && (int64_t)got->rows * got->width == numel) compare(ms->mode, plain[i].name, got->data, want, numel, plain[i].bound);
    }
    for (int l = 0; l < 64; l++) {
        char name[64];
        for (int kv = 0; kv < 2; kv++) {
            snprintf(name, sizeof name, "%s_layer%d", kv ? "v" : "k", l);
            if (!g4_st_find(gs, name)) continue;
            int64_t numel;
            const float *want = golden_f32(gs, name, &numel);
            const g4_captured *got = g4_capture_get(&cap, name);
            CHECK(got && (int64_t)got->rows * got->width == numel, "%s: %s missing or wrong size", ms->mode, name);
            if (got && (int64_t)got->rows * got->width == numel) compare(ms->mode, name, got->data, want, numel, ms->kv);
        }
    }
    int64_t numel;
    const float *hidden = golden_f32(gs, "hidden_after_layer", &numel);
    int layers = (int)(numel / ((int64_t)n * g4_capture_get(&cap, "inputs_embeds")->width));
    for (int l = 0; l < layers; l++) {
        char name[64];
        snprintf(name, sizeof name, "hidden_after_layer%d", l);
        const g4_captured *got = g4_capture_get(&cap, name);
        CHECK(got != NULL, "%s missing", name);
        if (got) compare(ms->mode, name, got->data, hidden + (int64_t)l * got->rows * got->width, (int64_t)got->rows * got->width, hidden_bound(ms, l));
    }
    const float *want = golden_f32(gs, "prefill_logits", &numel);
    CHECK(numel == (int64_t)n * V, "prefill_logits size");
    compare(ms->mode, "prefill_logits", logits, want, numel, ms->logits_max);
    double p99 = p99_abs_diff(logits, want, numel);
    CHECK(p99 <= ms->logits_p99, "%s: prefill logits p99 %.3g > %.3g", ms->mode, p99, ms->logits_p99);
    g4_capture_free(&cap);
    free(logits);
    g4_session_free(s);
}

/* Greedy generation, and step logits teacher-forced on the golden generated ids. */
static void check_generation(const mode_spec *ms, const g4_model *m, const g4_safetensors *gs, const int32_t *ids, int n,
                             const int32_t *gold, int n_gold) {
    g4_options o = options_for(ms);
    g4_session *s = g4_session_new(m, &o);
    int V = g4_model_vocab_size(m);
    float *logits = malloc(sizeof *logits * (size_t)n_gold * V);
    CHECK(g4_session_eval(s, ids, n, logits, 0) == 0, "%s", g4_last_error());
    int32_t gen[64];
    int same = 0;
    for (int i = 0; i < n_gold; i++) {
        gen[i] = g4_argmax(logits + (size_t)i * V, V);
        if (same == i && gen[i] == gold[i]) same++;
        if (i + 1 < n_gold) CHECK(g4_session_eval(s, &gold[i], 1, logits + (size_t)(i + 1) * V, 0) == 0, "%s", g4_last_error());
    }
    CHECK(same >= ms->ids_must_match, "%s: generated ids match the golden for %d steps, need %d", ms->mode, same, ms->ids_must_match);
    printf("ok %s generated ids identical for %d of %d steps (need %d)\n", ms->mode, same, n_gold, ms->ids_must_match);
    int64_t numel;
    const float *want = golden_f32(gs, "step_logits", &numel);
    compare(ms->mode, "step_logits (teacher-forced)", logits, want, numel, ms->logits_max);
    double p99 = p99_abs_diff(logits, want, numel);
    CHECK(p99 <= ms->logits_p99, "%s: step logits p99 %.3g > %.3g", ms->mode, p99, ms->logits_p99);
    /* Free-running greedy decode (not teacher-forced) must give the golden tokens too. */
    g4_session_reset(s);
    CHECK(g4_session_eval(s, ids, n, logits, 0) == 0, "%s", g4_last_error());
    int free_same = 0;
    for (int i = 0; i < n_gold; i++) {
        int32_t next = g4_argmax(logits, V);
        if (free_same == i && next == gold[i]) free_same++;
        if (i + 1 < n_gold) g4_session_eval(s, &next, 1, logits, 0);
    }
    CHECK(free_same >= ms->ids_must_match, "%s: free-running greedy matches for %d steps", ms->mode, free_same);
    free(logits);
    g4_session_free(s);
}

/* One prefill over prompt + generated ids gives the same logits as decoding token by token. */
static void check_incremental(const mode_spec *ms, const g4_model *m, const int32_t *ids, int n, const int32_t *gold, int n_gold) {
    g4_options o = options_for(ms);
    int V = g4_model_vocab_size(m), total = n + n_gold - 1;
    int32_t *all = malloc(sizeof *all * (size_t)total);
    memcpy(all, ids, sizeof *ids * (size_t)n);
    memcpy(all + n, gold, sizeof *gold * (size_t)(n_gold - 1));
    float *one = malloc(sizeof *one * (size_t)total * V), *step = malloc(sizeof *step * (size_t)total * V);
    g4_session *s = g4_session_new(m, &o);
    CHECK(g4_session_eval(s, all, total, one, 1) == 0, "%s", g4_last_error());
    g4_session_reset(s);
    for (int i = 0; i < total; i++) CHECK(g4_session_eval(s, &all[i], 1, step + (size_t)i * V, 0) == 0, "%s", g4_last_error());
    double d = max_abs_diff(one, step, (int64_t)total * V);
    double bound = ms->act == G4_ACT_FLOAT ? 1e-4 : ms->logits_max;
    CHECK(d <= bound, "%s: prefill vs token-by-token logits differ by %.3g", ms->mode, d);
    printf("ok %s prefill vs token-by-token logits max|diff| %.3g\n", ms->mode, d);
    g4_session_free(s);
    free(all);
    free(one);
    free(step);
}

int main(void) {
    char path[8192];
    snprintf(path, sizeof path, "%s/golden.json", tiny_dir());
    golden = read_json(path);
    int n, n_gold;
    int32_t *ids = json_ids(cJSON_GetObjectItem(golden, "input_ids"), &n);
    g4_model *m = g4_model_load(tiny_dir());
    CHECK(m != NULL, "load: %s", g4_last_error());
    if (!m) return check_report("fixture");
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        const mode_spec *ms = &modes[i];
        const cJSON *gm = cJSON_GetObjectItem(cJSON_GetObjectItem(golden, "modes"), ms->mode);
        int32_t *gold = json_ids(cJSON_GetObjectItem(gm, "generated_ids"), &n_gold);
        g4_safetensors gs;
        snprintf(path, sizeof path, "%s/%s", tiny_dir(), ms->file);
        if (g4_st_open_file(&gs, path) != 0) {
            fprintf(stderr, "%s\n", g4_last_error());
            return 2;
        }
        check_prefill_tensors(ms, m, &gs, ids, n);
        check_generation(ms, m, &gs, ids, n, gold, n_gold);
        check_incremental(ms, m, ids, n, gold, n_gold);
        g4_st_close(&gs);
        free(gold);
    }
    g4_model_free(m);
    free(ids);
    cJSON_Delete(golden);
    return check_report("fixture");
}
