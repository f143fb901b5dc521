/* WAV bytes to the 16 kHz mono float PCM the feature extractor takes, as transformers' load_audio
 * (librosa.load(sr=16000)): decode, channel mean, then libsoxr's HQ resampler, the library and
 * recipe under librosa's default res_type 'soxr_hq' (python-soxr). */
#include <soxr.h>
#include <stdlib.h>
#include <string.h>

#include "audio/audio.h"
#include "util/err.h"

int g4_audio_resample(const float *in, size_t n, int rate, float **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    /* room for every output sample: n x 16000 / rate, rounded up, plus slack for the flush */
    size_t cap = (size_t)((double)n * G4_AUDIO_RATE / rate) + 16;
    float *o = malloc(cap * sizeof *o);
    if (!o) return g4_fail("out of memory resampling %zu samples", n);
    if (rate == G4_AUDIO_RATE) {
        memcpy(o, in, n * sizeof *o);
        *out = o;
        *n_out = n;
        return 0;
    }
    soxr_error_t err = NULL;
    soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
    soxr_quality_spec_t q = soxr_quality_spec(SOXR_HQ, 0);
    soxr_runtime_spec_t rt = soxr_runtime_spec(1);   /* one thread: the same bits on every run */
    soxr_t s = soxr_create(rate, G4_AUDIO_RATE, 1, &err, &io, &q, &rt);
    if (!s || err) {
        free(o);
        return g4_fail("libsoxr: cannot resample %d Hz to 16 kHz: %s", rate, err ? err : "soxr_create failed");
    }
    size_t done = 0, got = 0;
    err = soxr_process(s, in, n, NULL, o, cap, &got);
    done += got;
    /* end of input: flush the filter's tail until nothing more comes */
    while (!err && done < cap) {
        got = 0;
        err = soxr_process(s, NULL, 0, NULL, o + done, cap - done, &got);
        done += got;
        if (got == 0) break;
    }
    soxr_delete(s);
    if (err) {
        free(o);
        return g4_fail("libsoxr: resampling %d Hz to 16 kHz failed: %s", rate, err);
    }
    *out = o;
    *n_out = done;
    return 0;
}

int g4_audio_pcm16k(const void *bytes, size_t len, const char *name, float **pcm, size_t *n) {
    *pcm = NULL;
    *n = 0;
    g4_wav w;
    if (g4_wav_decode(bytes, len, name, &w) != 0) return -1;
    float *mono = g4_wav_downmix(&w);
    int rate = w.rate;
    size_t frames = w.frames;
    g4_wav_free(&w);
    if (!mono) return -1;
    int rc = g4_audio_resample(mono, frames, rate, pcm, n);
    free(mono);
    if (rc != 0) return g4_fail_prefix("%s: ", name);
    if (*n > G4_AUDIO_MAX_SAMPLES) {
        free(*pcm);
        *pcm = NULL;
        return g4_fail("%s: audio is %zu samples at 16 kHz; at most 30 s (480000 samples) is supported", name, *n);
    }
    return 0;
}
