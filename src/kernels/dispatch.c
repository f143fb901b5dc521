/* Level selection: the levels of levels.h in their order, the best one this build and CPU can
 * run, or the one G4_DISPATCH names. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_x86.h"
#include "kernels.h"
#include "levels.h"
#include "util/err.h"

#define G4_LEVEL_ENTRY(name) &g4_kernels_##name,
static const g4_kernels *const levels[] = {G4_KERNEL_LEVELS(G4_LEVEL_ENTRY)};
#undef G4_LEVEL_ENTRY
#define N_LEVELS ((int)(sizeof levels / sizeof *levels))

int g4_kernels_count(void) { return N_LEVELS; }

const g4_kernels *g4_kernels_at(int i) { return i >= 0 && i < N_LEVELS ? levels[i] : NULL; }

int g4_kernels_available(const g4_kernels *k) { return k && k->built && (!k->supported || k->supported()); }

static const g4_kernels *level_named(const char *name) {
    for (int i = 0; name && i < N_LEVELS; i++)
        if (strcmp(name, levels[i]->name) == 0) return levels[i];
    return NULL;
}

const g4_kernels *g4_kernels_level(const char *name) {
    const g4_kernels *k = level_named(name);
    return g4_kernels_available(k) ? k : NULL;
}

const g4_kernels *g4_kernels_best(void) {
    for (int i = 0; i < N_LEVELS; i++)
        if (g4_kernels_available(levels[i])) return levels[i];
    return &g4_kernels_portable;
}

const char *g4_kernels_cpu_flags(void) {
#if defined(__aarch64__)
    return "asimd";
#else
    return g4_x86_cpu_flags();
#endif
}

/* "|name" for each level, the first bar left out below */
#define G4_LEVEL_NAME(name) "|" #name
const char *g4_kernels_names(void) { return &G4_KERNEL_LEVELS(G4_LEVEL_NAME)[1]; }
#undef G4_LEVEL_NAME

const g4_kernels *g4_kernels_get(void) {
    const char *force = getenv("G4_DISPATCH");
    const g4_kernels *best = g4_kernels_best();
    if (!force || !*force) return best;
    const g4_kernels *k = g4_kernels_level(force);
    if (k) return k;
    /* Sessions call this once each; one warning per process is enough. */
    static atomic_int warned;
    if (!atomic_exchange(&warned, 1))
        g4_warn("G4_DISPATCH=%s %s (%s); using %s", force, level_named(force) ? "is not supported on this CPU" : "is unknown",
                g4_kernels_names(), best->name);
    return best;
}

/* ---- the weight-preparation hook's copies (kernels.h, g4_wprep) ---- */

g4_wprep *g4_wprep_new(const g4_kernels *level, const g4_qweight *w, size_t bytes) {
    g4_wprep *p = malloc(sizeof *p);
    uint8_t *data = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!p || !data) {
        free(p);
        free(data);
        return NULL;
    }
    *p = (g4_wprep){.level = level, .codes = w->w, .bits = w->bits, .in = w->in, .out = w->out, .block = w->block,
                    .row_bytes = w->row_bytes, .bytes = bytes, .data = data};
    return p;
}

void g4_wprep_free(g4_wprep *p) {
    if (!p) return;
    free(p->data);
    free(p);
}

long g4_wprep_row0(const g4_qweight *w, const g4_kernels *level) {
    const g4_wprep *p = w->prep;
    if (!p || p->level != level || p->bits != w->bits || p->in != w->in || p->block != w->block || p->row_bytes != w->row_bytes ||
        p->row_bytes == 0)
        return -1;
    /* as integers: w may point into another allocation altogether (a reordered copy of the rows) */
    uintptr_t at = (uintptr_t)w->w, from = (uintptr_t)p->codes;
    if (at < from || (at - from) % p->row_bytes) return -1;
    size_t row0 = (at - from) / p->row_bytes;
    if (w->out < 0 || row0 + (size_t)w->out > (size_t)p->out) return -1;
    return (long)row0;
}
