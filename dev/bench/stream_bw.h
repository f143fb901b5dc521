/* Streaming read bandwidth, shared by `g4 bench` (tools/bench_cmd.c) and bench/bench_kernels.c:
 * `threads` threads each sum their slice of a large buffer with the widest loads the CPU has
 * (32-byte AVX2 loads where it has AVX2, else 16-byte GCC vectors: SSE2 or NEON) into independent
 * sums, so the loop is bound by loads rather than by one add chain. The roofline must be what the
 * machine can read, not what one loop happens to: 8-byte loads read 10-20 % slower than 16-byte
 * ones on the 2-core development machine (Zen 3), and 16-byte loads in turn 6-15 % slower than
 * 32-byte ones with 2 threads (about 20 % with one), slower than the AVX2 matmuls themselves
 * stream their weights: a roofline that the engine's own kernels can beat would flatter them.
 * Header-only (dev/, the development tier): both programs are built from it, no library carries it. */
#ifndef G4_BENCH_STREAM_BW_H
#define G4_BENCH_STREAM_BW_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define G4_BW_X86 1
#endif

typedef struct {
    const uint64_t *data;
    size_t n;
    int avx2;
    uint64_t sum;
} g4_bw_slice;
typedef uint64_t g4_bw_v2 __attribute__((vector_size(16)));

#ifdef G4_BW_X86
/* The sum of words [0, n - n % 32) of p: 32-byte loads, 256 bytes a step into eight sums. */
__attribute__((target("avx2"))) static uint64_t g4_bw_sum_avx2(const uint64_t *p, size_t n) {
    const __m256i *v = (const __m256i *)(const void *)p;
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a, e = a, f = a, g = a, h = a;
    for (size_t i = 0; i + 32 <= n; i += 32, v += 8) {
        a = _mm256_add_epi64(a, _mm256_loadu_si256(v));
        b = _mm256_add_epi64(b, _mm256_loadu_si256(v + 1));
        c = _mm256_add_epi64(c, _mm256_loadu_si256(v + 2));
        d = _mm256_add_epi64(d, _mm256_loadu_si256(v + 3));
        e = _mm256_add_epi64(e, _mm256_loadu_si256(v + 4));
        f = _mm256_add_epi64(f, _mm256_loadu_si256(v + 5));
        g = _mm256_add_epi64(g, _mm256_loadu_si256(v + 6));
        h = _mm256_add_epi64(h, _mm256_loadu_si256(v + 7));
    }
    a = _mm256_add_epi64(_mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)),
                         _mm256_add_epi64(_mm256_add_epi64(e, f), _mm256_add_epi64(g, h)));
    return (uint64_t)_mm256_extract_epi64(a, 0) + (uint64_t)_mm256_extract_epi64(a, 3);
}
#endif

/* One thread's slice. Each starts a multiple of 256 bytes into the buffer, so on a buffer aligned
 * as mmap and aligned_alloc(64) give them every load is aligned (the 16-byte loads need 16). */
static void *g4_bw_sum_slice(void *p) {
    g4_bw_slice *s = p;
#ifdef G4_BW_X86
    if (s->avx2) {
        s->sum = g4_bw_sum_avx2(s->data, s->n);
        return NULL;
    }
#endif
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

/* Whether the probe reads with 32-byte AVX2 loads on this CPU (else 16-byte vectors). */
static int g4_bw_avx2(void) {
#ifdef G4_BW_X86
    return __builtin_cpu_supports("avx2") != 0;
#else
    return 0;
#endif
}

/* The probe's loads, as `g4 bench` reports them: "avx2-32" or "vec-16". */
static const char *g4_stream_loads(void) { return g4_bw_avx2() ? "avx2-32" : "vec-16"; }

/* Bytes per second read by `threads` threads (at most 64) over buf: the best of `passes`. */
static double g4_stream_bandwidth(const uint64_t *buf, size_t bytes, int threads, int passes) {
    int t_n = threads < 1 ? 1 : threads < 64 ? threads : 64;
    size_t per = bytes / 8 / (size_t)t_n & ~(size_t)31; /* words per thread: slices stay 256-byte multiples */
    int avx2 = g4_bw_avx2();
    double best = 0;
    for (int pass = 0; pass < passes; pass++) {
        pthread_t th[64];
        g4_bw_slice sl[64];
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int t = 0; t < t_n; t++) {
            sl[t] = (g4_bw_slice){buf + per * (size_t)t, per, avx2, 0};
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
