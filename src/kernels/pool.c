/* A persistent thread pool for the matmuls. Decode issues a few hundred small matmuls per token,
 * so waking threads must be cheap: idle workers poll an atomic job word for a short while before
 * sleeping on a condition variable, and the caller works on the job itself.
 *
 * A job's items are cut into chunks that every participant claims from one atomic word, so a
 * worker the OS has not scheduled yet (2 vCPUs shared with other processes) only means the caller
 * claims more chunks; nobody waits for a thread that has not started. Small jobs (decode) get
 * guided chunks, each a share of what is left, so the last ones are short and the end of a job
 * waits on little; big jobs get equal chunks of bounded work.
 * Which thread runs a chunk never changes its results: each item is computed by exactly one
 * thread with the same code.
 *
 * The job word packs [generation:32][chunks:16][next chunk:16]. Claiming is a compare-exchange
 * that also checks the generation, so a late worker can never take a chunk of a later job; the
 * job's other fields are read only after a successful claim, while the caller is still waiting
 * for that chunk and cannot rewrite them. Locking: run_mu serializes jobs and reconfiguration; mu
 * only guards the sleep/wake handshakes. */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h"
#include "pool.h"

#define MAX_THREADS 256
/* Jobs of up to CHUNKS_PER_THREAD * CHUNK_WORK multiply-adds per thread are split guided; bigger
 * ones into chunks of about CHUNK_WORK. */
#define CHUNKS_PER_THREAD 4
#define CHUNK_WORK (double)(1 << 22)
/* How long an idle thread keeps polling before it sleeps: long enough to cover the float work
 * between two matmuls of one decode step, short enough not to burn a core between tokens. */
#define SPIN_NS 200000L

static pthread_mutex_t run_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_work = PTHREAD_COND_INITIALIZER;
static pthread_cond_t cv_done = PTHREAD_COND_INITIALIZER;

/* Under run_mu. */
static int want_threads; /* 0: default */
static int n_running;    /* threads incl. the caller; 0 while stopped */
static int atexit_done;
static double min_work = 65536;
static uint32_t generation;
static pthread_t workers[MAX_THREADS];

static _Atomic uint64_t job_word;
static atomic_int done_chunks;
static atomic_int stopping;

/* The current job: written by the caller before it publishes job_word. */
static g4_pool_fn job_fn;
static void *job_ctx;
static int job_items, job_chunk;
/* Guided jobs: chunk k covers [job_start[k], job_start[k + 1]); job_chunk is 0. A guided split
 * takes about 6 nt chunks, so it is used up to GUIDED_MAX / 8 threads. */
#define GUIDED_MAX 256
static int job_start[GUIDED_MAX + 1];

/* Background items (g4_pool_background): bg_word packs [generation:32][items:16][next item:16]
 * like the job word; bg_done[k] holds the generation whose item k has finished. The set's owner
 * holds bg_mu from g4_pool_background to g4_pool_background_end. */
#define BG_MAX 2048
static pthread_mutex_t bg_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint64_t bg_word;
static atomic_uint bg_done[BG_MAX];
static g4_pool_fn bg_fn;
static void *bg_ctx;
static uint32_t bg_generation; /* under bg_mu */
static int bg_waited;          /* under bg_mu: the items below it are known to be done */

/* Pool workers run every g4_pool_for of their own inline (a background item's kernels call it):
 * only the caller's thread hands out jobs. */
static _Thread_local int is_pool_worker;

static uint32_t word_gen(uint64_t w) { return (uint32_t)(w >> 32); }
static int word_chunks(uint64_t w) { return (int)((w >> 16) & 0xFFFF); }
static int word_next(uint64_t w) { return (int)(w & 0xFFFF); }

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

/* Claims and runs chunks of generation `gen` until none is left. */
static void work_on(uint32_t gen) {
    uint64_t w = atomic_load_explicit(&job_word, memory_order_acquire);
    while (word_gen(w) == gen && word_next(w) < word_chunks(w)) {
        if (!atomic_compare_exchange_weak_explicit(&job_word, &w, w + 1, memory_order_acq_rel, memory_order_acquire))
            continue;
        long k = word_next(w), b = job_chunk ? k * job_chunk : job_start[k];
        long e = job_chunk ? b + job_chunk : job_start[k + 1];
        if (e > job_items) e = job_items;
        if (b < e) job_fn(job_ctx, (int)b, (int)e);
        if (atomic_fetch_add_explicit(&done_chunks, 1, memory_order_acq_rel) + 1 == word_chunks(w)) {
            pthread_mutex_lock(&mu);
            pthread_cond_broadcast(&cv_done);
            pthread_mutex_unlock(&mu);
        }
        w = atomic_load_explicit(&job_word, memory_order_acquire);
    }
}

/* Claims the next background item of generation `gen` if it lies below `upto`, runs it and marks
 * it done; 0 when there was none to claim. */
static int run_background_item(uint32_t gen, int upto) {
    uint64_t w = atomic_load_explicit(&bg_word, memory_order_acquire);
    while (word_gen(w) == gen && word_next(w) < word_chunks(w) && word_next(w) < upto) {
        if (!atomic_compare_exchange_weak_explicit(&bg_word, &w, w + 1, memory_order_acq_rel, memory_order_acquire)) continue;
        int k = word_next(w);
        bg_fn(bg_ctx, k, k + 1);
        atomic_store_explicit(&bg_done[k], gen, memory_order_release);
        return 1;
    }
    return 0;
}

/* Polls until the job word leaves generation `gen`, running background items meanwhile; 0 when
 * the time is up with nothing to do (then sleep). */
static int spin_new_job(uint32_t gen) {
    long start = now_ns();
    for (unsigned i = 1;; i++) {
        if (word_gen(atomic_load_explicit(&job_word, memory_order_acquire)) != gen) return 1;
        if (run_background_item(word_gen(atomic_load_explicit(&bg_word, memory_order_acquire)), INT_MAX)) {
            start = now_ns();
            continue;
        }
        cpu_relax();
        if ((i & 255) == 0 && now_ns() - start > SPIN_NS) return 0;
    }
}

static int spin_done(int chunks) {
    long start = now_ns();
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&done_chunks, memory_order_acquire) == chunks) return 1;
        cpu_relax();
        if ((i & 255) == 0 && now_ns() - start > SPIN_NS) return 0;
    }
}

static void *worker(void *arg) {
    uint32_t seen = (uint32_t)(uintptr_t)arg;
    is_pool_worker = 1;
    for (;;) {
        if (!spin_new_job(seen)) {
            pthread_mutex_lock(&mu);
            while (word_gen(atomic_load_explicit(&job_word, memory_order_acquire)) == seen) pthread_cond_wait(&cv_work, &mu);
            pthread_mutex_unlock(&mu);
        }
        seen = word_gen(atomic_load_explicit(&job_word, memory_order_acquire));
        if (atomic_load_explicit(&stopping, memory_order_acquire)) return NULL;
        work_on(seen);
    }
}

static int default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

static int configured_threads(void) { return want_threads > 0 ? want_threads : default_threads(); }

/* Under run_mu: a new generation with no chunks, seen by sleeping and polling workers alike. */
static void publish(uint64_t word) {
    pthread_mutex_lock(&mu);
    atomic_store_explicit(&job_word, word, memory_order_release);
    pthread_cond_broadcast(&cv_work);
    pthread_mutex_unlock(&mu);
}

/* Under run_mu. */
static void stop_locked(void) {
    if (n_running > 1) {
        atomic_store_explicit(&stopping, 1, memory_order_release);
        publish((uint64_t)++generation << 32);
        for (int i = 1; i < n_running; i++) pthread_join(workers[i], NULL);
        atomic_store_explicit(&stopping, 0, memory_order_release);
    }
    n_running = 0;
}

/* exit() may come from another thread while a matmul holds the pool; joining then would wait
 * forever, and the process is going away anyway. */
static void shutdown_at_exit(void) {
    if (pthread_mutex_trylock(&run_mu) != 0) return;
    stop_locked();
    pthread_mutex_unlock(&run_mu);
}

/* Under run_mu. */
static void start_locked(void) {
    int want = configured_threads();
    n_running = 1;
    for (int i = 1; i < want; i++) {
        if (pthread_create(&workers[i], NULL, worker, (void *)(uintptr_t)generation) != 0) break; /* run with fewer */
        n_running++;
    }
    if (!atexit_done) atexit_done = atexit(shutdown_at_exit) == 0;
}

/* Under run_mu: guided chunks into job_start, each 1/(2 nt) of the items left (whole grains), but
 * at least 1/(16 nt) of the job; returns their count. On the decode matmuls this cut the caller's
 * wait at the end of each job enough to decode about 2-3 % faster than 4 equal chunks per
 * thread (tokens alternating between the two in one process). */
static int plan_guided(int items, int grain, int nt) {
    int least = (items / (16 * nt) + grain - 1) / grain * grain, k = 0, at = 0;
    if (least < grain) least = grain;
    while (at < items) {
        int left = items - at, c = (left / (2 * nt) + grain - 1) / grain * grain;
        if (c < least) c = least;
        if (c > left || k == GUIDED_MAX - 1) c = left;
        job_start[k++] = at;
        at += c;
    }
    job_start[k] = items;
    return k;
}

void g4_pool_for(int items, int grain, double work, g4_pool_fn fn, void *ctx) {
    if (items <= 0) return;
    if (is_pool_worker || pthread_mutex_trylock(&run_mu) != 0) {
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
    int guided = work / CHUNK_WORK <= nt * CHUNKS_PER_THREAD && nt <= GUIDED_MAX / 8;
    int chunk = 0, chunks = guided ? plan_guided(items, grain, nt) : 0;
    if (!chunks) {
        /* a chunk of at most about CHUNK_WORK multiply-adds, so a thread the OS deschedules
         * holds up at most a short chunk */
        double by_work = work / CHUNK_WORK;
        int want_chunks = nt * CHUNKS_PER_THREAD;
        if (by_work > want_chunks) want_chunks = by_work < 0xFFFF ? (int)by_work : 0xFFFF;
        chunk = (items + want_chunks - 1) / want_chunks;
        chunk = (chunk + grain - 1) / grain * grain;
        chunks = (items + chunk - 1) / chunk;
        if (chunks > 0xFFFF) { /* keep the count within its 16 bits */
            chunk = (items + 0xFFFE) / 0xFFFF;
            chunk = (chunk + grain - 1) / grain * grain;
            chunks = (items + chunk - 1) / chunk;
        }
    }
    job_fn = fn;
    job_ctx = ctx;
    job_items = items;
    job_chunk = chunk;
    atomic_store_explicit(&done_chunks, 0, memory_order_relaxed);
    uint32_t gen = ++generation;
    publish((uint64_t)gen << 32 | (uint64_t)chunks << 16);
    work_on(gen);
    if (!spin_done(chunks)) {
        pthread_mutex_lock(&mu);
        while (atomic_load_explicit(&done_chunks, memory_order_acquire) != chunks) pthread_cond_wait(&cv_done, &mu);
        pthread_mutex_unlock(&mu);
    }
    pthread_mutex_unlock(&run_mu);
}

int g4_pool_background(int items, g4_pool_fn fn, void *ctx) {
    if (items <= 0 || items > BG_MAX || is_pool_worker || pthread_mutex_trylock(&bg_mu) != 0) return 0;
    bg_fn = fn;
    bg_ctx = ctx;
    if (++bg_generation == 0) ++bg_generation; /* 0 is what bg_done starts as */
    bg_waited = 0;
    atomic_store_explicit(&bg_word, (uint64_t)bg_generation << 32 | (uint64_t)items << 16, memory_order_release);
    return 1;
}

void g4_pool_background_wait(int upto) {
    uint32_t gen = bg_generation;
    int items = word_chunks(atomic_load_explicit(&bg_word, memory_order_acquire));
    if (upto > items) upto = items;
    while (run_background_item(gen, upto)) {
    }
    /* each wait checks only the items the previous ones did not: a decode step waits once a layer */
    for (; bg_waited < upto; bg_waited++)
        while (atomic_load_explicit(&bg_done[bg_waited], memory_order_acquire) != gen) cpu_relax();
}

void g4_pool_background_end(void) {
    g4_pool_background_wait(INT_MAX);
    pthread_mutex_unlock(&bg_mu);
}

typedef struct {
    unsigned char *to;
    const unsigned char *from;
    size_t bytes, slice;
} copy_job;

static void copy_slices(void *ctx, int b, int e) {
    const copy_job *j = ctx;
    size_t lo = (size_t)b * j->slice, hi = (size_t)e * j->slice < j->bytes ? (size_t)e * j->slice : j->bytes;
    memcpy(j->to + lo, j->from + lo, hi - lo);
}

void g4_pool_memcpy(void *to, const void *from, size_t bytes, size_t slice) {
    if (!bytes) return;
    if (slice < bytes / INT_MAX + 1) slice = bytes / INT_MAX + 1; /* item counts are ints */
    copy_job j = {to, from, bytes, slice};
    g4_pool_for((int)((bytes + slice - 1) / slice), 1, (double)bytes, copy_slices, &j);
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
