/* g4 synth --towers (issue 35): the tiny preset with a vision tower and an audio conformer.
 * - layout: the tower tensors as the mobile checkpoint stores them (multimodal.md §6): vision
 *   linears I8 [out, in], audio linears 2-bit U8 [out, in / 4], lconv1d.linear_start 4-bit
 *   [out, in / 2], each with F32 weight_scale [out, 1] and non-zero static activation scales; the
 *   unconverted parts BF16. (transformers 5.17 loads the folder with no missing, unexpected or
 *   mismatched key: checked by hand, see README "Synthetic towers".)
 * - end to end: an image (photo.jpg, budget 70) and a clip (1 s at 16 kHz) through
 *   g4_image_soft_tokens / g4_audio_soft_tokens give the processor's token counts (multimodal.md
 *   §2, §4 formulas), text-width rows, all finite and not all equal, the same bits on every kernel
 *   level in int and fake modes; the towers' bytes are a function of the seed.
 * - g4 bench --image WxH --audio SECONDS --json on it, levels alternated: the soft-token counts,
 *   the tower linears' multiply-adds worked out from the shapes (all int8 under --act int, the
 *   float ones apart), one entry per level, times consistent with x real time.
 * - refusals: --towers on a non-mobile preset, and an image on a synth without towers, fail with one
 *   line; bench's --image / --audio values that are neither a file nor a size. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "audio/audio.h"
#include "model/synth.h"
#include "testutil.h"
#include "util/err.h"

#define VFIX "tests/fixtures/vision"
#define AFIX "tests/fixtures/audio"

static char base_tmp[] = "/tmp/g4_synth_towers_XXXXXX";

static const char *tmp_dir(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", base_tmp, name);
    return buf[k];
}

/* ---- layout ---- */

static void expect_tensor(const g4_safetensors *st, const char *name, g4_dtype dt, int ndim, int64_t d0, int64_t d1) {
    const g4_tensor *t = g4_st_find(st, name);
    CHECK(t != NULL, "%s missing", name);
    if (!t) return;
    int ok = t->dtype == dt && t->ndim == ndim && (ndim < 1 || t->shape[0] == d0) && (ndim < 2 || t->shape[1] == d1);
    CHECK(ok, "%s: %s ndim %d [%lld, %lld], expected %s [%lld, %lld]", name, g4_dtype_name(t->dtype), t->ndim, (long long)t->shape[0],
          (long long)(t->ndim > 1 ? t->shape[1] : 0), g4_dtype_name(dt), (long long)d0, (long long)d1);
}

/* A quantized tower linear [out, in] at `bits`, with its F32 row scales and non-zero activation scales. */
static void expect_quantized(const g4_safetensors *st, const char *module, int bits, int in, int out) {
    char n[256];
    snprintf(n, sizeof n, "%s.linear.weight", module);
    expect_tensor(st, n, bits == 8 ? G4_DT_I8 : G4_DT_U8, 2, out, in * bits / 8);
    snprintf(n, sizeof n, "%s.linear.weight_scale", module);
    expect_tensor(st, n, G4_DT_F32, 2, out, 1);
    static const char *const acts[] = {"input_activation_scale", "output_activation_scale"};
    for (int i = 0; i < 2; i++) {
        snprintf(n, sizeof n, "%s.linear.%s", module, acts[i]);
        const g4_tensor *t = g4_st_find(st, n);
        CHECK(t && t->dtype == G4_DT_F32 && g4_tensor_float(t, 0) >= 0.02f && g4_tensor_float(t, 0) < 0.05f, "%s: missing or outside [0.02, 0.05)", n);
    }
}

static void test_layout(const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    g4_safetensors st;
    if (golden_open(&st, path)) return;
    /* the tiny towers: vision 32 wide, 2 heads x 16, MLP 64, patch 4; audio 32 wide, channels [128, 4], output 64 */
    expect_quantized(&st, "model.vision_tower.encoder.layers.1.self_attn.q_proj", 8, 32, 32);
    expect_quantized(&st, "model.vision_tower.encoder.layers.0.mlp.down_proj", 8, 64, 32);
    expect_quantized(&st, "model.audio_tower.layers.1.feed_forward2.ffw_layer_1", 2, 32, 128);
    expect_quantized(&st, "model.audio_tower.layers.0.self_attn.post", 2, 32, 32);
    expect_quantized(&st, "model.audio_tower.layers.0.lconv1d.linear_start", 4, 32, 64);
    expect_tensor(&st, "model.vision_tower.patch_embedder.input_proj.weight", G4_DT_BF16, 2, 32, 48);
    expect_tensor(&st, "model.vision_tower.patch_embedder.position_embedding_table", G4_DT_BF16, 3, 2, 64);
    expect_tensor(&st, "model.embed_vision.embedding_projection.weight", G4_DT_BF16, 2, 64, 32);
    expect_tensor(&st, "model.audio_tower.subsample_conv_projection.layer1.conv.weight", G4_DT_BF16, 4, 4, 128);
    expect_tensor(&st, "model.audio_tower.subsample_conv_projection.input_proj_linear.weight", G4_DT_BF16, 2, 32, 128);
    expect_tensor(&st, "model.audio_tower.layers.1.self_attn.relative_k_proj.weight", G4_DT_BF16, 2, 32, 32);
    expect_tensor(&st, "model.audio_tower.layers.1.lconv1d.depthwise_conv1d.weight", G4_DT_BF16, 3, 32, 1);
    expect_tensor(&st, "model.audio_tower.output_proj.bias", G4_DT_BF16, 1, 64, 0);
    expect_tensor(&st, "model.embed_audio.embedding_projection.weight", G4_DT_BF16, 2, 64, 64);
    CHECK(g4_st_find(&st, "model.vision_tower.encoder.layers.2.self_attn.q_proj.linear.weight") == NULL, "a third vision layer");
    CHECK(g4_st_find(&st, "model.audio_tower.layers.0.self_attn.q_proj.input_min") == NULL, "clamp tensors in the mobile layout");
    g4_st_close(&st);
    printf("ok layout: tower linears 8 / 2 / 4-bit with static activation scales, float parts BF16\n");
}

/* ---- end to end ---- */

typedef int (*soft_fn)(const g4_model *m, const g4_options *o, const char *data, size_t len, float **e, int *n);

static int image_70(const g4_model *m, const g4_options *o, const char *data, size_t len, float **e, int *n) {
    return g4_image_soft_tokens(m, o, data, len, 70, e, n);
}

static int audio_any(const g4_model *m, const g4_options *o, const char *data, size_t len, float **e, int *n) {
    return g4_audio_soft_tokens(m, o, data, len, e, n);
}

/* One input through `fn` on every kernel level this CPU has, in int and fake modes: n_expect rows
 * of the text width, finite, not all one value, the same bits on every level. */
static void run_levels(const g4_model *m, const char *what, soft_fn fn, const char *data, size_t len, int n_expect) {
    int D = g4_model_hidden_size(m);
    static const struct {
        g4_act_mode act;
        const char *name;
    } modes[] = {{G4_ACT_INT, "int"}, {G4_ACT_FAKE, "fake"}};
    for (size_t md = 0; md < sizeof modes / sizeof modes[0]; md++) {
        g4_options o;
        g4_options_default(&o);
        o.act = modes[md].act;
        float *ref = NULL;
        int levels = 0;
        for (int k = 0; k < g4_kernels_count(); k++) {
            const g4_kernels *kl = g4_kernels_at(k);
            if (!g4_kernels_available(kl)) continue;
            setenv("G4_DISPATCH", kl->name, 1);
            float *e = NULL;
            int n = 0;
            int rc = fn(m, &o, data, len, &e, &n);
            CHECK(rc == 0 && n == n_expect, "%s %s on %s: rc %d, %d soft tokens (%d expected): %s", what, modes[md].name, kl->name, rc, n,
                  n_expect, rc ? g4_last_error() : "");
            if (rc || n != n_expect) {
                free(e);
                continue;
            }
            levels++;
            if (!ref) {
                int finite = 1, varied = 0;
                for (size_t i = 0; i < (size_t)n * D; i++) finite &= isfinite(e[i]) != 0, varied |= e[i] != e[0];
                CHECK(finite && varied, "%s %s: soft tokens finite %d, varied %d", what, modes[md].name, finite, varied);
                ref = e;
                printf("ok %s %s: %d soft tokens x %d, finite (level %s)\n", what, modes[md].name, n, D, kl->name);
            } else {
                CHECK(memcmp(e, ref, sizeof *e * (size_t)n * D) == 0, "%s %s: level %s differs from the first level", what, modes[md].name, kl->name);
                free(e);
            }
        }
        unsetenv("G4_DISPATCH");
        CHECK(levels >= 1, "%s: no kernel level ran", what);
        if (levels >= 2) printf("ok %s %s: the same bits on %d kernel levels\n", what, modes[md].name, levels);
        free(ref);
    }
}

/* Soft tokens of an image at budget `tokens` (multimodal.md §2): sides scaled to multiples of
 * patch x pool within tokens x pool^2 patches, then one token per pool x pool block. */
static int image_tokens(int h, int w, int patch, int pool, int tokens) {
    double factor = sqrt((double)tokens * pool * pool * patch * patch / ((double)h * w));
    int side = patch * pool, th = (int)floor(h * factor / side) * side, tw = (int)floor(w * factor / side) * side;
    return (th / patch / pool) * (tw / patch / pool);
}

/* Soft tokens of n samples at 16 kHz (multimodal.md §4). */
static int audio_tokens(size_t n) {
    int t = (int)((n + 160 - 321) / 160 + 1);
    for (int i = 0; i < 2; i++) t = (t + 2 - 3) / 2 + 1;
    return t;
}

static void test_end_to_end(const char *dir) {
    g4_model *m = g4_model_load(dir);
    CHECK(m != NULL, "%s: %s", dir, g4_last_error());
    if (!m) return;
    char *img, *wav;
    size_t ilen, wlen;
    CHECK(g4_read_file(VFIX "/photo.jpg", &img, &ilen) == 0 && g4_read_file(AFIX "/s16_16k_mono.wav", &wav, &wlen) == 0, "%s",
          g4_last_error());
    run_levels(m, "image photo.jpg (160 x 120, budget 70)", image_70, img, ilen, image_tokens(120, 160, 4, 3, 70));
    float *pcm = NULL;
    size_t n = 0;
    CHECK(g4_audio_pcm16k(wav, wlen, "s16_16k_mono.wav", &pcm, &n) == 0, "%s", g4_last_error());
    free(pcm);
    run_levels(m, "clip s16_16k_mono.wav", audio_any, wav, wlen, audio_tokens(n));
    free(img);
    free(wav);
    g4_model_free(m);
}

/* ---- g4 bench --image / --audio ---- */

/* Runs `$G4_BIN args` and returns its stdout (malloc'd) and exit status; stderr into *err_out. */
static char *run_g4(const char *args, int *rc, char **err_out) {
    const char *bin = check_bin();
    if (!bin) return NULL;
    char cmd[2048], errp[600];
    snprintf(errp, sizeof errp, "%s/stderr.txt", base_tmp);
    snprintf(cmd, sizeof cmd, "%s %s 2>%s", bin, args, errp);
    FILE *f = popen(cmd, "r");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    size_t got;
    while (out && (got = fread(out + n, 1, cap - n - 1, f)) > 0) n += got;
    if (out) out[n] = 0;
    int st = pclose(f);
    *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (err_out && g4_read_file(errp, err_out, NULL)) *err_out = NULL;
    return out;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static void test_bench(const char *dir) {
    /* the first two levels this CPU has, alternated */
    const char *lv[2] = {NULL, NULL};
    int nl = 0;
    for (int k = 0; k < g4_kernels_count() && nl < 2; k++)
        if (g4_kernels_available(g4_kernels_at(k))) lv[nl++] = g4_kernels_at(k)->name;
    char args[1024];
    snprintf(args, sizeof args, "bench -m %s --image 160x120 --audio 2 -r 2 -t 2 --act int --json --kernels %s%s%s", dir, lv[0],
             nl > 1 ? "," : "", nl > 1 ? lv[1] : "");
    int rc = -1;
    char *out = run_g4(args, &rc, NULL);
    cJSON *j = out ? cJSON_Parse(out) : NULL;
    CHECK(rc == 0 && j, "bench --image --audio --json: exit %d, output %s", rc, out ? out : "");
    if (j) {
        const cJSON *img = cJSON_GetObjectItemCaseSensitive(j, "image"), *aud = cJSON_GetObjectItemCaseSensitive(j, "audio");
        const cJSON *by = cJSON_GetObjectItemCaseSensitive(j, "by_kernels");
        double patches = num(img, "patches"), frames = num(aud, "mel_frames");
        CHECK(num(img, "soft_tokens") == image_tokens(120, 160, 4, 3, 280), "bench image: %g soft tokens", num(img, "soft_tokens"));
        CHECK(num(aud, "soft_tokens") == audio_tokens(32000) && num(aud, "seconds") == 2.0, "bench audio: %g soft tokens", num(aud, "soft_tokens"));
        CHECK(cJSON_GetArraySize(by) == nl && num(j, "peak_rss_mb") > 1, "bench: %d level entries, peak RSS %g MB", cJSON_GetArraySize(by),
              num(j, "peak_rss_mb"));
        /* the audio tower runs on every subsampled frame: n = sub(sub(frames)) */
        int n = ((int)frames + 2 - 3) / 2 + 1;
        n = (n + 2 - 3) / 2 + 1;
        for (int l = 0; l < cJSON_GetArraySize(by); l++) {
            const cJSON *e = cJSON_GetArrayItem(by, l), *v = cJSON_GetObjectItemCaseSensitive(e, "vision"),
                        *a = cJSON_GetObjectItemCaseSensitive(e, "audio"), *k = cJSON_GetObjectItemCaseSensitive(e, "kernels");
            CHECK(cJSON_IsString(k) && strcmp(k->valuestring, lv[l]) == 0, "bench: entry %d is not level %s", l, lv[l]);
            /* vision: 2 layers x (4 x 32 x 32 + 3 x 32 x 64) per patch in int8; the float patch embedder 48 x 32 */
            CHECK(num(v, "int_macs") == patches * 2 * (4 * 32 * 32 + 3 * 32 * 64) && num(v, "float_macs") == patches * 48 * 32,
                  "bench vision MACs: int %.0f, float %.0f", num(v, "int_macs"), num(v, "float_macs"));
            /* audio: 2 layers x (two FFNs 2 x 2 x 32 x 128, q k v post 4 x 32 x 32, lconv 32 x 64 + 32 x 32) per frame in int8;
             * float: input_proj 128 x 32 and output_proj 32 x 64 per frame, embed 64 x 64 per token, relative_k_proj 32 x 32 on
             * 5 positions per layer */
            double nt = num(aud, "soft_tokens");
            CHECK(num(a, "int_macs") == n * 2.0 * (2 * 2 * 32 * 128 + 4 * 32 * 32 + 32 * 64 + 32 * 32) &&
                      num(a, "float_macs") == n * (128.0 * 32 + 32 * 64) + nt * 64 * 64 + 2 * 5 * 32 * 32,
                  "bench audio MACs: int %.0f, float %.0f (%d frames)", num(a, "int_macs"), num(a, "float_macs"), n);
            double enc = num(a, "encode_s");
            CHECK(enc > 0 && fabs(num(a, "x_realtime") - 2.0 / enc) <= 1e-3 * (2.0 / enc) + 1e-3 && num(v, "encode_s") >= num(v, "linear_s") &&
                      num(v, "linear_gmacs") > 0 && num(e, "text_gate_first_gmacs") > 0,
                  "bench: times inconsistent (audio encode %g s, x real time %g)", enc, num(a, "x_realtime"));
        }
        printf("ok bench --image 160x120 --audio 2 --json on %d level(s): token counts and tower MACs as worked out\n", nl);
    }
    cJSON_Delete(j);
    free(out);
    static const struct {
        const char *flag, *needle;
    } bad[] = {{"--image 10y10", "--image 10y10: no such file, and not WxH"}, {"--audio 31", "--audio 31: no such file, and not a length"},
               {"--audio 0", "--audio 0: no such file"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "bench -m %s %s -r 1", dir, bad[i].flag);
        char *err = NULL;
        out = run_g4(args, &rc, &err);
        CHECK(rc == 1 && err && strstr(err, bad[i].needle) && strchr(err, '\n') == err + strlen(err) - 1, "bench %s: exit %d, stderr %s",
              bad[i].flag, rc, err ? err : "");
        free(out);
        free(err);
    }
}

/* ---- refusals and determinism ---- */

static void test_refusals(void) {
    CHECK(g4_synth_towers("e2b-q4_0", tmp_dir("q4"), 0, NULL, 1, NULL) == -1 && strstr(g4_last_error(), "mobile layouts"),
          "--towers on e2b-q4_0: %s", g4_last_error());
    CHECK(g4_synth_towers("e2b-drafter", tmp_dir("dr"), 0, NULL, 1, NULL) == -1 && strstr(g4_last_error(), "e2b-drafter"),
          "--towers on e2b-drafter: %s", g4_last_error());
    /* a synth without towers has the placeholder vision_config: an image is refused in one line */
    const char *plain = tmp_dir("plain");
    CHECK(g4_synth("tiny", plain, 0, NULL) == 0, "%s", g4_last_error());
    g4_model *m = g4_model_load(plain);
    CHECK(m != NULL, "%s", g4_last_error());
    if (m) {
        char *img;
        size_t len;
        if (g4_read_file(VFIX "/photo.jpg", &img, &len) == 0) {
            g4_options o;
            g4_options_default(&o);
            float *e = NULL;
            int nt = 0;
            CHECK(g4_image_soft_tokens(m, &o, img, len, 70, &e, &nt) == -1 && !e && strstr(g4_last_error(), "vision_config") &&
                      !strchr(g4_last_error(), '\n'),
                  "image on a synth without towers: %s", g4_last_error());
            free(img);
        }
        g4_model_free(m);
    }
}

static int same_bytes(const char *a, const char *b) {
    g4_mapped_file x, y;
    if (g4_map_file(a, &x) != 0) return 0;
    if (g4_map_file(b, &y) != 0) {
        g4_unmap_file(&x);
        return 0;
    }
    int same = x.size == y.size && memcmp(x.data, y.data, x.size) == 0;
    g4_unmap_file(&x);
    g4_unmap_file(&y);
    return same;
}

int main(void) {
    if (!mkdtemp(base_tmp)) return 2;
    const char *dir = tmp_dir("tiny"), *again = tmp_dir("again"), *other = tmp_dir("seed1");
    char d1[512], d2[512], d3[512];
    snprintf(d1, sizeof d1, "%s", dir);
    snprintf(d2, sizeof d2, "%s", again);
    snprintf(d3, sizeof d3, "%s", other);
    g4_synth_stats st;
    CHECK(g4_synth_towers("tiny", d1, 0, NULL, 1, &st) == 0, "%s", g4_last_error());
    CHECK(g4_synth_towers("tiny", d2, 0, NULL, 1, NULL) == 0 && g4_synth_towers("tiny", d3, 1, NULL, 1, NULL) == 0, "%s", g4_last_error());
    char p1[600], p2[600], p3[600];
    snprintf(p1, sizeof p1, "%s/model.safetensors", d1);
    snprintf(p2, sizeof p2, "%s/model.safetensors", d2);
    snprintf(p3, sizeof p3, "%s/model.safetensors", d3);
    CHECK(same_bytes(p1, p2) && !same_bytes(p1, p3), "the towers' bytes are not a function of the seed");
    if (check_dispatch_level()) {
        test_layout(d1);
        test_end_to_end(d1);
        test_bench(d1);
    }
    test_refusals();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", base_tmp);
    return check_report("test_synth_towers");
}
