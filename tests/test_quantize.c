/* g4 quantize --q4_0 and the block quantizers it uses (dev/quant/blockq.h, dev/model/quantize.h):
 * - the rules on hand-worked blocks (Q4_0's d = max / -8 with truncation of x/d + 8.5, Q8_0's
 *   half-away rounding), and float16 rounding against every float16 value and the midpoints
 *   between them;
 * - tests/fixtures/tiny-bf16 quantized by g4 equals tests/fixtures/tiny-q4_0, which an independent
 *   numpy quantizer wrote (tests/fixtures/gen/gen_tiny_bf16.py): every tensor's name, dtype, shape
 *   and bytes, and config.json; the other --embed choices give the layouts they name and load;
 * - a BF16 checkpoint with a 16-wide per-layer input (tiny-bf16 cut to it): the rows of 16 stay
 *   BF16, byte for byte, and the output loads and runs;
 * - refusals, each one line naming the file, tensor or field: a quantized input, rows that are
 *   not whole blocks, a weight that is not finite, a scale past float16, the input folder as the
 *   output, and the command line's own errors. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/safetensors_write.h"
#include "model/quantize.h"
#include "quant/blockq.h"
#include "testutil.h"
#include "util/err.h"
#include "model/feed.h"

static char base_tmp[256];

static const char *tmp_path(const char *name) {
    static char buf[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", base_tmp, name);
    return buf[k];
}

/* ---- the rules ---- */

static void check_q4_0_rule(void) {
    float x[G4_QBLOCK] = {0};
    int8_t c[G4_QBLOCK];
    /* max = -8 (the largest magnitude, negative): d = 1, codes = trunc(x + 8.5) - 8, clamped at 7 */
    const float in[] = {-8.0f, 0.5f, -0.5f, 1.5f, 7.6f, 7.4f, -7.5f, 2.49f, -3.0f, 8.0f};
    const int want[] = {-8, 1, 0, 2, 7, 7, -7, 2, -3, 7};
    for (int i = 0; i < 10; i++) x[i] = in[i];
    float d = g4_q4_0_block(x, c);
    CHECK(d == 1.0f, "Q4_0 d %g, expected 1 (max -8 / -8)", d);
    for (int i = 0; i < 10; i++) CHECK(c[i] == want[i], "Q4_0 code of %g: %d, expected %d", in[i], c[i], want[i]);
    for (int i = 10; i < G4_QBLOCK; i++) CHECK(c[i] == 0, "Q4_0 code of 0: %d", c[i]);
    /* the first of two equal magnitudes decides the sign: +8 first gives d = -1 and maps +8 to -8 */
    memset(x, 0, sizeof x);
    x[3] = 8.0f;
    x[7] = -8.0f;
    d = g4_q4_0_block(x, c);
    CHECK(d == -1.0f && c[3] == -8 && c[7] == 7, "Q4_0 with +8 before -8: d %g, codes %d %d", d, c[3], c[7]);
    /* a block of zeros: d = +0 / -8 = -0, every code 0 */
    memset(x, 0, sizeof x);
    d = g4_q4_0_block(x, c);
    CHECK(d == 0 && signbit(d) && g4_f32_to_f16(d) == 0x8000, "Q4_0 of zeros: d %g", d);
    for (int i = 0; i < G4_QBLOCK; i++) CHECK(c[i] == 0, "Q4_0 code of a zero block %d", c[i]);
    printf("ok Q4_0: d = max / -8, codes trunc(x / d + 8.5) - 8 clamped to 7, first maximum wins, zeros give d = -0\n");
}

static void check_q8_0_rule(void) {
    float x[G4_QBLOCK] = {0};
    int8_t c[G4_QBLOCK];
    const float in[] = {127.0f, 2.5f, -2.5f, 0.49f, -0.5f, -127.0f, 63.5f};
    const int want[] = {127, 3, -3, 0, -1, -127, 64};
    for (int i = 0; i < 7; i++) x[i] = in[i];
    float d = g4_q8_0_block(x, c);
    CHECK(d == 1.0f, "Q8_0 d %g, expected 1 (127 / 127)", d);
    for (int i = 0; i < 7; i++) CHECK(c[i] == want[i], "Q8_0 code of %g: %d, expected %d", in[i], c[i], want[i]);
    memset(x, 0, sizeof x);
    d = g4_q8_0_block(x, c);
    CHECK(d == 0 && !signbit(d), "Q8_0 of zeros: d %g", d);
    printf("ok Q8_0: d = amax / 127, codes round half away from zero\n");
}

/* g4_f32_to_f16 against float16's own values: each converts exactly, the midpoint between two
 * neighbours goes to the even one, and a float just off the midpoint to the nearer one. */
static void check_f16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x7bff; h++) { /* 0x7bff, the largest, rounds up to infinity: below */
        float v = g4_f16_to_f32((uint16_t)h), next = g4_f16_to_f32((uint16_t)(h + 1));
        bad += g4_f32_to_f16(v) != h || g4_f32_to_f16(-v) != (h | 0x8000);
        float mid = (float)(((double)v + (double)next) / 2); /* exact: float16 midpoints fit a float */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        bad += g4_f32_to_f16(mid) != even;
        bad += g4_f32_to_f16(nextafterf(mid, 0)) != h || g4_f32_to_f16(nextafterf(mid, INFINITY)) != h + 1;
    }
    CHECK(bad == 0, "float16 rounding: %d of %d cases wrong", bad, 5 * 0x7bff);
    CHECK(g4_f32_to_f16(65504.0f) == 0x7bff && g4_f32_to_f16(65519.996f) == 0x7bff && g4_f32_to_f16(65520.0f) == 0x7c00 &&
              g4_f32_to_f16(-1e9f) == 0xfc00 && g4_f32_to_f16(INFINITY) == 0x7c00 && (g4_f32_to_f16(NAN) & 0x7e00) == 0x7e00,
          "float16 overflow and specials");
    CHECK(g4_f32_to_f16(0x1p-25f) == 0 && g4_f32_to_f16(nextafterf(0x1p-25f, 1)) == 1 && g4_f32_to_f16(1e-30f) == 0, "float16 underflow");
    printf("ok float16: every value, every midpoint (ties to even) and its neighbours, overflow at 65520, subnormals\n");
}

/* ---- the command against the numpy quantizer ---- */

static int same_tensor(const g4_tensor *a, const g4_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->nbytes != b->nbytes) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return memcmp(a->data, b->data, a->nbytes) == 0;
}

static void check_against_numpy(void) {
    const char *out = tmp_path("q4");
    g4_quantize_stats st;
    CHECK(g4_quantize_q4_0("tests/fixtures/tiny-bf16", out, G4_EMBED_Q8_0, &st) == 0, "%s", g4_last_error());
    char a[1024], b[1024];
    snprintf(a, sizeof a, "%s/model.safetensors", out);
    g4_safetensors got, want;
    if (g4_st_open_file(&got, a) != 0 || g4_st_open_file(&want, "tests/fixtures/tiny-q4_0/model.safetensors") != 0) {
        CHECK(0, "%s", g4_last_error());
        return;
    }
    int differ = 0, missing = 0;
    for (int i = 0; i < want.n_tensors; i++) {
        const g4_tensor *w = &want.tensors[i], *g = g4_st_find(&got, w->name);
        if (!g) missing++, fprintf(stderr, "g4 quantize wrote no %s\n", w->name);
        else if (!same_tensor(g, w)) differ++, fprintf(stderr, "g4 quantize's %s differs from the numpy quantizer's\n", w->name);
    }
    CHECK(differ == 0 && missing == 0 && got.n_tensors == want.n_tensors, "%d tensors differ, %d missing, %d written, %d expected", differ,
          missing, got.n_tensors, want.n_tensors);
    CHECK(st.n_quantized > 0 && st.n_quantized + st.n_copied == want.n_tensors - st.n_quantized, "stats: %d quantized, %d copied",
          st.n_quantized, st.n_copied);
    printf("ok g4 quantize --q4_0 tiny-bf16: all %d tensors equal the numpy quantizer's byte for byte (%d quantized)\n", want.n_tensors,
           st.n_quantized);
    g4_st_close(&got);
    g4_st_close(&want);
    snprintf(a, sizeof a, "%s/config.json", out);
    cJSON *cg = read_json(a), *cw = read_json("tests/fixtures/tiny-q4_0/config.json");
    CHECK(cJSON_Compare(cg, cw, 1), "config.json differs from the numpy quantizer's");
    const cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(cg, "quantization_config"), "module_quant_configs");
    CHECK(m && m->child && !strcmp(m->child->string, "^lm_head$"), "module_quant_configs lost its order");
    cJSON_Delete(cg);
    cJSON_Delete(cw);
    snprintf(a, sizeof a, "%s/generation_config.json", out);
    snprintf(b, sizeof b, "tests/fixtures/tiny-bf16/generation_config.json");
    char *x = slurp(a), *y = slurp(b);
    CHECK(*y && !strcmp(x, y), "generation_config.json was not copied");
    free(x);
    free(y);
}

/* --embed q4_0 and bf16: the embeddings as 4-bit codes with block scales, or left BF16 with
 * quantize_embeddings false; both load and run. */
static void check_embed_choices(void) {
    struct { g4_embed_quant e; const char *dir; g4_dtype dt; const char *name; } cases[] = {
        {G4_EMBED_Q4_0, "q4e", G4_DT_U8, "model.language_model.embed_tokens_per_layer.embedding_quantized"},
        {G4_EMBED_BF16, "bfe", G4_DT_BF16, "model.language_model.embed_tokens_per_layer.weight"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *out = tmp_path(cases[i].dir);
        char path[1024];
        CHECK(g4_quantize_q4_0("tests/fixtures/tiny-bf16", out, cases[i].e, NULL) == 0, "%s", g4_last_error());
        snprintf(path, sizeof path, "%s/model.safetensors", out);
        g4_safetensors st;
        CHECK(g4_st_open_file(&st, path) == 0, "%s", g4_last_error());
        const g4_tensor *t = g4_st_find(&st, cases[i].name);
        CHECK(t && t->dtype == cases[i].dt, "--embed %s: %s missing or not %s", cases[i].dir, cases[i].name, g4_dtype_name(cases[i].dt));
        const g4_tensor *q = g4_st_find(&st, "model.language_model.layers.0.mlp.up_proj.weight_scale");
        CHECK(q && q->dtype == G4_DT_F16, "--embed %s: the linears are not block-scaled", cases[i].dir);
        g4_st_close(&st);
        g4_model *m = g4_model_load(out);
        CHECK(m != NULL, "--embed %s: %s", cases[i].dir, g4_last_error());
        if (m) {
            g4_options o;
            g4_options_default(&o);
            o.ctx = 16;
            g4_session *s = g4_session_new(m, &o);
            int32_t ids[3] = {2, 17, 33}, next = -1;
            CHECK(s && g4_session_feed_argmax(s, ids, 3, &next) == 0 && next >= 0, "--embed %s: %s", cases[i].dir, g4_last_error());
            g4_session_free(s);
        }
        g4_model_free(m);
    }
    printf("ok --embed q4_0 and bf16 write the layouts they name, and load and run\n");
}

/* ---- refusals ---- */

typedef struct {
    float value; /* every element */
    int cols;
} one_tensor;

static int fill_value(void *user, int index, const g4_stw_tensor *t, uint64_t off, uint8_t *buf, size_t n) {
    (void)index;
    (void)t;
    (void)off;
    const one_tensor *o = user;
    for (size_t i = 0; i < n; i += 4) memcpy(buf + i, &o->value, 4);
    return 0;
}

/* A folder with tiny-bf16's config and a model.safetensors of one F32 linear [4, cols] whose
 * every element is `value`. */
static const char *one_linear_checkpoint(const char *name, float value, int cols) {
    const char *dir = tmp_path(name);
    char path[1024];
    mkdir(dir, 0777);
    char *cfg = slurp("tests/fixtures/tiny-bf16/config.json");
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file_or_exit(path, cfg, strlen(cfg));
    free(cfg);
    g4_stw w;
    g4_stw_init(&w);
    int64_t shape[2] = {4, cols};
    one_tensor o = {value, cols};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (g4_stw_add(&w, "model.language_model.layers.0.mlp.down_proj.weight", G4_DT_F32, 2, shape) != 0 ||
        g4_stw_write(&w, path, fill_value, &o, NULL) != 0) {
        fprintf(stderr, "%s\n", g4_last_error());
        exit(2);
    }
    g4_stw_free(&w);
    return dir;
}

static void expect_refusal(const char *what, const char *in, const char *out, const char *needle) {
    char path[1024];
    int rc = g4_quantize_q4_0(in, out, G4_EMBED_Q8_0, NULL);
    CHECK(rc != 0 && strstr(g4_last_error(), needle), "%s: rc %d, message \"%s\" lacks \"%s\"", what, rc, g4_last_error(), needle);
    CHECK(!strchr(g4_last_error(), '\n'), "%s: the message is not one line", what);
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    if (strcmp(in, out) != 0) CHECK(!g4_file_exists(path), "%s: a model.safetensors was left behind", what);
    printf("ok refused %s: %s\n", what, g4_last_error());
}

static void check_refusals(void) {
    expect_refusal("a quantized checkpoint", "tests/fixtures/tiny-q4_0", tmp_path("r1"), "quantized already");
    expect_refusal("the mobile checkpoint", tiny_dir(), tmp_path("r2"), "quantized already");
    expect_refusal("rows of 48 inputs", one_linear_checkpoint("odd", 0.5f, 48), tmp_path("r3"),
                   "tensor model.language_model.layers.0.mlp.down_proj.weight: F32 [4, 48]: its rows are not whole blocks of 32");
    expect_refusal("a NaN weight", one_linear_checkpoint("nan", NAN, 32), tmp_path("r4"),
                   "nan/model.safetensors: tensor model.language_model.layers.0.mlp.down_proj.weight: element [0, 0] is nan");
    expect_refusal("a scale past float16", one_linear_checkpoint("big", 1e6f, 32), tmp_path("r5"), "past float16's range");
    const char *same = one_linear_checkpoint("same", 0.5f, 32);
    expect_refusal("the input folder as output", same, same, "the output folder is the input folder");
    expect_refusal("a missing folder", tmp_path("none"), tmp_path("r6"), "none");
}

/* ---- rows that are not whole blocks: kept BF16 ---- */

/* tiny-bf16 with hidden_size_per_layer_input 16 (a BF16 Gemma 4 with a 16-wide per-layer input):
 * along each tensor's per-layer-input axis (`dim`, in groups of 32 per layer) the first 16 of
 * every 32 are kept; every other tensor is the fixture's bytes. Its per_layer_projection
 * weights are [32, 16]: rows of 16 inputs, not whole blocks of 32. */
typedef struct {
    const g4_safetensors *src;
    const g4_tensor **from; /* per output tensor */
    int *dim;               /* the halved axis, or -1 for a plain copy */
} ple16_t;

static int ple16_dim(const char *name) {
    static const struct { const char *suffix; int dim; } axes[] = {
        {"embed_tokens_per_layer.weight", 1}, {"per_layer_model_projection.weight", 0}, {"per_layer_projection_norm.weight", 0},
        {"per_layer_input_gate.weight", 0},   {"per_layer_projection.weight", 1},
    };
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof axes / sizeof *axes; i++) {
        size_t k = strlen(axes[i].suffix);
        if (n >= k && !strcmp(name + n - k, axes[i].suffix) && (n == k || name[n - k - 1] == '.')) return axes[i].dim;
    }
    return -1;
}

static int fill_ple16(void *user, int index, const g4_stw_tensor *t, uint64_t off, uint8_t *buf, size_t n) {
    (void)t;
    const ple16_t *p = user;
    const g4_tensor *src = p->from[index];
    int d = p->dim[index];
    if (d < 0) {
        memcpy(buf, src->data + off, n);
        return 0;
    }
    int64_t inner = 1; /* elements per step of axis d in the source */
    for (int i = d + 1; i < src->ndim; i++) inner *= src->shape[i];
    int64_t len = src->shape[d];
    for (size_t b = 0; b < n; b += 2) { /* BF16: two bytes an element */
        int64_t e = (int64_t)((off + b) / 2), lo = e % inner, k = e / inner % (len / 2), hi = e / inner / (len / 2);
        int64_t ks = k / 16 * 32 + k % 16; /* the first 16 of each group of 32 */
        memcpy(buf + b, src->data + 2 * ((hi * len + ks) * inner + lo), 2);
    }
    return 0;
}

static const char *ple16_checkpoint(void) {
    const char *dir = tmp_path("ple16");
    char path[1024];
    mkdir(dir, 0777);
    cJSON *cfg = read_json("tests/fixtures/tiny-bf16/config.json");
    cJSON_SetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(cfg, "text_config"), "hidden_size_per_layer_input"), 16);
    char *text = cJSON_Print(cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file_or_exit(path, text, strlen(text));
    free(text);
    cJSON_Delete(cfg);
    char *gen = slurp("tests/fixtures/tiny-bf16/generation_config.json");
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    write_file_or_exit(path, gen, strlen(gen));
    free(gen);
    g4_safetensors src;
    if (g4_st_open_dir(&src, "tests/fixtures/tiny-bf16") != 0) {
        fprintf(stderr, "%s\n", g4_last_error());
        exit(2);
    }
    ple16_t p = {&src, calloc((size_t)src.n_tensors, sizeof *p.from), calloc((size_t)src.n_tensors, sizeof *p.dim)};
    g4_stw w;
    g4_stw_init(&w);
    for (int i = 0; i < src.n_tensors; i++) {
        const g4_tensor *t = &src.tensors[i];
        int64_t shape[8];
        memcpy(shape, t->shape, sizeof *shape * (size_t)t->ndim);
        p.from[w.n] = t;
        p.dim[w.n] = strstr(t->name, "language_model.") ? ple16_dim(t->name) : -1;
        if (p.dim[w.n] >= 0) shape[p.dim[w.n]] /= 2;
        if (g4_stw_add(&w, t->name, t->dtype, t->ndim, shape) != 0) exit(2);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (g4_stw_write(&w, path, fill_ple16, &p, NULL) != 0) {
        fprintf(stderr, "%s\n", g4_last_error());
        exit(2);
    }
    g4_stw_free(&w);
    free(p.from);
    free(p.dim);
    g4_st_close(&src);
    return dir;
}

/* The greedy token after a short prompt, or -1 (with a failed check) when `dir` does not load or run. */
static int32_t next_token(const char *dir) {
    g4_model *m = g4_model_load(dir);
    CHECK(m != NULL, "%s: %s", dir, g4_last_error());
    if (!m) return -1;
    g4_options o;
    g4_options_default(&o);
    o.ctx = 16;
    g4_session *s = g4_session_new(m, &o);
    int32_t ids[3] = {2, 17, 33}, next = -1;
    CHECK(s && g4_session_feed_argmax(s, ids, 3, &next) == 0 && next >= 0 && next < 256, "%s: %s", dir, g4_last_error());
    g4_session_free(s);
    g4_model_free(m);
    return next;
}

/* g4 quantize --q4_0 on a BF16 checkpoint with a 16-wide per-layer input: the ten
 * per_layer_projection weights [32, 16] stay BF16, byte for byte the input's, listed in
 * modules_to_not_convert; every other linear is Q4_0; the output loads and runs. */
static void check_kept_bf16(void) {
    const char *in = ple16_checkpoint(), *out = tmp_path("ple16-q4");
    CHECK(next_token(in) >= 0, "the 16-wide BF16 checkpoint does not run");
    g4_quantize_stats qs;
    CHECK(g4_quantize_q4_0(in, out, G4_EMBED_Q8_0, &qs) == 0, "%s", g4_last_error());
    CHECK(qs.n_kept_bf16 == 10, "%d tensors kept BF16, expected the 10 per_layer_projection weights", qs.n_kept_bf16);
    char a[1024], b[1024];
    g4_safetensors got, want;
    snprintf(a, sizeof a, "%s/model.safetensors", out);
    snprintf(b, sizeof b, "%s/model.safetensors", in);
    if (g4_st_open_file(&got, a) != 0 || g4_st_open_file(&want, b) != 0) {
        CHECK(0, "%s", g4_last_error());
        g4_quantize_stats_free(&qs);
        return;
    }
    snprintf(a, sizeof a, "%s/config.json", out);
    cJSON *cfg = read_json(a);
    const cJSON *nc = cJSON_GetObjectItem(cJSON_GetObjectItem(cfg, "quantization_config"), "modules_to_not_convert");
    for (int l = 0; l < 10; l++) {
        char module[128], name[160];
        snprintf(module, sizeof module, "model.language_model.layers.%d.per_layer_projection", l);
        snprintf(name, sizeof name, "%s.weight", module);
        const g4_tensor *g = g4_st_find(&got, name), *w = g4_st_find(&want, name);
        CHECK(g && w && w->shape[1] == 16 && same_tensor(g, w), "%s: not the input's BF16 [32, 16] bytes", name);
        snprintf(name, sizeof name, "%s.weight_scale", module);
        CHECK(!g4_st_find(&got, name), "%s written for a tensor kept BF16", name);
        int listed = 0, kept = 0;
        for (const cJSON *e = nc ? nc->child : NULL; e; e = e->next) listed += cJSON_IsString(e) && !strcmp(e->valuestring, module);
        for (int i = 0; i < qs.n_kept_bf16; i++) kept += !strcmp(qs.kept_bf16[i], module);
        CHECK(listed == 1 && kept == 1, "%s: listed %d times in modules_to_not_convert, %d in the stats", module, listed, kept);
    }
    const g4_tensor *q = g4_st_find(&got, "model.language_model.layers.0.per_layer_input_gate.weight_scale");
    CHECK(q && q->dtype == G4_DT_F16 && q->shape[0] == 16 && q->shape[1] == 1, "per_layer_input_gate [16, 32] is not Q4_0");
    cJSON_Delete(cfg);
    g4_st_close(&got);
    g4_st_close(&want);
    g4_quantize_stats_free(&qs);
    CHECK(next_token(out) >= 0, "the quantized checkpoint does not run");
    printf("ok rows of 16 inputs: the 10 per_layer_projection weights kept BF16 byte for byte and listed in "
           "modules_to_not_convert, the rest Q4_0; the output loads and runs\n");
    const char *bin = check_bin();
    if (!bin) return;
    char cmd[4096], log[1024];
    snprintf(log, sizeof log, "%s/kept.log", base_tmp);
    snprintf(cmd, sizeof cmd, "%s quantize --q4_0 %s %s/ple16-cli > %s 2>&1", bin, in, base_tmp, log);
    int st = system(cmd);
    char *text = slurp(log);
    int lines = 0, kept = 0;
    for (char *p = text; *p; p++) lines += *p == '\n';
    for (char *p = text; (p = strstr(p, "g4 quantize: kept model.language_model.layers.")); p++) kept++;
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && kept == 10 && lines == 11 &&
              strstr(text, "kept model.language_model.layers.9.per_layer_projection.weight BF16: its rows are not whole blocks of 32"),
          "g4 quantize on the 16-wide checkpoint: %s", text);
    free(text);
    printf("ok g4 quantize prints one line naming each tensor kept BF16\n");
}

/* The command line: usage errors are one line and exit 1; a good run prints its summary. */
static void check_cli(void) {
    const char *bin = check_bin();
    if (!bin) return;
    struct { const char *args, *needle; int rc; } cases[] = {
        {"tests/fixtures/tiny-bf16 %s/c1", "--q4_0 is required", 1},
        {"--q4_0 tests/fixtures/tiny-bf16", "needs an input and an output folder", 1},
        {"--q4_0 --embed q2 tests/fixtures/tiny-bf16 %s/c2", "--embed q2: expected one of q8_0 q4_0 bf16", 1},
        {"--q4_0 --bogus tests/fixtures/tiny-bf16 %s/c3", "unknown flag --bogus", 1},
        {"--q4_0 tests/fixtures/tiny-q4_0 %s/c4", "g4 quantize: error: tests/fixtures/tiny-q4_0/config.json: the checkpoint is quantized already", 1},
        {"--q4_0 tests/fixtures/tiny-bf16 %s/c5", "g4 quantize: wrote", 0},
        {"--q4_0 --embed=bf16 tests/fixtures/tiny-bf16 %s/c6", "embeddings bf16", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[1024], cmd[4096], log[1024];
        snprintf(args, sizeof args, cases[i].args, base_tmp);
        snprintf(log, sizeof log, "%s/cli.log", base_tmp);
        snprintf(cmd, sizeof cmd, "%s quantize %s > %s 2>&1", bin, args, log);
        int st = system(cmd);
        int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        char *text = slurp(log);
        int lines = 0;
        for (char *p = text; *p; p++) lines += *p == '\n';
        CHECK(rc == cases[i].rc && strstr(text, cases[i].needle) && lines == 1, "g4 quantize %s: exit %d, output \"%s\"", args, rc, text);
        free(text);
    }
    printf("ok g4 quantize command line: usage errors and runs\n");
}

int main(void) {
    snprintf(base_tmp, sizeof base_tmp, "/tmp/g4_quantize_XXXXXX");
    if (!mkdtemp(base_tmp)) return 2;
    check_q4_0_rule();
    check_q8_0_rule();
    check_f16();
    check_against_numpy();
    check_embed_choices();
    check_refusals();
    check_kept_bf16();
    check_cli();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", base_tmp);
    return check_report("quantize");
}
