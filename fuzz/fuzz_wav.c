/* Fuzz target: the audio front end's WAV entry point (src/audio/audio.h).
 *
 * Input: the bytes of a WAV file. g4_audio_pcm16k decodes, down-mixes and resamples it; when it
 * accepts the file, the 16 kHz samples must be finite and g4_audio_log_mel must either refuse them
 * (too short) or give finite features with a 0/1 mask and the frame count g4_audio_mel_frames says.
 * A refusal must leave a one-line error naming the input. */
#include "audio/audio.h"
#include "util/err.h"

#include "fuzz_common.h"

#include <math.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g4_set_log(NULL, NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    float *pcm = NULL;
    size_t n = 0;
    if (g4_audio_pcm16k(data, size, "fuzz.wav", &pcm, &n) != 0) {
        const char *e = g4_last_error();
        FZ_CHECK(pcm == NULL && strncmp(e, "fuzz.wav: ", 10) == 0 && !strchr(e, '\n'), "bad refusal: %s", e);
        return 0;
    }
    FZ_CHECK(n <= G4_AUDIO_MAX_SAMPLES, "%zu samples past the 30 s limit", n);
    for (size_t i = 0; i < n; i++) FZ_CHECK(isfinite(pcm[i]), "sample %zu is not finite", i);
    float *mel = NULL;
    uint8_t *mask = NULL;
    int T = 0;
    if (g4_audio_log_mel(pcm, n, &mel, &mask, &T) == 0) {
        FZ_CHECK(T == g4_audio_mel_frames(n) && T > 0, "%d frames for %zu samples", T, n);
        for (size_t i = 0; i < (size_t)T * G4_AUDIO_MEL_BINS; i++) FZ_CHECK(isfinite(mel[i]), "mel %zu not finite", i);
        for (int t = 0; t < T; t++) FZ_CHECK(mask[t] <= 1, "mask %d is %d", t, mask[t]);
    } else {
        FZ_CHECK(mel == NULL && mask == NULL, "a refused log-mel left its outputs");
    }
    free(mel);
    free(mask);
    free(pcm);
    return 0;
}
