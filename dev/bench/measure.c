/* What g4 bench measures inside the runtime (measure.h). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "bench/measure.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "audio/audio.h"
#include "audio/tower.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/probe.h"
#include "util/err.h"
#include "util/file.h"
#include "vision/tower.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- kernel levels ---- */

const char *g4_bench_level(void) { return g4_kernels_get()->name; }
const char *g4_bench_level_best(void) { return g4_kernels_best()->name; }
const char *g4_bench_cpu_flags(void) { return g4_kernels_cpu_flags(); }
const char *g4_bench_levels(void) { return g4_kernels_names(); }
int g4_bench_level_available(const char *name) { return g4_kernels_level(name) != NULL; }
int g4_bench_session_level(g4_session *s, const char *name) { return g4_session_set_kernels(s, name); }

/* ---- the towers' inputs ---- */

struct g4_bench_media {
    const g4_model *m;
    const g4_vision_tower *vt;
    const g4_audio_tower *at;
    g4_image_patches p;
    float *mel;
    uint8_t *mask;
    int T;
};

/* An RGB test image of w x h: smooth gradients and a disc (edges for the resampler) plus hashed
 * noise; the values do not matter to the timing, only the size. */
static int synth_image(int w, int h, g4_rgb_image *im) {
    im->w = w, im->h = h;
    im->rgb = malloc((size_t)w * h * 3);
    if (!im->rgb) return -1;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            int disc = (x - w / 2) * (x - w / 2) + (y - h / 2) * (y - h / 2) < (w < h ? w : h) * (w < h ? w : h) / 9;
            for (int c = 0; c < 3; c++) {
                unsigned hash = ((unsigned)(y * w + x) * 3u + (unsigned)c) * 2654435761u;
                int v = (x * 255 / w + y * 255 / h * (c + 1)) / (c + 2) + (int)(hash >> 28) - 8;
                v = disc ? 255 - v : v;
                im->rgb[((size_t)y * w + x) * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
        }
    return 0;
}

/* A 16 kHz test clip of n samples: a sweeping tone with a slow envelope and hashed noise. */
static float *synth_clip(size_t n) {
    float *pcm = malloc(sizeof *pcm * (n ? n : 1));
    if (!pcm) return NULL;
    for (size_t i = 0; i < n; i++) {
        double t = (double)i / 16000.0, f = 200.0 + 150.0 * t;
        unsigned hash = (unsigned)i * 2654435761u;
        pcm[i] = (float)(0.3 * sin(2 * 3.141592653589793 * f * t) * (0.6 + 0.4 * sin(t * 1.7)) + ((double)(hash >> 16) / 65536.0 - 0.5) * 0.05);
    }
    return pcm;
}

/* "WxH" (both 1..G4_IMAGE_MAX_SIDE), else 0. */
static int parse_wxh(const char *v, int *w, int *h) {
    char tail;
    return sscanf(v, "%dx%d%c", w, h, &tail) == 2 && *w >= 1 && *h >= 1 && *w <= G4_IMAGE_MAX_SIDE && *h <= G4_IMAGE_MAX_SIDE;
}

/* The bytes of the file `path` names (a regular file, at most 256 MiB): 1 when read, 0 when there
 * is no such file (the flag's value is then a size), -1 on error. */
static int read_input(const char *path, char **data, size_t *len) {
    if (!g4_file_exists(path)) return 0;
    return g4_read_file_bounded(path, (size_t)256 << 20, G4_READ_REGULAR, data, len) ? -1 : 1;
}

/* The image (a file or WxH) decoded and patchified into bm->p. */
static int prepare_image(g4_bench_media *bm, const char *image, g4_bench_media_info *info) {
    g4_rgb_image im;
    int w, h;
    double t0 = now_s();
    char *data = NULL;
    size_t len = 0;
    int got = (bm->vt = g4_vision_tower_get(bm->m)) ? read_input(image, &data, &len) : -1, rc = -1;
    if (got > 0) rc = g4_image_decode(data, len, &im);
    else if (got == 0 && parse_wxh(image, &w, &h)) rc = synth_image(w, h, &im) ? g4_fail("g4 bench: out of memory") : 0;
    else if (got == 0) g4_fail("g4 bench: --image %s: no such file, and not WxH (e.g. 768x768)", image);
    free(data);
    if (rc) return -1;
    info->width = im.w, info->height = im.h;
    rc = g4_image_patchify(&im, g4_vision_patch_size(bm->vt), g4_vision_pooling(bm->vt), g4_vision_default_soft_tokens(bm->vt), &bm->p);
    g4_rgb_image_free(&im);
    if (rc) return -1;
    info->image = 1;
    info->patches = bm->p.n_real, info->grid_w = bm->p.grid_w, info->grid_h = bm->p.grid_h;
    info->image_prep_s = now_s() - t0;
    return 0;
}

/* The clip (a file or a length in seconds) resampled and turned into log-mel frames. */
static int prepare_audio(g4_bench_media *bm, const char *audio, g4_bench_media_info *info) {
    float *pcm = NULL;
    size_t n = 0;
    double t0 = now_s();
    char *data = NULL;
    size_t len = 0;
    int got = (bm->at = g4_audio_tower_get(bm->m)) ? read_input(audio, &data, &len) : -1, rc = -1;
    if (got > 0) {
        rc = g4_audio_pcm16k(data, len, audio, &pcm, &n);
    } else if (got == 0) { /* a length in seconds: a synthesized clip */
        char *end;
        double sec = strtod(audio, &end);
        if (end == audio || *end || !(sec > 0 && sec <= 30))
            g4_fail("g4 bench: --audio %s: no such file, and not a length in seconds (0 < s <= 30)", audio);
        else if (!(pcm = synth_clip(n = (size_t)(sec * 16000 + 0.5)))) g4_fail("g4 bench: out of memory");
        else rc = 0;
    }
    free(data);
    if (rc) return -1;
    info->clip_s = (double)n / 16000.0;
    rc = g4_audio_log_mel(pcm, n, &bm->mel, &bm->mask, &bm->T);
    free(pcm);
    if (rc) return -1;
    info->audio = 1;
    info->mel_frames = bm->T;
    info->clip_prep_s = now_s() - t0;
    return 0;
}

g4_bench_media *g4_bench_media_new(const g4_model *m, const char *image, const char *audio, g4_bench_media_info *info) {
    g4_bench_media *bm = calloc(1, sizeof *bm);
    memset(info, 0, sizeof *info);
    if (!bm) {
        g4_fail("g4 bench: out of memory");
        return NULL;
    }
    bm->m = m;
    if ((image && prepare_image(bm, image, info)) || (audio && prepare_audio(bm, audio, info))) {
        g4_bench_media_free(bm);
        return NULL;
    }
    return bm;
}

void g4_bench_media_free(g4_bench_media *bm) {
    if (!bm) return;
    g4_image_patches_free(&bm->p);
    free(bm->mel), free(bm->mask);
    free(bm);
}

int g4_bench_media_encode(const g4_bench_media *bm, const g4_options *o, g4_bench_encode *image, g4_bench_encode *audio) {
    if (bm->vt) {
        float *e = NULL;
        g4_vision_stats st;
        int n = 0, rc = g4_vision_encode(bm->m, bm->vt, o, &bm->p, &e, &n, &st);
        free(e);
        if (rc) return -1;
        *image = (g4_bench_encode){st.seconds, st.linear_seconds, st.attention_seconds, 0, st.int_macs, st.float_macs, n};
    }
    if (bm->at) {
        float *e = NULL;
        g4_audio_stats st;
        int n = 0, rc = g4_audio_encode(bm->m, bm->at, o, bm->mel, bm->mask, bm->T, &e, &n, &st);
        free(e);
        if (rc) return -1;
        *audio = (g4_bench_encode){st.seconds, st.linear_seconds, st.attention_seconds, st.subsample_seconds, st.int_macs, st.float_macs, n};
    }
    return 0;
}

/* ---- one text linear ---- */

g4_bench_linear g4_bench_gate_proj(const g4_model *m, const g4_options *o, int layer) {
    g4_bench_linear r = {0, 0, 0};
    char name[128];
    snprintf(name, sizeof name, "model.language_model.layers.%d.mlp.gate_proj", layer);
    g4_session *s = g4_session_new(m, o);
    int H = g4_model_hidden_size(m), F = m->layers[layer].mlp_dim, iters = 0;
    float *x = calloc((size_t)64 * H, sizeof *x), *y = calloc((size_t)64 * F, sizeof *y);
    if (s && x && y) {
        for (size_t i = 0; i < (size_t)64 * H; i++) x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
        double t1 = now_s();
        while ((r.seconds = now_s() - t1) < 0.3 && (r.int_path = g4_session_run_linear(s, name, x, 64, y, NULL, NULL)) >= 0) iters++;
    }
    r.macs = (double)iters * 64 * H * F;
    g4_session_free(s);
    free(x), free(y);
    return r;
}

int g4_bench_n_layers(const g4_model *m) { return m->cfg.n_layers; }
