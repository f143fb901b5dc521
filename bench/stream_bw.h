/* Streaming read bandwidth, shared by `g4 bench` (tools/bench_cmd.c) and bench/bench_kernels.c:
 * `threads` threads each sum their slice of a large buffer with 16-byte loads (GCC vectors: SSE2
 * or NEON) into four independent sums, so the loop is bound by loads rather than by one add
 * chain. Earlier versions used 8-byte loads, which on the 2-core development machine read 10-20 %
 * slower, slower than the AVX2 matmuls themselves stream their weights: a roofline that the
 * engine's own kernels can beat would flatter them. Header-only: both programs are built from it,
 * the library does not carry it. */
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
typedef uint64_t g4_bw_v2 __attribute__((vector_size(16)));

/* One thread's slice: the buffer is at least 16-byte aligned (malloc, mmap) and each slice starts
 * a multiple of 64 bytes into it, so every load is aligned. */
static void *g4_bw_sum_slice(void *p) {
    g4_bw_slice *s = p;
    const g4_bw_v2 *v = (const g4_bw_v2 *)(const void *)s->data;
    g4_bw_v2 a = {0, 0}, b = a, c = a, d = a;
    for (size_t i = 0; i + 8 <= s->n; i += 8) {
        a += v[i / 2];
        b += v[i / 2 + 1];
        c += v[i / 2 + 2];
        d += v[i / 2 + 3];
    }
    a += b + c + d;
    s->sum = a[0] + a[1];
    return NULL;
}

/* Bytes per second read by `threads` threads (at most 64) over buf: the best of `passes`. */
static double g4_stream_bandwidth(const uint64_t *buf, size_t bytes, int threads, int passes) {
    int t_n = threads < 1 ? 1 : threads < 64 ? threads : 64;
    size_t per = bytes / 8 / (size_t)t_n & ~(size_t)7; /* words per thread: slices stay 64-byte multiples */
    double best = 0;
    for (int pass = 0; pass < passes; pass++) {
        pthread_t th[64];
        g4_bw_slice sl[64];
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int t = 0; t < t_n; t++) {
            sl[t] = (g4_bw_slice){buf + per * (size_t)t, per, 0};
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
        double bw = (double)(per * (size_t)t_n) * 8 / dt;
        if (bw > best) best = bw;
    }
    return best;
}

#endif
