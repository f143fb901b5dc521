/* The int-mode linear, bit for bit, against the single-QuantizedLinear fixture of tiny-mobile
 * (unit_linear.safetensors): input codes, int32 accumulators, and output codes under every
 * requant rule. Its y_codes are the exact float64 requantization; the other rules may differ
 * only where the exact value sits next to a rounding boundary (y_tie_dist). */
#include "kernels/kernels.h"
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
    g4_quantizer_init(&qdiv, *s_in, 0, G4_ROUND_HALF_EVEN, G4_QDIV_DIV);
    g4_quantizer_init(&qrecip, *s_in, 0, G4_ROUND_HALF_EVEN, G4_QDIV_RECIP);
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
    static const g4_requant_mode modes[] = {G4_REQUANT_F64, G4_REQUANT_F32, G4_REQUANT_TFL_DOUBLE, G4_REQUANT_TFL_SINGLE};
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
        const char *name = g4_requant_mode_name(modes[m]);
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

int main(void) {
    char path[8192];
    snprintf(path, sizeof path, "%s/unit_linear.safetensors", tiny_dir());
    if (g4_st_open_file(&st, path) != 0) {
        fprintf(stderr, "%s\n", g4_last_error());
        return 2;
    }
    check_case("w4", 4);
    check_case("w2", 2);
    check_case("w8", 8);
    g4_st_close(&st);
    return check_report("unit_linear");
}
