/* Audio input (issue 35, audio half): WAV bytes -> 16 kHz mono float PCM -> Gemma 4's log-mel
 * features. The reference is transformers 5.17: `load_audio` (librosa.load at 16 kHz: libsndfile's
 * float read, the channel mean, soxr HQ) then `Gemma4AudioFeatureExtractor`. Built from AUDIO_SRC
 * (sources.mk), which links libsoxr and kissfft; the aarch64 cross build leaves it out. */
#ifndef G4_AUDIO_AUDIO_H
#define G4_AUDIO_AUDIO_H

#include <stddef.h>
#include <stdint.h>

#define G4_AUDIO_RATE 16000
/* the processor's max_length: 30 s at 16 kHz; longer audio is refused, never truncated */
#define G4_AUDIO_MAX_SAMPLES 480000
#define G4_AUDIO_MEL_BINS 128

/* One decoded WAV: frames x channels floats, interleaved, scaled as libsndfile reads them. */
typedef struct {
    float *samples;
    size_t frames;
    int channels;
    int rate;
} g4_wav;

/* Parses a RIFF/WAVE file held in memory: PCM 8/16/24/32-bit int, IEEE float 32/64-bit, plain or
 * WAVE_FORMAT_EXTENSIBLE, any channel count up to 64. `name` labels the errors (a path, "audio").
 * Returns 0, or -1 with a one-line g4_last_error naming the field that is wrong. */
int g4_wav_decode(const void *bytes, size_t len, const char *name, g4_wav *out);
void g4_wav_free(g4_wav *w);

/* The channel mean per frame, as librosa.to_mono (float32, channels summed in order). Returns a
 * malloc'd frames-long array or NULL (out of memory, error set). */
float *g4_wav_downmix(const g4_wav *w);

/* Resamples mono float PCM from `rate` to 16 kHz with libsoxr's HQ recipe (librosa's default
 * res_type 'soxr_hq'). *out is malloc'd; at rate 16000 it is a copy. */
int g4_audio_resample(const float *in, size_t n, int rate, float **out, size_t *n_out);

/* WAV bytes to 16 kHz mono: decode, down-mix, resample. Refuses audio longer than 30 s. */
int g4_audio_pcm16k(const void *bytes, size_t len, const char *name, float **pcm, size_t *n);

/* Gemma4AudioFeatureExtractor on one clip of n samples (n <= G4_AUDIO_MAX_SAMPLES): the clip padded
 * with zeros to a multiple of 128 samples (the processor's pad_to_multiple_of), 160 zeros
 * prepended, frames of 320 with hop 160, periodic Hann, |rfft(512)|, 128 HTK mel bins 0-8000 Hz,
 * log(mel + 1e-3), frames whose window reaches past the real audio masked (set to 0, mask 0).
 * *mel is malloc'd n_frames x 128 floats, *mask n_frames bytes (0/1). */
int g4_audio_log_mel(const float *pcm, size_t n, float **mel, uint8_t **mask, int *n_frames);

/* Frames of g4_audio_log_mel for n samples. */
int g4_audio_mel_frames(size_t n);

/* The conformer's subsampling: a length n after one 3x3 stride-2 pad-1 convolution. */
int g4_audio_subsampled_len(int n);

/* One subsampling layer on in [T][F][cin] (channels last) with its frame mask: out
 * [T'][F'][cout], mask_out [T'] (mask[::2]); w is the Conv2d weight [cout][cin][3][3], norm_w the
 * LayerNorm weight [cout]. Float in every activation mode (the checkpoint keeps it float). 0, or -1
 * (out of memory) with the error. */
int g4_audio_subsample_layer(const float *in, const uint8_t *mask, int T, int F, int cin, const float *w,
                              const float *norm_w, int cout, float eps, float *out, uint8_t *mask_out);

/* The relative-position sinusoids of the conformer's attention: rows positions rows-1 .. 0, each
 * [sin(p x inv_ts), cos(p x inv_ts)], inv_ts[i] = exp(-i ln(1e4) / (hidden/2 - 1)); out [rows][hidden]. */
void g4_audio_rel_pos_sinusoids(int hidden, int rows, float *out);

/* The chunked local attention between the projections and `post` (audio/attention.c): q, k, v
 * [T][H*D] as the projections give them (unscaled), rel_k [L][H*D] (relative_k_proj of the
 * sinusoids), per_dim_scale [D] (the raw parameter; softplus applied here), valid [T] the key mask;
 * out [T][H*D]. 0, or -1 with the error set (out of memory). */
int g4_audio_local_attention(const float *q, const float *k, const float *v, int T, int H, int D, const float *rel_k,
                              int L, const float *per_dim_scale, const uint8_t *valid, int chunk, int context_left,
                              int context_right, float logit_cap, float *out);

/* The light conv's core (audio/lconv.c): x [T][2C] (linear_start's output) -> GLU -> causal
 * depthwise conv with w [C][kernel] -> out [T][C] (conv_norm's input). 0, or -1 with the error set
 * (out of memory). */
int g4_audio_glu_depthwise_conv(const float *x, int T, int C, const float *w, int kernel, float *out);

#endif
