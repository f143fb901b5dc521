/* A bounded RIFF/WAVE reader. Why not libsndfile: g4 takes WAV only (the API's input_audio is
 * base64 WAV), from memory, and must refuse every malformed header with a one-line error naming the
 * field; a ~200-line parser that checks each size against the bytes it has does that with no
 * virtual-I/O glue and no extra dependency for the aarch64 cross build. Sample scaling follows
 * libsndfile's float read (what librosa.load, the reference's loader, returns): 8-bit unsigned
 * (x - 128) / 128, 16/24/32-bit signed x / 2^(bits-1), float as stored. */
#include "audio/audio.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

#define WAV_MAX_CHANNELS 64
#define WAVE_FORMAT_PCM 1
#define WAVE_FORMAT_IEEE_FLOAT 3
#define WAVE_FORMAT_EXTENSIBLE 0xFFFE
#define WAV_FLOAT_LIMIT 1e6   /* see g4_wav_decode */

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint16_t le16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }

typedef struct {
    int format;       /* WAVE_FORMAT_PCM or WAVE_FORMAT_IEEE_FLOAT (extensible resolved) */
    int channels;
    uint32_t rate;
    int bits;         /* container bits per sample */
    int block_align;
} wav_fmt;

/* the KSDATAFORMAT_SUBTYPE GUID tail shared by PCM and IEEE float */
static const unsigned char ks_guid_tail[14] = {0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80,
                                               0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71};

static int parse_fmt(const unsigned char *p, uint32_t size, const char *name, wav_fmt *f) {
    if (size < 16) return g4_fail("%s: WAV fmt chunk is %u bytes (at least 16)", name, size);
    int tag = le16(p);
    f->channels = le16(p + 2);
    f->rate = le32(p + 4);
    uint32_t byte_rate = le32(p + 8);
    f->block_align = le16(p + 12);
    f->bits = le16(p + 14);
    if (tag == WAVE_FORMAT_EXTENSIBLE) {
        if (size < 40) return g4_fail("%s: WAV extensible fmt chunk is %u bytes (at least 40)", name, size);
        if (le16(p + 16) < 22) return g4_fail("%s: WAV extensible fmt cbSize is %u (at least 22)", name, le16(p + 16));
        int valid = le16(p + 18);
        if (valid == 0 || valid > f->bits)
            return g4_fail("%s: WAV valid bits per sample %d does not fit the %d-bit container", name, valid, f->bits);
        if (memcmp(p + 26, ks_guid_tail, sizeof ks_guid_tail) != 0)
            return g4_fail("%s: WAV extensible sub-format is not PCM or IEEE float", name);
        tag = le16(p + 24);
    }
    if (tag != WAVE_FORMAT_PCM && tag != WAVE_FORMAT_IEEE_FLOAT)
        return g4_fail("%s: WAV format tag 0x%04x is not PCM (1) or IEEE float (3); compressed WAV is not supported",
                       name, tag);
    f->format = tag;
    if (f->channels < 1 || f->channels > WAV_MAX_CHANNELS)
        return g4_fail("%s: WAV channel count %d (1..%d)", name, f->channels, WAV_MAX_CHANNELS);
    if (f->rate < 1000 || f->rate > 768000) return g4_fail("%s: WAV sample rate %u Hz (1000..768000)", name, f->rate);
    if (tag == WAVE_FORMAT_PCM && f->bits != 8 && f->bits != 16 && f->bits != 24 && f->bits != 32)
        return g4_fail("%s: WAV PCM bits per sample %d (8, 16, 24 or 32)", name, f->bits);
    if (tag == WAVE_FORMAT_IEEE_FLOAT && f->bits != 32 && f->bits != 64)
        return g4_fail("%s: WAV float bits per sample %d (32 or 64)", name, f->bits);
    if (f->block_align != f->channels * (f->bits / 8))
        return g4_fail("%s: WAV block align %d is not channels x bytes per sample (%d)", name, f->block_align,
                       f->channels * (f->bits / 8));
    if (byte_rate != f->rate * (uint32_t)f->block_align)
        return g4_fail("%s: WAV byte rate %u is not sample rate x block align (%u)", name, byte_rate,
                       f->rate * (uint32_t)f->block_align);
    return 0;
}

/* One sample at p in the file's format, as libsndfile's float read gives it. */
static float sample_at(const unsigned char *p, const wav_fmt *f) {
    if (f->format == WAVE_FORMAT_IEEE_FLOAT) {
        if (f->bits == 32) {
            uint32_t u = le32(p);
            float x;
            memcpy(&x, &u, 4);
            return x;
        }
        uint64_t u = (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
        double x;
        memcpy(&x, &u, 8);
        return (float)x;
    }
    switch (f->bits) {
    case 8: return (float)((int)p[0] - 128) * (1.0f / 128.0f);
    case 16: return (float)(int16_t)le16(p) * (1.0f / 32768.0f);
    case 24: {
        /* libsndfile reads 24-bit into the top of an int and scales by 2^-31: the same value */
        int32_t x = (int32_t)((uint32_t)p[0] << 8 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 24);
        return (float)x * (1.0f / 2147483648.0f);
    }
    default: return (float)(int32_t)le32(p) * (1.0f / 2147483648.0f);
    }
}

/* A chunk id for an error message: any byte (newline, NUL, control) may be there in a hostile
 * file, and a message must stay one printable line, so bytes outside ASCII printing range are
 * written as \xNN. */
static const char *chunk_id(const unsigned char *c, char out[17]) {
    char *o = out;
    for (int i = 0; i < 4; i++) {
        if (c[i] >= 0x20 && c[i] < 0x7f && c[i] != '\\') *o++ = (char)c[i];
        else o += snprintf(o, 5, "\\x%02x", c[i]);
    }
    *o = 0;
    return out;
}

int g4_wav_decode(const void *bytes, size_t len, const char *name, g4_wav *out) {
    memset(out, 0, sizeof *out);
    const unsigned char *b = bytes;
    if (len < 12) return g4_fail("%s: not a WAV file: %zu bytes, shorter than a RIFF header", name, len);
    if (memcmp(b, "RIFF", 4) != 0 || memcmp(b + 8, "WAVE", 4) != 0) {
        if (memcmp(b, "RIFX", 4) == 0 || memcmp(b, "RF64", 4) == 0)
            return g4_fail("%s: %.4s WAV is not supported (little-endian RIFF only)", name, (const char *)b);
        return g4_fail("%s: not a WAV file (no RIFF/WAVE header)", name);
    }
    uint64_t riff_end = (uint64_t)le32(b + 4) + 8;
    if (riff_end > len)
        return g4_fail("%s: WAV RIFF size says %llu bytes, the file has %zu", name, (unsigned long long)riff_end, len);
    wav_fmt f = {0};
    int have_fmt = 0;
    const unsigned char *data = NULL;
    uint32_t data_size = 0;
    uint64_t pos = 12;
    while (pos + 8 <= riff_end && !data) {
        const unsigned char *c = b + pos;
        uint32_t size = le32(c + 4);
        if (pos + 8 + size > riff_end) {
            char id[17];
            return g4_fail("%s: WAV chunk '%s' at byte %llu says %u bytes, only %llu remain", name, chunk_id(c, id),
                           (unsigned long long)pos, size, (unsigned long long)(riff_end - pos - 8));
        }
        if (memcmp(c, "fmt ", 4) == 0) {
            if (have_fmt) return g4_fail("%s: WAV has two fmt chunks", name);
            if (parse_fmt(c + 8, size, name, &f) != 0) return -1;
            have_fmt = 1;
        } else if (memcmp(c, "data", 4) == 0) {
            if (!have_fmt) return g4_fail("%s: WAV data chunk before the fmt chunk", name);
            data = c + 8;
            data_size = size;
        }
        pos += 8 + (uint64_t)size + (size & 1);   /* chunks are padded to even sizes */
    }
    if (!have_fmt) return g4_fail("%s: WAV has no fmt chunk", name);
    if (!data) return g4_fail("%s: WAV has no data chunk", name);
    if (data_size % (uint32_t)f.block_align != 0)
        return g4_fail("%s: WAV data chunk of %u bytes is not a whole number of %d-byte frames", name, data_size,
                       f.block_align);
    size_t frames = data_size / (uint32_t)f.block_align;
    if (frames == 0) return g4_fail("%s: WAV has no audio samples", name);
    /* refuse > 30 s here, before the resampler, so a huge file costs no memory */
    if ((double)frames / f.rate > (double)G4_AUDIO_MAX_SAMPLES / G4_AUDIO_RATE + 1e-9)
        return g4_fail("%s: audio is %.2f s long; at most 30 s (750 audio tokens) is supported", name,
                       (double)frames / f.rate);
    float *s = malloc(frames * (size_t)f.channels * sizeof *s);
    if (!s) return g4_fail("%s: out of memory for %zu WAV frames", name, frames);
    int bps = f.bits / 8;
    for (size_t i = 0; i < frames * (size_t)f.channels; i++) {
        s[i] = sample_at(data + i * (size_t)bps, &f);
        /* only float WAVs can hold these. Audio is within [-1, 1] (some clipping past it is fine);
         * a sample past WAV_FLOAT_LIMIT is garbage, and summing channels or filtering such values
         * overflows to infinity, which would poison every feature */
        if (!isfinite(s[i])) {
            free(s);
            return g4_fail("%s: WAV sample %zu is not a finite number", name, i);
        }
        if (fabsf(s[i]) > WAV_FLOAT_LIMIT) {
            double bad = s[i];
            free(s);
            return g4_fail("%s: WAV float sample %zu is %g, not audio (at most %g in magnitude)", name, i, bad,
                           WAV_FLOAT_LIMIT);
        }
    }
    out->samples = s;
    out->frames = frames;
    out->channels = f.channels;
    out->rate = (int)f.rate;
    return 0;
}

void g4_wav_free(g4_wav *w) {
    free(w->samples);
    memset(w, 0, sizeof *w);
}

float *g4_wav_downmix(const g4_wav *w) {
    float *m = malloc((w->frames ? w->frames : 1) * sizeof *m);
    if (!m) {
        g4_fail("out of memory for %zu audio frames", w->frames);
        return NULL;
    }
    for (size_t i = 0; i < w->frames; i++) {
        const float *fr = w->samples + i * (size_t)w->channels;
        float sum = fr[0];
        for (int c = 1; c < w->channels; c++) sum += fr[c];
        m[i] = sum / (float)w->channels;
    }
    return m;
}
