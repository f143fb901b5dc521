/* Each quantization switch changes what it claims and nothing else: tensors upstream of the
 * point it controls stay bit-identical, the point itself changes as specified. Runs on the
 * tiny-mobile fixture with every intermediate tensor captured. */
#include "quant/int8.h"
#include "testutil.h"

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
    CHECK(g4_session_eval(s, prompt, N_PROMPT, logits, 0) == 0, "%s", g4_last_error());
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
        g4_quantizer_init(&q, scale, 0, G4_ROUND_HALF_EVEN, G4_QDIV_DIV);
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
            g4_quantizer_init(&d, t, 0, G4_ROUND_HALF_EVEN, G4_QDIV_DIV);
            g4_quantizer_init(&r, t, 0, G4_ROUND_HALF_EVEN, G4_QDIV_RECIP);
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
    dbl.requant = G4_REQ_TFL_DOUBLE;
    g4_capture a = run(&f32), b = run(&dbl);
    EXPECT_SAME(a, b, "inputs_embeds", "--requant");
    EXPECT_SAME(a, b, "per_layer_inputs", "--requant");
    EXPECT_DIFF(a, b, "hidden_after_layer0", "--requant");
    g4_options fake = base(G4_ACT_FAKE, 1, 1, 1), fake_dbl = fake;
    fake_dbl.requant = G4_REQ_TFL_DOUBLE;
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

int main(void) {
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
    g4_model_free(model);
    return check_report("switches");
}
