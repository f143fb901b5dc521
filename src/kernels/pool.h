/* The persistent worker pool behind every dispatched matmul (internal to src/kernels/). */
#ifndef G4_KERNELS_POOL_H
#define G4_KERNELS_POOL_H

#include <stddef.h>

/* Processes items [begin, end) of a job. */
typedef void (*g4_pool_fn)(void *ctx, int begin, int end);

/* Runs fn over [0, items) cut into contiguous chunks that the pool threads and the caller claim
 * (chunk bounds are multiples of `grain`). `work` is the job's size in multiply-adds: below
 * the pool's minimum the caller runs everything itself, since waking threads would cost more.
 * The caller also runs everything when another thread is using the pool, and so does a pool
 * worker (inside a background item). Returns when done. */
void g4_pool_for(int items, int grain, double work, g4_pool_fn fn, void *ctx);

/* Background items: items [0, items) of fn (one at a time) that idle pool workers run between
 * jobs, for results the caller needs only later. They are claimed in order, and
 * g4_pool_background_wait(upto) runs every item below `upto` that nobody has claimed yet and
 * waits for the rest of them, so what they compute never depends on who ran them. One set at a
 * time: 0 while any set is active, its owner's included (or when items exceeds 2048), and the
 * caller should do the work itself; after 1, g4_pool_background_end (which waits for every item)
 * must follow, from the same thread. */
int g4_pool_background(int items, g4_pool_fn fn, void *ctx);
void g4_pool_background_wait(int upto);
void g4_pool_background_end(void);

/* memcpy of `bytes` split over the pool in slices of `slice` bytes (copies large enough to be
 * bound by page faults on fresh memory: each thread takes its own). */
void g4_pool_memcpy(void *to, const void *from, size_t bytes, size_t slice);

/* Minimum work worth splitting (default 65536 multiply-adds); tests set 0 to split everything. */
void g4_pool_set_min_work(double work);

#endif
