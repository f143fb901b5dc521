/* Both towers of a BF16 checkpoint with clipped linears that cut (issue 35): the fixture
 * tests/fixtures/bf16-towers (gen_bf16_towers.py: tiny-bf16's layout, no quantization_config, every
 * tower linear BF16 with input_min/max and output_min/max at 0.8 x the float range measured on the
 * test inputs; 737 vision and 571 audio values cut; the unclamped towers land 2-6 % away) against
 * transformers' soft tokens for two images and two clips, on every kernel level: the first level
 * within 1e-5 of transformers (relative to the largest value), the others the same bits. The
 * checkpoint has no activation scales, so --act fake and int run the same float path: the same
 * bits as float. */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"
#include "util/err.h"

#define BDIR "tests/fixtures/bf16-towers"
#define BAND 1e-5

typedef struct {
    const char *path, *golden;
    int image; /* else a clip */
} input_t;

static const input_t inputs[] = {{"tests/fixtures/vision/rgb.png", "img0.soft", 1},
                                 {"tests/fixtures/vision/photo.jpg", "img1.soft", 1},
                                 {"tests/fixtures/audio/s16_16k_mono.wav", "clip0.soft", 0},
                                 {"tests/fixtures/audio/s16_44k_stereo.wav", "clip1.soft", 0}};

static int soft_tokens(const g4_model *m, const g4_options *o, const input_t *in, const char *data, size_t len, float **e, int *n) {
    return in->image ? g4_image_soft_tokens(m, o, data, len, 70, e, n) : g4_audio_soft_tokens(m, o, data, len, e, n);
}

static void check_input(const g4_model *m, const g4_safetensors *st, const input_t *in) {
    int D = g4_model_hidden_size(m);
    char *data;
    size_t len;
    CHECK(g4_read_file(in->path, &data, &len) == 0, "%s", g4_last_error());
    const g4_tensor *g = g4_st_find(st, in->golden);
    CHECK(g && g->ndim == 2 && g->shape[1] == D, "golden %s missing or not [n, %d]", in->golden, D);
    if (!g || g->ndim != 2 || g->shape[1] != D) return free(data);
    static const struct {
        g4_act_mode act;
        const char *name;
    } modes[] = {{G4_ACT_FLOAT, "float"}, {G4_ACT_FAKE, "fake"}, {G4_ACT_INT, "int"}};
    float *ref = NULL;
    int levels = 0;
    for (size_t md = 0; md < sizeof modes / sizeof modes[0]; md++) {
        g4_options o;
        g4_options_default(&o);
        o.act = modes[md].act;
        for (int k = 0; k < g4_kernels_count(); k++) {
            const g4_kernels *kl = g4_kernels_at(k);
            if (!g4_kernels_available(kl)) continue;
            setenv("G4_DISPATCH", kl->name, 1);
            float *e = NULL;
            int n = 0;
            int rc = soft_tokens(m, &o, in, data, len, &e, &n);
            CHECK(rc == 0 && n == g->shape[0], "%s %s %s: rc %d, %d soft tokens (golden %lld): %s", in->path, modes[md].name, kl->name, rc, n,
                  (long long)g->shape[0], rc ? g4_last_error() : "");
            if (rc || n != g->shape[0]) {
                free(e);
                continue;
            }
            levels++;
            if (!ref) {
                char what[160];
                snprintf(what, sizeof what, "%s (float, level %s)", in->path, kl->name);
                golden_band(what, e, n, D, g, BAND);
                ref = e;
            } else {
                CHECK(memcmp(e, ref, sizeof *e * (size_t)n * D) == 0, "%s %s: level %s differs from float on the first level", in->path,
                      modes[md].name, kl->name);
                free(e);
            }
        }
    }
    unsetenv("G4_DISPATCH");
    CHECK(levels >= 3, "%s: %d runs", in->path, levels);
    free(ref);
    free(data);
}

int main(void) {
    g4_safetensors st;
    if (golden_open(&st, BDIR "/goldens.safetensors")) return check_report("test_bf16_towers");
    if (check_dispatch_level()) {
        g4_model *m = g4_model_load(BDIR);
        CHECK(m != NULL, "%s: %s", BDIR, g4_last_error());
        if (m) {
            for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) check_input(m, &st, &inputs[i]);
            g4_model_free(m);
        }
    }
    g4_st_close(&st);
    return check_report("test_bf16_towers");
}
