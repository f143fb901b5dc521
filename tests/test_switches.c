/* Each quantization switch changes what it claims and nothing else: tensors upstream of the
 * point it controls stay bit-identical, the point itself changes as specified. Runs on the
 * tiny-mobile fixture with every intermediate tensor captured. */
#include "model/probe.h"
#include "quant/int8.h"
#include "testutil.h"
#include "model/feed.h"

static g4_model *model;
static const int32_t prompt[] = {2, 501, 288, 465, 482, 442, 412, 19, 336, 371, 455, 145};
#define N_PROMPT ((int)(sizeof prompt / sizeof *prompt))

static g4_options base(g4_act_mode act, int linear, int kv, int pmp) {
    g4_options o;
    g4_options_default(&o);
    o.act = act;
    o.linear_quant = linear;
    o.kv_quant = kv;
    o.pmp_quant = pmp;
    o.ctx = 32;
    return o;
}

static g4_capture run(const g4_options *o) {
    g4_capture cap = {0};
    g4_session *s = g4_session_new(model, o);
    CHECK(s != NULL, "%s", g4_last_error());
    if (!s) return cap;
    g4_session_set_trace(s, g4_capture_trace, &cap);
    float *logits = malloc(sizeof *logits * (size_t)g4_model_vocab_size(model));
    CHECK(g4_session_feed(s, prompt, N_PROMPT, logits, 0) == 0, "%s", g4_last_error());
    free(logits);
    g4_session_free(s);
    return cap;
}

static const g4_captured *get(const g4_capture *c, const char *name) {
    const g4_captured *t = g4_capture_get(c, name);
    if (!t) {
        fprintf(stderr, "tensor %s not captured\n", name);
        exit(2);
    }
    return t;
}

static int same(const g4_capture *a, const g4_capture *b, const char *name) {
    const g4_captured *x = get(a, name), *y = get(b, name);
    return x->rows == y->rows && x->width == y->width && !memcmp(x->data, y->data, sizeof(float) * (size_t)x->rows * x->width);
}

static double diff(const g4_capture *a, const g4_capture *b, const char *name) {
    const g4_captured *x = get(a, name), *y = get(b, name);
    return max_abs_diff(x->data, y->data, (int64_t)x->rows * x->width);
}

#define EXPECT_SAME(a, b, name, what) CHECK(same(&(a), &(b), name), "%s: %s changed", what, name)
#define EXPECT_DIFF(a, b, name, what) CHECK(diff(&(a), &(b), name) > 0, "%s: %s did not change", what, name)

/* Everything off in fake mode is the float run, bit for bit. */
static void test_all_off_is_float(void) {
    g4_options f = base(G4_ACT_FLOAT, 1, 1, 1), off = base(G4_ACT_FAKE, 0, 0, 0), off_int = base(G4_ACT_INT, 0, 0, 0);
    g4_capture a = run(&f), b = run(&off), c = run(&off_int);
    const char *names[] = {"inputs_embeds", "per_layer_inputs", "k_layer0", "v_layer5", "hidden_after_layer9", "final_norm"};
    for (int i = 0; i < 6; i++) {
        EXPECT_SAME(a, b, names[i], "fake with every point off");
        EXPECT_SAME(a, c, names[i], "int with every point off");
    }
    g4_capture_free(&a);
    g4_capture_free(&b);
    g4_capture_free(&c);
}

/* --linear-quant: the linear points only; the PLE inputs (no linear precedes them) stay put. */
static void test_linear_quant(void) {
    g4_options off = base(G4_ACT_FAKE, 0, 0, 0), on = base(G4_ACT_FAKE, 1, 0, 0);
    g4_capture a = run(&off), b = run(&on);
    EXPECT_SAME(a, b, "inputs_embeds", "--linear-quant");
    EXPECT_SAME(a, b, "per_layer_inputs", "--linear-quant");
    EXPECT_DIFF(a, b, "k_layer0", "--linear-quant");
    EXPECT_DIFF(a, b, "hidden_after_layer0", "--linear-quant");
    g4_capture_free(&a);
    g4_capture_free(&b);
}

/* --kv: K and V of the first producer become exactly Q(K; k_cache_scale), Q(V; v_cache_scale)
 * of the unquantized run; nothing before them moves. */
static void test_kv_quant(void) {
    g4_options off = base(G4_ACT_FAKE, 0, 0, 0), on = base(G4_ACT_FAKE, 0, 1, 0);
    g4_capture a = run(&off), b = run(&on);
    EXPECT_SAME(a, b, "inputs_embeds", "--kv int8");
    EXPECT_SAME(a, b, "per_layer_inputs", "--kv int8");
    char path[8192];
    snprintf(path, sizeof path, "%s/model.safetensors", tiny_dir());
    g4_safetensors st;
    if (g4_st_open_file(&st, path) != 0) exit(2);
    const char *kv[2] = {"k", "v"};
    for (int i = 0; i < 2; i++) {
        char name[32], tensor[128];
        snprintf(name, sizeof name, "%s_layer0", kv[i]);
        snprintf(tensor, sizeof tensor, "model.language_model.layers.0.self_attn.%s_cache_scale", kv[i]);
        float scale = g4_load_f32(g4_st_find(&st, tensor)->data);
        g4_quantizer q;
        g4_quantizer_init(&q, scale, 0, G4_ROUND_EVEN, G4_QDIV_DIVIDE);
        const g4_captured *x = get(&a, name), *y = get(&b, name);
        int bad = 0;
        for (int j = 0; j < x->rows * x->width; j++) bad += g4_fake_quantize(&q, x->data[j]) != y->data[j];
        CHECK(bad == 0, "--kv int8: %d values of %s are not Q(value; %s)", bad, name, tensor);
        EXPECT_DIFF(a, b, name, "--kv int8");
    }
    g4_st_close(&st);
    EXPECT_DIFF(a, b, "hidden_after_layer0", "--kv int8");
    g4_capture_free(&a);
    g4_capture_free(&b);
}

/* --pmp-quant and --pmp-placement: the per-layer inputs change; layer 0's K (which does not
 * depend on them) does not; its output (the PLE block) does. */
static void test_pmp(void) {
    g4_options off = base(G4_ACT_FAKE, 0, 0, 0), on = base(G4_ACT_FAKE, 0, 0, 1), raw = on;
    raw.pmp_out_raw = 1;
    g4_capture a = run(&off), b = run(&on), c = run(&raw);
    EXPECT_SAME(a, b, "inputs_embeds", "--pmp-quant");
    EXPECT_SAME(a, b, "k_layer0", "--pmp-quant");
    EXPECT_SAME(a, b, "v_layer0", "--pmp-quant");
    EXPECT_DIFF(a, b, "per_layer_inputs", "--pmp-quant");
    EXPECT_DIFF(a, b, "hidden_after_layer0", "--pmp-quant");
    EXPECT_SAME(b, c, "k_layer0", "--pmp-placement");
    EXPECT_DIFF(b, c, "per_layer_inputs", "--pmp-placement");
    g4_capture_free(&a);
    g4_capture_free(&b);
    g4_capture_free(&c);
}

/* --round: with the projection's input scale set to 2|e| for an embedding value e, e/s is an
 * exact tie (0.5): ties-to-even gives 0, away gives 1, and the per-layer inputs change. */
static float first_embedding_value(void) {
    g4_options f = base(G4_ACT_FLOAT, 0, 0, 0);
    g4_capture a = run(&f);
    float v = 0;
    const g4_captured *e = get(&a, "inputs_embeds");
    for (int i = 0; i < e->width && v == 0; i++) v = fabsf(e->data[i]);
    g4_capture_free(&a);
    return v;
}

static void test_round(void) {
    float v = first_embedding_value();
    g4_options even = base(G4_ACT_FAKE, 0, 0, 1);
    even.pmp_s_in = 2 * v;
    even.qdiv = G4_QDIV_DIVIDE;
    g4_options away = even;
    away.round = G4_ROUND_AWAY;
    g4_capture a = run(&even), b = run(&away);
    EXPECT_SAME(a, b, "inputs_embeds", "--round");
    EXPECT_SAME(a, b, "k_layer0", "--round");
    EXPECT_DIFF(a, b, "per_layer_inputs", "--round");
    g4_capture_free(&a);
    g4_capture_free(&b);
}

/* --qdiv: a scale for which x / s and x * (1/s) round an embedding value to different codes. */
static void test_qdiv(void) {
    float v = first_embedding_value(), found = 0;
    for (int k = 0; k < 127 && !found; k++) {
        float t = v / ((float)k + 0.5f); /* v / t is (about) a tie: try the few scales around it */
        for (int i = 0; i < 4; i++) t = nextafterf(t, 0.0f);
        for (int i = 0; i < 9 && !found; i++, t = nextafterf(t, INFINITY)) {
            g4_quantizer d, r;
            g4_quantizer_init(&d, t, 0, G4_ROUND_EVEN, G4_QDIV_DIVIDE);
            g4_quantizer_init(&r, t, 0, G4_ROUND_EVEN, G4_QDIV_RECIPROCAL);
            if (g4_quantize(&d, v) != g4_quantize(&r, v)) found = t;
        }
    }
    CHECK(found != 0, "no scale separates x/s from x*(1/s) for %g", v);
    g4_options div = base(G4_ACT_FAKE, 0, 0, 1);
    div.pmp_s_in = found;
    div.qdiv = G4_QDIV_DIVIDE;
    g4_options recip = div;
    recip.qdiv = G4_QDIV_RECIPROCAL;
    g4_capture a = run(&div), b = run(&recip);
    EXPECT_SAME(a, b, "inputs_embeds", "--qdiv");
    EXPECT_SAME(a, b, "k_layer0", "--qdiv");
    EXPECT_DIFF(a, b, "per_layer_inputs", "--qdiv");
    g4_capture_free(&a);
    g4_capture_free(&b);
}

/* --requant: acts in int mode only, on the linear outputs; the float path ignores it. */
static void test_requant(void) {
    g4_options f32 = base(G4_ACT_INT, 1, 1, 1), dbl = f32;
    dbl.requant = G4_REQUANT_TFL_DOUBLE;
    g4_capture a = run(&f32), b = run(&dbl);
    EXPECT_SAME(a, b, "inputs_embeds", "--requant");
    EXPECT_SAME(a, b, "per_layer_inputs", "--requant");
    EXPECT_DIFF(a, b, "hidden_after_layer0", "--requant");
    g4_options fake = base(G4_ACT_FAKE, 1, 1, 1), fake_dbl = fake;
    fake_dbl.requant = G4_REQUANT_TFL_DOUBLE;
    g4_capture c = run(&fake), d = run(&fake_dbl);
    EXPECT_SAME(c, d, "final_norm", "--requant in fake mode");
    g4_capture_free(&a);
    g4_capture_free(&b);
    g4_capture_free(&c);
    g4_capture_free(&d);
}

/* --lmhead-dynamic-q8: only the logits move (the lm_head input is quantized per token), and
 * only by the size of an int8 rounding of the final norm. */
static void test_lmhead_dynamic(void) {
    g4_options off = base(G4_ACT_INT, 1, 1, 1), on = off;
    on.lmhead_dynamic_q8 = 1;
    g4_capture a = run(&off), b = run(&on);
    EXPECT_SAME(a, b, "final_norm", "--lmhead-dynamic-q8");
    EXPECT_DIFF(a, b, "logits", "--lmhead-dynamic-q8");
    double d = diff(&a, &b, "logits");
    CHECK(d < 0.5, "--lmhead-dynamic-q8 moved the logits by %g", d);
    printf("ok --lmhead-dynamic-q8 moves the last logits by at most %.3g\n", d);
    g4_capture_free(&a);
    g4_capture_free(&b);
}

/* The checkpoint's linears as the fixture describes them, not as the engine binds them: every
 * module of manifest.json with an input_activation_scale and role "text" (transformers'
 * QuantizedLinear modules of the text model; a KV-shared layer's unused k_proj/v_proj carry another
 * role), quantized where that scale in model.safetensors is not 0. */
typedef struct {
    char module[128];
    int quantized;
    int unused; /* a KV-shared layer's k_proj/v_proj: present in the file, no linear of the model */
} fixture_linear;

static int fixture_linears(fixture_linear *out, int max) {
    char path[8192];
    snprintf(path, sizeof path, "%s/manifest.json", tiny_dir());
    cJSON *manifest = read_json(path);
    snprintf(path, sizeof path, "%s/model.safetensors", tiny_dir());
    g4_safetensors st;
    if (g4_st_open_file(&st, path) != 0) exit(2);
    static const char suffix[] = ".input_activation_scale";
    int n = 0;
    for (const cJSON *e = manifest->child; e && n < max; e = e->next) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(e, "name")), *role = cJSON_GetStringValue(cJSON_GetObjectItem(e, "role"));
        size_t len = name ? strlen(name) : 0;
        if (!role || len <= strlen(suffix) || strcmp(name + len - strlen(suffix), suffix) != 0) continue;
        if (strncmp(name, "model.language_model.", 21) != 0 && strncmp(name, "lm_head.", 8) != 0) continue;
        fixture_linear *f = &out[n++];
        snprintf(f->module, sizeof f->module, "%.*s", (int)(len - strlen(suffix)), name);
        f->unused = strcmp(role, "text") != 0;
        const g4_tensor *t = g4_st_find(&st, name);
        f->quantized = t && g4_load_f32(t->data) != 0;
    }
    g4_st_close(&st);
    cJSON_Delete(manifest);
    return n;
}

/* The kind of a layer linear: its name after "layers.<L>." ("per_layer_input_gate",
 * "mlp.down_proj", ...), or the whole name (lm_head). */
static const char *linear_kind(const char *module) {
    const char *p = strstr(module, "layers.");
    if (!p) return module;
    p += strlen("layers.");
    while (*p >= '0' && *p <= '9') p++;
    return *p == '.' ? p + 1 : module;
}

/* Every quantized linear runs in integers in int mode, for every token row, and none does in float
 * or fake mode: the counts of probe.h after a prefill (every row's logits, so every row passes every
 * layer) and a few decode steps equal the fixture's linears x tokens. A linear sent down the float
 * path in int mode gives nearly the same logits (the 8-bit per-layer-input gate and projection: the
 * fixture's unit_linear shows their integer and fake-quant codes equal), so only its path shows it. */
static void test_every_linear_path(void) {
    enum { MAX_LINEARS = 256, DECODE_STEPS = 3 };
    static fixture_linear lins[MAX_LINEARS];
    int n_lins = fixture_linears(lins, MAX_LINEARS), V = g4_model_vocab_size(model);
    const long long rows = N_PROMPT + DECODE_STEPS;
    float *logits = malloc(sizeof *logits * (size_t)N_PROMPT * V);
    static const char *must_cover[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                                       "mlp.up_proj", "mlp.down_proj", "per_layer_input_gate", "per_layer_projection"};
    for (size_t k = 0; k < sizeof must_cover / sizeof *must_cover; k++) {
        int found = 0;
        for (int i = 0; i < n_lins; i++) found += lins[i].quantized && !lins[i].unused && !strcmp(linear_kind(lins[i].module), must_cover[k]);
        CHECK(found > 0, "the fixture has no quantized %s", must_cover[k]);
    }
    for (int act = G4_ACT_FLOAT; act <= G4_ACT_INT; act++) {
        g4_options o = base((g4_act_mode)act, 1, 1, 1);
        g4_session *s = g4_session_new(model, &o);
        CHECK(g4_session_feed(s, prompt, N_PROMPT, logits, 1) == 0, "%s", g4_last_error());
        for (int t = 0; t < DECODE_STEPS; t++) CHECK(g4_session_feed(s, &prompt[t], 1, logits, 0) == 0, "%s", g4_last_error());
        int n_int = 0, n_float = 0;
        for (int i = 0; i < n_lins; i++) {
            const fixture_linear *f = &lins[i];
            long long ri = -1, rf = -1;
            int bound = g4_session_linear_rows(s, f->module, &ri, &rf) == 0;
            if (f->unused) {
                CHECK(!bound, "%s (unused by a KV-shared layer) is a linear of the model", f->module);
                continue;
            }
            CHECK(bound, "%s", g4_last_error());
            int want_int = act == G4_ACT_INT && f->quantized;
            CHECK(ri == (want_int ? rows : 0) && rf == (want_int ? 0 : rows), "act %d: %s ran %lld rows in integers and %lld in float, not %lld in %s",
                  act, f->module, ri, rf, rows, want_int ? "integers" : "float");
            *(want_int ? &n_int : &n_float) += 1;
        }
        printf("ok act %d: %d linears x %lld rows in integers, %d in float\n", act, n_int, rows, n_float);
        for (size_t k = 0; act == G4_ACT_INT && k < sizeof must_cover / sizeof *must_cover; k++) {
            int count = 0;
            for (int i = 0; i < n_lins; i++) count += lins[i].quantized && !lins[i].unused && !strcmp(linear_kind(lins[i].module), must_cover[k]);
            printf("ok   int: %d %s linears among them\n", count, must_cover[k]);
        }
        g4_session_free(s);
    }
    free(logits);
}

int main(void) {
    if (!check_dispatch_level()) return check_report("switches");
    model = g4_model_load(tiny_dir());
    CHECK(model != NULL, "%s", g4_last_error());
    if (!model) return check_report("switches");
    test_all_off_is_float();
    test_linear_quant();
    test_kv_quant();
    test_pmp();
    test_round();
    test_qdiv();
    test_requant();
    test_lmhead_dynamic();
    test_every_linear_path();
    g4_model_free(model);
    return check_report("switches");
}
