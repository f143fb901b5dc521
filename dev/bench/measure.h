/* What `g4 bench` measures inside the runtime (dev/bench/measure.c): the kernel levels by name,
 * a session moved to another level, the towers' encodes with their per-part times (--image,
 * --audio) and one text linear timed alone. The command (tools/bench_cmd.c) keeps the flags, the
 * repetitions and the printing; this is the part that needs the runtime's internals. */
#ifndef G4_DEV_BENCH_MEASURE_H
#define G4_DEV_BENCH_MEASURE_H

#include "g4.h"

/* ---- kernel levels (src/kernels/levels.h), as G4_DISPATCH names them ---- */

/* The level in use (G4_DISPATCH's, else the best), the one the dispatcher picks unforced, and the
 * CPU flags that choice is made from ("" when none). */
const char *g4_bench_level(void);
const char *g4_bench_level_best(void);
const char *g4_bench_cpu_flags(void);
/* The levels this build and CPU have, comma-separated; whether `name` is one of them. */
const char *g4_bench_levels(void);
int g4_bench_level_available(const char *name);
/* The session's later evaluations on level `name` (g4 bench --alternate steps); -1, changing
 * nothing, when this build or CPU lacks it. */
int g4_bench_session_level(g4_session *s, const char *name);

/* ---- g4 bench --image / --audio ---- */

/* The inputs, prepared once: an image (a PNG/JPEG file, or "WxH": a synthesized test image of
 * that size) decoded and cut into the model's patches, and a clip (a WAV file, or a length in
 * seconds, 0 < s <= 30: a synthesized 16 kHz clip) resampled and turned into log-mel frames. */
typedef struct g4_bench_media g4_bench_media;
typedef struct {
    int image, audio;                       /* which inputs it holds */
    int width, height, patches, grid_w, grid_h; /* the image and its patch grid */
    double image_prep_s;                    /* decode (or synthesis) + preprocessing */
    double clip_s;                          /* the clip's length */
    int mel_frames;
    double clip_prep_s;                     /* decode (or synthesis) + resampling + log-mel */
} g4_bench_media_info;
/* image, audio: NULL for none. Binds the model's towers. NULL with a one-line error naming the
 * flag (--image, --audio) or the file. */
g4_bench_media *g4_bench_media_new(const g4_model *m, const char *image, const char *audio, g4_bench_media_info *info);
void g4_bench_media_free(g4_bench_media *bm);

/* One encode: its seconds; of them the tower's linears (the session's profile), its attention and
 * (audio) the subsampling convolutions; the multiply-adds of its linears in int8 and in float. */
typedef struct {
    double seconds, linear_s, attention_s, subsample_s, int_macs, float_macs;
    int n_tokens;
} g4_bench_encode;
/* Encodes each input bm holds once with o on the current kernel level (image, audio: where to put
 * each one's figures; the one bm lacks is left alone). 0, or -1 with the tower's error. */
int g4_bench_media_encode(const g4_bench_media *bm, const g4_options *o, g4_bench_encode *image, g4_bench_encode *audio);

/* Layer `layer`'s mlp.gate_proj run alone (the forward pass's own linear step) on a 64-row chunk,
 * again and again for at least 0.3 s, in a session of o on the current level: the multiply-adds
 * done, their seconds, and whether the int8 path ran (1) or the float one (0). */
typedef struct {
    double macs, seconds;
    int int_path;
} g4_bench_linear;
g4_bench_linear g4_bench_gate_proj(const g4_model *m, const g4_options *o, int layer);
/* The text model's decoder layers. */
int g4_bench_n_layers(const g4_model *m);

#endif
