/* The audio front end (src/audio/) against transformers 5.17: WAV decoding + down-mix + soxr
 * resampling against load_audio (librosa.load at 16 kHz), the log-mel features against
 * Gemma4AudioFeatureExtractor, on the clips of tests/fixtures/audio (gen_audio_goldens.py); the
 * sample scaling against worked values; every malformed header refused with a one-line error; the
 * whole tower (g4_audio_soft_tokens) against transformers' soft tokens on tests/fixtures/audio/tower
 * (gen_audio_tower.py) in every activation mode on every kernel level. */
#define _DEFAULT_SOURCE /* setenv, mkdtemp, symlink, realpath */
#include <stdint.h>
#include <unistd.h>

#include "audio/audio.h"
#include "check.h"
#include "model/model.h"
#include "model/session.h"
#include "testutil.h"
#include "format/safetensors.h"
#include "g4.h"
#include "util/file.h"
#include "model/feed.h"

#define FIX "tests/fixtures/audio"

/* Bands, measured (max |g4 - transformers|) and set just above. pcm16k: Debian's libsoxr against
 * python-soxr's bundled build of the same library: measured 0 (bit-equal) on every clip. mel, in
 * log units (natural log of mel energies): kissfft's float FFT against numpy's double one; the FFT's
 * rounding is absolute (~1e-7 of the frame's energy), so it shows most in bins near the 1e-3 floor:
 * max 2.6e-6..2.5e-5, mean <= 3.2e-7 on five clips; the 8 kHz clip, resampled, has almost nothing
 * above 4 kHz, and there max 1.9e-3, mean 4.0e-5. */
#define PCM_BAND 0.0f
#define MEL_BAND 2.5e-3f
#define MEL_MEAN_BAND 5e-5

static const char *clips[] = {"s16_16k_mono", "s16_44k_stereo", "u8_8k_mono", "s24_48k_mono", "s32_16k_stereo", "f32_22k_3ch"};

static float max_diff_f32(const float *a, const g4_tensor *t, size_t n, double *mean) {
    float m = 0;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - g4_load_f32(t->data + 4 * i));
        if (!(d <= m)) m = d;   /* a NaN counts as the worst */
        sum += d;
    }
    if (mean) *mean = n ? sum / (double)n : 0;
    return m;
}

/* g4's mel of pcm against the clip's golden mel and mask */
static void check_mel(const char *clip, const char *from, const float *pcm, size_t n, const g4_tensor *gmel,
                      const g4_tensor *gmask) {
    float *mel;
    uint8_t *mask;
    int T;
    int rc = g4_audio_log_mel(pcm, n, &mel, &mask, &T);
    CHECK(rc == 0, "%s: log-mel failed: %s", clip, g4_last_error());
    if (rc != 0) return;
    CHECK(T == gmel->shape[0] && gmel->shape[1] == G4_AUDIO_MEL_BINS && T == gmask->shape[0], "%s: %d frames, golden %lld",
          clip, T, (long long)gmel->shape[0]);
    if (T == gmel->shape[0]) {
        int mask_eq = memcmp(mask, gmask->data, (size_t)T) == 0;
        CHECK(mask_eq, "%s: frame mask differs", clip);
        double mean;
        float d = max_diff_f32(mel, gmel, (size_t)T * G4_AUDIO_MEL_BINS, &mean);
        CHECK(d <= MEL_BAND && mean <= MEL_MEAN_BAND, "%s: mel (from %s) max |diff| %g (band %g), mean %g (band %g)", clip,
              from, d, MEL_BAND, mean, MEL_MEAN_BAND);
        printf("ok %s: mel from %s: %d frames, max |diff| %.3g (band %g), mean %.3g (band %g)\n", clip, from, T, d,
               MEL_BAND, mean, MEL_MEAN_BAND);
    }
    free(mel);
    free(mask);
}

static void test_clips(void) {
    g4_safetensors st;
    int rc = golden_open(&st, FIX "/golden.safetensors");
    if (rc != 0) return;
    for (size_t c = 0; c < sizeof clips / sizeof clips[0]; c++) {
        const char *clip = clips[c];
        char path[256];
        snprintf(path, sizeof path, FIX "/%s.wav", clip);
        char *bytes;
        size_t len;
        if (g4_read_file(path, &bytes, &len) != 0) {
            CHECK(0, "%s", g4_last_error());
            continue;
        }
        const g4_tensor *gpcm = golden_find(&st, "%s.pcm16k", clip), *gmel = golden_find(&st, "%s.mel", clip),
                       *gmask = golden_find(&st, "%s.mask", clip);
        float *pcm;
        size_t n;
        rc = g4_audio_pcm16k(bytes, len, path, &pcm, &n);
        CHECK(rc == 0, "%s: %s", clip, g4_last_error());
        if (rc == 0 && gpcm && gmel && gmask) {
            CHECK(n == (size_t)gpcm->shape[0], "%s: %zu samples at 16 kHz, transformers %lld", clip, n, (long long)gpcm->shape[0]);
            if (n == (size_t)gpcm->shape[0]) {
                float d = max_diff_f32(pcm, gpcm, n, NULL);
                CHECK(d <= PCM_BAND, "%s: pcm16k max |diff| %g > %g", clip, d, PCM_BAND);
                printf("ok %s: pcm16k %zu samples, max |diff| %.3g (band %g)\n", clip, n, d, PCM_BAND);
            }
            /* the features alone (from transformers' own pcm), then the whole chain */
            float *ref = golden_copy_f32(gpcm);
            check_mel(clip, "transformers' pcm", ref, (size_t)gpcm->shape[0], gmel, gmask);
            check_mel(clip, "the WAV", pcm, n, gmel, gmask);
            free(ref);
        }
        free(pcm);
        free(bytes);
    }
    g4_st_close(&st);
}

/* The two subsampling conv layers against transformers' modules (subsample.safetensors: seeded
 * float weights, the s16_16k_mono features). Band: float32 against torch's float32 convolution and
 * LayerNorm, another summation order: measured max 1.2e-6 (outputs O(1)), band 1e-5. */
#define SUB_BAND 1e-5f
static void test_subsample(void) {
    g4_safetensors st, gs;
    if (golden_open(&st, FIX "/subsample.safetensors")) return;
    if (golden_open(&gs, FIX "/golden.safetensors")) {
        g4_st_close(&st);
        return;
    }
    const g4_tensor *mel_t = golden_find(&gs, "s16_16k_mono.mel"), *mask_t = golden_find(&gs, "s16_16k_mono.mask");
    const g4_tensor *w0 = g4_st_find(&st, "w0"), *n0 = g4_st_find(&st, "n0"), *w1 = g4_st_find(&st, "w1"),
                    *n1 = g4_st_find(&st, "n1"), *o0 = g4_st_find(&st, "out0"), *o1 = g4_st_find(&st, "out1"),
                    *m1 = g4_st_find(&st, "mask1"), *m2 = g4_st_find(&st, "mask2");
    CHECK(mel_t && mask_t && w0 && n0 && w1 && n1 && o0 && o1 && m1 && m2, "subsample.safetensors: a tensor is missing");
    if (mel_t && mask_t && w0 && n0 && w1 && n1 && o0 && o1 && m1 && m2) {
        int T = (int)mel_t->shape[0], F = G4_AUDIO_MEL_BINS;
        int T1 = g4_audio_subsampled_len(T), F1 = g4_audio_subsampled_len(F);
        int T2 = g4_audio_subsampled_len(T1), F2 = g4_audio_subsampled_len(F1);
        CHECK(T1 == o0->shape[0] && F1 == o0->shape[1] && T2 == o1->shape[0] && F2 == o1->shape[1],
              "subsampled sizes %dx%d, %dx%d", T1, F1, T2, F2);
        if (T1 == o0->shape[0] && F1 == o0->shape[1] && T2 == o1->shape[0] && F2 == o1->shape[1]) {
            float *mel = golden_copy_f32(mel_t), *fw0 = golden_copy_f32(w0), *fn0 = golden_copy_f32(n0), *fw1 = golden_copy_f32(w1), *fn1 = golden_copy_f32(n1);
            float *h0 = malloc((size_t)T1 * F1 * 8 * sizeof *h0), *h1 = malloc((size_t)T2 * F2 * 4 * sizeof *h1);
            uint8_t *mask1 = malloc((size_t)T1), *mask2 = malloc((size_t)T2);
            g4_audio_subsample_layer(mel, mask_t->data, T, F, 1, fw0, fn0, 8, 1e-6f, h0, mask1);
            g4_audio_subsample_layer(h0, mask1, T1, F1, 8, fw1, fn1, 4, 1e-6f, h1, mask2);
            CHECK(memcmp(mask1, m1->data, (size_t)T1) == 0 && memcmp(mask2, m2->data, (size_t)T2) == 0, "subsampled masks differ");
            float d0 = max_diff_f32(h0, o0, (size_t)T1 * F1 * 8, NULL), d1 = max_diff_f32(h1, o1, (size_t)T2 * F2 * 4, NULL);
            CHECK(d0 <= SUB_BAND && d1 <= SUB_BAND, "subsample layers: max |diff| %g, %g > %g", d0, d1, SUB_BAND);
            printf("ok subsample layers: %dx%d -> %dx%dx8 -> %dx%dx4, max |diff| %.3g, %.3g (band %g)\n", T, F, T1, F1, T2, F2,
                   d0, d1, SUB_BAND);
            free(mel), free(fw0), free(fn0), free(fw1), free(fn1), free(h0), free(h1), free(mask1), free(mask2);
        }
    }
    g4_st_close(&gs);
    g4_st_close(&st);
}

/* The attention core against transformers' Gemma4AudioAttention in a float tower
 * (attention.safetensors: its projections' outputs in, the input of its `post` linear out; 19
 * positions, 6 of them padding, chunk 4, context_left 5; made under sdpa, as from_pretrained runs
 * it). Float32 against torch's float32, another summation order: measured max 1.1e-6 on outputs
 * O(1); band 1e-5. The sinusoids: measured max 6e-8 against torch's; band 1e-6. */
#define ATT_BAND 1e-5f
static void test_attention(void) {
    g4_safetensors st;
    if (golden_open(&st, FIX "/attention.safetensors")) return;
    const char *names[] = {"q", "k", "v", "relk", "pos", "ctx", "per_dim_scale", "valid"};
    const g4_tensor *t[8];
    int all = 1;
    for (int i = 0; i < 8; i++) all &= (t[i] = g4_st_find(&st, names[i])) != NULL;
    CHECK(all, "attention.safetensors: a tensor is missing");
    if (all) {
        int T = (int)t[0]->shape[0], HD = (int)t[0]->shape[1], L = (int)t[3]->shape[0], H = 2, D = HD / H;
        float *q = golden_copy_f32(t[0]), *k = golden_copy_f32(t[1]), *v = golden_copy_f32(t[2]), *relk = golden_copy_f32(t[3]), *pds = golden_copy_f32(t[6]);
        float *pos = malloc((size_t)L * HD * sizeof *pos), *ctx = malloc((size_t)T * HD * sizeof *ctx);
        g4_audio_rel_pos_sinusoids(HD, L, pos);
        float dp = max_diff_f32(pos, t[4], (size_t)L * HD, NULL);
        CHECK(dp <= 1e-6f, "relative-position sinusoids: max |diff| %g", dp);
        CHECK(g4_audio_local_attention(q, k, v, T, H, D, relk, L, pds, t[7]->data, 4, 5, 0, 50.0f, ctx) == 0, "attention core: %s", g4_last_error());
        float d = max_diff_f32(ctx, t[5], (size_t)T * HD, NULL);
        CHECK(d <= ATT_BAND, "attention core: max |diff| %g > %g", d, ATT_BAND);
        printf("ok attention core: %d positions, sinusoids max |diff| %.3g, context max |diff| %.3g (band %g)\n", T, dp, d,
               ATT_BAND);
        free(q), free(k), free(v), free(relk), free(pds), free(pos), free(ctx);
    }
    /* the light conv's core from the same tower: GLU + causal depthwise conv, width 5. Measured
     * max 4.8e-7; band 1e-5 */
    const g4_tensor *li = g4_st_find(&st, "lconv_in"), *lw = g4_st_find(&st, "lconv_w"), *lo = g4_st_find(&st, "lconv_out");
    CHECK(li && lw && lo, "attention.safetensors: the lconv tensors are missing");
    if (li && lw && lo) {
        int T = (int)li->shape[0], C = (int)lw->shape[0], K = (int)lw->shape[1];
        float *x = golden_copy_f32(li), *w = golden_copy_f32(lw), *y = malloc((size_t)T * C * sizeof *y);
        CHECK(g4_audio_glu_depthwise_conv(x, T, C, w, K, y) == 0, "light conv core: %s", g4_last_error());
        float d = max_diff_f32(y, lo, (size_t)T * C, NULL);
        CHECK(d <= ATT_BAND && K == 5, "light conv core: max |diff| %g > %g (kernel %d)", d, ATT_BAND, K);
        printf("ok light conv core: %d positions x %d channels, kernel %d, max |diff| %.3g (band %g)\n", T, C, K, d, ATT_BAND);
        free(x), free(w), free(y);
    }
    g4_st_close(&st);
}

/* ---- hand-built WAVs ---- */

typedef struct {
    unsigned char *b;
    size_t len, cap;
} buf;

static void put(buf *w, const void *p, size_t n) {
    if (w->len + n > w->cap) {
        w->cap = (w->len + n) * 2;
        w->b = realloc(w->b, w->cap);
    }
    memcpy(w->b + w->len, p, n);
    w->len += n;
}
static void put16(buf *w, unsigned v) {
    unsigned char b[2] = {v & 255, (v >> 8) & 255};
    put(w, b, 2);
}
static void put32(buf *w, uint32_t v) {
    unsigned char b[4] = {v & 255, (v >> 8) & 255, (v >> 16) & 255, v >> 24};
    put(w, b, 4);
}

/* A RIFF/WAVE with a plain fmt chunk (tag, channels, rate, bits) and `data` as the data chunk. */
static buf make_wav(int tag, int channels, uint32_t rate, int bits, const void *data, uint32_t data_len) {
    buf w = {0};
    put(&w, "RIFF", 4);
    put32(&w, 4 + 8 + 16 + 8 + data_len + (data_len & 1));
    put(&w, "WAVEfmt ", 8);
    put32(&w, 16);
    put16(&w, (unsigned)tag);
    put16(&w, (unsigned)channels);
    put32(&w, rate);
    put32(&w, rate * (uint32_t)(channels * bits / 8));
    put16(&w, (unsigned)(channels * bits / 8));
    put16(&w, (unsigned)bits);
    put(&w, "data", 4);
    put32(&w, data_len);
    if (data_len) put(&w, data, data_len);
    if (data_len & 1) put(&w, "", 1);
    return w;
}

static void set32(buf *w, size_t at, uint32_t v) {
    for (int i = 0; i < 4; i++) w->b[at + i] = (unsigned char)(v >> (8 * i));
}

/* decodes and checks the samples against worked values, exactly */
static void check_samples(const char *what, buf w, const float *want, size_t n, int channels) {
    g4_wav out;
    int rc = g4_wav_decode(w.b, w.len, what, &out);
    CHECK(rc == 0, "%s: %s", what, g4_last_error());
    if (rc == 0) {
        CHECK(out.frames * (size_t)out.channels == n && out.channels == channels, "%s: %zu frames x %d", what, out.frames, out.channels);
        int eq = out.frames * (size_t)out.channels == n && memcmp(out.samples, want, n * sizeof *want) == 0;
        CHECK(eq, "%s: samples differ from the worked values", what);
        g4_wav_free(&out);
    }
    free(w.b);
}

static void test_scaling(void) {
    /* libsndfile's float read: u8 (x-128)/128, s16 x/32768, s24 x/2^23, s32 x/2^31 */
    unsigned char u8[3] = {0, 128, 255};
    float u8_want[3] = {-1.0f, 0.0f, 127.0f / 128.0f};
    check_samples("u8", make_wav(1, 1, 8000, 8, u8, 3), u8_want, 3, 1);
    unsigned char s16[6] = {0x00, 0x80, 0xff, 0x7f, 0x01, 0x00};
    float s16_want[3] = {-1.0f, 32767.0f / 32768.0f, 1.0f / 32768.0f};
    check_samples("s16", make_wav(1, 1, 16000, 16, s16, 6), s16_want, 3, 1);
    unsigned char s24[6] = {0x00, 0x00, 0x80, 0xff, 0xff, 0xff};
    float s24_want[2] = {-1.0f, -1.0f / 8388608.0f};
    check_samples("s24", make_wav(1, 2, 16000, 24, s24, 6), s24_want, 2, 2);
    unsigned char s32[8] = {0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x40};
    float s32_want[2] = {-1.0f, 0.5f};
    check_samples("s32", make_wav(1, 1, 16000, 32, s32, 8), s32_want, 2, 1);
    double f64[2] = {0.25, -0.125};
    float f64_want[2] = {0.25f, -0.125f};
    check_samples("f64", make_wav(3, 1, 16000, 64, f64, 16), f64_want, 2, 1);

    /* WAVE_FORMAT_EXTENSIBLE with the PCM sub-format GUID: the s16 samples again */
    buf w = {0};
    put(&w, "RIFF", 4);
    put32(&w, 4 + 8 + 40 + 8 + 6);
    put(&w, "WAVEfmt ", 8);
    put32(&w, 40);
    put16(&w, 0xFFFE), put16(&w, 1), put32(&w, 16000), put32(&w, 32000), put16(&w, 2), put16(&w, 16);
    put16(&w, 22), put16(&w, 16), put32(&w, 4);
    static const unsigned char guid[16] = {1, 0, 0, 0, 0, 0, 0x10, 0, 0x80, 0, 0, 0xAA, 0, 0x38, 0x9B, 0x71};
    put(&w, guid, 16);
    put(&w, "data", 4);
    put32(&w, 6);
    put(&w, s16, 6);
    check_samples("extensible", w, s16_want, 3, 1);

    /* the down-mix is the channel mean (librosa.to_mono) */
    g4_wav st = {.samples = (float[]){0.5f, 0.25f, -1.0f, 1.0f}, .frames = 2, .channels = 2, .rate = 16000};
    float *m = g4_wav_downmix(&st);
    CHECK(m && m[0] == 0.375f && m[1] == 0.0f, "down-mix %g %g", m ? m[0] : -9, m ? m[1] : -9);
    free(m);
}

/* decoding (or the whole front end) refuses `w` with an error containing `want` */
static void check_refused(const char *what, const void *b, size_t len, const char *want) {
    float *pcm = NULL;
    size_t n = 0;
    int rc = g4_audio_pcm16k(b, len, "clip.wav", &pcm, &n);
    const char *e = g4_last_error();
    CHECK(rc == -1 && pcm == NULL, "%s: accepted", what);
    CHECK(strstr(e, want) && strstr(e, "clip.wav") && !strchr(e, '\n'), "%s: error '%s' lacks '%s'", what, e, want);
    printf("ok refused %s: %s\n", what, e);
    free(pcm);
}

static void test_bad_media(void) {
    unsigned char s16[4] = {1, 2, 3, 4};
    check_refused("a 0-byte file", "", 0, "0 bytes");
    check_refused("garbage", "this is not a wav file at all", 29, "not a WAV file");
    buf w = make_wav(1, 1, 16000, 16, s16, 4);
    set32(&w, 4, 1000);   /* RIFF size beyond the file */
    check_refused("a RIFF size past the end", w.b, w.len, "RIFF size says 1008 bytes, the file has 48");
    free(w.b);
    w = make_wav(1, 1, 16000, 16, s16, 4);
    set32(&w, 40, 4000);   /* data chunk size beyond the file */
    check_refused("a data size past the end", w.b, w.len, "chunk 'data' at byte 36 says 4000 bytes, only 4 remain");
    free(w.b);
    w = make_wav(1, 1, 16000, 16, s16, 4);
    set32(&w, 40, 4000);
    memcpy(w.b + 36, "d\n\0\\", 4);   /* a chunk id of a newline, a NUL and a backslash: still one line */
    check_refused("a control-byte chunk id", w.b, w.len, "chunk 'd\\x0a\\x00\\x5c' at byte 36 says 4000 bytes");
    free(w.b);
    w = make_wav(1, 1, 16000, 16, s16, 4);
    check_refused("a truncated file", w.b, w.len - 2, "RIFF size says");
    free(w.b);
    w = make_wav(2, 1, 16000, 16, s16, 4);
    check_refused("ADPCM", w.b, w.len, "format tag 0x0002");
    free(w.b);
    w = make_wav(1, 1, 16000, 12, s16, 4);
    check_refused("12-bit PCM", w.b, w.len, "bits per sample 12");
    free(w.b);
    w = make_wav(1, 0, 16000, 16, s16, 4);
    check_refused("0 channels", w.b, w.len, "channel count 0");
    free(w.b);
    w = make_wav(1, 1, 16000, 16, s16, 4);
    w.b[32] = 4;   /* block align 4 for one 16-bit channel */
    check_refused("a wrong block align", w.b, w.len, "block align 4");
    free(w.b);
    w = make_wav(1, 1, 16000, 16, s16, 4);
    set32(&w, 28, 12345);
    check_refused("a wrong byte rate", w.b, w.len, "byte rate 12345");
    free(w.b);
    w = make_wav(1, 2, 16000, 16, s16, 2);
    check_refused("half a frame", w.b, w.len, "not a whole number of 4-byte frames");
    free(w.b);
    w = make_wav(1, 1, 16000, 16, s16, 0);
    check_refused("no samples", w.b, w.len, "no audio samples");
    free(w.b);
    float nan_s[2] = {0.0f, NAN};
    w = make_wav(3, 1, 16000, 32, nan_s, 8);
    check_refused("a NaN sample", w.b, w.len, "sample 1 is not a finite number");
    free(w.b);
    float huge[3] = {0.5f, -1.5f, 3e38f};   /* finite, but its channel sum or filtering overflows */
    w = make_wav(3, 1, 16000, 32, huge, 12);
    check_refused("a 3e38 float sample", w.b, w.len, "WAV float sample 2 is 3e+38, not audio");
    free(w.b);
    w = make_wav(1, 1, 16000, 16, s16, 4);
    memcpy(w.b + 12, "junk", 4);   /* the fmt chunk renamed: data comes first */
    check_refused("no fmt before data", w.b, w.len, "data chunk before the fmt chunk");
    free(w.b);

    /* 31 s refused before any resampling; exactly 30 s accepted, at 16 kHz and at 44.1 kHz */
    size_t n31 = 31 * 16000;
    void *zeros = calloc(31 * 44100 * 4, 1);   /* the largest clip below */
    w = make_wav(1, 1, 16000, 16, zeros, (uint32_t)(n31 * 2));
    check_refused("31 s of audio", w.b, w.len, "audio is 31.00 s long; at most 30 s");
    free(w.b);
    w = make_wav(1, 2, 44100, 16, zeros, 31 * 44100 * 4);
    check_refused("31 s of 44.1 kHz stereo", w.b, w.len, "at most 30 s");
    free(w.b);
    int rates[2] = {16000, 44100};
    for (int i = 0; i < 2; i++) {
        w = make_wav(1, 1, (uint32_t)rates[i], 16, zeros, (uint32_t)(30 * rates[i] * 2));
        float *pcm;
        size_t n;
        int rc = g4_audio_pcm16k(w.b, w.len, "30s.wav", &pcm, &n);
        CHECK(rc == 0 && n == G4_AUDIO_MAX_SAMPLES, "30 s at %d Hz: rc %d, %zu samples: %s", rates[i], rc, n, g4_last_error());
        if (rc == 0) free(pcm);
        free(w.b);
    }
    free(zeros);
}

/* ---- the tower (part "tower"): tower/ is gen_audio_tower.py's variant of tiny-mobile ---- */

/* Bands (max |difference| / max |golden|) against gen_audio_tower.py's goldens: float and fake
 * against transformers' own modes, int against the fake-quant goldens. Measured on the two
 * full-band clips: float 4.9e-7, fake and int 3.0e-7 (int gives fake quantization's codes at
 * every tower linear; float and fake differ by 0.54%, 1800 times the band, so the calibrated
 * scales and the clamps are seen). The 8 kHz clip's log-mel already differs by up to 1.9e-3 in
 * near-empty bins (kissfft's float FFT, MEL_BAND above), which the tower carries: float 1.2e-5,
 * fake and int 1.7e-6; it gets
 * TOWER_BAND_8K. */
#define TOWER_BAND_FLOAT 1e-5
#define TOWER_BAND_FAKE 1e-5
#define TOWER_BAND_INT 1e-5
#define TOWER_BAND_8K 1e-4

static const struct {
    g4_act_mode act;
    const char *name, *golden;
    double band;
} TOWER_MODES[] = {{G4_ACT_FLOAT, "float", "soft_float", TOWER_BAND_FLOAT},
                   {G4_ACT_FAKE, "fake", "soft_fake", TOWER_BAND_FAKE},
                   {G4_ACT_INT, "int", "soft_fake", TOWER_BAND_INT}};

static const char *tower_clips[] = {"s16_16k_mono.wav", "s16_44k_stereo.wav", "u8_8k_mono.wav"};

/* One clip through g4_audio_soft_tokens in every mode on every kernel level this CPU has: the
 * first level against golden clip<ci>.soft_<mode> within the mode's band, the others equal to it
 * bit for bit. */
static void check_clip_modes(const g4_model *m, const g4_safetensors *st, int ci) {
    g4_options o;
    g4_options_default(&o);
    int D = g4_model_hidden_size(m);
    char path[256], *data;
    size_t len;
    snprintf(path, sizeof path, FIX "/%s", tower_clips[ci]);
    CHECK(g4_read_file(path, &data, &len) == 0, "%s", g4_last_error());
    for (size_t md = 0; md < sizeof TOWER_MODES / sizeof TOWER_MODES[0]; md++) {
        o.act = TOWER_MODES[md].act;
        const g4_tensor *g = golden_find(st, "clip%d.%s", ci, TOWER_MODES[md].golden);
        if (!g) continue;
        float *ref = NULL;
        int n_ref = 0, levels = 0;
        for (int k = 0; k < g4_kernels_count(); k++) {
            const g4_kernels *kl = g4_kernels_at(k);
            if (!g4_kernels_available(kl)) continue;
            setenv("G4_DISPATCH", kl->name, 1);
            float *e = NULL;
            int n = 0;
            int rc = g4_audio_soft_tokens(m, &o, data, len, &e, &n);
            CHECK(rc == 0, "%s %s %s: %s", tower_clips[ci], TOWER_MODES[md].name, kl->name, g4_last_error());
            if (rc) continue;
            levels++;
            if (!ref) {
                ref = e, n_ref = n;
                CHECK(g->ndim == 2 && g->shape[0] == n && g->shape[1] == D, "%s %s: %d tokens x %d, golden %lld x %lld", tower_clips[ci],
                      TOWER_MODES[md].name, n, D, (long long)g->shape[0], (long long)g->shape[1]);
                if (g->shape[0] == n && g->shape[1] == D) {
                    char what[160];
                    snprintf(what, sizeof what, "tower %s %s", tower_clips[ci], TOWER_MODES[md].name);
                    golden_band(what, e, n, D, g, strstr(tower_clips[ci], "8k") ? TOWER_BAND_8K : TOWER_MODES[md].band);
                }
            } else {
                CHECK(n == n_ref && memcmp(e, ref, sizeof *e * (size_t)n * D) == 0, "%s %s: level %s differs from the first level",
                      tower_clips[ci], TOWER_MODES[md].name, kl->name);
                free(e);
            }
        }
        unsetenv("G4_DISPATCH");
        CHECK(levels >= 1, "no kernel level ran");
        free(ref);
    }
    free(data);
}


/* A full 30 s clip (the longest accepted): the processor's audio_seq_length, 750 soft tokens,
 * every frame valid, through linears called in several session-sized pieces. No transformers
 * golden at this length (the clips above check the values): the count, finiteness and the
 * kernel levels' equality in int mode. */
static void check_30s(const g4_model *m) {
    size_t n = 30 * 16000;
    int16_t *pcm = malloc(n * sizeof *pcm);
    for (size_t i = 0; i < n; i++) pcm[i] = (int16_t)(8000.0 * sin(2 * M_PI * 440.0 * (double)i / 16000.0) * (0.5 + 0.5 * sin((double)i / 9000.0)));
    buf w = make_wav(1, 1, 16000, 16, pcm, (uint32_t)(n * 2));
    free(pcm);
    g4_options o;
    g4_options_default(&o);
    o.act = G4_ACT_INT;
    float *ref = NULL;
    int n_ref = 0, D = g4_model_hidden_size(m);
    for (int k = 0; k < g4_kernels_count(); k++) {
        const g4_kernels *kl = g4_kernels_at(k);
        if (!g4_kernels_available(kl)) continue;
        setenv("G4_DISPATCH", kl->name, 1);
        float *e = NULL;
        int nt = 0;
        double t0 = g4_prof_clock();
        int rc = g4_audio_soft_tokens(m, &o, w.b, w.len, &e, &nt);
        double dt = g4_prof_clock() - t0;
        CHECK(rc == 0 && nt == 750, "30 s clip on %s: rc %d, %d tokens (750 expected): %s", kl->name, rc, nt, rc ? g4_last_error() : "");
        if (rc) continue;
        int finite = 1;
        for (size_t i = 0; i < (size_t)nt * D; i++) finite &= isfinite(e[i]) != 0;
        CHECK(finite, "30 s clip on %s: a non-finite soft token value", kl->name);
        if (!ref) {
            ref = e, n_ref = nt;
            printf("ok 30 s clip: %d soft tokens (int, level %s, %.2f s including decode, resampling and log-mel)\n", nt, kl->name, dt);
        } else {
            CHECK(nt == n_ref && memcmp(e, ref, sizeof *e * (size_t)nt * D) == 0, "30 s clip: level %s differs from the first level", kl->name);
            free(e);
        }
    }
    unsetenv("G4_DISPATCH");
    free(ref);
    free(w.b);
}

/* A copy of the tower fixture in a temp folder with `from` replaced by `to` in its config.json
 * (once), its model.safetensors linked: the model loads (the text model is untouched), and the
 * first clip is refused with one line holding `needle`. */
static void expect_tower_refusal(const char *from, const char *to, const char *needle, const char *wav, size_t len) {
    char dir[] = "/tmp/g4_audio_XXXXXX", path[4096], target[4096];
    if (!mkdtemp(dir)) exit(2);
    char *cfg = NULL;
    size_t clen = 0;
    if (g4_read_file(FIX "/tower/config.json", &cfg, &clen)) exit(2);
    char *at = strstr(cfg, from);
    CHECK(at != NULL, "tower/config.json has no %s", from);
    if (at) {
        size_t n = clen + strlen(to) + 1;
        char *out = malloc(n);
        snprintf(out, n, "%.*s%s%s", (int)(at - cfg), cfg, to, at + strlen(from));
        snprintf(path, sizeof path, "%s/config.json", dir);
        FILE *f = fopen(path, "w");
        if (!f || fwrite(out, 1, strlen(out), f) != strlen(out) || fclose(f)) exit(2);
        free(out);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (!realpath(FIX "/tower", target)) exit(2);
        strncat(target, "/model.safetensors", sizeof target - strlen(target) - 1);
        if (symlink(target, path) != 0) exit(2);
        g4_options o;
        g4_options_default(&o);
        g4_model *m = g4_model_load_options(dir, &o);
        CHECK(m != NULL, "%s -> %s: the model itself: %s", from, to, g4_last_error());
        if (m) {
            float *e = (float *)1;
            int nt = 7;
            int rc = g4_audio_soft_tokens(m, &o, wav, len, &e, &nt);
            CHECK(rc == -1 && e == NULL && nt == 0 && strstr(g4_last_error(), needle) && !strchr(g4_last_error(), '\n'), "%s -> %s: %s", from,
                  to, rc ? g4_last_error() : "accepted");
            if (rc) printf("ok refused (%s -> %s): %s\n", from, to, g4_last_error());
            /* a failed bind leaves the model as it was: a second call is refused the same way */
            CHECK(m->audio == NULL && g4_audio_soft_tokens(m, &o, wav, len, &e, &nt) == -1, "%s -> %s: second call", from, to);
            g4_model_free(m);
        }
        unlink(path);
        snprintf(path, sizeof path, "%s/config.json", dir);
        unlink(path);
    }
    free(cfg);
    rmdir(dir);
}

static void test_tower(void) {
    g4_safetensors st;
    if (golden_open(&st, FIX "/tower/goldens.safetensors")) return;
    g4_options o;
    g4_options_default(&o);
    g4_model *m = g4_model_load_options(FIX "/tower", &o);
    CHECK(m != NULL, "%s", g4_last_error());
    if (m) {
        /* lazy: loading the model binds no tower; a text session made before keeps working */
        CHECK(m->audio == NULL, "the audio tower was bound at load");
        int before = m->n_linears;
        g4_session *early = g4_session_new(m, &o);
        CHECK(early != NULL, "%s", g4_last_error());
        for (int i = 0; i < 3; i++) check_clip_modes(m, &st, i);
        check_30s(m);
        /* 10 clippable linears a layer, relative_k_proj, input_proj, output_proj, embed_audio */
        CHECK(m->audio != NULL && m->n_linears == before + 11 + 3, "tower bound on first use: %d linears, %d before", m->n_linears, before);
        if (early) {
            int32_t ids[3] = {2, 10, 11};
            CHECK(g4_session_feed(early, ids, 3, NULL, 0) == 0, "text session after the tower: %s", g4_last_error());
            g4_session_free(early);
        }
        g4_model_free(m);
    }
    g4_st_close(&st);
    char *data;
    size_t len;
    CHECK(g4_read_file(FIX "/s16_16k_mono.wav", &data, &len) == 0, "%s", g4_last_error());
    /* tiny-mobile's own tower cannot take 128 mel bins (channels [8, 4]): refused naming the field */
    g4_model *tiny = g4_model_load_options(tiny_dir(), &o);
    CHECK(tiny != NULL, "%s", g4_last_error());
    if (tiny) {
        float *e = (float *)1;
        int n = 7;
        CHECK(g4_audio_soft_tokens(tiny, &o, data, len, &e, &n) == -1 && e == NULL && n == 0 &&
                  strstr(g4_last_error(), "subsampling_conv_channels[0] is 8"),
              "tiny-mobile's tower: %s", g4_last_error());
        g4_model_free(tiny);
    }
    expect_tower_refusal("\"conv_kernel_size\": 5", "\"conv_kernel_size\": 3", "lconv1d.depthwise_conv1d.weight: expected a float tensor [32, 1, 3]",
                         data, len);
    expect_tower_refusal("\"output_proj_dims\": 64", "\"output_proj_dims\": 48", "output_proj.weight", data, len);
    expect_tower_refusal("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "audio_config.hidden_act \"gelu\"", data, len);
    g4_model *text = g4_model_load_options("models/gemma4-tiny-math", &o);
    CHECK(text != NULL, "%s", g4_last_error());
    if (text) {
        float *e = (float *)1;
        int n = 7;
        CHECK(g4_audio_soft_tokens(text, &o, data, len, &e, &n) == -1 && e == NULL && n == 0 && strstr(g4_last_error(), "no audio_config"),
              "text-only model: %s", g4_last_error());
        g4_model_free(text);
    }
    free(data);
}

int main(void) {
    test_clips();
    test_subsample();
    test_attention();
    test_scaling();
    test_bad_media();
    if (check_dispatch_level()) test_tower();
    return check_report("test_audio");
}
