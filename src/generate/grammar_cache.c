/* Warm constraint state for front ends (g4.h "g4_grammar_cache"): one tokenizer trie, and the
 * grammars front ends ask for by text, compiled once, each with a start state whose token-mask
 * cache finished generations keep warm. A new context's first masks walk the whole vocabulary
 * (0.1-1.2 s on Gemma's 262k tokens) and the trie costs 0.4-1.4 s: both are paid once here, not
 * per request. Entries are dropped least recently used first, never while a state from them runs. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "g4.h"
#include "util/err.h"

typedef struct {
    g4_constraint_kind kind;
    char *text;
    size_t len;
    g4_grammar *g;
    g4_grammar_state *warm; /* the start state; its mask cache grows with each finished generation */
    int users;              /* states from g4_grammar_cache_start not yet handed back */
    long used;              /* the cache's clock at its last use */
} entry;

struct g4_grammar_cache {
    pthread_mutex_t lock;
    g4_grammar_vocab *v;
    entry *e;
    int n, cap;
    long clock, compiles, hits;
};

g4_grammar_cache *g4_grammar_cache_new(const g4_tokenizer *tok, int max_entries) {
    if (max_entries < 1) {
        g4_fail("grammar cache: max_entries %d: expected 1 or more", max_entries);
        return NULL;
    }
    g4_grammar_cache *c = calloc(1, sizeof *c);
    if (c) c->e = calloc((size_t)max_entries, sizeof *c->e);
    if (!c || !c->e) {
        free(c);
        g4_fail("grammar cache: out of memory");
        return NULL;
    }
    if (!(c->v = g4_grammar_vocab_new(tok))) {
        free(c->e);
        free(c);
        return NULL;
    }
    c->cap = max_entries;
    pthread_mutex_init(&c->lock, NULL);
    return c;
}

static void entry_free(entry *e) {
    g4_grammar_state_free(e->warm);
    g4_grammar_free(e->g);
    free(e->text);
    memset(e, 0, sizeof *e);
}

void g4_grammar_cache_free(g4_grammar_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) entry_free(&c->e[i]);
    free(c->e);
    g4_grammar_vocab_free(c->v);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

const g4_grammar_vocab *g4_grammar_cache_vocab(const g4_grammar_cache *c) { return c ? c->v : NULL; }

static g4_grammar *compile_kind(g4_constraint_kind kind, const char *text, size_t len) {
    switch (kind) {
    case G4_CONSTRAINT_GBNF: return g4_grammar_compile(text, len);
    case G4_CONSTRAINT_JSON_SCHEMA: return g4_grammar_from_json_schema(text, len);
    case G4_CONSTRAINT_JSON_OBJECT: return g4_grammar_json(1);
    case G4_CONSTRAINT_REGEX: return g4_grammar_from_regex(text, len);
    }
    g4_fail("grammar cache: unknown constraint kind %d", (int)kind);
    return NULL;
}

static entry *find(g4_grammar_cache *c, g4_constraint_kind kind, const char *text, size_t len) {
    if (kind == G4_CONSTRAINT_JSON_OBJECT) len = 0; /* one entry, whatever text came with it */
    for (int i = 0; i < c->n; i++)
        if (c->e[i].kind == kind && c->e[i].len == len && (len == 0 || !memcmp(c->e[i].text, text, len))) return &c->e[i];
    return NULL;
}

/* A free slot: a new one, or the least recently used entry that no running state holds (NULL when
 * every one is in use: the caller then compiles a state of its own, uncached). */
static entry *slot(g4_grammar_cache *c) {
    if (c->n < c->cap) return &c->e[c->n++];
    entry *lru = NULL;
    for (int i = 0; i < c->n; i++)
        if (c->e[i].users == 0 && (!lru || c->e[i].used < lru->used)) lru = &c->e[i];
    if (lru) entry_free(lru);
    return lru;
}

static entry *compile_entry(g4_grammar_cache *c, g4_constraint_kind kind, const char *text, size_t len) {
    g4_grammar *g = compile_kind(kind, text, len);
    if (!g) return NULL;
    if (kind == G4_CONSTRAINT_JSON_OBJECT) len = 0;
    char *copy = malloc(len ? len : 1);
    g4_grammar_state *warm = copy ? g4_grammar_start(g) : NULL;
    entry *e = warm ? slot(c) : NULL;
    if (!e) {
        if (!warm) g4_fail("grammar cache: out of memory");
        else g4_fail("grammar cache: all %d entries are in use", c->cap);
        g4_grammar_state_free(warm);
        free(copy);
        g4_grammar_free(g);
        return NULL;
    }
    if (len) memcpy(copy, text, len);
    *e = (entry){.kind = kind, .text = copy, .len = len, .g = g, .warm = warm};
    c->compiles++;
    return e;
}

g4_grammar_state *g4_grammar_cache_start(g4_grammar_cache *c, g4_constraint_kind kind, const char *text, size_t len) {
    if (!c || (!text && len)) {
        g4_fail("grammar cache: no cache or text");
        return NULL;
    }
    pthread_mutex_lock(&c->lock);
    entry *e = find(c, kind, text, len);
    if (e) c->hits++;
    else e = compile_entry(c, kind, text, len);
    g4_grammar_state *st = e ? g4_grammar_state_copy(e->warm) : NULL;
    if (st) e->users++, e->used = ++c->clock;
    pthread_mutex_unlock(&c->lock);
    return st;
}

void g4_grammar_cache_done(g4_grammar_cache *c, g4_grammar_state *started, const g4_grammar_state *done) {
    if (!c || !started) return;
    const g4_grammar *g = g4_grammar_state_grammar(started);
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < c->n; i++) {
        entry *e = &c->e[i];
        if (e->g != g) continue;
        if (done && g4_grammar_state_grammar(done) == g) g4_grammar_state_keep_cache(e->warm, done);
        if (e->users > 0) e->users--;
        break;
    }
    g4_grammar_state_free(started);
    pthread_mutex_unlock(&c->lock);
}

void g4_grammar_cache_stats(const g4_grammar_cache *c, int *entries, long *compiles, long *hits) {
    g4_grammar_cache *m = (g4_grammar_cache *)c; /* the lock only */
    pthread_mutex_lock(&m->lock);
    *entries = c->n;
    *compiles = c->compiles;
    *hits = c->hits;
    pthread_mutex_unlock(&m->lock);
}
