/* Bit-exact tests of the reference int8 arithmetic (src/quant/int8.c) against
 * shared/fixtures/int8/vectors.json (every case, every rule it records) and the hand cases of
 * int8-arithmetic.md §7 and activation-quant.md §10.
 *
 * Build with -ffp-contract=off (the Makefile must pass it too): the reference must round
 * every f32 operation separately, exactly like the vectors' generator. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "quant/int8.h"
#include "quant/pack.h"
#include "util/err.h"

#define MAX_K 64
#define MAX_ROWS 16

/* ---------------------------------------------------------------- small helpers --------- */

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static char *read_text_file(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    char *buf = NULL;
    long n = -1;
    if (fseek(fp, 0, SEEK_END) == 0 && (n = ftell(fp)) >= 0 && fseek(fp, 0, SEEK_SET) == 0) {
        buf = malloc((size_t)n + 1);
        if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
            free(buf);
            buf = NULL;
        }
        if (buf) buf[n] = 0;
    }
    fclose(fp);
    return buf;
}

/* Field accessors: a missing or mistyped field is a test failure, never a crash. They only
 * count failures, so the pass count is the number of real arithmetic checks. */
static const cJSON *field(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) CHECK(0, "vectors.json: missing field \"%s\"", key);
    return v;
}

static double num(const cJSON *o, const char *key) {
    const cJSON *v = field(o, key);
    if (v && !cJSON_IsNumber(v)) CHECK(0, "vectors.json: \"%s\" is not a number", key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0.0;
}

static int inum(const cJSON *o, const char *key) { return (int)num(o, key); }

/* "0x3d4ccccd" -> the f32 with that bit pattern. */
static float f32_field(const cJSON *o, const char *key) {
    const cJSON *v = field(o, key);
    if (!v || !cJSON_IsString(v)) {
        CHECK(0, "vectors.json: \"%s\" is not a hex string", key);
        return 0.0f;
    }
    return f32_from_bits((uint32_t)strtoul(v->valuestring, NULL, 16));
}

static uint32_t hex_field_u32(const cJSON *o, const char *key) {
    const cJSON *v = field(o, key);
    return v && cJSON_IsString(v) ? (uint32_t)strtoul(v->valuestring, NULL, 16) : 0;
}

/* Reads an int array of at most cap elements; returns its length (or -1). */
static int int_array(const cJSON *arr, int *out, int cap) {
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) > cap) return -1;
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) out[n++] = cJSON_IsNumber(e) ? e->valueint : 0;
    return n;
}

/* Reads ["78", "f3", ...]; returns the byte count (or -1). */
static int hex_byte_array(const cJSON *arr, uint8_t *out, int cap) {
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) > cap) return -1;
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) out[n++] =
        cJSON_IsString(e) ? (uint8_t)strtoul(e->valuestring, NULL, 16) : 0;
    return n;
}

/* LiteRT stores low-bit codes as two's complement fields (int8-arithmetic.md §1.1, what
 * vectors.json records); the checkpoint and pack.h use offset binary, code = raw - 2^(b-1)
 * (checkpoint.md §6). The two differ exactly in each field's top bit, so flipping it maps
 * one onto the other, padding included (LiteRT pads with code 0 = raw 0, HF with raw 2^(b-1)). */
static uint8_t litert_to_checkpoint_byte(uint8_t b, int bits) {
    return bits == 4 ? (uint8_t)(b ^ 0x88) : bits == 2 ? (uint8_t)(b ^ 0xAA) : b;
}

/* Test-side packer in the checkpoint layout, written from checkpoint.md §6 independently of
 * pack.h, so unpacking is checked against a second reading of the spec. */
static size_t pack_checkpoint_row(const int *codes, size_t n, int bits, uint8_t *out) {
    size_t per = (size_t)(8 / bits), nbytes = (n + per - 1) / per;
    unsigned fmask = (1u << bits) - 1, offset = bits == 8 ? 0u : 1u << (bits - 1);
    for (size_t i = 0; i < nbytes; i++) {
        unsigned b = 0;
        for (size_t k = 0; k < per; k++) {
            size_t j = i * per + k;
            unsigned raw = j < n ? ((unsigned)(codes[j] + (int)offset) & fmask) : offset;
            b |= raw << (k * (size_t)bits);
        }
        out[i] = (uint8_t)b;
    }
    return nbytes;
}

static const g4_requant_rule k_modes[] = {G4_REQUANT_F32, G4_REQUANT_F64, G4_REQUANT_TFL_DOUBLE,
                                          G4_REQUANT_TFL_SINGLE, G4_REQUANT_TFL_NEON};

/* The vectors.json column recording each mode's result; F64 has none (hand cases below). */
static const char *vector_column(g4_requant_rule mode) {
    switch (mode) {
    case G4_REQUANT_F32: return "xnn_fp32";
    case G4_REQUANT_TFL_DOUBLE: return "tfl_double";
    case G4_REQUANT_TFL_SINGLE: return "tfl_single";
    case G4_REQUANT_TFL_NEON: return "neon_4row";
    default: return NULL;
    }
}

/* ---------------------------------------------------------------- vectors.json ---------- */

static void test_vec_quantize_multiplier(const cJSON *cases) {
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        double m = num(c, "m");
        int32_t mult = -1, single_mult = -1;
        int shift = 99, single_shift = 99;
        CHECK_EQ_INT(g4_quantize_multiplier(m, &mult, &shift), 0);
        CHECK(mult == inum(c, "mult") && shift == inum(c, "shift"), "m=%.17g: (%d, %d)", m,
              (int)mult, shift);
        /* No vector needs the single-rounding clamp (shift <= 30 everywhere). */
        CHECK_EQ_INT(g4_quantize_multiplier_single(m, &single_mult, &single_shift), 0);
        CHECK(single_mult == mult && single_shift == shift, "single m=%.17g", m);
    }
}

/* One requant row (the "mbqm" section or an FC row): parameters and every mode's code. */
static void check_requant_row(const cJSON *r, const char *where) {
    float s_in = (float)num(r, "s_in"), s_w = (float)num(r, "s_w"), s_out = (float)num(r, "s_out");
    int32_t acc = inum(r, "acc"), zp = inum(r, "zp_out");
    for (size_t i = 0; i < sizeof k_modes / sizeof k_modes[0]; i++) {
        g4_requant rq;
        CHECK(g4_requant_init(&rq, k_modes[i], s_in, s_w, s_out, zp) == 0, "%s: %s", where,
              g4_last_error());
        CHECK(rq.mult == inum(r, "mult") && rq.shift == inum(r, "shift"),
              "%s acc=%d %s: mult/shift %d %d", where, (int)acc, g4_requant_rule_name(k_modes[i]),
              (int)rq.mult, rq.shift);
        CHECK(f32_bits(rq.scale_f32) == hex_field_u32(r, "xnn_scale_f32_bits"),
              "%s acc=%d: xnn scale 0x%08x", where, (int)acc, (unsigned)f32_bits(rq.scale_f32));
        const char *col = vector_column(k_modes[i]);
        if (!col) continue;
        int got = g4_requantize(&rq, acc), want = inum(r, col);
        CHECK(got == want, "%s acc=%d mode %s: got %d want %d", where, (int)acc,
              g4_requant_rule_name(k_modes[i]), got, want);
    }
}

static void test_vec_mbqm(const cJSON *rows) {
    const cJSON *r;
    cJSON_ArrayForEach(r, rows) check_requant_row(r, "mbqm");
}

static void test_vec_quantize(const cJSON *cases) {
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        float x = f32_field(c, "x_f32_bits"), s = f32_field(c, "s_f32_bits");
        int32_t zp = inum(c, "zp");
        CHECK((double)x == num(c, "x"), "x bits vs value %.17g", (double)x);
        g4_quantizer ref, neon, xnn;
        CHECK_EQ_INT(g4_quantizer_init(&ref, s, zp, G4_ROUND_AWAY, G4_QDIV_DIVIDE), 0);
        CHECK_EQ_INT(g4_quantizer_init(&neon, s, zp, G4_ROUND_EVEN, G4_QDIV_RECIPROCAL), 0);
        CHECK_EQ_INT(g4_quantizer_init(&xnn, s, zp, G4_ROUND_EVEN, G4_QDIV_RECIPROCAL), 0);
        /* NEON forms 1/s as (float)(1.0 / (double)s), XNNPACK as 1.0f / s; both are the
         * correctly rounded f32 reciprocal, so one quantizer serves both columns. */
        CHECK(f32_bits(neon.inv_scale) == f32_bits((float)(1.0 / (double)s)), "recip s=%g",
              (double)s);
        CHECK(g4_quantize(&ref, x) == inum(c, "tfl_ref"), "tfl_ref x=%.9g s=%.9g: %d",
              (double)x, (double)s, g4_quantize(&ref, x));
        CHECK(g4_quantize(&neon, x) == inum(c, "tfl_neon"), "tfl_neon x=%.9g s=%.9g: %d",
              (double)x, (double)s, g4_quantize(&neon, x));
        CHECK(g4_quantize(&xnn, x) == inum(c, "xnn"), "xnn x=%.9g s=%.9g: %d", (double)x,
              (double)s, g4_quantize(&xnn, x));
    }
}

/* Packed weight buffer (checkpoint layout) of one FC case; returns 0 on success. */
static int fc_weights(const cJSON *fc, int bits, int out, int k, uint8_t *w) {
    const cJSON *rows = field(fc, "W"), *packed = field(fc, "W_packed_hex");
    size_t stride = g4_packed_row_bytes(bits, (size_t)k);
    for (int o = 0; o < out; o++) {
        int codes[MAX_K];
        uint8_t *row = w + (size_t)o * stride, mine[MAX_K];
        if (int_array(cJSON_GetArrayItem(rows, o), codes, MAX_K) != k) return -1;
        if (bits == 8) {
            for (int j = 0; j < k; j++) row[j] = (uint8_t)(int8_t)codes[j];
        } else {
            int n = hex_byte_array(cJSON_GetArrayItem(packed, o), row, MAX_K);
            if (n != (int)stride) return -1;
            for (int j = 0; j < n; j++) row[j] = litert_to_checkpoint_byte(row[j], bits);
        }
        /* The recorded packed bytes must be the recorded codes. */
        int8_t un[MAX_K];
        g4_unpack_row(row, bits, (size_t)k, un);
        int same = 1;
        for (int j = 0; j < k; j++) same &= un[j] == codes[j];
        CHECK(same, "FC %s row %d: packed bytes do not unpack to W",
              cJSON_GetStringValue(cJSON_GetObjectItem(fc, "name")), o);
        CHECK(pack_checkpoint_row(codes, (size_t)k, bits, mine) == stride &&
                  memcmp(mine, row, stride) == 0,
              "FC row %d: repacking differs", o);
    }
    return 0;
}

static void test_vec_fc_case(const cJSON *fc) {
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(fc, "name"));
    int xi[MAX_K], bias[MAX_ROWS], bits = inum(fc, "weight_bits"), zp_in = inum(fc, "zp_in");
    const cJSON *rows = field(fc, "rows"), *bias_j = field(fc, "bias");
    int k = int_array(field(fc, "x"), xi, MAX_K), out = cJSON_GetArraySize(rows);
    int has_bias = bias_j && cJSON_IsArray(bias_j);
    if (k <= 0 || out <= 0 || out > MAX_ROWS ||
        (has_bias && int_array(bias_j, bias, MAX_ROWS) != out)) {
        CHECK(0, "FC %s: malformed case", name ? name : "?");
        return;
    }
    int8_t x[MAX_K];
    int32_t bias32[MAX_ROWS], acc[MAX_ROWS];
    float s_w[MAX_ROWS];
    for (int j = 0; j < k; j++) x[j] = (int8_t)xi[j];
    for (int o = 0; o < out; o++) {
        bias32[o] = has_bias ? bias[o] : 0;
        s_w[o] = (float)num(cJSON_GetArrayItem(rows, o), "s_w");
        CHECK(inum(cJSON_GetArrayItem(rows, o), "channel") == o, "FC %s: row order", name);
    }
    uint8_t w[MAX_ROWS * MAX_K];
    if (fc_weights(fc, bits, out, k, w)) {
        CHECK(0, "FC %s: malformed weights", name);
        return;
    }
    const int32_t *b = has_bias ? bias32 : NULL;
    CHECK_EQ_INT(g4_matvec_packed_acc(x, zp_in, w, bits, (size_t)out, (size_t)k, b, acc), 0);
    for (int o = 0; o < out; o++) {
        const cJSON *r = cJSON_GetArrayItem(rows, o);
        CHECK(acc[o] == inum(r, "acc"), "FC %s row %d: acc %d", name, o, (int)acc[o]);
        check_requant_row(r, name);
    }
    /* The whole matvec, per mode, with per-row params built from the row scales. */
    const cJSON *r0 = cJSON_GetArrayItem(rows, 0);
    float s_in = (float)num(r0, "s_in"), s_out = (float)num(r0, "s_out");
    int zp_out = inum(r0, "zp_out");
    for (size_t i = 0; i < sizeof k_modes / sizeof k_modes[0]; i++) {
        const char *col = vector_column(k_modes[i]);
        g4_requant rq[MAX_ROWS];
        int8_t y[MAX_ROWS];
        if (!col) continue;
        CHECK_EQ_INT(
            g4_requant_init_rows(rq, (size_t)out, k_modes[i], s_in, s_w, s_out, zp_out), 0);
        CHECK_EQ_INT(g4_matvec_packed(x, zp_in, w, bits, (size_t)out, (size_t)k, b, rq, y), 0);
        for (int o = 0; o < out; o++)
            CHECK(y[o] == inum(cJSON_GetArrayItem(rows, o), col), "FC %s row %d %s: %d", name,
                  o, col, y[o]);
    }
}

static void test_vec_fc(const cJSON *cases) {
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) test_vec_fc_case(c);
}

static void test_vec_dequantize(const cJSON *cases) {
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        float y = g4_dequantize(inum(c, "q"), f32_field(c, "s_f32_bits"), inum(c, "zp"));
        CHECK(f32_bits(y) == hex_field_u32(c, "y_f32_bits"), "q=%d: 0x%08x", inum(c, "q"),
              (unsigned)f32_bits(y));
        CHECK((double)y == num(c, "y"), "q=%d: %.17g", inum(c, "q"), (double)y);
    }
}

static void test_vec_pack(const cJSON *cases) {
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        int vals[MAX_K], bits = inum(c, "bits");
        uint8_t bytes[MAX_K], mine[MAX_K];
        int n = int_array(field(c, "values"), vals, MAX_K);
        int nb = hex_byte_array(field(c, "bytes_hex"), bytes, MAX_K);
        if (n <= 0 || nb != (int)g4_packed_row_bytes(bits, (size_t)n)) {
            CHECK(0, "pack case: malformed (bits %d, %d values, %d bytes)", bits, n, nb);
            continue;
        }
        for (int j = 0; j < nb; j++) bytes[j] = litert_to_checkpoint_byte(bytes[j], bits);
        int8_t un[MAX_K];
        g4_unpack_row(bytes, bits, (size_t)n, un);
        for (int j = 0; j < n; j++)
            CHECK(un[j] == vals[j] && g4_packed_code(bytes, bits, (size_t)j) == vals[j],
                  "pack bits %d element %d: %d want %d", bits, j, un[j], vals[j]);
        CHECK(pack_checkpoint_row(vals, (size_t)n, bits, mine) == (size_t)nb &&
                  memcmp(mine, bytes, (size_t)nb) == 0,
              "pack bits %d: repacked bytes differ", bits);
    }
}

static void test_vectors_json(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/fixtures/int8/vectors.json", check_shared_dir());
    char *text = read_text_file(path);
    CHECK(text != NULL, "cannot read %s", path);
    if (!text) return;
    cJSON *root = cJSON_Parse(text);
    free(text);
    CHECK(root != NULL, "cannot parse %s", path);
    if (!root) return;
    static const struct {
        const char *key;
        void (*run)(const cJSON *);
    } sections[] = {{"quantize_multiplier", test_vec_quantize_multiplier},
                    {"mbqm", test_vec_mbqm},
                    {"quantize", test_vec_quantize},
                    {"fc", test_vec_fc},
                    {"dequantize", test_vec_dequantize},
                    {"pack", test_vec_pack}};
    const size_t nsec = sizeof sections / sizeof sections[0];
    /* A section this test does not know would go untested: fail loudly instead. */
    const cJSON *sec;
    cJSON_ArrayForEach(sec, root) {
        int known = 0;
        for (size_t i = 0; i < nsec; i++) known |= strcmp(sec->string, sections[i].key) == 0;
        if (!known) CHECK(0, "vectors.json: untested section \"%s\"", sec->string);
    }
    for (size_t i = 0; i < nsec; i++) {
        const cJSON *arr = field(root, sections[i].key);
        if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) == 0)
            CHECK(0, "vectors.json: section %s missing or empty", sections[i].key);
        else
            sections[i].run(arr);
    }
    cJSON_Delete(root);
}

/* ---------------------------------------------------------------- hand cases ------------ */

/* activation-quant.md §10 item 1, for both tie rules and both division modes. s = 0.25 is a
 * power of two, so x/s and x*(1/s) are both exact and the cases test rounding and clamping
 * alone; the division-vs-reciprocal difference is covered by vectors.json (-12.15 / 0.1). */
static void test_quantizer_unit_cases(void) {
    static const struct {
        float x_over_s;
        int even, away;
    } cases[] = {
        {127.4f, 127, 127}, {127.5f, 127, 127}, {-128.5f, -128, -128}, {0.5f, 0, 1},
        {-2.5f, -2, -3},    {-0.5f, 0, -1},     {1.5f, 2, 2},          {-128.4f, -128, -128},
        {1e30f, 127, 127},  {-1e30f, -128, -128}, {0.0f, 0, 0},        {-0.0f, 0, 0},
    };
    const float s = 0.25f;
    for (int d = 0; d < 2; d++) {
        g4_qdiv qdiv = d ? G4_QDIV_DIVIDE : G4_QDIV_RECIPROCAL;
        g4_quantizer even, away;
        CHECK_EQ_INT(g4_quantizer_init(&even, s, 0, G4_ROUND_EVEN, qdiv), 0);
        CHECK_EQ_INT(g4_quantizer_init(&away, s, 0, G4_ROUND_AWAY, qdiv), 0);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            float x = cases[i].x_over_s * s;
            CHECK(g4_quantize(&even, x) == cases[i].even, "even qdiv=%d x/s=%g: %d", d,
                  (double)cases[i].x_over_s, g4_quantize(&even, x));
            CHECK(g4_quantize(&away, x) == cases[i].away, "away qdiv=%d x/s=%g: %d", d,
                  (double)cases[i].x_over_s, g4_quantize(&away, x));
        }
        /* Q(x; s) = code * s. */
        CHECK(g4_fake_quantize(&even, 0.3f) == 0.25f, "fake 0.3");
        CHECK(g4_fake_quantize(&away, 40.0f) == 127 * 0.25f, "fake clamp");
    }
    /* Vector form = scalar form. */
    g4_quantizer q;
    float xs[5] = {0.125f, -0.375f, 1.0f, 100.0f, -0.1f};
    int8_t codes[5];
    CHECK_EQ_INT(g4_quantizer_init(&q, s, 0, G4_ROUND_EVEN, G4_QDIV_RECIPROCAL), 0);
    g4_quantize_vec(&q, xs, 5, codes);
    CHECK(codes[0] == 0 && codes[1] == -2 && codes[2] == 4 && codes[3] == 127 && codes[4] == 0,
          "quantize_vec");
}

static void test_quantizer_identity_and_errors(void) {
    g4_quantizer q;
    CHECK(g4_scale_is_identity(0.0f) && g4_scale_is_identity(-0.0f), "identity scale");
    CHECK(!g4_scale_is_identity(1e-30f), "tiny scale is not identity");
    CHECK_EQ_INT(g4_quantizer_init(&q, 0.0f, 0, G4_ROUND_EVEN, G4_QDIV_RECIPROCAL), 0);
    CHECK(g4_quantizer_is_identity(&q), "quantizer identity");
    static const float xs[] = {3.14159f, -1e30f, 1e-40f, -0.0f, 1e30f};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++)
        CHECK(f32_bits(g4_fake_quantize(&q, xs[i])) == f32_bits(xs[i]), "s=0 passthrough %g",
              (double)xs[i]);
    static const float bad[] = {-0.1f, 1e-45f};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        g4_clear_error();
        CHECK(g4_quantizer_init(&q, bad[i], 0, G4_ROUND_EVEN, G4_QDIV_RECIPROCAL) == -1,
              "bad scale %g accepted", (double)bad[i]);
        CHECK(strstr(g4_last_error(), "scale") != NULL, "%s", g4_last_error());
    }
    CHECK(g4_quantizer_init(&q, (float)INFINITY, 0, G4_ROUND_EVEN, G4_QDIV_RECIPROCAL) == -1,
          "inf scale");
    CHECK(g4_quantizer_init(&q, (float)NAN, 0, G4_ROUND_EVEN, G4_QDIV_RECIPROCAL) == -1,
          "nan scale");
    CHECK(g4_quantizer_init(&q, 0.1f, 128, G4_ROUND_EVEN, G4_QDIV_RECIPROCAL) == -1, "zp 128");
}

static void test_rounding(void) {
    static const struct {
        float v, even, away;
    } c[] = {{0.5f, 0, 1},   {1.5f, 2, 2},     {2.5f, 2, 3},     {-0.5f, -0.0f, -1},
             {-1.5f, -2, -2}, {-2.5f, -2, -3},  {0.49999997f, 0, 0}, {8388607.5f, 8388608, 8388608},
             {8388609.0f, 8388609, 8388609}, {-121.5f, -122, -122}, {-122.5f, -122, -123}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        CHECK(g4_round_f32(c[i].v, G4_ROUND_EVEN) == c[i].even, "even %.9g", (double)c[i].v);
        CHECK(g4_round_f32(c[i].v, G4_ROUND_AWAY) == c[i].away, "away %.9g", (double)c[i].v);
        CHECK(g4_round_f64(c[i].v, G4_ROUND_EVEN) == c[i].even, "even64 %.9g", (double)c[i].v);
        CHECK(g4_round_f64(c[i].v, G4_ROUND_AWAY) == c[i].away, "away64 %.9g", (double)c[i].v);
    }
}

/* int8-arithmetic.md §7.6 (c) and the gemmlowp primitives' edges. */
static void test_fixed_point_primitives(void) {
    const int32_t m30 = INT32_C(1) << 30;
    static const struct {
        int32_t x;
        int shift;
        int32_t dbl, sgl;
    } c[] = {{-6, -1, -2, -1}, {6, -1, 2, 2}, {-10, -2, -1, -1}, {-3, 0, -1, -1}, {3, 0, 2, 2}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        CHECK_EQ_INT(g4_mbqm_double(c[i].x, m30, c[i].shift), c[i].dbl);
        CHECK_EQ_INT(g4_mbqm_single(c[i].x, m30, c[i].shift), c[i].sgl);
    }
    CHECK_EQ_INT(g4_srdhm(INT32_MIN, INT32_MIN), INT32_MAX);
    CHECK_EQ_INT(g4_srdhm(52, 1314464482), 32); /* §7.6 (a) mechanism */
    CHECK_EQ_INT(g4_rounding_divide_by_pot(32, 6), 1);
    CHECK_EQ_INT(g4_rounding_divide_by_pot(-32, 6), -1);  /* -0.5: ties away from zero */
    CHECK_EQ_INT(g4_rounding_divide_by_pot(-31, 6), 0);
    CHECK_EQ_INT(g4_rounding_divide_by_pot(-33, 6), -1);
    CHECK_EQ_INT(g4_rounding_divide_by_pot(12345, 0), 12345);
    CHECK_EQ_INT(g4_rounding_divide_by_pot(INT32_MIN, 31), -1);
    CHECK_EQ_INT(g4_rounding_divide_by_pot(INT32_MAX, 31), 1);
    CHECK_EQ_INT(g4_mbqm_neon_4row(-8, m30, -3), 0); /* -0.5: vrshl rounds half up */
    CHECK_EQ_INT(g4_mbqm_double(-8, m30, -3), -1);
    /* shift > 0 multiplies first (left shift, int32 wrap). */
    CHECK_EQ_INT(g4_mbqm_double(3, m30, 2), 6);
    CHECK_EQ_INT(g4_mbqm_single(3, m30, 2), 6);
    CHECK_EQ_INT(g4_mbqm_neon_4row(3, m30, 2), 6);

    int32_t mult;
    int shift;
    CHECK_EQ_INT(g4_quantize_multiplier(2147483648.0, &mult, &shift), 0);
    CHECK(mult == m30 && shift == 32, "2^31: %d %d", (int)mult, shift);
    CHECK_EQ_INT(g4_quantize_multiplier_single(2147483648.0, &mult, &shift), 0);
    CHECK(mult == INT32_MAX && shift == 30, "single 2^31: %d %d", (int)mult, shift);
    CHECK_EQ_INT(g4_quantize_multiplier(1073741824.0, &mult, &shift), 0);
    CHECK(mult == m30 && shift == 31, "2^30: %d %d", (int)mult, shift);
    CHECK_EQ_INT(g4_quantize_multiplier_single(1073741824.0, &mult, &shift), 0);
    CHECK(mult == INT32_MAX && shift == 30, "single 2^30: %d %d", (int)mult, shift);
    CHECK_EQ_INT(g4_quantize_multiplier(0.0, &mult, &shift), 0);
    CHECK(mult == 0 && shift == 0, "zero");
    CHECK_EQ_INT(g4_quantize_multiplier(-0.5, &mult, &shift), -1);
    CHECK_EQ_INT(g4_quantize_multiplier(NAN, &mult, &shift), -1);
}

/* G4_REQUANT_F64 has no column in vectors.json. Expected codes: round-half-even of the
 * exact values tabulated in int8-arithmetic.md §7.6 (a) and (b), plus cases that separate
 * the modes and catch plausible mis-implementations (all modes' codes computed with the
 * functions of int8ref.py; F64 with the unit_linear formula of gen/qformat.py). */
static void test_requant_f64_and_distinguishing(void) {
    static const struct {
        uint32_t s_x, s_w, s_y;
        int32_t acc;
        int f32, f64, dbl, sgl, neon;
    } c[] = {
        /* §7.6 (a): 0.038878, 0.0123, 0.05 */
        {0x3d1f3e8a, 0x3c4985f0, 0x3d4ccccd, 52, 0, 0, 1, 0, 1},
        {0x3d1f3e8a, 0x3c4985f0, 0x3d4ccccd, -52, 0, 0, -1, 0, 0},
        {0x3d1f3e8a, 0x3c4985f0, 0x3d4ccccd, 261, 2, 2, 3, 2, 3},
        {0x3d1f3e8a, 0x3c4985f0, 0x3d4ccccd, 575, 5, 5, 6, 5, 6},
        {0x3d1f3e8a, 0x3c4985f0, 0x3d4ccccd, -784, -7, -7, -8, -7, -7},
        /* §7.6 (b): 0.5, 0.125, 1.0 (exact products: F64 ties go to even) */
        {0x3f000000, 0x3e000000, 0x3f800000, 8, 0, 0, 1, 1, 1},
        {0x3f000000, 0x3e000000, 0x3f800000, -8, 0, 0, -1, 0, 0},
        {0x3f000000, 0x3e000000, 0x3f800000, 40, 2, 2, 3, 3, 3},
        {0x3f000000, 0x3e000000, 0x3f800000, -24, -2, -2, -2, -1, -1},
        {0x3f000000, 0x3e000000, 0x3f800000, -9, -1, -1, -1, -1, 0},
        /* f32 multiplier rounds exact -59.4999977 over the boundary */
        {0x3d38f419, 0x3b3ae272, 0x3c7cf2d4, -7134, -60, -59, -60, -59, -59},
        /* |acc| > 2^24: (float)acc rounds 16908289 to 16908288 = 64.5 * 2^18 -> even 64 */
        {0x3f800000, 0x36800000, 0x3f800000, 16908289, 64, 65, 65, 65, 65},
        {0x3f800000, 0x36800000, 0x3f800000, -16908289, -64, -65, -65, -65, -64},
        /* 3 * 2^-20: (float)acc then one f32 multiply gives 48.5000038 -> 49; rounding the
         * exact product acc * scale once to f32 would give the tie 48.5 -> 48 */
        {0x3f800000, 0x36400000, 0x3f800000, 16951979, 49, 49, 49, 49, 49},
        {0x3f800000, 0x36400000, 0x3f800000, -16951979, -49, -49, -49, -49, -48},
        /* 0.625, 5, 24: left to right is the exact tie -112.5 -> -112, while acc * M with
         * M = fl(3.125 / 24) in double would give -112.50000000000001 -> -113 */
        {0x3f200000, 0x40a00000, 0x41c00000, -864, -112, -112, -113, -113, -112},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const int want[] = {c[i].f32, c[i].f64, c[i].dbl, c[i].sgl, c[i].neon};
        for (size_t m = 0; m < sizeof k_modes / sizeof k_modes[0]; m++) {
            g4_requant rq;
            CHECK_EQ_INT(g4_requant_init(&rq, k_modes[m], f32_from_bits(c[i].s_x),
                                         f32_from_bits(c[i].s_w), f32_from_bits(c[i].s_y), 0),
                         0);
            int got = g4_requantize(&rq, c[i].acc);
            CHECK(got == want[m], "case %zu acc=%d %s: got %d want %d", i, (int)c[i].acc,
                  g4_requant_rule_name(k_modes[m]), got, want[m]);
        }
    }
}

static void test_requant_init_errors(void) {
    g4_requant rq;
    CHECK_EQ_INT(g4_requant_init(&rq, G4_REQUANT_F32, 0.1f, 0.01f, 0.0f, 0), -1);
    CHECK_EQ_INT(g4_requant_init(&rq, G4_REQUANT_F32, 0.0f, 0.01f, 0.1f, 0), -1);
    CHECK_EQ_INT(g4_requant_init(&rq, G4_REQUANT_TFL_DOUBLE, 1.0f, 1.0f, 1.0f / 512, 0), -1);
    CHECK_EQ_INT(g4_requant_init(&rq, G4_REQUANT_F64, 0.1f, 0.01f, 0.1f, -129), -1);
    CHECK_EQ_INT(g4_requant_init(&rq, (g4_requant_rule)9, 0.1f, 0.01f, 0.1f, 0), -1);
    float s_w[2] = {0.01f, -1.0f};
    g4_requant rows[2];
    g4_clear_error();
    CHECK_EQ_INT(g4_requant_init_rows(rows, 2, G4_REQUANT_F32, 0.1f, s_w, 0.1f, 0), -1);
    CHECK(strncmp(g4_last_error(), "row 1: ", 7) == 0, "%s", g4_last_error());
    /* A multiplier below 2^-32 is flushed to zero by TFLite; every code becomes 0. */
    CHECK_EQ_INT(g4_requant_init(&rq, G4_REQUANT_TFL_DOUBLE, 1e-6f, 1e-6f, 1.0f, 0), 0);
    CHECK(rq.mult == 0 && rq.shift == 0 && g4_requantize(&rq, 1000000) == 0, "flush");
}

/* ---------------------------------------------------------------- unpack / dot ---------- */

/* Hand-packed bytes in the checkpoint layout (checkpoint.md §6: offset binary, LSB first). */
static void test_unpack_hand_packed(void) {
    /* Pad fields hold code 0 (raw 2^(b-1)), as the checkpoint pads. */
    static const uint8_t w4[] = {0x0F, 0x78, 0x88}; /* raw 15,0 | 8,7 | 8,pad */
    static const int8_t w4_codes[] = {7, -8, 0, -1, 0};
    static const uint8_t w2[] = {0xE4, 0x1B, 0xAA}; /* raw 0,1,2,3 | 3,2,1,0 | 2,pad,pad,pad */
    static const int8_t w2_codes[] = {-2, -1, 0, 1, 1, 0, -1, -2, 0};
    static const uint8_t w8[] = {0x80, 0x7F, 0xFF, 0x00, 0x01};
    static const int8_t w8_codes[] = {-128, 127, -1, 0, 1};
    static const struct {
        int bits;
        const uint8_t *bytes;
        const int8_t *codes;
        size_t n, nbytes;
    } c[] = {{4, w4, w4_codes, 5, 3}, {2, w2, w2_codes, 9, 3}, {8, w8, w8_codes, 5, 5}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        int8_t out[16];
        if (c[i].n > sizeof out) continue; /* keeps GCC's -O3 bounds analysis quiet */
        CHECK_EQ_INT(g4_packed_row_bytes(c[i].bits, c[i].n), c[i].nbytes);
        g4_unpack_row(c[i].bytes, c[i].bits, c[i].n, out);
        for (size_t j = 0; j < c[i].n; j++) {
            CHECK(out[j] == c[i].codes[j], "bits %d element %zu: %d", c[i].bits, j, out[j]);
            CHECK_EQ_INT(g4_packed_code(c[i].bytes, c[i].bits, j), c[i].codes[j]);
        }
        /* Dot product against x = 1..n, by hand: sum (j+1) * code[j]. */
        int8_t x[sizeof out];
        int32_t want = 0;
        for (size_t j = 0; j < c[i].n; j++) {
            x[j] = (int8_t)(j + 1);
            want += (int32_t)(j + 1) * c[i].codes[j];
        }
        CHECK_EQ_INT(g4_dot_packed(x, 0, c[i].bytes, c[i].bits, c[i].n), want);
        /* Input zero point 1: sum code * (x - 1) = want - sum code. */
        int32_t code_sum = 0;
        for (size_t j = 0; j < c[i].n; j++) code_sum += c[i].codes[j];
        CHECK_EQ_INT(g4_dot_packed(x, 1, c[i].bytes, c[i].bits, c[i].n), want - code_sum);
    }
}

/* Worst-case magnitudes of activation-quant.md §7 (all exact in int32), and the int32
 * wrap-around of a sum that reaches 2^31. */
static void test_dot_extremes(void) {
    static const struct {
        int bits, code;
        size_t k;
        int32_t want;
    } c[] = {{8, -128, 1536, 128 * 128 * 1536}, {4, -8, 6144, 128 * 8 * 6144},
             {2, -2, 12288, 128 * 2 * 12288}, {8, -128, 131072, INT32_MIN}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        size_t nb = g4_packed_row_bytes(c[i].bits, c[i].k);
        uint8_t *w = malloc(nb);
        int8_t *x = malloc(c[i].k);
        if (!w || !x) {
            CHECK(0, "out of memory");
            free(w);
            free(x);
            return;
        }
        /* Every field of every byte holds the same code. */
        const int fill[4] = {c[i].code, c[i].code, c[i].code, c[i].code};
        uint8_t byte;
        pack_checkpoint_row(fill, (size_t)(8 / c[i].bits), c[i].bits, &byte);
        memset(w, byte, nb);
        memset(x, 0x80, c[i].k); /* -128 */
        CHECK(g4_dot_packed(x, 0, w, c[i].bits, c[i].k) == c[i].want, "bits %d k %zu: %d",
              c[i].bits, c[i].k, (int)g4_dot_packed(x, 0, w, c[i].bits, c[i].k));
        free(w);
        free(x);
    }
}

/* Matvec over rows whose length leaves padding in the last byte: the row stride must be
 * g4_packed_row_bytes, and each output must equal an independent naive sum. */
static void test_matvec_padded_rows(void) {
    enum { OUT = 5, K = 7 };
    static const int bits_list[] = {2, 4, 8};
    int8_t x[K];
    int32_t bias[OUT];
    for (int j = 0; j < K; j++) x[j] = (int8_t)(j * 37 % 256 - 128);
    for (int o = 0; o < OUT; o++) bias[o] = 1000 * o - 2000;
    for (size_t b = 0; b < sizeof bits_list / sizeof bits_list[0]; b++) {
        int bits = bits_list[b], lo = bits == 8 ? -128 : -(1 << (bits - 1));
        int span = bits == 8 ? 256 : 1 << bits;
        size_t stride = g4_packed_row_bytes(bits, K);
        uint8_t w[OUT * K];
        int32_t want[OUT], acc[OUT];
        for (int o = 0; o < OUT; o++) {
            int codes[K];
            want[o] = bias[o];
            for (int j = 0; j < K; j++) {
                codes[j] = lo + (o * 7 + j * 3) % span;
                want[o] += codes[j] * (x[j] - 3);
            }
            pack_checkpoint_row(codes, K, bits, w + (size_t)o * stride);
        }
        CHECK_EQ_INT(g4_matvec_packed_acc(x, 3, w, bits, OUT, K, bias, acc), 0);
        for (int o = 0; o < OUT; o++)
            CHECK(acc[o] == want[o], "bits %d row %d: %d want %d", bits, o, (int)acc[o],
                  (int)want[o]);
        g4_requant rq[OUT];
        float s_w[OUT] = {0.01f, 0.02f, 0.03f, 0.04f, 0.05f};
        int8_t y[OUT];
        CHECK_EQ_INT(g4_requant_init_rows(rq, OUT, G4_REQUANT_F32, 0.05f, s_w, 0.1f, 0), 0);
        CHECK_EQ_INT(g4_matvec_packed(x, 3, w, bits, OUT, K, bias, rq, y), 0);
        for (int o = 0; o < OUT; o++)
            CHECK(y[o] == g4_requantize(&rq[o], want[o]), "bits %d row %d y", bits, o);
    }
    int32_t acc[1];
    int8_t y[1];
    g4_requant rq;
    CHECK_EQ_INT(g4_requant_init(&rq, G4_REQUANT_F32, 0.1f, 0.1f, 0.1f, 0), 0);
    CHECK_EQ_INT(g4_matvec_packed_acc(x, 0, (const uint8_t *)x, 3, 1, 1, NULL, acc), -1);
    CHECK_EQ_INT(g4_matvec_packed(x, 0, (const uint8_t *)x, 16, 1, 1, NULL, &rq, y), -1);
}

int main(void) {
    test_vectors_json();
    test_quantizer_unit_cases();
    test_quantizer_identity_and_errors();
    test_rounding();
    test_fixed_point_primitives();
    test_requant_f64_and_distinguishing();
    test_requant_init_errors();
    test_unpack_hand_packed();
    test_dot_extremes();
    test_matvec_padded_rows();
    return check_report("int8");
}
