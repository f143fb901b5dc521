/* Every dispatch level's matmuls against the reference kernels, bit for bit (memcmp), on random
 * shapes with odd tails, several activation rows, every weight format, and 1-3 pool threads.
 * Weight buffers end exactly at the last packed byte so ASan catches any read past a row. The
 * elementwise and attention kernels are checked the same way against their references. */
#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

#include "check.h"
#include "g4.h"
#include "kernels/kernels.h"
#include "kernels/levels.h"
#include "kernels/pool.h"
#include "quant/pack.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void) {
    /* splitmix64: fixed seed, so a failure reproduces */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int rnd_int(int lo, int hi) { return lo + (int)(rnd() % (uint64_t)(hi - lo + 1)); }

/* A finite float of varied magnitude and sign, sometimes an exact (signed) zero. */
static float rnd_float(void) {
    uint64_t r = rnd();
    if ((r & 31) == 0) return (r & 32) ? -0.0f : 0.0f;
    uint32_t u = (uint32_t)(r >> 32);
    uint32_t exp = 127 - 24 + (uint32_t)((r >> 8) % 40); /* 2^-24 .. 2^15 */
    u = (u & 0x807FFFFFu) | exp << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct {
    int bits, in, out, n;
    size_t extra; /* row padding beyond the packed bytes */
    int extreme;  /* x = -128 with every raw weight field 0 (1) or all ones (2): the int16 corners; block-scaled
                     weights: every x at the fixed-point image's bound, -(2 - 2^-23) (X = -2^22) */
    int block;    /* inputs per weight scale (0: one per row) */
} shape;

typedef struct {
    g4_qweight w;
    uint8_t *wbuf;
    float *scale, *xf, *yref, *y;
    int8_t *xi;
    int32_t *aref, *a;
} problem;

static void make_problem(problem *p, const shape *s) {
    int bits = s->bits;
    size_t packed = bits == G4_WT_BF16 ? 2 * (size_t)s->in : g4_packed_row_bytes(bits, (size_t)s->in);
    size_t row_bytes = packed + s->extra;
    size_t total = (size_t)(s->out - 1) * row_bytes + packed;
    p->wbuf = malloc(total);
    for (size_t i = 0; i < total; i++) p->wbuf[i] = (uint8_t)rnd();
    /* Finite BF16 values only: which NaN payload an add propagates is not part of the contract. */
    for (int o = 0; bits == G4_WT_BF16 && o < s->out; o++)
        for (int i = 0; i < s->in; i++) {
            float f = rnd_float();
            uint32_t u;
            memcpy(&u, &f, 4);
            p->wbuf[(size_t)o * row_bytes + 2 * (size_t)i] = (uint8_t)(u >> 16);
            p->wbuf[(size_t)o * row_bytes + 2 * (size_t)i + 1] = (uint8_t)(u >> 24);
        }
    if (s->extreme) memset(p->wbuf, s->extreme == 2 ? 0xFF : bits == 8 ? 0x80 : 0x00, total);
    size_t n_scales = (size_t)s->out * (s->block ? (size_t)(s->in / s->block) : 1);
    p->scale = malloc(sizeof(float) * n_scales);
    for (size_t o = 0; o < n_scales; o++) p->scale[o] = (float)(rnd() % 100000 + 1) * 1e-6f;
    /* block scales are signed as Q4_0's are, sometimes 0 (a block of zeros) */
    for (size_t o = 0; s->block && o < n_scales; o++) p->scale[o] *= rnd() % 16 == 0 ? 0.0f : rnd() % 2 ? -1.0f : 1.0f;
    p->w = (g4_qweight){.bits = bits, .in = s->in, .out = s->out, .block = s->block, .row_bytes = row_bytes, .w = p->wbuf,
                        .w_scale = bits == G4_WT_BF16 ? NULL : p->scale};
    size_t nx = (size_t)s->n * s->in, ny = (size_t)s->n * s->out;
    p->xf = malloc(sizeof(float) * nx);
    p->xi = malloc(nx);
    for (size_t i = 0; i < nx; i++) {
        p->xf[i] = s->extreme && s->block ? -(2.0f - 0x1p-23f) : rnd_float();
        p->xi[i] = s->extreme ? -128 : (int8_t)rnd();
    }
    p->yref = malloc(sizeof(float) * ny);
    p->y = malloc(sizeof(float) * ny);
    p->aref = malloc(sizeof(int32_t) * ny);
    p->a = malloc(sizeof(int32_t) * ny);
    g4_ref_matmul_f32(&p->w, p->xf, s->n, p->yref);
    if (bits != G4_WT_BF16 && !s->block) g4_ref_matmul_i8(&p->w, p->xi, s->n, p->aref);
}

static void free_problem(problem *p) {
    free(p->wbuf);
    free(p->scale);
    free(p->xf);
    free(p->xi);
    free(p->yref);
    free(p->y);
    free(p->aref);
    free(p->a);
}

/* Runs one level on one problem against the reference results. */
static void run_level(const g4_kernels *k, problem *p, const shape *s, const char *what) {
    size_t ny = (size_t)s->n * s->out;
    memset(p->y, 0xA5, sizeof(float) * ny);
    k->matmul_f32(&p->w, p->xf, s->n, p->y);
    int ok = memcmp(p->y, p->yref, sizeof(float) * ny) == 0;
    CHECK(ok, "%s %s f32 bits=%d block=%d in=%d out=%d n=%d extra=%zu threads=%d", what, k->name, s->bits, s->block, s->in, s->out,
          s->n, s->extra, g4_kernels_threads());
    if (s->bits != G4_WT_BF16 && !s->block) { /* block-scaled weights have no int8-activation product */
        memset(p->a, 0xA5, sizeof(int32_t) * ny);
        k->matmul_i8(&p->w, p->xi, s->n, p->a);
        ok = memcmp(p->a, p->aref, sizeof(int32_t) * ny) == 0;
        CHECK(ok, "%s %s i8 bits=%d in=%d out=%d n=%d extra=%zu threads=%d", what, k->name, s->bits, s->in,
              s->out, s->n, s->extra, g4_kernels_threads());
    }
}

/* The levels this build and CPU have, the portable one (the references) first and the best one
 * last: the table's order reversed (find_levels). */
#define MAX_LEVELS 16
static const g4_kernels *levels[MAX_LEVELS];
static int n_levels;

static void find_levels(void) {
    for (int i = g4_kernels_count() - 1; i >= 0; i--) {
        const g4_kernels *k = g4_kernels_at(i);
        if (g4_kernels_level(k->name)) printf("ok level %s available\n", k->name);
        else SKIP_FEATURE("level %s: not built for this architecture or not supported by this CPU", k->name);
        if (g4_kernels_available(k) && n_levels < MAX_LEVELS) levels[n_levels++] = k;
    }
    CHECK(n_levels <= MAX_LEVELS && n_levels >= 1, "%d levels available (room for %d)", n_levels, MAX_LEVELS);
}

static void check_shape(const shape *s, const char *what) {
    problem p;
    make_problem(&p, s);
    for (int l = 0; l < n_levels; l++) run_level(levels[l], &p, s, what);
    free_problem(&p);
}

static void random_shapes(int count) {
    static const int bits_list[] = {2, 4, 8, 16};
    for (int c = 0; c < count; c++) {
        shape s = {.bits = bits_list[c % 4], .in = rnd_int(1, 300), .out = rnd_int(1, 70), .n = rnd_int(1, 9),
                   .extra = (rnd() % 4 == 0) ? (size_t)rnd_int(1, 5) : 0};
        if (c % 3 == 0) s.in |= 1; /* odd: partial bytes and partial vectors */
        check_shape(&s, "random");
    }
}

/* The fixture sizes, whole vectors and blocks, the E2B widths, and the prefill chunk. */
static void fixed_shapes(void) {
    static const int ins[] = {1, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 63, 64, 65, 96, 127, 128, 129, 1536};
    static const int bits_list[] = {2, 4, 8, 16};
    for (size_t b = 0; b < 4; b++)
        for (size_t i = 0; i < sizeof ins / sizeof *ins; i++) {
            shape s = {.bits = bits_list[b], .in = ins[i], .out = 13, .n = (int)(i % 6) + 1};
            check_shape(&s, "fixed");
        }
    shape big[] = {
        {.bits = 2, .in = 12288, .out = 9, .n = 2},
        {.bits = 2, .in = 1000, .out = 7, .n = 1}, /* decode rows: whole groups of 4 blocks, then 3 and a tail */
        {.bits = 4, .in = 6144, .out = 11, .n = 5},
        {.bits = 8, .in = 256, .out = 70, .n = 64},
        {.bits = 4, .in = 200, .out = 33, .n = 64},
        {.bits = G4_WT_BF16, .in = 1536, .out = 21, .n = 3},
        /* several K slices (the prefill path splits K when activation rows do not fit L1) */
        {.bits = 2, .in = 8191, .out = 7, .n = 3},
        {.bits = 4, .in = 4097, .out = 6, .n = 4},
        {.bits = 8, .in = 2049, .out = 9, .n = 5},
        {.bits = 2, .in = 12288, .out = 5, .n = 1, .extreme = 1},
        {.bits = 4, .in = 12288, .out = 5, .n = 3, .extreme = 1},
        {.bits = 8, .in = 12288, .out = 5, .n = 2, .extreme = 1},
        {.bits = 2, .in = 12288, .out = 5, .n = 2, .extreme = 2},
        {.bits = 4, .in = 12288, .out = 5, .n = 1, .extreme = 2},
        {.bits = 8, .in = 12288, .out = 5, .n = 3, .extreme = 2},
        /* the VNNI levels' 64-byte blocks: rows of whole blocks, one byte short of them and one
         * past, a prefill chunk of E2B's width, and tiles over several K slices */
        {.bits = 2, .in = 1536, .out = 21, .n = 64},
        {.bits = 4, .in = 1532, .out = 10, .n = 7},
        {.bits = 2, .in = 260, .out = 9, .n = 1},
        {.bits = 8, .in = 129, .out = 9, .n = 6},
        {.bits = 2, .in = 8191, .out = 7, .n = 6},
        {.bits = 4, .in = 4097, .out = 6, .n = 7},
        {.bits = 8, .in = 4097, .out = 9, .n = 9},
        /* int32 wrap-around: 140,000 products of -128 x -128 (8-bit) and 2^21 + 9 of -8 x -128
         * (4-bit) sum past 2^31, which the reference's sums wrap modulo 2^32 (vpdpbusd does not
         * saturate, and neither may any level) */
        {.bits = 8, .in = 140000, .out = 3, .n = 1, .extreme = 1},
        {.bits = 8, .in = 140000, .out = 5, .n = 5, .extreme = 1},
        {.bits = 8, .in = 140001, .out = 2, .n = 2, .extreme = 1},
        {.bits = 4, .in = (1 << 21) + 9, .out = 2, .n = 1, .extreme = 1},
    };
    for (size_t i = 0; i < sizeof big / sizeof *big; i++) check_shape(&big[i], "big");
}

/* acc rows of view v = rows [o0, o0 + v->out) of p's weight, through matmul, against the reference's
 * sums of the whole weight: 1 when every sum is bit-identical. */
static int view_matches(const problem *p, const shape *s, const g4_qweight *v, int o0, g4_matmul_i8_fn matmul) {
    int32_t *a = malloc(sizeof(int32_t) * (size_t)s->n * (size_t)v->out);
    memset(a, 0xA5, sizeof(int32_t) * (size_t)s->n * (size_t)v->out);
    matmul(v, p->xi, s->n, a);
    int ok = 1;
    for (int t = 0; t < s->n; t++)
        ok &= memcmp(a + (size_t)t * v->out, p->aref + (size_t)t * s->out + o0, sizeof(int32_t) * (size_t)v->out) == 0;
    free(a);
    return ok;
}

/* The weight-preparation hook's copies (kernels.h, g4_wprep) and the AMX level's (amx_pack.c),
 * on any CPU: every code read back from the tile layout equals the stored code (g4_packed_code);
 * a view of rows finds its first row in the copy, its tiles where it starts on a 16-row group and
 * none inside one; a copy is refused to another level, to codes copied elsewhere, to another shape
 * and to rows past its end; formats the tiles do not take get none; and every available level
 * given a weight that carries the copy (whole, and views of rows) gives the reference's sums:
 * the levels without the hook ignore it, the amx level (where the CPU has it) reads it. */
static void amx_prepared_layout(void) {
    static const int ins[] = {1, 5, 63, 64, 65, 129, 257, 300, 1000};
    int count = 0;
    for (int c = 0; c < 24; c++) {
        shape s = {.bits = c % 3 == 0 ? 2 : c % 3 == 1 ? 4 : 8, .in = ins[rnd() % 9], .out = rnd_int(1, 70), .n = rnd_int(1, 40),
                   .extra = rnd() % 3 == 0 ? (size_t)rnd_int(1, 70) : 0};
        problem p;
        make_problem(&p, &s);
        g4_wprep *prep = g4_amx_prepare(&p.w);
        size_t q = g4_amx_tile_vectors(s.bits, s.in), gbytes = q * G4_AMX_TILE_BYTES;
        CHECK(prep && prep->level == &g4_kernels_amx && prep->bytes == ((size_t)(s.out + 15) / 16 + 1) * gbytes,
              "amx prepare bits=%d in=%d out=%d: a copy of %zu bytes", s.bits, s.in, s.out, prep ? prep->bytes : 0);
        if (!prep) {
            free_problem(&p);
            continue;
        }
        long wrong = 0;
        for (int o = 0; o < s.out; o++)
            for (int i = 0; i < s.in; i++)
                wrong += g4_amx_prepared_code(prep, o, i) != g4_packed_code(p.wbuf + (size_t)o * p.w.row_bytes, s.bits, (size_t)i);
        CHECK(wrong == 0, "amx tile layout bits=%d in=%d out=%d extra=%zu: %ld codes differ from the stored ones", s.bits, s.in, s.out,
              s.extra, wrong);
        p.w.prep = prep;
        CHECK(g4_wprep_row0(&p.w, &g4_kernels_amx) == 0 && g4_amx_prepared_tiles(&p.w) == prep->data, "amx copy: the whole weight");
        for (int o0 = 1; o0 < s.out; o0 += rnd_int(1, 20)) {
            g4_qweight v = g4_qweight_rows(&p.w, o0, rnd_int(1, s.out - o0));
            const uint8_t *tiles = g4_amx_prepared_tiles(&v);
            CHECK(g4_wprep_row0(&v, &g4_kernels_amx) == o0 && tiles == (o0 % 16 ? NULL : prep->data + (size_t)(o0 / 16) * gbytes),
                  "amx copy: view of rows [%d, %d) out of %d", o0, o0 + v.out, s.out);
            for (int l = 0; l < n_levels; l++)
                if (g4_kernels_available(levels[l])) {
                    int ok = view_matches(&p, &s, &v, o0, levels[l]->matmul_i8);
                    CHECK(ok, "%s matmul_i8 on a view [%d, +%d) carrying the amx copy, bits=%d in=%d out=%d n=%d", levels[l]->name, o0, v.out,
                          s.bits, s.in, s.out, s.n);
                    count += ok;
                }
        }
        for (int l = 0; l < n_levels; l++)
            if (g4_kernels_available(levels[l])) {
                int ok = view_matches(&p, &s, &p.w, 0, levels[l]->matmul_i8);
                CHECK(ok, "%s matmul_i8 on a weight carrying the amx copy, bits=%d in=%d out=%d n=%d", levels[l]->name, s.bits, s.in, s.out, s.n);
                count += ok;
            }
        /* refused: another level's lookup, codes copied elsewhere or not at a row, another shape, rows past the end */
        size_t total = (size_t)(s.out - 1) * p.w.row_bytes + g4_packed_row_bytes(s.bits, (size_t)s.in);
        uint8_t *copy = malloc(total);
        memcpy(copy, p.wbuf, total);
        g4_qweight moved = p.w, shifted = p.w, wider = p.w, longer = p.w;
        moved.w = copy;
        shifted.w = p.wbuf + 1, shifted.out = s.out - 1;
        wider.in = s.in + 1;
        longer.out = s.out + 1;
        CHECK(g4_wprep_row0(&p.w, &g4_kernels_avx2) < 0 && g4_wprep_row0(&moved, &g4_kernels_amx) < 0 &&
                  (s.out < 2 || p.w.row_bytes < 2 || g4_wprep_row0(&shifted, &g4_kernels_amx) < 0) && g4_wprep_row0(&wider, &g4_kernels_amx) < 0 &&
                  g4_wprep_row0(&longer, &g4_kernels_amx) < 0 && !g4_amx_prepared_tiles(&moved) && !g4_amx_prepared_tiles(&longer),
              "amx copy refused to another level, moved codes, a misaligned view, another shape, rows past the end (bits=%d in=%d out=%d)",
              s.bits, s.in, s.out);
        free(copy);
        g4_wprep_free(prep);
        free_problem(&p);
    }
    shape blocked = {.bits = 4, .in = 64, .out = 3, .n = 1, .block = 32}, bf16 = {.bits = G4_WT_BF16, .in = 8, .out = 3, .n = 1};
    problem pb, pf;
    make_problem(&pb, &blocked);
    make_problem(&pf, &bf16);
    CHECK(!g4_amx_prepare(&pb.w) && !g4_amx_prepare(&pf.w), "amx prepare takes no block-scaled or BF16 weight");
    free_problem(&pb);
    free_problem(&pf);
    /* the amx level's hook copies the 8-bit weights alone (amx.c, amx_prepare: the measured choice) */
    if (g4_kernels_amx.built) {
        shape sizes[3] = {{.bits = 2, .in = 100, .out = 20, .n = 1}, {.bits = 4, .in = 100, .out = 20, .n = 1}, {.bits = 8, .in = 100, .out = 20, .n = 1}};
        for (int b = 0; b < 3; b++) {
            problem pp;
            make_problem(&pp, &sizes[b]);
            g4_wprep *c = g4_kernels_amx.prepare(&pp.w);
            CHECK((c != NULL) == (sizes[b].bits == 8) && (!c || c->level == &g4_kernels_amx), "amx level's hook on a %d-bit weight: %s",
                  sizes[b].bits, c ? "a copy" : "none");
            g4_wprep_free(c);
            free_problem(&pp);
        }
    }
    /* the hook is the amx level's alone: every other level reads the stored layout */
    for (int l = 0; l < g4_kernels_count(); l++) {
        const g4_kernels *k = g4_kernels_at(l);
        CHECK((k->prepare != NULL) == (k == &g4_kernels_amx && k->built), "%s: prepare hook %s", k->name, k->prepare ? "set" : "unset");
    }
    printf("ok amx prepared weights: tile layout equals the stored codes; %d level runs with the copy attached bit-identical (threads=%d)\n",
           count, g4_kernels_threads());
}

/* The AMX level's tiles on every shape edge, called directly (the level's matmul_i8 hands fewer
 * than its threshold of rows to the vector levels): K (packed bytes) not a multiple of the 64-byte
 * tile row, weight rows and activation rows not multiples of 16 or of the 32 a thread takes,
 * padded rows (row_bytes past the packed bytes), and int32 wrap-around (the extreme shapes of
 * fixed_shapes, with a tile's rows). A CPU without AMX reports a feature skip. */
static void amx_tile_shapes(void) {
    if (!g4_kernels_level("amx")) {
        SKIP_FEATURE("amx tiles: the CPU lacks amx_tile/amx_int8 (or the OS does not grant the tile state)%s", "");
        return;
    }
    static const int ins[] = {1, 5, 63, 64, 65, 127, 128, 129, 255, 256, 257, 300, 513, 1000, 1536};
    static const int outs[] = {1, 15, 16, 17, 31, 32, 33, 47, 48, 70};
    static const int ns[] = {1, 2, 8, 15, 16, 17, 31, 32, 33, 47, 64};
    int count = 0;
    for (int c = 0; c < 90; c++) {
        shape s = {.bits = c % 3 == 0 ? 2 : c % 3 == 1 ? 4 : 8, .in = ins[rnd() % 15], .out = outs[rnd() % 10], .n = ns[rnd() % 11],
                   .extra = rnd() % 3 == 0 ? (size_t)rnd_int(1, 70) : 0};
        shape big[] = {
            {.bits = 8, .in = 140000, .out = 3, .n = 17, .extreme = 1},
            {.bits = 8, .in = 140001, .out = 33, .n = 2, .extreme = 1},
            {.bits = 8, .in = 70000, .out = 17, .n = 33, .extreme = 2},
            {.bits = 2, .in = 12288, .out = 35, .n = 18, .extreme = 2},
            {.bits = 4, .in = 6144, .out = 40, .n = 40},
        };
        for (int k = -1; k < (c == 0 ? 5 : 0); k++) {
            const shape *sh = k < 0 ? &s : &big[k];
            problem p;
            make_problem(&p, sh);
            size_t ny = (size_t)sh->n * sh->out;
            memset(p.a, 0xA5, sizeof(int32_t) * ny);
            g4_amx_matmul_i8_tiles(&p.w, p.xi, sh->n, p.a);
            int ok = memcmp(p.a, p.aref, sizeof(int32_t) * ny) == 0;
            CHECK(ok, "amx tiles bits=%d in=%d out=%d n=%d extra=%zu extreme=%d threads=%d", sh->bits, sh->in, sh->out, sh->n, sh->extra,
                  sh->extreme, g4_kernels_threads());
            count += ok;
            /* the same from the level's prepared copy: the whole weight, views from a 16-row group
             * (tiles from the copy) and from inside one (the stored codes) */
            g4_wprep *prep = g4_amx_prepare(&p.w);
            p.w.prep = prep;
            ok = prep && g4_amx_prepared_tiles(&p.w) && view_matches(&p, sh, &p.w, 0, g4_amx_matmul_i8_tiles);
            for (int o0 = 16; ok && o0 < sh->out; o0 += 9) {
                g4_qweight v = g4_qweight_rows(&p.w, o0, sh->out - o0);
                ok = view_matches(&p, sh, &v, o0, g4_amx_matmul_i8_tiles);
            }
            CHECK(ok, "amx tiles from the prepared copy bits=%d in=%d out=%d n=%d extra=%zu extreme=%d threads=%d", sh->bits, sh->in, sh->out,
                  sh->n, sh->extra, sh->extreme, g4_kernels_threads());
            count += ok;
            run_level(&g4_kernels_amx, &p, sh, "amx"); /* the level's own choice per shape, and its f32 path, with the copy */
            p.w.prep = NULL;
            g4_wprep_free(prep);
            free_problem(&p);
        }
    }
    printf("ok amx tiles: %d shapes bit-identical to the reference (threads=%d)\n", count, g4_kernels_threads());
}

/* Block-scaled weights (one scale per `block` inputs): llama.cpp's Q4_0 and Q8_0 layouts (blocks of
 * 32, which the SIMD levels' tiles take), a 2-bit and a 64-input variant (which they hand to the
 * portable kernel), remainder tiles (out not a multiple of 4), rows past a tile's 4, signed and
 * zero scales, and activations at the fixed-point bound: every level equals the reference bit
 * for bit. */
static void block_shapes(void) {
    static const int bits_list[] = {4, 8, 4, 8, 2};
    static const int block_list[] = {32, 32, 64, 64, 32};
    for (int c = 0; c < 40; c++) {
        int bits = bits_list[c % 5], block = block_list[c % 5];
        shape s = {.bits = bits, .block = block, .in = block * rnd_int(1, 20), .out = rnd_int(1, 37), .n = rnd_int(1, 9),
                   .extra = (rnd() % 4 == 0) ? (size_t)rnd_int(1, 5) : 0};
        check_shape(&s, "blocks");
    }
    shape big[] = {
        {.bits = 4, .block = 32, .in = 1536, .out = 37, .n = 64},
        {.bits = 4, .block = 32, .in = 12288, .out = 6, .n = 1},
        {.bits = 8, .block = 32, .in = 1536, .out = 41, .n = 5},
        {.bits = 4, .block = 32, .in = 6144, .out = 5, .n = 3, .extreme = 1}, /* raw fields 0: D = -2^30 per block */
        {.bits = 4, .block = 32, .in = 6144, .out = 5, .n = 2, .extreme = 2}, /* raw fields 15 */
        {.bits = 8, .block = 32, .in = 2048, .out = 6, .n = 2, .extreme = 1}, /* codes -128: D = 2^34 */
        {.bits = 8, .block = 32, .in = 2048, .out = 3, .n = 4, .extreme = 2}, /* codes -1 */
    };
    for (size_t i = 0; i < sizeof big / sizeof *big; i++) check_shape(&big[i], "blocks big");
}

/* The fold's order shows: scales 2^60, 1, -2^60 on three equal blocks make the sum in block order
 * exactly 0 (the middle term is lost against 2^60, then the outer two cancel), where any other
 * order or a rounding more or less keeps a trace; every level must give +0. */
static void blocks_fold_order(void) {
    for (int bits = 4; bits <= 8; bits += 4) {
        int in = 96, out = 6, n = 2;
        size_t rb = g4_packed_row_bytes(bits, (size_t)in);
        uint8_t *w = malloc(rb * (size_t)out);
        memset(w, bits == 4 ? 0x99 : 0x01, rb * (size_t)out); /* every code 1 */
        float scale[6 * 3], x[2 * 96], y[2 * 6];
        for (int o = 0; o < out; o++) scale[3 * o] = 0x1p60f, scale[3 * o + 1] = 1.0f, scale[3 * o + 2] = -0x1p60f;
        for (int i = 0; i < n * in; i++) x[i] = 1.0f;
        g4_qweight qw = {.bits = bits, .in = in, .out = out, .block = 32, .row_bytes = rb, .w = w, .w_scale = scale};
        for (int l = 0; l < n_levels; l++) {
            memset(y, 0xA5, sizeof y);
            levels[l]->matmul_f32(&qw, x, n, y);
            int zero = 1;
            for (int i = 0; i < n * out; i++) zero &= y[i] == 0 && !signbit(y[i]);
            CHECK(zero, "%s: %d-bit block fold 2^60, 1, -2^60 is not +0 (got %g)", levels[l]->name, bits, (double)y[0]);
        }
        free(w);
    }
}

/* The block-scaled reference against an independent long double sum of x[i] * code * its block's
 * scale: within the fixed-point image's half step per element plus one f32 rounding; rows with a
 * NaN or an infinity give NaN. */
static void blocks_accuracy(void) {
    int bad = 0, checked = 0;
    for (int c = 0; c < 40; c++) {
        int bits = c % 2 ? 8 : 4, B = 32, in = B * rnd_int(1, 24), out = rnd_int(1, 7);
        size_t rb = g4_packed_row_bytes(bits, (size_t)in), nb = (size_t)in / B;
        uint8_t *w = malloc(rb * (size_t)out);
        for (size_t i = 0; i < rb * (size_t)out; i++) w[i] = (uint8_t)rnd();
        float *scale = malloc(sizeof(float) * (size_t)out * nb), *x = malloc(sizeof(float) * (size_t)in), y[8];
        for (size_t i = 0; i < (size_t)out * nb; i++) scale[i] = ((float)(rnd() % 2001) - 1000.0f) * 1e-4f;
        for (int i = 0; i < in; i++) x[i] = rnd_float() * (c % 5 == 0 && i % 37 == 0 ? 1e5f : 1.0f);
        g4_qweight qw = {.bits = bits, .in = in, .out = out, .block = B, .row_bytes = rb, .w = w, .w_scale = scale};
        g4_ref_matmul_f32(&qw, x, 1, y);
        float mx = 0;
        for (int i = 0; i < in; i++) mx = fabsf(x[i]) > mx ? fabsf(x[i]) : mx;
        int e = 0;
        if (mx > 0) frexpf(mx, &e);
        long double step = ldexpl(1.0L, e - G4_FIX_BITS);
        for (int o = 0; o < out; o++) {
            long double exact = 0, slack = 0;
            for (int i = 0; i < in; i++) {
                long double wv = (long double)g4_packed_code(w + (size_t)o * rb, bits, (size_t)i) * scale[(size_t)o * nb + (size_t)i / B];
                exact += (long double)x[i] * wv;
                slack += fabsl(wv) * step / 2;
            }
            if (fabsl((long double)y[o] - exact) > slack + fabsl(exact) * 1.2e-7L + 1e-30L) bad++;
            checked++;
        }
        x[in / 3] = c % 2 ? NAN : INFINITY;
        g4_ref_matmul_f32(&qw, x, 1, y);
        for (int o = 0; o < out; o++) CHECK(isnan(y[o]), "block-scaled: a non-finite row gives NaN (bits %d in %d)", bits, in);
        free(w);
        free(scale);
        free(x);
    }
    CHECK(bad == 0, "block-scaled reference within the fixed-point bound of the exact sum (%d of %d outside)", bad, checked);
    printf("ok block-scaled reference: %d outputs within the fixed-point bound of a long double sum\n", checked);
}

/* ---- elementwise and attention kernels against their references ---- */

/* A float that is sometimes special: NaN, +-inf, +-0, a half-way point of the quantizer grid, or
 * out of the int8 range; otherwise of varied magnitude around the scale. */
static float rnd_act(float scale) {
    switch (rnd() % 16) {
    case 0: return NAN;
    case 1: return (rnd() & 1) ? INFINITY : -INFINITY;
    case 2: return (rnd() & 1) ? 0.0f : -0.0f;
    case 3: return ((float)rnd_int(-140, 140) + 0.5f) * scale; /* ties, some exact */
    case 4: return (float)rnd_int(-128, 127) * scale;           /* exact grid values */
    case 5: return rnd_float();
    default: return ((float)(int)(rnd() % 600001) - 300000.0f) * 1e-3f * scale;
    }
}

static int same_bits(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

static void check_quantizers(const g4_kernels *k) {
    static const float scales[] = {0.0123f, 1.0f, 3e-5f, 0.5f, 17.25f};
    for (int c = 0; c < 60; c++) {
        float scale = scales[c % 5];
        g4_quantizer q;
        g4_quantizer_init(&q, scale, c % 7 == 3 ? rnd_int(-5, 5) : 0, c % 4 == 1 ? G4_ROUND_AWAY : G4_ROUND_EVEN,
                          c % 3 == 2 ? G4_QDIV_DIVIDE : G4_QDIV_RECIPROCAL);
        size_t n = (size_t)rnd_int(0, 300);
        float *x = malloc(sizeof(float) * (n + 1)), *fr = malloc(sizeof(float) * (n + 1)), *fk = malloc(sizeof(float) * (n + 1));
        int8_t *cr = malloc(n + 1), *ck = malloc(n + 1);
        for (size_t i = 0; i < n; i++) x[i] = rnd_act(scale);
        g4_ref_quantize(&q, x, n, cr);
        memset(ck, 0x5A, n + 1);
        k->quantize(&q, x, n, ck);
        CHECK(same_bits(cr, ck, n) && ck[n] == 0x5A, "%s quantize n=%zu scale=%g case %d", k->name, n, (double)scale, c);
        memcpy(fr, x, sizeof(float) * n);
        memcpy(fk, x, sizeof(float) * n);
        fk[n] = 7.0f;
        g4_ref_fake_quant(&q, fr, n);
        k->fake_quant(&q, fk, n);
        CHECK(same_bits(fr, fk, sizeof(float) * n) && fk[n] == 7.0f, "%s fake_quant n=%zu case %d", k->name, n, c);
        free(x);
        free(fr);
        free(fk);
        free(cr);
        free(ck);
    }
}

static void check_requant(const g4_kernels *k) {
    for (int c = 0; c < 40; c++) {
        int n = rnd_int(1, 5), out = rnd_int(1, 90);
        size_t len = (size_t)n * out;
        int32_t *acc = malloc(sizeof(int32_t) * len);
        float *m32 = malloc(sizeof(float) * (size_t)out), *ws = malloc(sizeof(float) * (size_t)out);
        float *yr = malloc(sizeof(float) * len), *yk = malloc(sizeof(float) * len);
        for (size_t i = 0; i < len; i++) {
            uint64_t r = rnd();
            acc[i] = r % 8 == 0 ? (r & 8 ? INT32_MAX : INT32_MIN) : r % 8 == 1 ? (int32_t)(r >> 40) : (int32_t)(r >> 32) % 100000;
        }
        for (int o = 0; o < out; o++) {
            m32[o] = (float)(rnd() % 100000 + 1) * 1e-7f;
            if (o % 5 == 0) m32[o] = 0.5f; /* acc * 0.5 lands on ties */
            ws[o] = (float)(rnd() % 100000 + 1) * 1e-6f;
        }
        float s_out = (float)(rnd() % 1000 + 1) * 1e-3f, s_in = (float)(rnd() % 1000 + 1) * 1e-4f;
        g4_ref_requant_f32(acc, n, out, m32, s_out, yr);
        k->requant_f32(acc, n, out, m32, s_out, yk);
        CHECK(same_bits(yr, yk, sizeof(float) * len), "%s requant_f32 n=%d out=%d", k->name, n, out);
        g4_ref_acc_scale(acc, n, out, s_in, ws, yr);
        k->acc_scale(acc, n, out, s_in, ws, yk);
        CHECK(same_bits(yr, yk, sizeof(float) * len), "%s acc_scale n=%d out=%d", k->name, n, out);
        free(acc);
        free(m32);
        free(ws);
        free(yr);
        free(yk);
    }
}

static void check_gelu(const g4_kernels *k) {
    static const float scales[] = {0.0123f, 0.25f, 3e-3f, 0.0f, 1.5f};
    for (int c = 0; c < 40; c++) {
        float scale = scales[c % 5];
        size_t n = c % 4 == 0 ? (size_t)rnd_int(1, 70) : (size_t)rnd_int(60, 3000);
        float *g = malloc(sizeof(float) * n), *m = malloc(sizeof(float) * n), *gr = malloc(sizeof(float) * n);
        for (size_t i = 0; i < n; i++) {
            /* mostly dequantized codes (the table path), with anything else mixed in */
            g[i] = rnd() % 8 ? (float)rnd_int(-128, 127) * (scale ? scale : 0.01f) : rnd_act(scale ? scale : 1.0f);
            m[i] = rnd() % 64 ? rnd_act(0.05f) : NAN;
        }
        memcpy(gr, g, sizeof(float) * n);
        g4_ref_gelu_mul(gr, m, n);
        k->gelu_mul(g, m, n, scale);
        CHECK(same_bits(gr, g, sizeof(float) * n), "%s gelu_mul n=%zu scale=%g", k->name, n, (double)scale);
        free(g);
        free(m);
        free(gr);
    }
}

/* |got - want| in units of the last place of want rounded to f32, rounded to an integer. */
static int ulp_error(float got, double want) {
    float wf = (float)want;
    double ulp = fabsf(nextafterf(wf, INFINITY) - wf);
    return (int)ceil(fabs((double)got - want) / ulp - 0.5);
}

/* g4_tanhf against libm's double tanh: within 2 ulp over a sweep of magnitudes and signs, exact
 * at 0 and +-inf, NaN for NaN. */
static void check_tanhf(void) {
    int worst = 0;
    for (int k = 0; k < 200000; k++) {
        float z = k < 100000 ? ldexpf((float)(rnd() % 1000000) / 1e6f, rnd_int(-30, 5)) : (float)(k - 150000) * 2.1e-4f;
        if (rnd() & 1) z = -z;
        double want = tanh((double)z);
        int err = ulp_error(g4_tanhf(z), want);
        if (err > worst) worst = err;
    }
    CHECK(worst <= 2, "g4_tanhf within 2 ulp of tanh (worst %d)", worst);
    CHECK(g4_tanhf(0.0f) == 0.0f && !signbit(g4_tanhf(0.0f)) && signbit(g4_tanhf(-0.0f)), "tanh(+-0) = +-0");
    CHECK(g4_tanhf(INFINITY) == 1.0f && g4_tanhf(-INFINITY) == -1.0f && isnan(g4_tanhf(NAN)), "tanh(+-inf), tanh(NaN)");
}

/* g4_expf against libm's double exp: within 1 ulp where the result is normal and within one
 * subnormal step below that, exact at the special values. */
static void check_expf(void) {
    int worst = 0, sub_bad = 0;
    for (int k = 0; k < 300000; k++) {
        float x = k < 200000 ? (float)((double)(rnd() % 2000001) / 2000000.0 * 200.0 - 108.0)
                             : ldexpf((float)(rnd() % 1000000) / 1e6f, rnd_int(-40, 6)) * ((rnd() & 1) ? 1.0f : -1.0f);
        double want = exp((double)x);
        float got = g4_expf(x), wf = (float)want;
        if (wf >= FLT_MIN && isfinite(wf)) {
            int err = ulp_error(got, want);
            if (err > worst) worst = err;
        } else if (wf < FLT_MIN) {
            sub_bad += fabs((double)got - want) > ldexp(1.0, -149);
        } else {
            sub_bad += !(isinf(got) && got > 0);
        }
    }
    CHECK(worst <= 1, "g4_expf within 1 ulp of exp (worst %d)", worst);
    CHECK(sub_bad == 0, "g4_expf within a subnormal step below FLT_MIN, inf above FLT_MAX (%d bad)", sub_bad);
    CHECK(g4_expf(0.0f) == 1.0f && g4_expf(-0.0f) == 1.0f && g4_expf(-INFINITY) == 0.0f && g4_expf(INFINITY) == INFINITY &&
              isnan(g4_expf(NAN)) && g4_expf(-200.0f) == 0.0f,
          "expf(+-0), expf(+-inf), expf(NaN), expf(-200)");
}

/* Each level's softcap equals the reference loop bit for bit, NaN and infinities included. */
static void check_softcap(const g4_kernels *k) {
    size_t n = (size_t)rnd_int(1, 5000);
    float *x = malloc(sizeof(float) * n), *xr = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) x[i] = xr[i] = rnd_act(1.0f) * 40.0f * (i % 7 == 0 ? 100.0f : 1.0f);
    if (n > 3) x[1] = xr[1] = NAN, x[2] = xr[2] = INFINITY, x[3] = xr[3] = -0.0f;
    g4_ref_softcap(xr, n, 30.0f);
    k->softcap(x, n, 30.0f);
    CHECK(same_bits(xr, x, sizeof(float) * n), "%s softcap n=%zu", k->name, n);
    free(x);
    free(xr);
}

typedef struct {
    int n, nh, hd, group, ctx, int8_k, int8_v;
    int shared; /* every row attends to the same positions [lo, ctx - 1]: the tiled schedule (vision) */
} attn_shape;

static void check_attention_shape(const attn_shape *as) {
    int n_kv = as->nh / as->group, kvw = n_kv * as->hd, w = as->nh * as->hd;
    size_t cache = (size_t)as->ctx * kvw;
    int8_t *kq = malloc(cache), *vq = malloc(cache);
    float *kf = malloc(sizeof(float) * cache), *vf = malloc(sizeof(float) * cache);
    float *q = malloc(sizeof(float) * (size_t)as->n * w), *oref = malloc(sizeof(float) * (size_t)as->n * w),
          *out = malloc(sizeof(float) * (size_t)as->n * w);
    for (size_t i = 0; i < cache; i++) {
        kq[i] = (int8_t)rnd();
        vq[i] = (int8_t)rnd();
        kf[i] = ((float)(int)(rnd() % 20001) - 10000.0f) * 1e-4f;
        vf[i] = rnd() % 50 ? ((float)(int)(rnd() % 20001) - 10000.0f) * 1e-4f : -0.0f;
    }
    for (size_t i = 0; i < (size_t)as->n * w; i++) q[i] = ((float)(int)(rnd() % 20001) - 10000.0f) * 3e-4f;
    g4_attn_row *rows = malloc(sizeof *rows * (size_t)as->n);
    int shared_lo = rnd() % 2 ? 0 : rnd_int(0, as->ctx / 4);
    for (int t = 0; t < as->n; t++) {
        int hi = as->shared ? as->ctx - 1 : rnd_int(0, as->ctx - 1), lo = as->shared ? shared_lo : rnd() % 3 ? 0 : rnd_int(0, hi);
        rows[t] = (g4_attn_row){.kq = as->int8_k ? kq : NULL, .vq = as->int8_v ? vq : NULL, .kf = as->int8_k ? NULL : kf,
                                .vf = as->int8_v ? NULL : vf, .k_scale = as->int8_k ? 0.0371f : 0,
                                .v_scale = as->int8_v ? 0.0113f : 0,
                                .lo = lo, .hi = hi};
    }
    g4_attn a = {.n = as->n, .n_heads = as->nh, .head_dim = as->hd, .kv_width = kvw, .group = as->group, .q = q, .out = oref,
                 .rows = rows};
    g4_ref_attention(&a);
    for (int l = 0; l < n_levels; l++) {
        const g4_kernels *k = levels[l];
        memset(out, 0xA5, sizeof(float) * (size_t)as->n * w);
        a.out = out;
        k->attention(&a);
        CHECK(same_bits(oref, out, sizeof(float) * (size_t)as->n * w),
              "%s attention n=%d heads=%d hd=%d group=%d ctx=%d k8=%d v8=%d shared=%d threads=%d", k->name, as->n, as->nh, as->hd, as->group,
              as->ctx, as->int8_k, as->int8_v, as->shared, g4_kernels_threads());
    }
    free(rows);
    free(kq);
    free(vq);
    free(kf);
    free(vf);
    free(q);
    free(oref);
    free(out);
}

static void check_attention(void) {
    static const int hds[] = {8, 12, 16, 20, 32, 64, 256};
    static const int groups[][2] = {{1, 1}, {2, 1}, {2, 2}, {4, 2}, {8, 8}, {8, 4}, {6, 3}, {8, 1}};
    for (int c = 0; c < 40; c++) {
        attn_shape as = {.n = rnd_int(1, 5), .hd = hds[c % 7], .ctx = rnd_int(1, 80), .int8_k = c % 4 != 1, .int8_v = c % 4 != 2};
        as.nh = groups[c % 8][0];
        as.group = groups[c % 8][1];
        check_attention_shape(&as);
    }
    /* the E2B shapes: one decode row and a prefill chunk, long enough for several V blocks */
    attn_shape big[] = {{1, 8, 256, 8, 600, 1, 1, 0}, {1, 8, 512, 8, 300, 1, 1, 0}, {3, 8, 512, 8, 300, 0, 0, 0}, {8, 8, 256, 8, 200, 1, 1, 0}};
    for (size_t i = 0; i < sizeof big / sizeof *big; i++) check_attention_shape(&big[i]);
    /* many rows over one key range, as the vision tower's bidirectional attention (query tiles of
     * 16 x key blocks of 64): rows and keys not multiples of the tiles, grouped heads, int8 and f32
     * caches, a head dim with a tail (12: the row schedule), and the E2B tower's 12 x 64 heads */
    attn_shape shared[] = {{33, 2, 16, 1, 70, 0, 0, 1},   {100, 12, 64, 1, 150, 0, 0, 1}, {47, 8, 32, 4, 129, 1, 1, 1},
                           {40, 6, 64, 3, 64, 1, 0, 1},   {64, 2, 12, 1, 90, 0, 1, 1},    {200, 12, 64, 1, 200, 0, 0, 1},
                           {32, 4, 256, 2, 65, 1, 1, 1}};
    for (size_t i = 0; i < sizeof shared / sizeof *shared; i++) check_attention_shape(&shared[i]);
}

static void elementwise_kernels(void) {
    for (int l = 0; l < n_levels; l++) {
        const g4_kernels *k = levels[l];
        check_quantizers(k);
        check_requant(k);
        check_gelu(k);
        check_softcap(k);
    }
    check_attention();
}

/* Two threads issuing matmuls at once: one gets the pool, the other runs inline; both exact. */
static void *concurrent_caller(void *arg) {
    const problem *p = arg;
    const g4_kernels *k = g4_kernels_get();
    int32_t *a = malloc(sizeof(int32_t) * (size_t)p->w.out * 4);
    long bad = 0;
    for (int rep = 0; rep < 20; rep++) {
        k->matmul_i8(&p->w, p->xi, 4, a);
        bad += memcmp(a, p->aref, sizeof(int32_t) * (size_t)p->w.out * 4) != 0;
    }
    free(a);
    return (void *)bad;
}

static void concurrency(void) {
    shape s = {.bits = 4, .in = 160, .out = 64, .n = 4};
    problem p;
    make_problem(&p, &s);
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, concurrent_caller, &p);
    for (int i = 0; i < 2; i++) {
        void *r;
        pthread_join(th[i], &r);
        CHECK(r == NULL, "concurrent caller %d: %ld mismatching runs", i, (long)(intptr_t)r);
    }
    free_problem(&p);
}

/* Every item of a pool job runs exactly once, whatever the thread count and chunking. */
typedef struct {
    int *hits;
    pthread_mutex_t mu;
} pool_probe;

static void probe_fn(void *ctx, int b, int e) {
    pool_probe *p = ctx;
    pthread_mutex_lock(&p->mu);
    for (int i = b; i < e; i++) p->hits[i]++;
    pthread_mutex_unlock(&p->mu);
}

/* Background items: each runs exactly once, every item below `upto` is done when
 * g4_pool_background_wait(upto) returns, a nested g4_pool_for inside an item completes, and a
 * second set (another thread's, or too many items) is refused while one is active. */
typedef struct {
    pool_probe p;
    int nested_bad;
} bg_probe;

static void bg_item(void *ctx, int b, int e) {
    bg_probe *q = ctx;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do /* long enough that a waiter may well find an item in flight */
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 20000);
    int hits[4] = {0};
    pool_probe inner = {.hits = hits};
    pthread_mutex_init(&inner.mu, NULL);
    g4_pool_for(4, 1, 1e12, probe_fn, &inner); /* from a worker: runs inline */
    pthread_mutex_destroy(&inner.mu);
    for (int i = 0; i < 4; i++)
        if (hits[i] != 1) {
            pthread_mutex_lock(&q->p.mu);
            q->nested_bad++;
            pthread_mutex_unlock(&q->p.mu);
        }
    probe_fn(&q->p, b, e); /* counted once it is done */
}

static void *bg_intruder(void *arg) {
    int *got = arg;
    *got = g4_pool_background(3, bg_item, NULL);
    return NULL;
}

static void pool_background_cases(void) {
    static const int sizes[] = {1, 7, 500, 2048};
    int bad = 0, early = 0, nested = 0, refused = 1;
    for (int threads = 1; threads <= 3; threads++) {
        g4_kernels_set_threads(threads);
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            int items = sizes[k], job_hits[64] = {0};
            bg_probe q = {.p = {.hits = calloc((size_t)items, sizeof(int))}};
            pool_probe job = {.hits = job_hits};
            pthread_mutex_init(&q.p.mu, NULL);
            pthread_mutex_init(&job.mu, NULL);
            CHECK(g4_pool_background(items, bg_item, &q) == 1, "a background set of %d items refused", items);
            pthread_t th;
            int got = -1;
            if (pthread_create(&th, NULL, bg_intruder, &got) == 0) {
                pthread_join(th, NULL);
                refused &= got == 0;
            }
            refused &= g4_pool_background(1, bg_item, &q) == 0; /* one set at a time, even its owner's */
            for (int upto = 1; upto <= items; upto += 1 + upto / 3) {
                g4_pool_for(64, 1, 1e12, probe_fn, &job); /* jobs between waits: idle workers pick items up */
                g4_pool_background_wait(upto);
                pthread_mutex_lock(&q.p.mu);
                for (int i = 0; i < upto; i++) early += q.p.hits[i] != 1;
                pthread_mutex_unlock(&q.p.mu);
            }
            g4_pool_background_end();
            for (int i = 0; i < items; i++) bad += q.p.hits[i] != 1;
            nested += q.nested_bad;
            pthread_mutex_destroy(&q.p.mu);
            pthread_mutex_destroy(&job.mu);
            free(q.p.hits);
        }
    }
    CHECK(g4_pool_background(0, bg_item, NULL) == 0 && g4_pool_background(2049, bg_item, NULL) == 0, "empty or oversized sets accepted");
    CHECK(bad == 0, "%d background items not run exactly once", bad);
    CHECK(early == 0, "%d background items not done when waited for", early);
    CHECK(nested == 0, "%d nested pool jobs inside background items went wrong", nested);
    CHECK(refused, "a second background set was accepted while one was active");
}

/* g4_pool_memcpy: every byte copied, none beyond, whatever the slices and threads. */
static void pool_memcpy_cases(void) {
    static const size_t sizes[] = {0, 1, 1000, 4095, 4096, 4097, 3 * 4096 + 17, (5u << 20) + 3};
    const size_t cap = (5u << 20) + 64;
    unsigned char *from = malloc(cap), *to = malloc(cap);
    for (size_t i = 0; i < cap; i++) from[i] = (unsigned char)(i * 131 + (i >> 9));
    int bad = 0;
    g4_pool_set_min_work(0); /* split even the small copies */
    for (int threads = 1; threads <= 3; threads++) {
        g4_kernels_set_threads(threads);
        for (size_t c = 0; c < sizeof sizes / sizeof *sizes; c++) {
            size_t slice = sizes[c] > (1u << 20) ? (size_t)2 << 20 : 4096;
            memset(to, 0xEE, cap);
            g4_pool_memcpy(to, from, sizes[c], slice);
            int ok = memcmp(to, from, sizes[c]) == 0;
            for (size_t i = sizes[c]; i < sizes[c] + 64 && i < cap; i++) ok &= to[i] == 0xEE;
            bad += !ok;
        }
    }
    g4_kernels_set_threads(0);
    g4_pool_set_min_work(65536);
    free(from);
    free(to);
    CHECK(bad == 0, "g4_pool_memcpy: %d of %d copies wrong", bad, (int)(3 * sizeof sizes / sizeof *sizes));
}

static void pool_exactly_once(void) {
    static const int sizes[] = {1, 2, 3, 5, 17, 64, 1000, 70001};
    /* 1, 2, 3 threads; 8 for a long guided split; 40, beyond the guided splits' limit */
    static const int thread_counts[] = {1, 2, 3, 8, 40};
    int bad = 0;
    for (size_t c = 0; c < sizeof thread_counts / sizeof *thread_counts; c++) {
        g4_kernels_set_threads(thread_counts[c]);
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            int items = sizes[k];
            pool_probe p = {.hits = calloc((size_t)items, sizeof(int))};
            pthread_mutex_init(&p.mu, NULL);
            /* big jobs get equal chunks, small ones (work 1e5) guided chunks */
            for (int rep = 0; rep < 50; rep++) g4_pool_for(items, 1 + rep % 5, rep % 2 ? 1e12 : 1e5, probe_fn, &p);
            for (int i = 0; i < items; i++) bad += p.hits[i] != 50;
            pthread_mutex_destroy(&p.mu);
            free(p.hits);
        }
    }
    CHECK(bad == 0, "%d items not run exactly once per job", bad);
}

/* G4_DISPATCH picks levels; a bad value warns once on stderr and falls back to the best level. */
static void dispatch_env(void) {
    /* `make test` may run with G4_DISPATCH set: put it back afterwards */
    const char *outer = getenv("G4_DISPATCH");
    char *saved_env = outer ? strdup(outer) : NULL;
    unsetenv("G4_DISPATCH");
    const g4_kernels *best = g4_kernels_get();
    setenv("G4_DISPATCH", "portable", 1);
    CHECK_STREQ(g4_kernels_get()->name, "portable");
    FILE *cap = tmpfile();
    fflush(stderr);
    int saved_fd = dup(2);
    dup2(fileno(cap), 2);
    setenv("G4_DISPATCH", "bogus", 1);
    const g4_kernels *k = g4_kernels_get();
    fflush(stderr);
    dup2(saved_fd, 2);
    close(saved_fd);
    char line[256] = {0};
    rewind(cap);
    if (!fgets(line, sizeof line, cap)) line[0] = 0;
    fclose(cap);
    CHECK(k == best, "bogus G4_DISPATCH gave %s, not %s", k->name, best->name);
    CHECK(strstr(line, "G4_DISPATCH=bogus") != NULL, "no warning, got \"%s\"", line);
    setenv("G4_DISPATCH", "avx2", 1);
    if (g4_kernels_level("avx2")) CHECK_STREQ(g4_kernels_get()->name, "avx2");
    unsetenv("G4_DISPATCH");
    CHECK(g4_kernels_get() == best, "unset G4_DISPATCH");
    if (saved_env) setenv("G4_DISPATCH", saved_env, 1);
    free(saved_env);
    printf("ok dispatch: best level %s\n", best->name);
}

/* Whether the CPU has `feature` as the kernel reports it, read independently of the dispatcher
 * (which asks __builtin_cpu_supports): on x86 a word of /proc/cpuinfo's "flags" line, on aarch64 a
 * HWCAP bit from getauxval (qemu-user passes its own there, while its /proc/cpuinfo may be the
 * host's). -1 when this cannot be read. */
static int cpu_has(const char *feature) {
#if defined(__aarch64__)
    static const struct {
        const char *name;
        unsigned long bit;
    } hwcaps[] = {{"asimd", 1ul << 1} /* HWCAP_ASIMD */};
    for (size_t i = 0; i < sizeof hwcaps / sizeof *hwcaps; i++)
        if (!strcmp(hwcaps[i].name, feature)) return (getauxval(AT_HWCAP) & hwcaps[i].bit) != 0;
    return -1;
#else
    static char flags[8192];
    if (!flags[0]) {
        FILE *f = fopen("/proc/cpuinfo", "r");
        char line[sizeof flags - 2];
        while (f && fgets(line, sizeof line, f))
            if (!strncmp(line, "flags", 5)) {
                line[strcspn(line, "\n")] = 0;
                snprintf(flags, sizeof flags, " %s ", strchr(line, ':') ? strchr(line, ':') + 1 : "");
                break;
            }
        if (f) fclose(f);
        if (!flags[0]) return -1;
    }
    char word[64];
    snprintf(word, sizeof word, " %s ", feature);
    return strstr(flags, word) != NULL;
#endif
}

/* A CPU with a level's features gets that level, and the dispatcher picks the best such level
 * (G4_DISPATCH unset); a level whose features the CPU lacks is not offered. Tests of the levels
 * skip those that are not available, so without this a dispatcher that never offered AVX2 would
 * pass every other test on the portable kernels. */
static void dispatch_matches_cpu(void) {
    const char *outer = getenv("G4_DISPATCH");
    char *saved_env = outer ? strdup(outer) : NULL;
    unsetenv("G4_DISPATCH");
    const char *want_best = NULL;
    for (int i = 0; i < g4_kernels_count(); i++) {
        const g4_kernels *level = g4_kernels_at(i), *k = g4_kernels_level(level->name);
        if (!level->built) { /* another architecture's: its features are not this CPU's to read */
            CHECK(k == NULL, "the %s level is offered by a build that does not compile it", level->name);
            continue;
        }
        int has = 1;
        char list[160] = "", feature[32];
        for (const char *f = level->cpu_needs; *f;) {
            size_t len = strcspn(f, " ");
            snprintf(feature, sizeof feature, "%.*s", (int)len, f);
            int h = cpu_has(feature);
            CHECK(h >= 0, "cannot read whether the CPU has %s", feature);
            has = has && h == 1;
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? "+" : "", feature);
            f += len;
            f += *f == ' ';
        }
        if (has) {
            CHECK(k != NULL, "the CPU has %s but the %s level is not available", list[0] ? list : "(nothing needed)", level->name);
            if (!want_best) want_best = level->name;
        } else {
            CHECK(k == NULL, "the %s level is offered on a CPU without %s", level->name, list);
        }
        if (has == (k != NULL))
            printf("ok cpu %s %s: level %s %s\n", list[0] ? (has ? "has" : "lacks") : "needs", list[0] ? list : "nothing", level->name,
                   k ? "available" : "not available");
    }
    const char *best = g4_kernels_get()->name;
    int right = want_best && !strcmp(best, want_best);
    CHECK(right, "the dispatcher chose %s, the CPU's best level is %s", best, want_best ? want_best : "?");
    if (right) printf("ok cpu: the dispatcher chooses %s, the best level the CPU has\n", best);
    if (saved_env) setenv("G4_DISPATCH", saved_env, 1);
    free(saved_env);
}

/* The float x codes matmul against an independent long double dot product: within the error the
 * fixed-point image allows (half a step 2^-S per element, S from the row's largest |x|) plus the
 * two f32 roundings; NaN/infinity rows give NaN; the digits rebuild each fixed-point value. */
static void fixed_point_accuracy(void) {
    int bad_bound = 0, bad_digits = 0, checked = 0;
    for (int c = 0; c < 60; c++) {
        int bits = c % 3 == 0 ? 2 : c % 3 == 1 ? 4 : 8, in = rnd_int(1, 700), out = rnd_int(1, 9), n = rnd_int(1, 3);
        size_t rb = g4_packed_row_bytes(bits, (size_t)in);
        uint8_t *w = malloc(rb * (size_t)out);
        for (size_t i = 0; i < rb * (size_t)out; i++) w[i] = (uint8_t)rnd();
        float *scale = malloc(sizeof(float) * (size_t)out), *x = malloc(sizeof(float) * (size_t)n * in),
              *y = malloc(sizeof(float) * (size_t)n * out);
        for (int o = 0; o < out; o++) scale[o] = (float)(rnd() % 1000 + 1) * 1e-3f;
        for (int i = 0; i < n * in; i++) x[i] = rnd_float() * (c % 5 == 0 && i % 97 == 0 ? 1e6f : 1.0f); /* outliers */
        g4_qweight qw = {.bits = bits, .in = in, .out = out, .row_bytes = rb, .w = w, .w_scale = scale};
        g4_ref_matmul_f32(&qw, x, n, y);
        int8_t *digits = malloc((size_t)G4_FIX_DIGITS * in);
        for (int t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * in;
            float mx = 0;
            for (int i = 0; i < in; i++) mx = fabsf(xt[i]) > mx ? fabsf(xt[i]) : mx;
            int e = 0;
            if (mx > 0) frexpf(mx, &e);
            long double step = ldexpl(1.0L, e - G4_FIX_BITS); /* 2^-S */
            int S = g4_fix_split_row(xt, in, digits);
            CHECK_EQ_INT(S, G4_FIX_BITS - e);
            for (int i = 0; i < in; i++) {
                long double v = 0;
                for (int p = G4_FIX_DIGITS - 1; p >= 0; p--) v = v * 256 + digits[(size_t)p * in + i];
                if (fabsl(v * step - xt[i]) > step / 2) bad_digits++;
            }
            for (int o = 0; o < out; o++) {
                const uint8_t *row = w + (size_t)o * rb;
                long double exact = 0, slack = 0;
                for (int i = 0; i < in; i++) {
                    int code = g4_packed_code(row, bits, (size_t)i);
                    exact += (long double)xt[i] * code;
                    slack += fabsl((long double)code) * step / 2;
                }
                exact *= scale[o];
                long double got = y[(size_t)t * out + o];
                long double bound = slack * scale[o] + fabsl(exact) * 2.5e-7L + 1e-30L;
                if (fabsl(got - exact) > bound) bad_bound++;
                checked++;
            }
        }
        /* a row with a NaN or an infinity: every output NaN */
        x[in / 2] = c % 2 ? NAN : -INFINITY;
        g4_ref_matmul_f32(&qw, x, 1, y);
        int all_nan = 1;
        for (int o = 0; o < out; o++) all_nan &= isnan(y[o]) != 0;
        CHECK(all_nan, "non-finite input row gives NaN outputs (bits=%d in=%d)", bits, in);
        /* an all-zero row: +0 */
        memset(x, 0, sizeof(float) * (size_t)in);
        g4_ref_matmul_f32(&qw, x, 1, y);
        int zero = 1;
        for (int o = 0; o < out; o++) zero &= y[o] == 0 && !signbit(y[o]);
        CHECK(zero, "all-zero input row gives +0 (bits=%d in=%d)", bits, in);
        free(w);
        free(scale);
        free(x);
        free(y);
        free(digits);
    }
    CHECK(bad_digits == 0, "fixed-point digits rebuild x within half a step (%d bad)", bad_digits);
    CHECK(bad_bound == 0, "float x codes within the fixed-point error bound of the exact dot (%d of %d outside)", bad_bound, checked);
}

static int cmp_float_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y;
}

/* The full answer g4_codes_f32_argmax must match: g4_argmax over each row's softcapped outputs. */
static void full_argmax(const g4_qweight *w, const float *x, int n, float cap, int32_t *want) {
    float *y = malloc(sizeof(float) * (size_t)n * (size_t)w->out);
    g4_ref_matmul_f32(w, x, n, y);
    if (cap > 0) g4_ref_softcap(y, (size_t)n * (size_t)w->out, cap);
    for (int t = 0; t < n; t++) want[t] = g4_argmax(y + (size_t)t * w->out, w->out);
    free(y);
}

/* One problem at every level with coarse image `coarse`: each row either settled with
 * g4_argmax's answer or handed back (-1), and every level settles as many rows. Returns that
 * count. */
static int argmax_case(const g4_qweight *w, const float *x, int n, float cap, int coarse, const char *what) {
    int32_t want[16], got[16];
    full_argmax(w, x, n, cap, want);
    int settled = -1;
    for (int l = 0; l < n_levels; l++) {
        const g4_kernels *k = levels[l];
        /* odd levels with the caller's scratch of the stated size (ASan checks it is enough) */
        void *scratch = l % 2 ? malloc(g4_codes_f32_argmax_scratch(w, n)) : NULL;
        g4_codes_f32_argmax(w, x, n, cap, coarse, k->matmul_i8, got, scratch);
        free(scratch);
        int ok = 1, count = 0;
        for (int t = 0; t < n; t++) {
            ok &= got[t] == want[t] || got[t] == -1;
            count += got[t] >= 0;
        }
        CHECK(ok, "%s: %s argmax coarse=%d bits=%d in=%d out=%d n=%d cap=%g (row 0: %d, want %d)", what, k->name, coarse,
              w->bits, w->in, w->out, n, (double)cap, got[0], want[0]);
        CHECK(settled < 0 || count == settled, "%s: %s settles %d rows, another level %d", what, k->name, count, settled);
        if (settled < 0) settled = count;
    }
    return settled;
}

/* Activations with one element 1000 times the others, like a model's massive activations, and more
 * outputs than the shortcut finishes: the one-row image may have to hand rows back (it must stay
 * right), the two digit rows must settle them. */
static void argmax_outlier(void) {
    const int bits = 2, in = 512, out = 20000, n = 3;
    size_t rb = g4_packed_row_bytes(bits, (size_t)in);
    uint8_t *wb = malloc(rb * (size_t)out);
    float *scale = malloc(sizeof(float) * (size_t)out), *x = malloc(sizeof(float) * (size_t)n * in);
    for (size_t i = 0; i < rb * (size_t)out; i++) wb[i] = (uint8_t)rnd();
    for (int o = 0; o < out; o++) scale[o] = (float)(0.01 * (0.5 + (double)(rnd() % 1000) / 1000.0));
    for (int i = 0; i < n * in; i++) x[i] = ((float)(int)(rnd() % 2001) - 1000.0f) * 1e-3f;
    for (int t = 0; t < n; t++) x[(size_t)t * in + 37 * (t + 1)] = 1000.0f;
    g4_qweight w = {.bits = bits, .in = in, .out = out, .row_bytes = rb, .w = wb, .w_scale = scale};
    int one_row = argmax_case(&w, x, n, 30.0f, 1, "outlier");
    int two_rows = argmax_case(&w, x, n, 30.0f, 2, "outlier");
    CHECK(two_rows == n, "two digit rows settle every row with an outlier (%d of %d; one row settled %d)", two_rows, n, one_row);
    free(wb);
    free(scale);
    free(x);
}

/* The greedy lm_head shortcut (g4_codes_f32_argmax) against the full outputs: random problems,
 * which it must settle; exact ties made by copying the winning row to an earlier index (the
 * earlier one must win); and the cases it must hand back: a NaN in x, a scale that is not
 * positive, softcapped values that all saturate to the cap. */
static void check_codes_argmax(void) {
    int settled = 0, rows = 0;
    for (int c = 0; c < 36; c++) {
        static const int bits_of[3] = {2, 4, 8};
        int bits = bits_of[c % 3], in = rnd_int(1, 900), out = rnd_int(1, 3000), n = rnd_int(1, 12);
        float cap = c % 4 == 0 ? 0.0f : 30.0f;
        size_t rb = g4_packed_row_bytes(bits, (size_t)in);
        uint8_t *wb = malloc(rb * (size_t)out);
        float *scale = malloc(sizeof(float) * (size_t)out), *x = malloc(sizeof(float) * (size_t)n * in);
        for (size_t i = 0; i < rb * (size_t)out; i++) wb[i] = (uint8_t)rnd();
        /* outputs of a few units, like logits, so that the softcap rarely saturates */
        double code_rms = bits == 2 ? 1.2 : bits == 4 ? 4.6 : 74.0, base = 5.0 / (sqrt((double)in) * 1.7 * code_rms);
        for (int o = 0; o < out; o++) scale[o] = (float)(base * (0.5 + (double)(rnd() % 1000) / 1000.0));
        for (int i = 0; i < n * in; i++) x[i] = ((float)(int)(rnd() % 600001) - 300000.0f) * 1e-5f;
        g4_qweight w = {.bits = bits, .in = in, .out = out, .row_bytes = rb, .w = wb, .w_scale = scale};
        for (int coarse = 1; coarse <= 2; coarse++) settled += argmax_case(&w, x, n, cap, coarse, "random");
        rows += 2 * n;
        /* a tie at the top: the winner of row 0 copied to an earlier index */
        int32_t want[16];
        full_argmax(&w, x, 1, cap, want);
        if (want[0] > 0) {
            int e = rnd_int(0, want[0] - 1);
            memcpy(wb + (size_t)e * rb, wb + (size_t)want[0] * rb, rb);
            scale[e] = scale[want[0]];
            int32_t tied[16];
            full_argmax(&w, x, 1, cap, tied);
            CHECK(tied[0] == e, "the copy at %d ties the winner %d (full answer %d)", e, want[0], tied[0]);
            for (int coarse = 1; coarse <= 2; coarse++) settled += argmax_case(&w, x, 1, cap, coarse, "tie");
            rows += 2;
        }
        if (c % 6 == 1) { /* must hand back: NaN input, bad scale, saturated softcap */
            int32_t got[16];
            int coarse = 1 + c % 12 / 6;
            float keep = x[0];
            x[0] = NAN;
            g4_codes_f32_argmax(&w, x, n, cap, coarse, g4_kernels_level("portable")->matmul_i8, got, NULL);
            CHECK(got[0] == -1, "a NaN input is handed back (got %d)", got[0]);
            x[0] = keep;
            float ks = scale[out / 2];
            scale[out / 2] = c % 12 == 1 ? 0.0f : -1.0f;
            g4_codes_f32_argmax(&w, x, n, cap, coarse, g4_kernels_level("portable")->matmul_i8, got, NULL);
            CHECK(got[0] == -1, "a scale of %g is handed back (got %d)", (double)scale[out / 2], got[0]);
            scale[out / 2] = ks;
            for (int o = 0; o < out; o++) scale[o] = 1e30f;
            argmax_case(&w, x, n, 1.0f, coarse, "saturated");
        }
        free(wb);
        free(scale);
        free(x);
    }
    CHECK(settled == rows, "the shortcut settles every random row (%d of %d)", settled, rows);
    argmax_outlier();
}

/* One top-k problem at every level (g4_codes_f32_top) against the full softcapped outputs: the
 * candidates hold every output the full values rank among the k largest and every extra id, their
 * values are the full values bit for bit, no other output exceeds the bound, and every level
 * gives the same candidates. Returns 1 when settled. */
static int top_case(const g4_qweight *w, const float *x, float cap, int k, const int32_t *extra, int n_extra, int coarse) {
    const int V = w->out, max_cand = 4096;
    float *y = malloc(sizeof(float) * (size_t)V), *vals = malloc(sizeof(float) * max_cand), *sorted = malloc(sizeof(float) * (size_t)V);
    int32_t *cand = malloc(sizeof(int32_t) * max_cand), *first = malloc(sizeof(int32_t) * max_cand);
    char *in_set = malloc((size_t)V);
    g4_ref_matmul_f32(w, x, 1, y);
    if (cap > 0) g4_ref_softcap(y, (size_t)V, cap);
    memcpy(sorted, y, sizeof(float) * (size_t)V);
    qsort(sorted, (size_t)V, sizeof(float), cmp_float_desc);
    const float kth = sorted[k - 1];
    int settled = -2, first_m = 0;
    for (int l = 0; l < n_levels; l++) {
        const g4_kernels *kl = levels[l];
        void *scratch = l % 2 ? malloc(g4_codes_f32_argmax_scratch(w, 1)) : NULL;
        float bound = NAN;
        int m = g4_codes_f32_top(w, x, cap, k, extra, n_extra, coarse, kl->matmul_i8, cand, vals, max_cand, &bound, scratch);
        free(scratch);
        if (settled == -2) settled = m >= 0, first_m = m, memcpy(first, cand, sizeof(int32_t) * (m > 0 ? m : 0));
        CHECK((m >= 0) == settled && (m < 0 || (m == first_m && memcmp(first, cand, sizeof(int32_t) * m) == 0)),
              "%s: top-k candidates differ between levels (m %d vs %d)", kl->name, m, first_m);
        if (m < 0) continue;
        memset(in_set, 0, (size_t)V);
        int ok = 1;
        for (int c = 0; c < m; c++) {
            ok &= cand[c] >= 0 && cand[c] < V && !in_set[cand[c]] && memcmp(&vals[c], &y[cand[c]], sizeof(float)) == 0;
            if (cand[c] >= 0 && cand[c] < V) in_set[cand[c]] = 1;
        }
        for (int o = 0; o < V; o++) {
            ok &= !(y[o] > kth) || in_set[o];  /* every output above the k-th value */
            ok &= in_set[o] || y[o] <= bound;   /* the bound holds for the rest */
        }
        int at_kth = 0; /* outputs equal to the k-th value: enough of them are candidates */
        for (int o = 0; o < V; o++) at_kth += y[o] == kth && in_set[o];
        int above = 0;
        for (int o = 0; o < V; o++) above += y[o] > kth;
        ok &= above + at_kth >= k;
        for (int e = 0; e < n_extra; e++) ok &= extra[e] < 0 || extra[e] >= V || in_set[extra[e]];
        CHECK(ok, "%s: top-k coarse=%d bits=%d in=%d out=%d k=%d cap=%g: %d candidates, bound %g, k-th %g", kl->name, coarse, w->bits,
              w->in, V, k, (double)cap, m, (double)bound, (double)kth);
    }
    free(y);
    free(vals);
    free(sorted);
    free(cand);
    free(first);
    free(in_set);
    return settled == 1;
}

/* Sampling's lm_head shortcut on random problems (as for the argmax above), with extra ids in and
 * out of range and repeated; a NaN input must be handed back. */
static void check_codes_top(void) {
    int settled = 0, cases = 0;
    for (int c = 0; c < 24; c++) {
        static const int bits_of[3] = {2, 4, 8};
        /* every fourth case has enough 1024-output blocks for k to fit among them (the selection's
         * prefilter, kth_largest_lower_end) */
        int wide = c % 4 == 3;
        int bits = bits_of[c % 3], in = wide ? rnd_int(1, 200) : rnd_int(1, 900), out = wide ? rnd_int(20000, 70000) : rnd_int(1, 5000);
        float cap = c % 4 == 0 ? 0.0f : 30.0f;
        size_t rb = g4_packed_row_bytes(bits, (size_t)in);
        uint8_t *wb = malloc(rb * (size_t)out);
        float *scale = malloc(sizeof(float) * (size_t)out), *x = malloc(sizeof(float) * (size_t)in);
        for (size_t i = 0; i < rb * (size_t)out; i++) wb[i] = (uint8_t)rnd();
        double code_rms = bits == 2 ? 1.2 : bits == 4 ? 4.6 : 74.0, base = 5.0 / (sqrt((double)in) * 1.7 * code_rms);
        for (int o = 0; o < out; o++) scale[o] = (float)(base * (0.5 + (double)(rnd() % 1000) / 1000.0));
        for (int i = 0; i < in; i++) x[i] = ((float)(int)(rnd() % 600001) - 300000.0f) * 1e-5f;
        if (c % 5 == 2 && out > 1) memcpy(wb, wb + rb * (size_t)(out - 1), rb), scale[0] = scale[out - 1]; /* a tie */
        g4_qweight w = {.bits = bits, .in = in, .out = out, .row_bytes = rb, .w = wb, .w_scale = scale};
        int32_t extra[6] = {rnd_int(0, out - 1), -3, out, rnd_int(0, out - 1), 0, 0};
        extra[5] = extra[0];
        int k = c % 3 == 0 ? 1 : rnd_int(1, out < 64 ? out : 64);
        for (int coarse = 1; coarse <= 2; coarse++, cases++) settled += top_case(&w, x, cap, k, extra, c % 2 ? 6 : 0, coarse);
        if (c % 6 == 1) {
            int32_t cand[64];
            float vals[64], bound;
            x[0] = NAN;
            CHECK(g4_codes_f32_top(&w, x, cap, 1, NULL, 0, 1, g4_kernels_level("portable")->matmul_i8, cand, vals, 64, &bound, NULL) == -1,
                  "a NaN input is handed back by the top-k shortcut");
        }
        free(wb);
        free(scale);
        free(x);
    }
    CHECK(settled == cases, "the top-k shortcut settles every random problem (%d of %d)", settled, cases);
}

int main(void) {
    find_levels();
    dispatch_env();
    dispatch_matches_cpu();
    CHECK(g4_kernels_threads() >= 1, "default threads %d", g4_kernels_threads());
    fixed_point_accuracy();
    blocks_accuracy();
    check_tanhf();
    check_expf();
    check_codes_argmax();
    check_codes_top();
    pool_exactly_once();
    pool_background_cases();
    pool_memcpy_cases();
    g4_pool_set_min_work(0); /* split even the tiny test shapes across threads */
    for (int threads = 1; threads <= 3; threads++) {
        g4_kernels_set_threads(threads);
        CHECK_EQ_INT(g4_kernels_threads(), threads);
        random_shapes(120);
        fixed_shapes();
        block_shapes();
        blocks_fold_order();
        elementwise_kernels();
        amx_tile_shapes();
        amx_prepared_layout();
    }
    g4_kernels_set_threads(2);
    concurrency();
    g4_kernels_shutdown(); /* a later matmul restarts the pool */
    random_shapes(8);
    g4_kernels_set_threads(0);
    CHECK_EQ_INT(g4_kernels_threads(), (int)sysconf(_SC_NPROCESSORS_ONLN));
    return check_report("kernels");
}
