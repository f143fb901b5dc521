/* Streaming read bandwidth, shared by `g4 bench` (tools/bench_cmd.c) and bench/bench_kernels.c:
 * `threads` threads each sum their slice of a large buffer with four independent sums, so the
 * loop is bound by loads rather than by one add chain. Header-only: both programs are built from
 * it, the library does not carry it. */
#ifndef G4_BENCH_STREAM_BW_H
#define G4_BENCH_STREAM_BW_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

typedef struct {
    const uint64_t *data;
    size_t n;
    uint64_t sum;
} g4_bw_slice;

static void *g4_bw_sum_slice(void *p) {
    g4_bw_slice *s = p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= s->n; i += 4) {
        a += s->data[i];
        b += s->data[i + 1];
        c += s->data[i + 2];
        d += s->data[i + 3];
    }
    s->sum = a + b + c + d;
    return NULL;
}

/* Bytes per second read by `threads` threads (at most 64) over buf: the best of `passes`. */
static double g4_stream_bandwidth(const uint64_t *buf, size_t bytes, int threads, int passes) {
    size_t n = bytes / 8;
    int t_n = threads < 1 ? 1 : threads < 64 ? threads : 64;
    double best = 0;
    for (int pass = 0; pass < passes; pass++) {
        pthread_t th[64];
        g4_bw_slice sl[64];
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int t = 0; t < t_n; t++) {
            sl[t] = (g4_bw_slice){buf + n / t_n * t, n / t_n, 0};
            pthread_create(&th[t], NULL, g4_bw_sum_slice, &sl[t]);
        }
        uint64_t total = 0;
        for (int t = 0; t < t_n; t++) {
            pthread_join(th[t], NULL);
            total += sl[t].sum;
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        double dt = (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
        if (total == 42) fputc(' ', stderr); /* keeps the sums alive */
        double bw = (double)(n / t_n * t_n) * 8 / dt;
        if (bw > best) best = bw;
    }
    return best;
}

#endif
