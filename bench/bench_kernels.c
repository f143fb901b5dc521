/* Micro-benchmark of the dispatched matmuls on E2B shapes (model.md §11), per level and thread
 * count, plus the machine's streaming read bandwidth so decode can be set against the roofline.
 * Weights are rotated through enough copies (>= 256 MB) that they come from DRAM, not L3, as they
 * do in a real decode step.
 *   make build/release/bench_kernels   (built with the tests; or by hand:)
 *   gcc -std=c11 -O2 -ffp-contract=off -pthread -Iinclude -Isrc -o bench_kernels bench/bench_kernels.c \
 *       src/kernels/[a-z]*.c src/quant/int8.c src/quant/pack.c src/util/err.c src/util/select.c -lm
 *   ./bench_kernels rows [THREADS]   (the int8 matmul of 1..512 rows: avx2, avx512vnni and the AMX tiles)
 *   ./bench_kernels [quick|attention|decode|full [LEVELS]]   (quick: fewer shapes, shorter runs; attention:
 *   only that; decode: one decode step's int8 matmuls, E2B's, in order, against plain loads of the same bytes; LEVELS: a comma-separated subset of the level names, g4_kernels_names()). The levels
 *   of a shape run in turn, round after round, and each level after avx2 is also given as its
 *   speed-up over avx2 in the same rounds. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"
#include "kernels/levels.h"
#include "kernels/pool.h"
#include "bench/stream_bw.h"
#include "quant/pack.h"

/* Weight + scale bytes touched per decoded token (model.md §11). */
#define MODEL_BYTES 795.76e6

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* ---- matmuls ---- */

typedef struct {
    const char *name;
    int in, out, bits;
} bshape;

/* The levels compared, in this order: the kernel table's reversed, so the portable level (the
 * references) comes first and the best last (find_levels; bench_kernels' second argument can name
 * a subset). Each level after RATIO_BASE is also given as its speed-up over it. */
#define MAX_LEVELS 16
#define RATIO_BASE "avx2"
static const char *all_levels[MAX_LEVELS];
static int n_all_levels, level_on[MAX_LEVELS], ratio_base = -1;

static int find_levels(void) {
    if (g4_kernels_count() > MAX_LEVELS) return -1;
    for (int i = g4_kernels_count() - 1; i >= 0; i--) {
        if (!strcmp(g4_kernels_at(i)->name, RATIO_BASE)) ratio_base = n_all_levels;
        level_on[n_all_levels] = 1;
        all_levels[n_all_levels++] = g4_kernels_at(i)->name;
    }
    return 0;
}

/* Whether level l is given as its speed-up over the ratio base. */
static int shows_ratio(int l, const int on[]) { return ratio_base >= 0 && l > ratio_base && on[ratio_base]; }

/* Seconds per call of call(ctx, level) for each level l with on[l]: the best of 5 rounds, each
 * round running every level once in turn, so a busy spell on the shared machine slows all of
 * them alike (others only ever slow a batch down). */
static void best_per_call(void (*call)(void *ctx, int level), void *ctx, const int on[MAX_LEVELS], int quick,
                          double per[MAX_LEVELS]) {
    double budget = (quick ? 0.3 : 1.0) / 5;
    for (int l = 0; l < n_all_levels; l++) per[l] = 1e30;
    for (int round = 0; round < 5; round++)
        for (int l = 0; l < n_all_levels; l++) {
            if (!on[l]) continue;
            double t0 = now_s(), dt;
            int c = 0;
            do {
                call(ctx, l);
                c++;
                dt = now_s() - t0;
            } while (dt < budget);
            if (dt / c < per[l]) per[l] = dt / c;
        }
}

/* One matmul per call, each on the next copy of the weights. */
typedef struct {
    const g4_kernels *k[MAX_LEVELS];
    g4_qweight *qw;
    uint8_t **w;
    int copies, calls, op, n;
    const int8_t *xi;
    int32_t *acc;
    const float *xf;
    float *y;
} matmul_call;

static void run_matmul(void *ctx, int level) {
    matmul_call *m = ctx;
    m->qw->w = m->w[m->calls++ % m->copies];
    if (m->op == 0) m->k[level]->matmul_i8(m->qw, m->xi, m->n, m->acc);
    else m->k[level]->matmul_f32(m->qw, m->xf, m->n, m->y);
}

static void bench_shape(const bshape *s, int quick) {
    size_t row_bytes = s->bits == G4_WT_BF16 ? 2 * (size_t)s->in : g4_packed_row_bytes(s->bits, (size_t)s->in);
    size_t wbytes = row_bytes * (size_t)s->out, sbytes = s->bits == G4_WT_BF16 ? 0 : 4 * (size_t)s->out;
    int copies = (int)((256e6 + wbytes - 1) / wbytes);
    if (copies < 2) copies = 2;
    uint8_t **w = malloc(sizeof *w * (size_t)copies);
    for (int c = 0; c < copies; c++) {
        w[c] = aligned_alloc(64, (wbytes + 63) & ~(size_t)63); /* 64-byte aligned, as the resident weights are (model.c) */
        for (size_t i = 0; i < wbytes; i += 8) {
            uint64_t r = rnd();
            memcpy(w[c] + i, &r, wbytes - i < 8 ? wbytes - i : 8);
        }
        if (s->bits == G4_WT_BF16) /* keep BF16 values finite and ordinary */
            for (size_t i = 1; i < wbytes; i += 2) w[c][i] = (uint8_t)((w[c][i] & 0x80) | 0x3C | (w[c][i] & 1));
    }
    float *scale = malloc(sizeof(float) * (size_t)s->out);
    for (int o = 0; o < s->out; o++) scale[o] = 0.01f;
    int nmax = 64;
    float *xf = malloc(sizeof(float) * (size_t)nmax * s->in), *y = malloc(sizeof(float) * (size_t)nmax * s->out);
    int8_t *xi = malloc((size_t)nmax * s->in);
    int32_t *acc = malloc(sizeof(int32_t) * (size_t)nmax * s->out);
    for (size_t i = 0; i < (size_t)nmax * s->in; i++) {
        xi[i] = (int8_t)rnd();
        xf[i] = (float)(int8_t)rnd() * 0.01f;
    }
    static const int ns[] = {1, 64};
    for (int op = 0; op < 2; op++) {
        if (op == 0 && s->bits == G4_WT_BF16) continue; /* BF16 runs in float only */
        for (int ni = 0; ni < 2; ni++) {
            int n = ns[ni];
            double macs = (double)s->in * s->out * n;
            matmul_call mc = {.w = w, .copies = copies, .op = op, .n = n, .xi = xi, .acc = acc, .xf = xf, .y = y};
            int on[MAX_LEVELS];
            for (int l = 0; l < n_all_levels; l++) {
                mc.k[l] = g4_kernels_level(all_levels[l]);
                /* the reference at n = 64 on the big shapes takes minutes: skip what it cannot finish */
                on[l] = level_on[l] && mc.k[l] && !(l == 0 && macs > 1e9);
            }
            for (int threads = 1; threads <= 2; threads++) {
                g4_kernels_set_threads(threads);
                g4_qweight qw = {.bits = s->bits, .in = s->in, .out = s->out, .row_bytes = row_bytes, .w = w[0], .w_scale = scale};
                mc.qw = &qw;
                double per[MAX_LEVELS];
                best_per_call(run_matmul, &mc, on, quick, per);
                for (int l = 0; l < n_all_levels; l++) {
                    if (!on[l]) continue;
                    double gbs = (double)(wbytes + sbytes) / per[l] / 1e9;
                    printf("%-22s %-4s %-10s n=%-2d thr=%d  %9.3f ms  %7.2f GB/s  %7.2f GMAC/s  %9.1f tok/s(this)  %6.1f tok/s(model@GB/s)",
                           s->name, op == 0 ? "i8" : "f32", all_levels[l], n, threads, per[l] * 1e3, gbs, macs / per[l] / 1e9, n / per[l],
                           gbs * 1e9 / MODEL_BYTES);
                    if (shows_ratio(l, on)) printf("  %.3fx " RATIO_BASE, per[ratio_base] / per[l]);
                    printf("\n");
                }
                fflush(stdout);
            }
        }
    }
    for (int c = 0; c < copies; c++) free(w[c]);
    free(w);
    free(scale);
    free(xf);
    free(y);
    free(xi);
    free(acc);
}

/* ---- decode attention (one query row) over an int8 cache, the E2B layer shapes ---- */

typedef struct {
    const char *name;
    int head_dim, positions;
} battn;

typedef struct {
    const g4_kernels *k[MAX_LEVELS];
    const g4_attn *a;
} attention_call;

static void run_attention(void *ctx, int level) {
    const attention_call *c = ctx;
    c->k[level]->attention(c->a);
}

static void bench_attention(const battn *s, int quick) {
    const int heads = 8, kv_width = s->head_dim; /* one KV head per layer */
    size_t cache = (size_t)s->positions * (size_t)kv_width;
    int8_t *k = malloc(cache), *v = malloc(cache);
    float *q = malloc(sizeof(float) * (size_t)heads * s->head_dim), *out = malloc(sizeof(float) * (size_t)heads * s->head_dim);
    for (size_t i = 0; i < cache; i++) {
        k[i] = (int8_t)rnd();
        v[i] = (int8_t)rnd();
    }
    for (int i = 0; i < heads * s->head_dim; i++) q[i] = (float)(int8_t)rnd() * 0.001f;
    g4_attn_row row = {.kq = k, .vq = v, .k_scale = 0.02f, .v_scale = 0.01f, .lo = 0, .hi = s->positions - 1};
    g4_attn a = {.n = 1, .n_heads = heads, .head_dim = s->head_dim, .kv_width = kv_width, .group = heads, .q = q,
                 .out = out, .rows = &row};
    attention_call ac = {.a = &a};
    int on[MAX_LEVELS];
    for (int l = 0; l < n_all_levels; l++) on[l] = level_on[l] && (ac.k[l] = g4_kernels_level(all_levels[l])) != NULL;
    for (int threads = 1; threads <= 2; threads++) {
        g4_kernels_set_threads(threads);
        double per[MAX_LEVELS];
        best_per_call(run_attention, &ac, on, quick, per);
        for (int l = 0; l < n_all_levels; l++) {
            if (!on[l]) continue;
            printf("%-22s attn %-10s n=1  thr=%d  %9.3f ms  %7.2f GFLOP/s", s->name, all_levels[l], threads, per[l] * 1e3,
                   4.0 * heads * s->head_dim * s->positions / per[l] / 1e9);
            if (shows_ratio(l, on)) printf("  %.3fx " RATIO_BASE, per[ratio_base] / per[l]);
            printf("\n");
        }
        fflush(stdout);
    }
    free(k);
    free(v);
    free(q);
    free(out);
}

/* ---- one decode step's int8 matmuls (E2B's linears in layer order, then the lm_head) ---- */

typedef struct {
    g4_qweight w;
    int8_t *x;
    int32_t *acc;
} step_matrix;

/* E2B's decoder linears (model.md; g4 inspect on `g4 synth --preset e2b`): layers 0-14 own their
 * KV (q, k, v, o, 4-bit MLP of 6144), 15-34 read it (q, o, 2-bit MLP of 12288); every fifth layer
 * is a full-attention one (head dim 512, else 256); each has the two 8-bit per-layer-input
 * linears. The BF16 per_layer_model_projection is left out: every level runs it alike. */
static int e2b_step_shapes(int in[], int out[], int bits[]) {
    int n = 0;
#define ADD(I, O, B) (in[n] = (I), out[n] = (O), bits[n] = (B), n++)
    for (int l = 0; l < 35; l++) {
        int hd = l % 5 == 4 ? 512 : 256, producer = l < 15;
        ADD(1536, 8 * hd, 4);
        if (producer) ADD(1536, hd, 4), ADD(1536, hd, 4);
        ADD(8 * hd, 1536, 4);
        if (producer) ADD(1536, 6144, 4), ADD(1536, 6144, 4), ADD(6144, 1536, 4);
        else ADD(1536, 12288, 2), ADD(1536, 12288, 2), ADD(12288, 1536, 2);
        ADD(1536, 256, 8), ADD(256, 1536, 8);
    }
    ADD(1536, 262144, 2); /* lm_head: greedy decode's one int8 row */
#undef ADD
    return n;
}

/* The plain read of a matrix's rows that a matmul could at best match: every 64-byte line loaded
 * and summed (64-byte loads where the CPU has AVX-512, else 32-byte ones), split over the pool as
 * the matmuls split their rows. */
typedef struct {
    const g4_qweight *w;
    uint64_t sum;
} load_job;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static uint64_t sum_lines_512(const uint8_t *p, size_t bytes) {
    __m512i a = _mm512_setzero_si512(), b = a;
    size_t i = 0;
    for (; i + 128 <= bytes; i += 128) {
        a = _mm512_add_epi64(a, _mm512_loadu_si512((const void *)(p + i)));
        b = _mm512_add_epi64(b, _mm512_loadu_si512((const void *)(p + i + 64)));
    }
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(a, b)) + (i < bytes ? p[i] : 0);
}
__attribute__((target("avx2"))) static uint64_t sum_lines_256(const uint8_t *p, size_t bytes) {
    __m256i a = _mm256_setzero_si256(), b = a;
    size_t i = 0;
    for (; i + 64 <= bytes; i += 64) {
        a = _mm256_add_epi64(a, _mm256_loadu_si256((const __m256i *)(p + i)));
        b = _mm256_add_epi64(b, _mm256_loadu_si256((const __m256i *)(p + i + 32)));
    }
    a = _mm256_add_epi64(a, b);
    return (uint64_t)_mm256_extract_epi64(a, 0) + (uint64_t)_mm256_extract_epi64(a, 3) + (i < bytes ? p[i] : 0);
}
static int loads_512;
#endif

static void load_rows(void *ctx, int o0, int o1) {
    load_job *j = ctx;
    const g4_qweight *w = j->w;
    const uint8_t *p = w->w + (size_t)o0 * w->row_bytes;
    size_t bytes = (size_t)(o1 - o0) * w->row_bytes;
    uint64_t s = 0;
#if defined(__x86_64__)
    s = loads_512 ? sum_lines_512(p, bytes) : sum_lines_256(p, bytes);
#else
    for (size_t i = 0; i < bytes; i += 64) s += p[i];
#endif
    __atomic_fetch_add(&j->sum, s, __ATOMIC_RELAXED);
}

typedef struct {
    const g4_kernels *k[MAX_LEVELS];
    step_matrix *m;
    int count;
    uint64_t sink;
} step_call;

/* variant n_all_levels: the plain loads */
static void run_step(void *ctx, int variant) {
    step_call *c = ctx;
    for (int i = 0; i < c->count; i++) {
        step_matrix *m = &c->m[i];
        if (variant < n_all_levels) {
            c->k[variant]->matmul_i8(&m->w, m->x, 1, m->acc);
        } else {
            load_job j = {&m->w, 0};
            g4_pool_for(m->w.out, 4, (double)m->w.out * m->w.in, load_rows, &j);
            c->sink += j.sum;
        }
    }
}

/* The matmuls of one decode step, every level (and the plain loads) in turn, rounds times: the
 * median step time of each, its speed over avx2, and its time over the loads'. The matrices are
 * 64-byte aligned, as the resident weights are, and 690 MB in all, so each step reads them from
 * DRAM as a decode step does. */
static void bench_decode_step(int rounds) {
    int in[400], out[400], bits[400];
    int count = e2b_step_shapes(in, out, bits);
    step_matrix *m = calloc((size_t)count, sizeof *m);
    size_t total = 0;
    for (int i = 0; i < count; i++) {
        size_t rb = g4_packed_row_bytes(bits[i], (size_t)in[i]), bytes = rb * (size_t)out[i];
        uint8_t *w = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        float *scale = malloc(sizeof(float) * (size_t)out[i]);
        m[i].x = malloc((size_t)in[i]);
        m[i].acc = malloc(sizeof(int32_t) * (size_t)out[i]);
        for (size_t b = 0; b < bytes; b += 8) {
            uint64_t r = rnd();
            memcpy(w + b, &r, bytes - b < 8 ? bytes - b : 8);
        }
        for (int o = 0; o < out[i]; o++) scale[o] = 0.01f;
        for (int k = 0; k < in[i]; k++) m[i].x[k] = (int8_t)rnd();
        m[i].w = (g4_qweight){.bits = bits[i], .in = in[i], .out = out[i], .row_bytes = rb, .w = w, .w_scale = scale};
        total += bytes;
    }
#if defined(__x86_64__)
    __builtin_cpu_init();
    loads_512 = __builtin_cpu_supports("avx512f");
#endif
    step_call c = {.m = m, .count = count};
    const int V = n_all_levels + 1;
    int on[MAX_LEVELS + 1];
    /* level 0, the portable one, would take minutes a round */
    for (int l = 0; l < n_all_levels; l++) on[l] = level_on[l] && l > 0 && (c.k[l] = g4_kernels_level(all_levels[l])) != NULL;
    on[n_all_levels] = 1;
    double *t = calloc((size_t)V * (size_t)rounds, sizeof *t);
    g4_kernels_set_threads(2);
    for (int r = 0; r < rounds; r++)
        for (int v = 0; v < V; v++) {
            if (!on[v]) continue;
            double t0 = now_s();
            run_step(&c, v);
            t[(size_t)v * rounds + r] = now_s() - t0;
        }
    double med[MAX_LEVELS + 1];
    for (int v = 0; v < V; v++) {
        if (!on[v]) continue;
        double *tv = t + (size_t)v * rounds;
        for (int a = 1; a < rounds; a++) /* insertion sort: a few dozen values */
            for (int b = a; b > 0 && tv[b] < tv[b - 1]; b--) {
                double x = tv[b];
                tv[b] = tv[b - 1], tv[b - 1] = x;
            }
        med[v] = rounds % 2 ? tv[rounds / 2] : (tv[rounds / 2 - 1] + tv[rounds / 2]) / 2;
    }
    printf("decode step: %d int8 matmuls, %.1f MB, 2 threads, %d rounds (median step)\n", count, total / 1e6, rounds);
    for (int v = 0; v < V; v++) {
        if (!on[v]) continue;
        printf("  %-12s %8.2f ms  %6.2f GB/s", v < n_all_levels ? all_levels[v] : loads_512 ? "loads (64 B)" : "loads (32 B)", med[v] * 1e3,
               total / med[v] / 1e9);
        if (ratio_base >= 0 && v != ratio_base && on[ratio_base]) printf("  %.3fx " RATIO_BASE, med[ratio_base] / med[v]);
        printf("  %.3f of the loads' time\n", med[v] / med[n_all_levels]);
    }
    fflush(stdout);
    for (int i = 0; i < count; i++) {
        free((void *)m[i].w.w);
        free((void *)m[i].w.w_scale);
        free(m[i].x);
        free(m[i].acc);
    }
    free(m);
    free(t);
    (void)c.sink;
}

/* Other processes sharing the cores skew every number here; say how busy the machine was. */
static void print_load(const char *when) {
    char buf[128] = "?";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (!fgets(buf, sizeof buf, f)) strcpy(buf, "?\n");
        fclose(f);
    }
    printf("load average %s: %s", when, buf);
}

/* ---- rows: where the AMX tiles overtake the vector levels (the amx level's amx_min_rows) ---- */

/* The int8 matmul of n activation rows on E2B shapes through avx2, avx512vnni and the AMX tiles
 * (g4_amx_matmul_i8_tiles, whatever the level's threshold) unpacking the stored codes and reading
 * the level's prepared copy (g4_amx_prepare, as the model makes at load), alternating round after
 * round, at `threads` threads: microseconds per call (best of 5 rounds) and each one's speed-up
 * over the best vector level. */
typedef struct {
    g4_qweight *qw;
    uint8_t **w;
    g4_wprep **prep; /* each copy's prepared tiles */
    int copies, calls, n;
    const int8_t *xi;
    int32_t *acc;
    g4_matmul_i8_fn fn[4];
} rows_call;

static void run_rows(void *ctx, int v) {
    rows_call *r = ctx;
    int c = r->calls++ % r->copies;
    r->qw->w = r->w[c];
    r->qw->prep = v == 3 ? r->prep[c] : NULL; /* variant 3: the tiles from the copy */
    r->fn[v](r->qw, r->xi, r->n, r->acc);
}

static void bench_rows(int threads, int quick) {
    const g4_kernels *a2 = g4_kernels_level("avx2"), *v5 = g4_kernels_level("avx512vnni");
    if (!a2 || !v5 || !g4_kernels_level("amx")) {
        printf("rows: needs the avx2, avx512vnni and amx levels (this CPU: %s)\n", g4_kernels_cpu_flags());
        return;
    }
    static const bshape shapes[] = {{"gate/up 1536x6144 q4", 1536, 6144, 4}, {"down 12288x1536 q2", 12288, 1536, 2}, {"ple 1536x256 q8", 1536, 256, 8}};
    static const int ns[] = {1, 2, 4, 6, 8, 12, 16, 24, 32, 64, 128, 512};
    g4_kernels_set_threads(threads);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const bshape *s = &shapes[si];
        size_t row_bytes = g4_packed_row_bytes(s->bits, (size_t)s->in), wbytes = row_bytes * (size_t)s->out;
        int copies = (int)((256e6 + wbytes - 1) / wbytes);
        uint8_t **w = malloc(sizeof *w * (size_t)copies);
        g4_wprep **prep = malloc(sizeof *prep * (size_t)copies);
        for (int c = 0; c < copies; c++) {
            w[c] = aligned_alloc(64, (wbytes + 63) & ~(size_t)63);
            for (size_t i = 0; i < wbytes; i++) w[c][i] = (uint8_t)rnd();
            g4_qweight whole = {.bits = s->bits, .in = s->in, .out = s->out, .row_bytes = row_bytes, .w = w[c]};
            prep[c] = g4_amx_prepare(&whole);
        }
        int nmax = 512;
        int8_t *xi = malloc((size_t)nmax * s->in);
        int32_t *acc = malloc(sizeof(int32_t) * (size_t)nmax * s->out);
        for (size_t i = 0; i < (size_t)nmax * s->in; i++) xi[i] = (int8_t)rnd();
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            g4_qweight qw = {.bits = s->bits, .in = s->in, .out = s->out, .row_bytes = row_bytes, .w = w[0]};
            rows_call rc = {.qw = &qw, .w = w, .prep = prep, .copies = copies, .n = ns[ni], .xi = xi, .acc = acc,
                            .fn = {a2->matmul_i8, v5->matmul_i8, g4_amx_matmul_i8_tiles, g4_amx_matmul_i8_tiles}};
            int on[MAX_LEVELS] = {1, 1, 1, prep[0] != NULL};
            double per[MAX_LEVELS];
            int saved = n_all_levels;
            n_all_levels = 4; /* best_per_call's variants: the four above */
            best_per_call(run_rows, &rc, on, quick, per);
            n_all_levels = saved;
            double vec = per[0] < per[1] ? per[0] : per[1];
            printf("rows %-22s thr=%-2d n=%-3d  avx2 %9.1f us  avx512vnni %9.1f us  amx-tiles %9.1f us  amx-prepared %9.1f us  "
                   "tiles/best-vector %.2fx  prepared/tiles %.2fx  (prepared %.1f GMAC/s)\n",
                   s->name, threads, ns[ni], per[0] * 1e6, per[1] * 1e6, per[2] * 1e6, per[3] * 1e6, vec / per[2], per[2] / per[3],
                   (double)s->in * s->out * ns[ni] / per[3] / 1e9);
            fflush(stdout);
        }
        for (int c = 0; c < copies; c++) {
            free(w[c]);
            g4_wprep_free(prep[c]);
        }
        free(w);
        free(prep);
        free(xi);
        free(acc);
    }
}

int main(int argc, char **argv) {
    int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    if (find_levels() != 0) {
        fprintf(stderr, "bench_kernels: more than %d kernel levels\n", MAX_LEVELS);
        return 1;
    }
    if (argc > 2) /* a comma-separated subset of the levels */
        for (int l = 0; l < n_all_levels; l++) {
            char pat[32];
            snprintf(pat, sizeof pat, ",%s,", all_levels[l]);
            char list[256];
            snprintf(list, sizeof list, ",%s,", argv[2]);
            level_on[l] = strstr(list, pat) != NULL;
        }
    print_load("at start");
    size_t words = ((size_t)1 << 30) / 8;
    uint64_t *buf = aligned_alloc(64, words * 8);
    if (!buf) {
        fprintf(stderr, "bench_kernels: out of memory for the 1 GB bandwidth buffer\n");
        return 1;
    }
    for (size_t i = 0; i < words; i++) buf[i] = i;
    for (int t = 1; t <= 2; t++) {
        double bw = g4_stream_bandwidth(buf, words * 8, t, 5); /* one measurement for both figures */
        printf("stream read 1 GB (%s loads), %d thread(s): %.2f GB/s -> decode roofline %.1f tok/s\n", g4_stream_loads(), t, bw / 1e9,
               bw / MODEL_BYTES);
    }
    free(buf);
    static const bshape shapes[] = {
        {"gate/up 1536x6144 q4", 1536, 6144, 4},
        {"down 6144x1536 q4", 6144, 1536, 4},
        {"down 12288x1536 q2", 12288, 1536, 2},
        {"gate 1536x12288 q2", 1536, 12288, 2},
        {"ple 1536x256 q8", 1536, 256, 8},
        {"pmp 1536x8960 bf16", 1536, 8960, 16},
        {"lm_head 1536x262144 q2", 1536, 262144, 2},
    };
    if (argc > 1 && strcmp(argv[1], "rows") == 0) { /* bench_kernels rows [THREADS] */
        bench_rows(argc > 2 ? atoi(argv[2]) : 2, 1);
        print_load("at end");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "decode") == 0) {
        bench_decode_step(quick ? 10 : 40);
        print_load("at end");
        return 0;
    }
    int only_attention = argc > 1 && strcmp(argv[1], "attention") == 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes && !only_attention; i++)
        if (!quick || i != 1) bench_shape(&shapes[i], quick);
    static const battn attn_shapes[] = {{"sliding hd256 T512", 256, 512}, {"full hd512 T576", 512, 576}};
    for (size_t i = 0; i < sizeof attn_shapes / sizeof *attn_shapes; i++) bench_attention(&attn_shapes[i], quick);
    print_load("at end");
    return 0;
}
