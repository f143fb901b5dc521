/* A calibrated lm_head: copies of the tiny-mobile fixture whose lm_head.input_activation_scale /
 * output_activation_scale are patched to non-zero values (the published checkpoint and the
 * fixture have 0), written to a private temporary folder. activation-quant.md §2 defines both
 * points for such a head (G3: Q(final_norm; s_in), G4: Q(logits; s_out), before the softcap; the
 * HF column, transformers' QuantizedLinear), so every mode must run it as it runs any linear:
 *   - int: input codes with x * (1/s_in), exact int32 sums, requantized with the session's rule
 *     (§7); the whole vocabulary for every row of a 40-token and a 70-token prompt (the n x vocab
 *     sums that overflowed the accumulator buffer, and the 64-row chunk);
 *   - fake: the same points as fake-quant (§5), in f32;
 *   - float: every activation scale ignored (§4): the unpatched fixture's logits, bit for bit.
 * The reference is computed here from the fixture's own lm_head tensors (unpacked as checkpoint.md
 * §6 says) applied to each mode's captured final_norm, in exact integer / double arithmetic, and
 * compared code by code (the logits' softcap inverted). The greedy, sampling and batch paths, the
 * --lmhead-dynamic-q8 precedence and the CLI run the same head. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/probe.h"
#include "testutil.h"
#include "util/err.h"
#include "model/feed.h"

/* Scales near the fixture's ranges (final_norm up to about 3.9, logits before the softcap up to
 * about 23), so both points clip a few values, as calibrated scales do. */
#define S_IN 0.03f
#define S_OUT 0.15f
#define N_LONG 70 /* a 64-row chunk and a 6-row one */
#define N_SHORT 40

static char tmp[256];
static unsigned char *orig_st;
static size_t orig_st_len;
static char *orig_config;
static g4_model *plain; /* the unpatched fixture */
static int32_t prompt[N_LONG];

/* The fixture's lm_head, read and unpacked here: codes[o * H + i], one scale per row. */
typedef struct {
    int V, H;
    int8_t *codes;
    float *w_scale;
    double cap; /* final_logit_softcapping */
} head;
static head hd;

/* Byte offset in the file of tensor `name`'s data, from the safetensors header. */
static size_t tensor_offset(const char *name) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | orig_st[i];
    cJSON *h = cJSON_ParseWithLength((const char *)orig_st + 8, (size_t)n);
    const cJSON *t = cJSON_GetObjectItem(h, name), *off = cJSON_GetObjectItem(t, "data_offsets");
    if (!off || cJSON_GetArraySize(off) != 2) {
        fprintf(stderr, "%s: no data_offsets in the fixture's header\n", name);
        exit(2);
    }
    size_t at = 8 + (size_t)n + (size_t)cJSON_GetArrayItem(off, 0)->valuedouble;
    cJSON_Delete(h);
    return at;
}

static void put_f32(unsigned char *at, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    for (int i = 0; i < 4; i++) at[i] = (unsigned char)(u >> (8 * i));
}

/* tmp/name: the fixture with the lm_head's activation scales set to s_in and s_out. */
static const char *patched_copy(const char *name, float s_in, float s_out) {
    static char dir[3][512];
    static int next;
    char *d = dir[next++ % 3], path[1024];
    snprintf(d, sizeof dir[0], "%s/%s", tmp, name);
    mkdir(d, 0777);
    unsigned char *st = malloc(orig_st_len);
    memcpy(st, orig_st, orig_st_len);
    put_f32(st + tensor_offset("lm_head.input_activation_scale"), s_in);
    put_f32(st + tensor_offset("lm_head.output_activation_scale"), s_out);
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    write_file_or_exit(path, st, orig_st_len);
    snprintf(path, sizeof path, "%s/config.json", d);
    write_file_or_exit(path, orig_config, strlen(orig_config));
    free(st);
    return d;
}

static void remove_copy(const char *dir) {
    const char *files[] = {"model.safetensors", "config.json", "stderr.txt", "logits.npy"};
    char path[1024];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* checkpoint.md §6: element j of a 2-bit row is bits 2(j%4)+1:2(j%4) of byte j/4, offset binary. */
static void read_head(void) {
    char path[8192];
    snprintf(path, sizeof path, "%s/model.safetensors", tiny_dir());
    g4_safetensors st;
    if (g4_st_open_file(&st, path) != 0) exit(2);
    const g4_tensor *w = g4_st_find(&st, "lm_head.weight"), *s = g4_st_find(&st, "lm_head.weight_scale");
    if (!w || !s || w->ndim != 2 || w->dtype != G4_DT_U8 || s->numel != w->shape[0]) {
        fprintf(stderr, "the fixture's lm_head is not a 2-bit U8 matrix with one scale per row\n");
        exit(2);
    }
    hd.V = (int)w->shape[0];
    hd.H = (int)w->shape[1] * 4;
    hd.codes = malloc((size_t)hd.V * hd.H);
    hd.w_scale = malloc(sizeof *hd.w_scale * (size_t)hd.V);
    for (int o = 0; o < hd.V; o++) {
        for (int i = 0; i < hd.H; i++) {
            int byte = w->data[(size_t)o * w->shape[1] + i / 4];
            hd.codes[(size_t)o * hd.H + i] = (int8_t)(((byte >> (2 * (i % 4))) & 3) - 2);
        }
        memcpy(&hd.w_scale[o], s->data + 4 * (size_t)o, 4);
    }
    g4_st_close(&st);
    snprintf(path, sizeof path, "%s/config.json", tiny_dir());
    cJSON *cfg = read_json(path);
    hd.cap = cJSON_GetObjectItem(cJSON_GetObjectItem(cfg, "text_config"), "final_logit_softcapping")->valuedouble;
    cJSON_Delete(cfg);
}

/* ---- the reference (activation-quant.md §1, §5, §7; int8-arithmetic.md §3.2) ---- */

static int clamp8(double v) { return v < -128 ? -128 : v > 127 ? 127 : (int)v; }

/* The input code of x: x * (1/s) with 1/s in f32 (int mode) or x / s (fake mode), ties to even
 * (rint in the default rounding mode), clamped after rounding. */
static int in_code(float x, float s, int recip) {
    float v = recip ? x * (1.0f / s) : x / s;
    return clamp8(rint((double)v));
}

/* Exact int32 sum of the input codes of row x against output o's weight codes. */
static int64_t int_dot(const int *cx, int o) {
    int64_t acc = 0;
    for (int i = 0; i < hd.H; i++) acc += (int64_t)cx[i] * hd.codes[(size_t)o * hd.H + i];
    return acc;
}

/* XNNPACK's requantization (requant f32): M = (s_in * s_w) / s_out in f32, (float)acc * M,
 * ties to even. */
static int requant_f32_code(int64_t acc, int o) {
    volatile float m = S_IN * hd.w_scale[o];
    m = m / S_OUT;
    float v = (float)acc * m;
    return clamp8(rint((double)v));
}

/* requant f64: ((acc * s_in) * s_w) / s_out in double, ties to even. */
static int requant_f64_code(int64_t acc, int o) { return clamp8(rint((double)acc * S_IN * hd.w_scale[o] / S_OUT)); }

/* Output o of a float-weight head on an input already quantized (or float): s_w * sum x c_w,
 * exact in long double. */
static long double float_dot(const float *x, int o) {
    long double d = 0;
    for (int i = 0; i < hd.H; i++) d += (long double)x[i] * hd.codes[(size_t)o * hd.H + i];
    return d * hd.w_scale[o];
}

/* The logit before the softcap that the engine's softcapped value l stands for, in output steps;
 * *on_grid is cleared when it is not within 1e-3 of an integer (the output was not quantized). */
static int engine_code(float l, int *on_grid) {
    double e = hd.cap * atanh((double)l / hd.cap) / S_OUT;
    if (!(fabs(e - rint(e)) < 1e-3)) *on_grid = 0;
    return (int)rint(e);
}

static double softcap(double y) { return hd.cap * tanh(y / hd.cap); }

/* ---- runs ---- */

static g4_options opts(g4_act_mode act) {
    g4_options o;
    g4_options_default(&o);
    o.act = act;
    o.ctx = 128;
    return o;
}

/* Every row's logits of prompt[0, n) and the captured final_norm (*cap, when asked). */
static float *run(const g4_model *m, const g4_options *o, int n, g4_capture *cap) {
    float *logits = malloc(sizeof *logits * (size_t)n * hd.V);
    g4_session *s = g4_session_new(m, o);
    CHECK(s != NULL, "%s", g4_last_error());
    if (!s) return logits;
    if (cap) g4_session_set_trace(s, g4_capture_trace, cap);
    CHECK(g4_session_feed(s, prompt, n, logits, 1) == 0, "%s", g4_last_error());
    g4_session_free(s);
    return logits;
}

static const float *final_norm(const g4_capture *c, int n) {
    const g4_captured *t = g4_capture_get(c, "final_norm");
    CHECK(t && t->rows == n && t->width == hd.H, "final_norm: %d rows of %d captured, not %d of %d", t ? t->rows : -1,
          t ? t->width : -1, n, hd.H);
    if (!t || t->rows != n || t->width != hd.H) exit(1);
    return t->data;
}

/* What a reference gives for one output: its code, or `tie` when the reference itself cannot
 * tell: a float matmul's exact value within 1e-3 of a half step, where the engine's f32 sums may
 * round either way (activation-quant.md §5). The integer path has no such ties. */
typedef struct {
    int code, tie;
    double y; /* the value before the softcap */
} ref_out;

typedef ref_out (*ref_fn)(const float *x, const int *cx, int o);

static ref_out ref_int_f32(const float *x, const int *cx, int o) {
    (void)x;
    int c = requant_f32_code(int_dot(cx, o), o);
    return (ref_out){c, 0, (double)((float)c * S_OUT)};
}

static ref_out ref_int_f64(const float *x, const int *cx, int o) {
    (void)x;
    int c = requant_f64_code(int_dot(cx, o), o);
    return (ref_out){c, 0, (double)((float)c * S_OUT)};
}

/* fake mode: Q(s_w * sum Q(x; s_in) c_w; s_out) with x / s. */
static ref_out ref_fake(const float *x, const int *cx, int o) {
    float xq[512];
    for (int i = 0; i < hd.H; i++) xq[i] = (float)cx[i] * S_IN;
    (void)x;
    long double y = float_dot(xq, o), e = y / S_OUT;
    int c = clamp8(rint((double)e));
    int tie = fabsl(e - floorl(e) - 0.5L) < 1e-3L && fabsl(e) < 128.5L;
    return (ref_out){c, tie, (double)((float)c * S_OUT)};
}

/* int mode with s_in = 0 (float input, activation-quant.md §7's lm_head case), s_out applied as
 * Q(y; s_out) with int mode's x * (1/s). */
static ref_out ref_out_only(const float *x, const int *cx, int o) {
    (void)cx;
    long double y = float_dot(x, o), e = y * (1.0f / S_OUT);
    int c = clamp8(rint((double)e));
    int tie = fabsl(e - floorl(e) - 0.5L) < 1e-3L && fabsl(e) < 128.5L;
    return (ref_out){c, tie, (double)((float)c * S_OUT)};
}

typedef struct {
    long long outputs, ties, wrong, off_grid, in_clamped, out_clamped;
    double max_diff;
} tally;

/* Every row's logits against the reference on that run's own final_norm. */
static tally compare(const float *logits, const float *fn, int n, ref_fn ref, int recip) {
    tally t = {0};
    int cx[512];
    if (hd.H > 512) exit(2);
    for (int r = 0; r < n; r++) {
        const float *x = fn + (size_t)r * hd.H;
        for (int i = 0; i < hd.H; i++) {
            cx[i] = in_code(x[i], S_IN, recip);
            t.in_clamped += cx[i] == 127 || cx[i] == -128;
        }
        for (int o = 0; o < hd.V; o++) {
            float l = logits[(size_t)r * hd.V + o];
            ref_out want = ref(x, cx, o);
            int on_grid = 1, got = engine_code(l, &on_grid);
            t.outputs++;
            t.off_grid += !on_grid;
            t.out_clamped += want.code == 127 || want.code == -128;
            if (want.tie) {
                t.ties++;
                continue;
            }
            t.wrong += got != want.code;
            double d = fabs((double)l - softcap(want.y));
            if (!(d <= t.max_diff)) t.max_diff = d;
        }
    }
    return t;
}

/* A tally that passes: every output on the s_out grid, every code the reference's (ties aside),
 * the softcapped value within f32 rounding of the reference's. */
static void expect_match(const char *what, tally t, int clamps) {
    CHECK(t.off_grid == 0, "%s: %lld of %lld logits are not on the output scale's grid (G4 dropped)", what, t.off_grid, t.outputs);
    CHECK(t.wrong == 0, "%s: %lld of %lld output codes differ from the reference", what, t.wrong, t.outputs);
    CHECK(t.max_diff < 1e-5, "%s: logits up to %g from the reference", what, t.max_diff);
    CHECK(t.ties * 100 < t.outputs, "%s: %lld of %lld outputs are reference ties", what, t.ties, t.outputs);
    printf("ok %s: %lld outputs, codes as the reference (%lld reference ties skipped), logits within %.2g\n", what, t.outputs, t.ties, t.max_diff);
    if (!clamps) return;
    /* the clamps of both points are part of what is checked */
    CHECK(t.in_clamped > 0 && t.out_clamped > 0, "%s: the scales clip no input (%lld) or no output (%lld)", what, t.in_clamped, t.out_clamped);
    printf("ok   %lld input codes and %lld output codes at the int8 limits\n", t.in_clamped, t.out_clamped);
}

static int same_floats(const float *a, const float *b, size_t n) { return memcmp(a, b, sizeof *a * n) == 0; }

/* int, fake and float modes on the patched head, each against its reference; final_norm (before
 * the head) as in the unpatched fixture's run. */
static void test_modes(const g4_model *m, int n) {
    static const struct {
        g4_act_mode act;
        g4_requant_rule requant;
        const char *name;
        ref_fn ref;
        int recip;
    } cases[] = {{G4_ACT_INT, G4_REQUANT_F32, "int (requant f32)", ref_int_f32, 1},
                 {G4_ACT_INT, G4_REQUANT_F64, "int (requant f64)", ref_int_f64, 1},
                 {G4_ACT_FAKE, G4_REQUANT_F32, "fake", ref_fake, 0}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        g4_options o = opts(cases[k].act);
        o.requant = cases[k].requant;
        g4_capture cap = {0}, cap0 = {0};
        float *logits = run(m, &o, n, &cap), *logits0 = run(plain, &o, n, &cap0);
        char what[96];
        snprintf(what, sizeof what, "%s, %d tokens", cases[k].name, n);
        CHECK(same_floats(final_norm(&cap, n), final_norm(&cap0, n), (size_t)n * hd.H), "%s: final_norm moved", what);
        expect_match(what, compare(logits, final_norm(&cap, n), n, cases[k].ref, cases[k].recip), 1);
        g4_capture_free(&cap);
        g4_capture_free(&cap0);
        free(logits);
        free(logits0);
    }
    g4_options f = opts(G4_ACT_FLOAT);
    float *a = run(m, &f, n, NULL), *b = run(plain, &f, n, NULL);
    CHECK(same_floats(a, b, (size_t)n * hd.V), "float, %d tokens: the lm_head scales changed the logits", n);
    printf("ok float, %d tokens: the unpatched fixture's logits, bit for bit\n", n);
    free(a);
    free(b);
}

/* Every row of an int-mode run took the integer path (probe.h counts), none of a fake one. */
static void test_path(const g4_model *m) {
    for (int act = G4_ACT_FAKE; act <= G4_ACT_INT; act++) {
        g4_options o = opts((g4_act_mode)act);
        float *logits = malloc(sizeof *logits * (size_t)N_SHORT * hd.V);
        g4_session *s = g4_session_new(m, &o);
        long long ri = -1, rf = -1;
        CHECK(s && g4_session_feed(s, prompt, N_SHORT, logits, 1) == 0 && g4_session_linear_rows(s, "lm_head", &ri, &rf) == 0, "%s",
              g4_last_error());
        int want_int = act == G4_ACT_INT;
        CHECK(ri == (want_int ? N_SHORT : 0) && rf == (want_int ? 0 : N_SHORT), "act %d: lm_head ran %lld rows in integers, %lld in float", act,
              ri, rf);
        g4_session_free(s);
        free(logits);
    }
}

/* The greedy token, the sampling path's logits and a batch step give what the full logits give. */
static void test_other_paths(const g4_model *m) {
    g4_options o = opts(G4_ACT_INT);
    float *all = run(m, &o, N_SHORT, NULL), *last = all + (size_t)(N_SHORT - 1) * hd.V;
    g4_session *s = g4_session_new(m, &o);
    int32_t next = -1;
    CHECK(g4_session_feed_argmax(s, prompt, N_SHORT, &next) == 0 && next == g4_argmax(last, hd.V), "greedy token %d, the logits' argmax %d",
          next, g4_argmax(last, hd.V));
    g4_session_reset(s);
    int32_t cand[64];
    float vals[64], bound = 0, *row = malloc(sizeof *row * (size_t)hd.V);
    int n_cand = 0;
    CHECK(g4_session_feed_top(s, prompt, N_SHORT, 8, NULL, 0, cand, vals, 64, &bound, &n_cand) == 0, "%s", g4_last_error());
    CHECK(g4_session_last_logits(s, row) == 0 && same_floats(row, last, (size_t)hd.V), "the sampling path's logits differ");
    g4_session_free(s);
    /* one batch step of 40 sequences: 40 rows through the head at once */
    o.n_seq = N_SHORT;
    s = g4_session_new(m, &o);
    int seqs[N_SHORT];
    for (int i = 0; i < N_SHORT; i++) seqs[i] = i;
    float *batch = malloc(sizeof *batch * (size_t)N_SHORT * hd.V);
    CHECK(s && g4_session_feed_batch(s, seqs, prompt, N_SHORT, batch) == 0, "%s", g4_last_error());
    g4_options o1 = opts(G4_ACT_INT);
    int bad = 0;
    for (int i = 0; i < N_SHORT; i++) {
        g4_session *s1 = g4_session_new(m, &o1);
        CHECK(g4_session_feed(s1, &prompt[i], 1, row, 0) == 0, "%s", g4_last_error());
        bad += !same_floats(row, batch + (size_t)i * hd.V, (size_t)hd.V);
        g4_session_free(s1);
    }
    CHECK(bad == 0, "%d of %d batch rows differ from the same token alone", bad, N_SHORT);
    printf("ok greedy, sampling and a %d-row batch step give the full logits' answers\n", N_SHORT);
    g4_session_free(s);
    free(batch);
    free(row);
    free(all);
}

/* --lmhead-dynamic-q8 stands in for a float head input: a static input scale in effect takes
 * precedence (int and fake: the same logits as without it); where the scales are ignored (float)
 * it applies as on the unpatched fixture. */
static void test_dynamic(const g4_model *m) {
    for (int act = G4_ACT_FLOAT; act <= G4_ACT_INT; act++) {
        g4_options off = opts((g4_act_mode)act), on = off;
        on.lmhead_dynamic_q8 = 1;
        float *a = run(m, &off, N_SHORT, NULL), *b = run(m, &on, N_SHORT, NULL), *c = run(plain, &on, N_SHORT, NULL);
        size_t len = (size_t)N_SHORT * hd.V;
        if (act == G4_ACT_FLOAT)
            CHECK(same_floats(b, c, len) && !same_floats(a, b, len), "float: --lmhead-dynamic-q8 is not the unpatched fixture's");
        else
            CHECK(same_floats(a, b, len), "act %d: --lmhead-dynamic-q8 changed a head with a static input scale", act);
        free(a);
        free(b);
        free(c);
    }
    printf("ok --lmhead-dynamic-q8: no effect with the static input scale, applied where it is ignored\n");
}

/* Only the output calibrated (s_in = 0): a float input (activation-quant.md §7's lm_head case),
 * then Q(y; s_out), in int mode with x * (1/s); with --lmhead-dynamic-q8 the dynamic head's
 * logits are quantized too. */
static void test_output_only(void) {
    const char *dir = patched_copy("out-only", 0, S_OUT);
    g4_model *m = g4_model_load(dir);
    CHECK(m != NULL, "%s", g4_last_error());
    if (!m) return;
    g4_options o = opts(G4_ACT_INT), dyn = o;
    dyn.lmhead_dynamic_q8 = 1;
    g4_capture cap = {0};
    float *logits = run(m, &o, N_SHORT, &cap), *d = run(m, &dyn, N_SHORT, NULL);
    expect_match("int, output scale only", compare(logits, final_norm(&cap, N_SHORT), N_SHORT, ref_out_only, 1), 0);
    int on_grid = 1;
    for (size_t i = 0; i < (size_t)N_SHORT * hd.V; i++) engine_code(d[i], &on_grid);
    CHECK(on_grid, "--lmhead-dynamic-q8 dropped the output scale");
    g4_capture_free(&cap);
    free(logits);
    free(d);
    g4_model_free(m);
    remove_copy(dir);
}

/* Only the input calibrated (s_out = 0): int32 sums scaled back to float, acc * (s_in * s_w) in
 * f32 (activation-quant.md §7, "s_y == 0"). */
static void test_input_only(void) {
    const char *dir = patched_copy("in-only", S_IN, 0);
    g4_model *m = g4_model_load(dir);
    CHECK(m != NULL, "%s", g4_last_error());
    if (!m) return;
    g4_options o = opts(G4_ACT_INT);
    g4_capture cap = {0};
    float *logits = run(m, &o, N_LONG, &cap);
    const float *fn = final_norm(&cap, N_LONG);
    int cx[512];
    double worst = 0;
    for (int r = 0; r < N_LONG; r++) {
        for (int i = 0; i < hd.H; i++) cx[i] = in_code(fn[(size_t)r * hd.H + i], S_IN, 1);
        for (int o2 = 0; o2 < hd.V; o2++) {
            float y = (float)int_dot(cx, o2) * (S_IN * hd.w_scale[o2]);
            double e = fabs((double)logits[(size_t)r * hd.V + o2] - softcap(y));
            if (!(e <= worst)) worst = e;
        }
    }
    CHECK(worst < 1e-5, "int, input scale only: logits up to %g from acc * (s_in * s_w)", worst);
    printf("ok int, input scale only, %d tokens: logits within %.2g of acc * (s_in * s_w)\n", N_LONG, worst);
    g4_capture_free(&cap);
    free(logits);
    g4_model_free(m);
    remove_copy(dir);
}

/* g4 run --logits-npy on the patched copy: exit 0, one warning line, the library's logits. */
static void test_cli(const char *dir, const g4_model *m) {
    const char *bin = check_bin();
    if (!bin) return;
    char cmd[4096], ids[1024] = "", path[1024];
    for (int i = 0; i < N_SHORT; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", prompt[i]);
    snprintf(cmd, sizeof cmd, "%s run -m %s --ids %s -n 1 --act int --logits-npy %s/logits.npy > /dev/null 2> %s/stderr.txt", bin, dir, ids,
             dir, dir);
    int st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "g4 run on a calibrated lm_head: status %d", st);
    snprintf(path, sizeof path, "%s/stderr.txt", dir);
    char *err = slurp(path);
    int lines = 0;
    for (const char *p = err; *p; p++) lines += *p == '\n';
    CHECK(lines == 1 && strstr(err, "g4: warning: ") == err && strstr(err, "lm_head.input_activation_scale"), "stderr: %s", err);
    free(err);
    snprintf(path, sizeof path, "%s/logits.npy", dir);
    char *npy;
    size_t len = 0;
    g4_options o = opts(G4_ACT_INT);
    float *want = run(m, &o, N_SHORT, NULL);
    size_t data = len, need = sizeof *want * (size_t)N_SHORT * hd.V;
    if (g4_read_file(path, &npy, &len) == 0) {
        data = len >= 10 ? 10 + (size_t)((unsigned char)npy[8] | (unsigned char)npy[9] << 8) : len;
        CHECK(len == data + need && !memcmp(npy + data, want, need), "--logits-npy: not the library's int-mode logits");
        free(npy);
    } else {
        CHECK(0, "g4 run wrote no %s", path);
    }
    free(want);
    printf("ok g4 run --act int --logits-npy on a calibrated lm_head: the library's logits\n");
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/g4-lmhead-XXXXXX");
    if (!mkdtemp(tmp)) return 2;
    read_tiny_fixture(&orig_st, &orig_st_len, &orig_config);
    g4_set_log(NULL, NULL);
    read_head();
    for (int t = 0; t < N_LONG; t++) prompt[t] = 2 + (t * 97 + 13) % 500;
    plain = g4_model_load(tiny_dir());
    const char *dir = patched_copy("both", S_IN, S_OUT);
    g4_model *m = g4_model_load(dir);
    CHECK(plain && m, "%s", g4_last_error());
    if (plain && m) {
        test_modes(m, N_SHORT);
        test_modes(m, N_LONG);
        test_path(m);
        test_other_paths(m);
        test_dynamic(m);
        test_output_only();
        test_input_only();
        test_cli(dir, m);
    }
    g4_model_free(m);
    g4_model_free(plain);
    remove_copy(dir);
    rmdir(tmp);
    free(orig_st);
    free(orig_config);
    free(hd.codes);
    free(hd.w_scale);
    return check_report("lmhead_scales");
}
