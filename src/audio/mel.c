/* Gemma 4's log-mel features (transformers' Gemma4AudioFeatureExtractor, default config): the
 * windowed frame is formed in float32 as numpy does (float32 waveform x float32 window), the FFT is
 * kissfft's real FFT (BSD; float: numpy's is double, the one source of difference, see
 * tests/test_audio.c for the band), the magnitude, mel product and log in double as numpy's. */
#include <kissfft/kiss_fftr.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "audio/audio.h"
#include "util/err.h"

#define FRAME 320
#define HOP 160
#define FFT 512
#define BINS (FFT / 2 + 1)
#define PAD_LEFT (FRAME / 2)
#define PAD_MULTIPLE 128       /* the processor's pad_to_multiple_of */
#define MEL_FLOOR 1e-3
#define MEL_MAX_HZ 8000.0

static double hz_to_mel_htk(double hz) { return 2595.0 * log10(1.0 + hz / 700.0); }
static double mel_to_hz_htk(double mel) { return 700.0 * (pow(10.0, mel / 2595.0) - 1.0); }

/* np.linspace(a, b, n)[i]: a + i * step, the last point exactly b */
static double linspace_at(double a, double b, int n, int i) {
    return i == n - 1 ? b : a + i * ((b - a) / (n - 1));
}

/* audio_utils.mel_filter_bank(257, 128, 0, 8000, 16000, norm=None, mel_scale="htk"): triangles
 * between mel-spaced corner frequencies over the FFT bins' frequencies; fb[bin][mel] */
static void mel_filters(double fb[BINS][G4_AUDIO_MEL_BINS]) {
    const int n_pts = G4_AUDIO_MEL_BINS + 2;
    double corner[G4_AUDIO_MEL_BINS + 2];
    double mmax = hz_to_mel_htk(MEL_MAX_HZ);
    for (int i = 0; i < n_pts; i++) corner[i] = mel_to_hz_htk(linspace_at(0.0, mmax, n_pts, i));
    for (int k = 0; k < BINS; k++) {
        double f = linspace_at(0.0, G4_AUDIO_RATE / 2, BINS, k);
        for (int m = 0; m < G4_AUDIO_MEL_BINS; m++) {
            double down = -(corner[m] - f) / (corner[m + 1] - corner[m]);
            double up = (corner[m + 2] - f) / (corner[m + 2] - corner[m + 1]);
            double v = down < up ? down : up;
            fb[k][m] = v > 0.0 ? v : 0.0;
        }
    }
}

/* window_function(320): the periodic Hann window, np.hanning(321)[:-1], cast to float32 */
static void hann_periodic(float w[FRAME]) {
    for (int n = 0; n < FRAME; n++) w[n] = (float)(0.5 - 0.5 * cos(2.0 * 3.14159265358979323846 * n / FRAME));
}

static size_t padded_len(size_t n) { return (n + PAD_MULTIPLE - 1) / PAD_MULTIPLE * PAD_MULTIPLE; }

int g4_audio_mel_frames(size_t n) {
    size_t total = padded_len(n) + PAD_LEFT;
    if (total < FRAME + 1) return 0;
    return (int)((total - (FRAME + 1)) / HOP + 1);
}

int g4_audio_log_mel(const float *pcm, size_t n, float **mel, uint8_t **mask, int *n_frames) {
    *mel = NULL;
    *mask = NULL;
    *n_frames = 0;
    if (n > G4_AUDIO_MAX_SAMPLES)
        return g4_fail("audio is %zu samples at 16 kHz; at most 30 s (480000 samples) is supported", n);
    int T = g4_audio_mel_frames(n);
    if (T <= 0) return g4_fail("audio of %zu samples is too short for one 20 ms frame", n);
    /* the processor's view: PAD_LEFT zeros, the clip, zeros up to the padded length */
    size_t total = PAD_LEFT + padded_len(n);
    float *wave = calloc(total, sizeof *wave);
    float *out = malloc((size_t)T * G4_AUDIO_MEL_BINS * sizeof *out);
    uint8_t *m = malloc((size_t)T);
    double (*fb)[G4_AUDIO_MEL_BINS] = malloc(sizeof(double[BINS][G4_AUDIO_MEL_BINS]));
    kiss_fftr_cfg cfg = kiss_fftr_alloc(FFT, 0, NULL, NULL);
    if (!wave || !out || !m || !fb || !cfg) {
        free(wave), free(out), free(m), free(fb), kiss_fftr_free(cfg);
        return g4_fail("out of memory for the log-mel of %zu samples", n);
    }
    memcpy(wave + PAD_LEFT, pcm, n * sizeof *pcm);
    mel_filters(fb);
    int lo[G4_AUDIO_MEL_BINS], hi[G4_AUDIO_MEL_BINS];
    for (int j = 0; j < G4_AUDIO_MEL_BINS; j++) {
        lo[j] = BINS, hi[j] = 0;
        for (int k = 0; k < BINS; k++)
            if (fb[k][j] != 0.0) {
                if (k < lo[j]) lo[j] = k;
                hi[j] = k + 1;
            }
    }
    float win[FRAME];
    hann_periodic(win);
    kiss_fft_scalar frame[FFT];
    kiss_fft_cpx spec[BINS];
    double mag[BINS];
    for (int t = 0; t < T; t++) {
        size_t start = (size_t)t * HOP;
        /* valid when the window's last sample (index FRAME of the 321-sample unfold) is real audio */
        size_t last = start + FRAME;
        m[t] = last >= PAD_LEFT && last < PAD_LEFT + n;
        float *o = out + (size_t)t * G4_AUDIO_MEL_BINS;
        if (!m[t]) {   /* the processor multiplies a masked frame's features by 0 */
            memset(o, 0, G4_AUDIO_MEL_BINS * sizeof *o);
            continue;
        }
        for (int i = 0; i < FRAME; i++) frame[i] = wave[start + i] * win[i];
        memset(frame + FRAME, 0, (FFT - FRAME) * sizeof frame[0]);
        kiss_fftr(cfg, frame, spec);
        for (int k = 0; k < BINS; k++) mag[k] = hypot((double)spec[k].r, (double)spec[k].i);
        /* only each triangle's non-zero FFT bins: the skipped terms are +0 added to a sum of
         * non-negative terms, so the sum is the full product's, bit for bit */
        for (int j = 0; j < G4_AUDIO_MEL_BINS; j++) {
            double s = 0.0;
            for (int k = lo[j]; k < hi[j]; k++) s += mag[k] * fb[k][j];
            o[j] = (float)log(s + MEL_FLOOR);
        }
    }
    free(wave);
    free(fb);
    kiss_fftr_free(cfg);
    *mel = out;
    *mask = m;
    *n_frames = T;
    return 0;
}
