/* A persistent thread pool for the matmuls. Decode issues a few hundred small matmuls per token,
 * so waking threads must be cheap: idle workers spin briefly on an atomic job counter before
 * sleeping on a condition variable, and the caller runs the first slice itself.
 * Locking: run_mu serializes jobs and (re)configuration; mu only guards the sleep/wake
 * handshakes. Job fields are published by the release increment of `gen`. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h"
#include "pool.h"

#define MAX_THREADS 256
/* How long an idle thread keeps polling before it sleeps: long enough to cover the float work
 * between two matmuls of one decode step, short enough not to burn a core between tokens. */
#define SPIN_NS 200000L

static pthread_mutex_t run_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_work = PTHREAD_COND_INITIALIZER;
static pthread_cond_t cv_done = PTHREAD_COND_INITIALIZER;

/* Under run_mu. */
static int want_threads;    /* 0: default */
static int n_running;       /* threads incl. the caller; 0 while stopped */
static int atexit_done;
static double min_work = 65536;
static pthread_t workers[MAX_THREADS];

static atomic_ulong gen;    /* bumped once per job and once to stop */
static atomic_int pending;  /* workers yet to finish the current job */
static atomic_int stopping;

/* The current job: written by the caller before bumping gen, read-only while it runs. */
static g4_pool_fn job_fn;
static void *job_ctx;
static int job_items, job_per;

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Bounded polls: until the generation moves past `old` / until no worker is pending. They return
 * 0 when the time is up and the caller should sleep instead. */
static int spin_gen(unsigned long old) {
    long start = now_ns();
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&gen, memory_order_acquire) != old) return 1;
        cpu_relax();
        if ((i & 255) == 0 && now_ns() - start > SPIN_NS) return 0;
    }
}

static int spin_done(void) {
    long start = now_ns();
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&pending, memory_order_acquire) == 0) return 1;
        cpu_relax();
        if ((i & 255) == 0 && now_ns() - start > SPIN_NS) return 0;
    }
}

static void run_slice(int s) {
    long b = (long)s * job_per, e = b + job_per;
    if (e > job_items) e = job_items;
    if (b < e) job_fn(job_ctx, (int)b, (int)e);
}

static void *worker(void *arg) {
    int idx = (int)(intptr_t)arg;
    unsigned long seen = 0;
    for (;;) {
        if (!spin_gen(seen)) {
            pthread_mutex_lock(&mu);
            while (atomic_load_explicit(&gen, memory_order_acquire) == seen) pthread_cond_wait(&cv_work, &mu);
            pthread_mutex_unlock(&mu);
        }
        seen = atomic_load_explicit(&gen, memory_order_acquire);
        if (atomic_load_explicit(&stopping, memory_order_acquire)) return NULL;
        run_slice(idx);
        if (atomic_fetch_sub_explicit(&pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&mu);
            pthread_cond_broadcast(&cv_done);
            pthread_mutex_unlock(&mu);
        }
    }
}

static int default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

static int configured_threads(void) { return want_threads > 0 ? want_threads : default_threads(); }

/* Under run_mu. */
static void stop_locked(void) {
    if (n_running <= 1) {
        n_running = 0;
        return;
    }
    atomic_store_explicit(&stopping, 1, memory_order_release);
    pthread_mutex_lock(&mu);
    atomic_fetch_add_explicit(&gen, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&cv_work);
    pthread_mutex_unlock(&mu);
    for (int i = 1; i < n_running; i++) pthread_join(workers[i], NULL);
    atomic_store_explicit(&stopping, 0, memory_order_release);
    atomic_store_explicit(&gen, 0, memory_order_release);
    n_running = 0;
}

static void shutdown_at_exit(void) { g4_kernels_shutdown(); }

/* Under run_mu. Workers start at generation 0 (stop_locked resets it once they are joined). */
static void start_locked(void) {
    int want = configured_threads();
    n_running = 1;
    for (int i = 1; i < want; i++) {
        if (pthread_create(&workers[i], NULL, worker, (void *)(intptr_t)i) != 0) break; /* run with fewer */
        n_running++;
    }
    if (!atexit_done) atexit_done = atexit(shutdown_at_exit) == 0;
}

void g4_pool_for(int items, int grain, double work, g4_pool_fn fn, void *ctx) {
    if (items <= 0) return;
    if (pthread_mutex_trylock(&run_mu) != 0) {
        fn(ctx, 0, items); /* another thread's job holds the pool */
        return;
    }
    if (!n_running) start_locked();
    int nt = n_running;
    if (grain < 1) grain = 1;
    if (nt <= 1 || work < min_work || items <= grain) {
        fn(ctx, 0, items);
        pthread_mutex_unlock(&run_mu);
        return;
    }
    int per = (items + nt - 1) / nt;
    per = (per + grain - 1) / grain * grain;
    job_fn = fn;
    job_ctx = ctx;
    job_items = items;
    job_per = per;
    atomic_store_explicit(&pending, nt - 1, memory_order_relaxed);
    pthread_mutex_lock(&mu);
    atomic_fetch_add_explicit(&gen, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&cv_work);
    pthread_mutex_unlock(&mu);
    run_slice(0);
    if (!spin_done()) {
        pthread_mutex_lock(&mu);
        while (atomic_load_explicit(&pending, memory_order_acquire) != 0) pthread_cond_wait(&cv_done, &mu);
        pthread_mutex_unlock(&mu);
    }
    pthread_mutex_unlock(&run_mu);
}

void g4_pool_set_min_work(double work) {
    pthread_mutex_lock(&run_mu);
    min_work = work;
    pthread_mutex_unlock(&run_mu);
}

void g4_kernels_set_threads(int n) {
    pthread_mutex_lock(&run_mu);
    stop_locked();
    want_threads = n > MAX_THREADS ? MAX_THREADS : n > 0 ? n : 0;
    pthread_mutex_unlock(&run_mu);
}

int g4_kernels_threads(void) {
    pthread_mutex_lock(&run_mu);
    int n = n_running ? n_running : configured_threads();
    pthread_mutex_unlock(&run_mu);
    return n;
}

void g4_kernels_shutdown(void) {
    pthread_mutex_lock(&run_mu);
    stop_locked();
    pthread_mutex_unlock(&run_mu);
}
