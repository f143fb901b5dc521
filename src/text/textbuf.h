/* A growable, always NUL-terminated byte string, shared by the chat renderer, the reply splitter
 * and the conversation (src/text/), and by the server (tools/serve/, through dev/g4dev.h). */
#ifndef G4_TEXT_TEXTBUF_H
#define G4_TEXT_TEXTBUF_H

#include <stdlib.h>
#include <string.h>

#include "../util/err.h" /* relative: the tools reach this header through dev/g4dev.h, without -Isrc */

typedef struct {
    char *p;
    size_t n, cap;
} g4_textbuf;

static inline int g4_textbuf_append(g4_textbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return g4_fail("text: out of memory");
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static inline int g4_textbuf_appends(g4_textbuf *b, const char *s) { return g4_textbuf_append(b, s, strlen(s)); }

static inline void g4_textbuf_clear(g4_textbuf *b) {
    b->n = 0;
    if (b->p) b->p[0] = 0;
}

/* Hands the string to the caller (an empty result is still a valid ""); the buffer is empty after. */
static inline int g4_textbuf_take(g4_textbuf *b, char **out, size_t *out_len) {
    if (!b->p && g4_textbuf_append(b, "", 0)) return -1;
    *out = b->p;
    if (out_len) *out_len = b->n;
    b->p = NULL, b->n = b->cap = 0;
    return 0;
}

#endif
