/* The int-mode linear, bit for bit, against the single-QuantizedLinear fixture of tiny-mobile
 * (unit_linear.safetensors): input codes, int32 accumulators, and output codes under every
 * requant rule. Its y_codes are the exact float64 requantization; the other rules may differ
 * only where the exact value sits next to a rounding boundary (y_tie_dist). */
#include "kernels/kernels.h"
#include "model/probe.h"
#include "quant/int8.h"
#include "quant/pack.h"
#include "testutil.h"

static g4_safetensors st;

/* A copy of tensor `case.field` (the mapped data may be unaligned). */
static void *field(const char *c, const char *f, g4_dtype dt, int64_t *numel) {
    char name[128];
    snprintf(name, sizeof name, "%s.%s", c, f);
    const g4_tensor *t = g4_st_find(&st, name);
    if (!t || t->dtype != dt) {
        fprintf(stderr, "unit_linear: %s missing or not %s\n", name, g4_dtype_name(dt));
        exit(2);
    }
    void *p = malloc(t->nbytes ? t->nbytes : 1);
    memcpy(p, t->data, t->nbytes);
    if (numel) *numel = t->numel;
    return p;
}

static void check_case(const char *c, int bits) {
    int64_t nx, nw;
    float *x = field(c, "x", G4_DT_F32, &nx), *w_scale = field(c, "weight_scale", G4_DT_F32, &nw);
    float *s_in = field(c, "input_activation_scale", G4_DT_F32, NULL), *s_out = field(c, "output_activation_scale", G4_DT_F32, NULL);
    int8_t *x_codes = field(c, "x_codes", G4_DT_I8, NULL), *w_codes = field(c, "weight_codes", G4_DT_I8, NULL);
    int8_t *y_codes = field(c, "y_codes", G4_DT_I8, NULL);
    uint8_t *tie = field(c, "x_is_exact_tie", G4_DT_U8, NULL), *w = field(c, "weight", bits == 8 ? G4_DT_I8 : G4_DT_U8, NULL);
    int32_t *acc_ref = field(c, "acc", G4_DT_I32, NULL);
    float *y_int = field(c, "y_int", G4_DT_F32, NULL), *tie_dist = field(c, "y_tie_dist", G4_DT_F32, NULL);
    int out = (int)nw, in = (int)(nx / 6), rows = 6;
    g4_qweight qw = {.bits = bits, .in = in, .out = out, .row_bytes = g4_packed_row_bytes(bits, (size_t)in), .w = w, .w_scale = w_scale};

    /* weight codes as packed */
    int bad = 0;
    for (int o = 0; o < out; o++)
        for (int i = 0; i < in; i++) bad += g4_packed_code(w + (size_t)o * qw.row_bytes, bits, (size_t)i) != w_codes[o * in + i];
    CHECK(bad == 0, "%s: %d unpacked weight codes differ", c, bad);

    /* input codes: exact with x / s; with x * (1/s) only exact ties may go the other way */
    g4_quantizer qdiv, qrecip;
    g4_quantizer_init(&qdiv, *s_in, 0, G4_ROUND_EVEN, G4_QDIV_DIVIDE);
    g4_quantizer_init(&qrecip, *s_in, 0, G4_ROUND_EVEN, G4_QDIV_RECIPROCAL);
    int8_t *codes = malloc((size_t)nx);
    int div_bad = 0, recip_off_tie = 0, recip_ties = 0;
    for (int64_t i = 0; i < nx; i++) {
        codes[i] = g4_quantize(&qdiv, x[i]);
        div_bad += codes[i] != x_codes[i];
        int8_t r = g4_quantize(&qrecip, x[i]);
        if (r != x_codes[i]) *(tie[i] ? &recip_ties : &recip_off_tie) += 1;
    }
    CHECK(div_bad == 0, "%s: %d input codes differ (qdiv=div)", c, div_bad);
    CHECK(recip_off_tie == 0, "%s: %d non-tie input codes differ (qdiv=recip)", c, recip_off_tie);
    printf("ok %s: input codes exact (div); recip differs on %d exact ties only\n", c, recip_ties);

    /* accumulators: the dispatched kernel and the reference */
    int32_t *acc = malloc(sizeof *acc * (size_t)rows * out), *acc2 = malloc(sizeof *acc2 * (size_t)rows * out);
    g4_ref_matmul_i8(&qw, x_codes, rows, acc);
    g4_kernels_get()->matmul_i8(&qw, x_codes, rows, acc2);
    CHECK(memcmp(acc, acc_ref, sizeof *acc * (size_t)rows * out) == 0, "%s: reference accumulators differ", c);
    CHECK(memcmp(acc2, acc_ref, sizeof *acc * (size_t)rows * out) == 0, "%s: %s accumulators differ", c, g4_kernels_get()->name);

    /* output codes per requant rule */
    static const g4_requant_rule modes[] = {G4_REQUANT_F64, G4_REQUANT_F32, G4_REQUANT_TFL_DOUBLE, G4_REQUANT_TFL_SINGLE};
    g4_requant *rq = malloc(sizeof *rq * (size_t)out);
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        CHECK(g4_requant_init_rows(rq, (size_t)out, modes[m], *s_in, w_scale, *s_out, 0) == 0, "%s", g4_last_error());
        int exact_bad = 0, near_tie = 0, off_by_one = 0, worse = 0;
        for (int t = 0; t < rows; t++)
            for (int o = 0; o < out; o++) {
                int i = t * out + o;
                int8_t yc = g4_requantize(&rq[o], acc_ref[i]);
                if (modes[m] == G4_REQUANT_F32)
                    CHECK(g4_requantize_f32(acc_ref[i], rq[o].scale_f32) == yc, "%s: g4_requantize_f32 differs", c);
                if (yc == y_codes[i]) continue;
                if (tie_dist[i] < 1e-4f) near_tie++;
                else exact_bad++;
                if (yc - y_codes[i] == 1 || yc - y_codes[i] == -1) off_by_one++;
                else worse++;
            }
        const char *name = g4_requant_rule_name(modes[m]);
        if (modes[m] == G4_REQUANT_F64) {
            CHECK(exact_bad + near_tie == 0, "%s: f64 requant differs on %d codes", c, exact_bad + near_tie);
        } else if (modes[m] == G4_REQUANT_TFL_DOUBLE) {
            /* gemmlowp rounds twice (the high multiply, then the shift), so it may land one code
             * off the exact value away from ties too; never more. */
            CHECK(worse == 0, "%s: %s requant off by more than one code on %d", c, name, worse);
        } else {
            CHECK(exact_bad == 0, "%s: %s requant differs on %d codes away from a tie", c, name, exact_bad);
        }
        printf("ok %s: requant %-10s differs from the exact codes on %d of %d (%d near a tie, all +-1: %s)\n", c, name,
               near_tie + exact_bad, rows * out, near_tie, worse ? "no" : "yes");
    }
    /* dequantized output equals y_int */
    int deq_bad = 0;
    for (int i = 0; i < rows * out; i++) deq_bad += g4_dequantize(y_codes[i], *s_out, 0) != y_int[i];
    CHECK(deq_bad == 0, "%s: %d dequantized outputs differ", c, deq_bad);
    void *bufs[] = {x, w_scale, s_in, s_out, x_codes, w_codes, y_codes, tie, w, acc_ref, y_int, tie_dist, codes, acc, acc2, rq};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
}

/* The input code of x under a tie rule and a division rule, computed in double from the
 * definitions, not with the engine's quantizer: the product of two floats is exact in double, so
 * rounding it to float gives the f32 product x * (1/s); and double has more than 2 * 24 + 2 bits,
 * so the quotients 1 / s and x / s rounded from double are the f32 ones. */
static int8_t reference_code(float x, float s, int ties_away, int divide) {
    float inv = (float)(1.0 / (double)s);
    double v = divide ? (double)(float)((double)x / (double)s) : (double)(float)((double)x * (double)inv);
    double r = floor(v), frac = v - r;
    if (frac > 0.5 || (frac == 0.5 && (ties_away ? v > 0 : fmod(r, 2.0) != 0))) r += 1;
    return (int8_t)(r > 127 ? 127 : r < -128 ? -128 : r);
}

/* What one unit case's rows tell apart: input codes where int mode's rules (ties to even,
 * x * (1/s)) and x / s differ, and where they and ties away differ. */
typedef struct {
    int div_differs, away_differs;
} rule_spread;

/* One case's rows through the engine's own int-mode path: the module, in a session with the
 * engine's default options (g4_options_default, as the CLI and g4 eval start from; the test names
 * no tie or division rule), run by the forward pass's linear step (probe.h). Its int8 input codes
 * must be int mode's reference codes (README: --round even, --qdiv recip in int mode, as XNNPACK):
 * the fixture's x_codes (x / s) everywhere but at exact ties, which the reference decides. Its
 * int32 accumulators must be the exact dot products of those codes with the fixture's weight
 * codes, and where a row's codes are the fixture's, its acc and its y_int too (y_codes: exact f64;
 * int mode requantizes in f32, which may differ next to a rounding boundary, y_tie_dist). */
static rule_spread check_engine_case(const g4_model *m, const char *c, const char *module) {
    int64_t nx, nw;
    float *x = field(c, "x", G4_DT_F32, &nx), *s_in = field(c, "input_activation_scale", G4_DT_F32, NULL);
    float *w_scale = field(c, "weight_scale", G4_DT_F32, &nw), *y_int = field(c, "y_int", G4_DT_F32, NULL);
    float *tie_dist = field(c, "y_tie_dist", G4_DT_F32, NULL);
    int8_t *x_codes = field(c, "x_codes", G4_DT_I8, NULL), *w_codes = field(c, "weight_codes", G4_DT_I8, NULL);
    uint8_t *tie = field(c, "x_is_exact_tie", G4_DT_U8, NULL);
    int32_t *acc_fix = field(c, "acc", G4_DT_I32, NULL);
    int out = (int)nw, rows = 6, in = (int)(nx / rows);
    rule_spread spread = {0, 0};
    int8_t *want = malloc((size_t)nx), *codes = malloc((size_t)nx);
    int div_bad = 0, off_tie = 0;
    for (int64_t i = 0; i < nx; i++) {
        want[i] = reference_code(x[i], *s_in, 0, 0);
        int8_t div = reference_code(x[i], *s_in, 0, 1);
        div_bad += div != x_codes[i]; /* the reference's x / s is the fixture's */
        off_tie += !tie[i] && want[i] != x_codes[i];
        spread.div_differs += want[i] != div;
        spread.away_differs += want[i] != reference_code(x[i], *s_in, 1, 0);
    }
    CHECK(div_bad == 0 && off_tie == 0, "%s: reference codes: %d differ from x_codes with x / s, %d away from ties with x * (1/s)", c, div_bad,
          off_tie);

    g4_options o;
    g4_options_default(&o);
    o.ctx = 8;
    g4_session *s = g4_session_new(m, &o);
    float *y = malloc(sizeof *y * (size_t)rows * out);
    int32_t *acc = malloc(sizeof *acc * (size_t)rows * out);
    int path = s ? g4_session_run_linear(s, module, x, rows, y, codes, acc) : -1;
    CHECK(path == 1, "%s: %s did not run in integers with the default options (%d: %s)", c, module, path, g4_last_error());
    if (path == 1) {
        int code_bad = 0, acc_bad = 0, y_bad = 0;
        for (int64_t i = 0; i < nx; i++) code_bad += codes[i] != want[i];
        for (int t = 0; t < rows; t++) {
            int as_fixture = memcmp(want + (size_t)t * in, x_codes + (size_t)t * in, (size_t)in) == 0;
            for (int o2 = 0; o2 < out; o2++) {
                int64_t dot = 0;
                for (int i = 0; i < in; i++) dot += (int64_t)want[(size_t)t * in + i] * w_codes[(size_t)o2 * in + i];
                size_t k = (size_t)t * out + o2;
                acc_bad += acc[k] != dot || (as_fixture && acc[k] != acc_fix[k]);
                y_bad += as_fixture && y[k] != y_int[k] && !(tie_dist[k] < 1e-4f);
            }
        }
        CHECK(code_bad == 0, "%s: %d of %lld input codes of the engine's default int path are not the reference's", c, code_bad, (long long)nx);
        CHECK(acc_bad == 0, "%s: %d int32 accumulators of the engine's default int path are wrong", c, acc_bad);
        CHECK(y_bad == 0, "%s: %d outputs of the engine's default int path differ from y_int", c, y_bad);
        printf("ok %s (%s): the default int path gives the reference input codes, accumulators and outputs; tie rules matter on %d "
               "codes (x / s) and %d (ties away)\n",
               c, module, spread.div_differs, spread.away_differs);
    }
    g4_session_free(s);
    void *bufs[] = {x, s_in, w_scale, y_int, tie_dist, x_codes, w_codes, tie, acc_fix, want, codes, y, acc};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    return spread;
}

/* Every case of one fixture's unit_linear: the kernels and requant rules (check_case), then the
 * engine's default int path (check_engine_case), whose tie rows must tell both rules apart
 * somewhere, or a wrong default rule could not fail it. */
static void check_fixture_cases(const char *dir) {
    char path[8192];
    snprintf(path, sizeof path, "%s/unit_linear.safetensors", dir);
    if (g4_st_open_file(&st, path) != 0) {
        fprintf(stderr, "%s\n", g4_last_error());
        exit(2);
    }
    snprintf(path, sizeof path, "%s/unit_linear.json", dir);
    cJSON *desc = read_json(path);
    g4_model *m = g4_model_load(dir);
    CHECK(m != NULL, "%s", g4_last_error());
    static const struct {
        const char *name;
        int bits;
    } cases[] = {{"w4", 4}, {"w2", 2}, {"w8", 8}};
    rule_spread total = {0, 0};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        check_case(cases[i].name, cases[i].bits);
        const cJSON *cj = cJSON_GetObjectItem(cJSON_GetObjectItem(desc, "cases"), cases[i].name);
        const char *module = cJSON_GetStringValue(cJSON_GetObjectItem(cj, "module"));
        CHECK(module != NULL, "%s: no module for case %s", path, cases[i].name);
        if (!m || !module) continue;
        rule_spread sp = check_engine_case(m, cases[i].name, module);
        total.div_differs += sp.div_differs;
        total.away_differs += sp.away_differs;
    }
    CHECK(total.div_differs > 0 && total.away_differs > 0, "%s: the tie rows cannot tell x / s (%d) or ties away (%d) from int mode's rules", dir,
          total.div_differs, total.away_differs);
    g4_model_free(m);
    cJSON_Delete(desc);
    g4_st_close(&st);
}

int main(void) {
    if (!check_dispatch_level()) return check_report("unit_linear");
    check_fixture_cases(tiny_dir());
    check_fixture_cases("tests/fixtures/tiny-b");
    return check_report("unit_linear");
}
