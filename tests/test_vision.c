/* Image input (issue 35): decoding, the processor's resize and patches, and the vision tower,
 * against goldens made by transformers (tests/fixtures/vision/gen_vision.py): PIL's decode of
 * each test image, Gemma4ImageProcessor's (torchvision backend, the default) patches and
 * positions, and the tiny-mobile fixture's soft tokens after embed_vision in float and fake-quant
 * modes, and a variant checkpoint with clamps that bite (clip). Parts: decode, preprocess, bad,
 * tower, clip. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdint.h>

#include "testutil.h"
#include "model/model.h"
#include "util/err.h"
#include "vision/image.h"
#include "vision/tower.h"
#include "model/feed.h"

#define VDIR "tests/fixtures/vision"

static const char *const FILES[] = {"rgb.png", "gray.png", "rgba.png", "palette.png", "photo.jpg", "gray.jpg"};
enum { N_FILES = sizeof FILES / sizeof FILES[0] };

/* Image i's golden `what`; a missing one ends the program (its checks read it). */
static const g4_tensor *golden(const g4_safetensors *st, int i, const char *what) {
    const g4_tensor *t = golden_find(st, "img%d.%s", i, what);
    if (!t) exit(check_report("test_vision"));
    return t;
}

static int read_bytes(const char *name, char **data, size_t *len) {
    char path[256];
    snprintf(path, sizeof path, VDIR "/%s", name);
    return g4_read_file(path, data, len);
}

/* Every test image decodes to PIL's convert("RGB") bytes exactly. */
static void test_decode(const g4_safetensors *st) {
    for (int i = 0; i < N_FILES; i++) {
        char *data;
        size_t len;
        CHECK(read_bytes(FILES[i], &data, &len) == 0, "%s", g4_last_error());
        g4_rgb_image im;
        int rc = g4_image_decode(data, len, &im);
        CHECK(rc == 0, "%s: %s", FILES[i], g4_last_error());
        const g4_tensor *g = golden(st, i, "rgb");
        if (rc == 0) {
            CHECK(g->ndim == 3 && g->shape[0] == im.h && g->shape[1] == im.w && g->shape[2] == 3, "%s: %d x %d", FILES[i], im.w, im.h);
            size_t n = (size_t)im.w * im.h * 3, diff = 0;
            for (size_t k = 0; k < n && k < (size_t)g->numel; k++) diff += im.rgb[k] != g->data[k];
            CHECK(diff == 0, "%s: %zu of %zu bytes differ from PIL's decode", FILES[i], diff, n);
        }
        g4_rgb_image_free(&im);
        free(data);
    }
}

/* The processor's target sizes at patch 16 (every budget, odd shapes, refusals), and each test
 * image's patches and positions at the tiny tower's patch size 4: bit for bit. */
static void test_preprocess(const g4_safetensors *st) {
    const g4_tensor *ts = g4_st_find(st, "target_sizes");
    CHECK(ts && ts->dtype == G4_DT_I32 && ts->ndim == 2 && ts->shape[1] == 5, "target_sizes golden");
    int bad = 0;
    for (int64_t r = 0; ts && r < ts->shape[0]; r++) {
        int32_t v[5];
        memcpy(v, ts->data + r * 20, 20);
        int th = -1, tw = -1;
        if (g4_image_target_size(v[0], v[1], 16, 3, v[2] * 9, &th, &tw) != 0) th = tw = -1;
        if (th != v[3] || tw != v[4]) {
            bad++;
            fprintf(stderr, "%d x %d budget %d: g4 %d x %d, transformers %d x %d\n", v[0], v[1], v[2], th, tw, v[3], v[4]);
        }
    }
    CHECK(bad == 0, "%d target sizes differ from the processor's", bad);
    for (int i = 0; i < N_FILES; i++) {
        const g4_tensor *gp = golden(st, i, "patches_u8"), *gq = golden(st, i, "pos"), *rgb = golden(st, i, "rgb");
        g4_rgb_image im = {.h = (int)rgb->shape[0], .w = (int)rgb->shape[1], .rgb = (uint8_t *)rgb->data};
        const int mst = 70; /* every test image's budget in gen_vision.py */
        g4_image_patches p;
        int rc = g4_image_patchify(&im, 4, 3, mst, &p);
        CHECK(rc == 0, "%s: %s", FILES[i], g4_last_error());
        if (rc) continue;
        CHECK(p.n_real == gp->shape[0] && p.patch_dim == gp->shape[1], "%s: %d patches of %d, golden %lld of %lld", FILES[i], p.n_real,
              p.patch_dim, (long long)gp->shape[0], (long long)gp->shape[1]);
        size_t n = (size_t)p.n_real * p.patch_dim, diff = 0, maxd = 0;
        for (size_t k = 0; k < n && k < (size_t)gp->numel; k++) {
            float want = (float)gp->data[k] * (float)(1.0 / 255.0);
            if (memcmp(&want, &p.pixels[k], 4) != 0) {
                diff++;
                size_t d = (size_t)fabsf(want - p.pixels[k]) * 255 + 1;
                if (d > maxd) maxd = d;
            }
        }
        CHECK(diff == 0, "%s: %zu of %zu patch values differ from the processor's", FILES[i], diff, n);
        int posbad = 0;
        for (int k = 0; k < p.max_patches; k++) {
            int32_t want[2] = {-1, -1};
            if (k < gq->shape[0]) memcpy(want, gq->data + 8 * k, 8);
            posbad += p.pos[2 * k] != want[0] || p.pos[2 * k + 1] != want[1];
            if (k >= p.n_real)
                for (int d = 0; d < p.patch_dim; d++) posbad += p.pixels[(size_t)k * p.patch_dim + d] != 0;
        }
        CHECK(posbad == 0, "%s: %d positions or padding rows differ", FILES[i], posbad);
        g4_image_patches_free(&p);
    }
}

/* Bad media: each refused with a one-line error that says what is wrong, never a crash. */
static void expect_refused(const char *what, const void *data, size_t len, const char *needle) {
    g4_rgb_image im;
    int rc = g4_image_decode(data, len, &im);
    CHECK(rc == -1, "%s: decoded (%d x %d)", what, im.w, im.h);
    const char *e = g4_last_error();
    CHECK(strstr(e, needle) && !strchr(e, '\n'), "%s: error \"%s\" lacks \"%s\"", what, e, needle);
    if (rc == 0) g4_rgb_image_free(&im);
}

static uint32_t crc32_of(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    }
    return ~c;
}

static void put32(uint8_t *p, uint32_t v) {
    p[0] = v >> 24, p[1] = v >> 16, p[2] = v >> 8, p[3] = v;
}

/* A PNG signature and IHDR declaring w x h RGB8 (a valid CRC), then no image data. */
static size_t png_header(uint8_t *b, uint32_t w, uint32_t h) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    memcpy(b, sig, 8);
    put32(b + 8, 13);
    memcpy(b + 12, "IHDR", 4);
    put32(b + 16, w);
    put32(b + 20, h);
    b[24] = 8, b[25] = 2, b[26] = 0, b[27] = 0, b[28] = 0;
    put32(b + 29, crc32_of(b + 12, 17));
    return 33;
}

static void test_bad(void) {
    char *data;
    size_t len;
    CHECK(read_bytes("rgb.png", &data, &len) == 0, "%s", g4_last_error());
    expect_refused("truncated PNG", data, len / 2, "bad PNG");
    expect_refused("PNG cut inside its header", data, 20, "bad PNG");
    free(data);
    CHECK(read_bytes("photo.jpg", &data, &len) == 0, "%s", g4_last_error());
    expect_refused("truncated JPEG", data, len / 2, "bad JPEG");
    free(data);
    uint8_t b[64];
    expect_refused("50000 x 50000 PNG header", b, png_header(b, 50000, 50000), "50000 x 50000");
    expect_refused("1 x 20000 PNG header", b, png_header(b, 1, 20000), "1 x 20000");
    expect_refused("3 x 400 PNG header (within the side and pixel bounds)", b, png_header(b, 3, 400), "aspect ratio over 100:1");
    expect_refused("8000 x 8000 PNG header (64 Mpx)", b, png_header(b, 8000, 8000), "pixels is refused");
    expect_refused("0 x 5 PNG header", b, png_header(b, 0, 5), "bad PNG");
    uint8_t garbage[100];
    for (int i = 0; i < 100; i++) garbage[i] = (uint8_t)(i * 37 + 11);
    expect_refused("garbage bytes", garbage, sizeof garbage, "not a PNG or JPEG");
    expect_refused("empty input", garbage, 0, "no data");
    uint8_t fake_jpeg[16] = {0xFF, 0xD8, 0xFF, 0xE0, 1, 2, 3};
    expect_refused("a JPEG signature and garbage", fake_jpeg, sizeof fake_jpeg, "bad JPEG");
    g4_image_patches p;
    g4_rgb_image one = {.w = 4, .h = 4, .rgb = garbage};
    CHECK(g4_image_patchify(&one, 16, 3, 100, &p) == -1 && strstr(g4_last_error(), "max_soft_tokens 100"), "budget 100: %s",
          g4_last_error());
}

/* Bands (max |difference| / max |golden|), against gen_vision.py's goldens: float and fake
 * against transformers' own modes, int against the fake-quant goldens. Measured on the six
 * images: at most 3.8e-7 in every mode (float rounding of the norms, RoPE, softmax; the int path
 * gives the same output codes as fake quantization at every tower linear here, while float and
 * fake differ by 29%, so the tiny tower's scales are exercised). */
#define BAND_FLOAT 1e-5
#define BAND_FAKE 1e-5
#define BAND_INT 1e-5

static const struct {
    g4_act_mode act;
    const char *name, *golden;
    double band;
} MODES[] = {{G4_ACT_FLOAT, "float", "soft_float", BAND_FLOAT}, {G4_ACT_FAKE, "fake", "soft_fake", BAND_FAKE}, {G4_ACT_INT, "int", "soft_fake", BAND_INT}};

/* One image through g4_image_soft_tokens in every mode and on every kernel level this CPU has:
 * the first level against golden img<gi>.soft_<mode> within the mode's band, the others equal
 * to it bit for bit. */
static void check_image_modes(const g4_model *m, const g4_safetensors *st, int gi, const char *file, int budget) {
    g4_options o;
    g4_options_default(&o);
    int D = g4_model_hidden_size(m);
    char *data;
    size_t len;
    CHECK(read_bytes(file, &data, &len) == 0, "%s", g4_last_error());
    for (size_t md = 0; md < sizeof MODES / sizeof MODES[0]; md++) {
        o.act = MODES[md].act;
        const g4_tensor *g = golden(st, gi, MODES[md].golden);
        float *ref = NULL;
        int n_ref = 0, levels = 0;
        for (int k = 0; k < g4_kernels_count(); k++) {
            const g4_kernels *kl = g4_kernels_at(k);
            if (!g4_kernels_available(kl)) continue;
            setenv("G4_DISPATCH", kl->name, 1);
            float *e = NULL;
            int n = 0;
            int rc = g4_image_soft_tokens(m, &o, data, len, budget, &e, &n);
            CHECK(rc == 0, "%s %s %s: %s", file, MODES[md].name, kl->name, g4_last_error());
            if (rc) continue;
            levels++;
            if (!ref) {
                ref = e, n_ref = n;
                CHECK(g->ndim == 2 && g->shape[0] == n && g->shape[1] == D, "%s %s: %d tokens x %d, golden %lld x %lld", file, MODES[md].name, n, D,
                      (long long)g->shape[0], (long long)g->shape[1]);
                if (g->shape[0] == n && g->shape[1] == D) {
                    char what[160];
                    snprintf(what, sizeof what, "%s %s", file, MODES[md].name);
                    golden_band(what, e, n, D, g, MODES[md].band);
                }
            } else {
                CHECK(n == n_ref && memcmp(e, ref, sizeof *e * (size_t)n * D) == 0, "%s %s: level %s differs from the first level", file,
                      MODES[md].name, kl->name);
                free(e);
            }
        }
        unsetenv("G4_DISPATCH");
        CHECK(levels >= 1, "no kernel level ran");
        free(ref);
    }
    free(data);
}

static void test_tower(const g4_safetensors *st) {
    g4_options o;
    g4_options_default(&o);
    g4_model *m = g4_model_load_options(tiny_dir(), &o);
    CHECK(m != NULL, "%s", g4_last_error());
    if (!m) return;
    /* lazy: loading the model binds no tower; a text session made before the tower's linears are
     * bound (their ids past its tables) keeps working and frees cleanly after (ASan run) */
    CHECK(m->vision == NULL, "the vision tower was bound at load");
    int before = m->n_linears;
    g4_session *early = g4_session_new(m, &o);
    CHECK(early != NULL, "%s", g4_last_error());
    for (int i = 0; i < N_FILES; i++) check_image_modes(m, st, i, FILES[i], 70);
    CHECK(m->vision != NULL && m->n_linears == before + 7 + 1, "tower bound on first use: %d linears, %d before", m->n_linears, before);
    if (early) {
        int32_t ids[3] = {2, 10, 11};
        CHECK(g4_session_feed(early, ids, 3, NULL, 0) == 0, "text session after the tower: %s", g4_last_error());
        g4_session_free(early);
    }
    g4_model_free(m);
    /* a model without vision_config: a one-line error, no crash */
    g4_model *text = g4_model_load_options("models/gemma4-tiny-math", &o);
    CHECK(text != NULL, "%s", g4_last_error());
    if (text) {
        float *e = (float *)1;
        int n = 7;
        char *data;
        size_t len;
        CHECK(read_bytes("rgb.png", &data, &len) == 0, "%s", g4_last_error());
        CHECK(g4_image_soft_tokens(text, &o, data, len, 0, &e, &n) == -1 && e == NULL && n == 0 && strstr(g4_last_error(), "no vision_config"),
              "text-only model: %s", g4_last_error());
        free(data);
        g4_model_free(text);
    }
}

/* The variant checkpoint (gen_vision_clip.py): finite clamps cutting both sides of every tower
 * linear, o_proj unquantized (scales 0), and processor_config.json's budget 140 as the default
 * (budget 0 here). */
static void test_clip(void) {
    g4_safetensors st;
    if (golden_open(&st, VDIR "/clip/goldens.safetensors")) return;
    g4_options o;
    g4_options_default(&o);
    g4_model *m = g4_model_load_options(VDIR "/clip", &o);
    CHECK(m != NULL, "%s", g4_last_error());
    if (m) {
        check_image_modes(m, &st, 0, "rgb.png", 0);
        check_image_modes(m, &st, 1, "photo.jpg", 0);
        g4_model_free(m);
    }
    g4_st_close(&st);
}

int main(void) {
    if (!test_parts_known("decode,preprocess,bad,tower,clip")) return check_report("test_vision");
    g4_safetensors st;
    if (golden_open(&st, VDIR "/goldens.safetensors")) return check_report("test_vision");
    if (test_part("decode")) test_decode(&st);
    if (test_part("preprocess")) test_preprocess(&st);
    if (test_part("bad")) test_bad();
    if (test_part("tower") && check_dispatch_level()) test_tower(&st);
    if (test_part("clip") && check_dispatch_level()) test_clip();
    g4_st_close(&st);
    return check_report("test_vision");
}
