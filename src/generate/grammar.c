/* GBNF grammars (llama.cpp's dialect) compiled to byte-level rules, and an incremental
 * recognizer over them: a set of parse stacks (llama.cpp's approach) whose tops are always byte
 * sets. Classes and `.` over code points become alternatives of UTF-8 byte-range sequences, so
 * the recognizer never needs to know where a character starts and tokens may split characters.
 *
 * Stacks are persistent: a node is (position, parent) interned in a hash table, so equal stacks
 * are the same node and a set of stacks is a deduplicated list of node ids. A token mask walks
 * the vocabulary's byte trie against the stacks, sharing every common prefix. */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <stdint.h>
#include <stdatomic.h>

#include "g4.h"
#include "util/err.h"

#define MAX_TEXT (1u << 20)
#define MAX_ELEMS (4u << 20)
#define MAX_REP 10000
#define MAX_NEST 256
#define MAX_STACKS 4096
#define MAX_DEPTH 1024
#define EXPAND_BUDGET (1u << 20)
#define MAX_ESCAPE_WORK 20000

enum { E_END = 0, E_ALT = 1, E_REF = 2, E_SET = 3 };
#define EL(t, v) (((uint32_t)(t) << 28) | (uint32_t)(v))
#define EL_T(e) ((e) >> 28)
#define EL_V(e) ((e) & 0x0FFFFFFFu)
#define NONE 0xFFFFFFFFu
#define COMPLETE 0xFFFFFFFEu /* a stack that is empty: the grammar can end */
#define BOTTOM 0xFFFFFFFDu   /* the parent of a mask walk's cut-off stack (see mask_entry) */
#define ESCAPE 0xFFFFFFFCu   /* a cut-off stack that returned below its bottom */

struct g4_grammar {
    uint32_t *el;          /* every rule's alternatives, flat: alt ALT alt ... END */
    uint32_t n_el;
    uint32_t *alt;         /* the start position of each alternative, rule by rule */
    uint32_t *alt_off;     /* rule r's alternatives: alt[alt_off[r] .. alt_off[r + 1]) */
    uint32_t n_rules, root;
    uint32_t (*sets)[8];   /* 256-bit byte sets */
    uint32_t n_sets;
};

/* ---- growable vectors ------------------------------------------------------------------------ */

typedef struct {
    uint32_t *p;
    size_t n, cap;
} u32vec;

static int vpush(u32vec *v, uint32_t x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        uint32_t *p = realloc(v->p, cap * sizeof *p);
        if (!p) return g4_fail("grammar: out of memory");
        v->p = p, v->cap = cap;
    }
    v->p[v->n++] = x;
    return 0;
}

static int vappend(u32vec *v, const uint32_t *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (vpush(v, x[i])) return -1;
    return 0;
}

/* ---- the compiler ---------------------------------------------------------------------------- */

typedef struct {
    char *name;
    size_t name_len;
    u32vec el;      /* this rule's elements, alternatives separated by E_ALT, no final E_END */
    int defined;
    size_t ref_at;  /* where it was first referenced (for "undefined rule") */
} rule_def;

typedef struct {
    const char *src, *end;
    rule_def *rules;
    size_t n_rules, cap_rules;
    u32vec sets;    /* 8 words per set */
    uint32_t byte_set[256]; /* set id + 1 of each single-byte set */
    size_t n_el;
    int failed;
} compiler;

static int at_err(compiler *c, const char *at, const char *fmt, const char *what) {
    size_t line = 1, col = 1;
    for (const char *p = c->src; p < at && p < c->end; p++) {
        if (*p == '\n') line++, col = 1;
        else col++;
    }
    c->failed = 1;
    return g4_fail("grammar: line %zu column %zu: %s%s", line, col, fmt, what ? what : "");
}

static int set_add(compiler *c, const uint32_t bits[8]) {
    size_t n = c->sets.n / 8;
    for (size_t i = n > 64 ? n - 64 : 0; i < n; i++) /* nearby duplicates (UTF-8 continuation ranges) */
        if (memcmp(c->sets.p + i * 8, bits, 32) == 0) return (int)i;
    if (n >= 0x0FFFFFFF || vappend(&c->sets, bits, 8)) return -1;
    return (int)n;
}

static int set_range(compiler *c, unsigned lo, unsigned hi) {
    if (lo == hi && c->byte_set[lo]) return (int)c->byte_set[lo] - 1;
    uint32_t bits[8] = {0};
    for (unsigned b = lo; b <= hi; b++) bits[b >> 5] |= 1u << (b & 31);
    int id = set_add(c, bits);
    if (id >= 0 && lo == hi) c->byte_set[lo] = (uint32_t)id + 1;
    return id;
}

static int emit(compiler *c, u32vec *out, uint32_t e) {
    if (++c->n_el > MAX_ELEMS) {
        c->failed = 1;
        return g4_fail("grammar: more than %u elements (repetitions expand; make the grammar smaller)", MAX_ELEMS);
    }
    return vpush(out, e);
}

static int emit_byte(compiler *c, u32vec *out, unsigned b) {
    int id = set_range(c, b, b);
    return id < 0 ? -1 : emit(c, out, EL(E_SET, id));
}

static uint32_t rule_new(compiler *c, const char *name, size_t len) {
    if (c->n_rules == c->cap_rules) {
        size_t cap = c->cap_rules ? c->cap_rules * 2 : 32;
        rule_def *r = realloc(c->rules, cap * sizeof *r);
        if (!r) return NONE;
        c->rules = r, c->cap_rules = cap;
    }
    if (c->n_rules >= 0x0FFFFFFF) return NONE;
    rule_def *r = &c->rules[c->n_rules];
    memset(r, 0, sizeof *r);
    r->name = malloc(len + 1);
    if (!r->name) return NONE;
    memcpy(r->name, name, len);
    r->name[len] = 0;
    r->name_len = len;
    return (uint32_t)c->n_rules++;
}

static uint32_t rule_named(compiler *c, const char *name, size_t len) {
    for (size_t i = 0; i < c->n_rules; i++)
        if (c->rules[i].name_len == len && memcmp(c->rules[i].name, name, len) == 0) return (uint32_t)i;
    return rule_new(c, name, len);
}

static uint32_t rule_anon(compiler *c) {
    char name[32];
    int n = snprintf(name, sizeof name, " %zu", c->n_rules); /* a space: never a GBNF name */
    return rule_new(c, name, (size_t)n);
}

/* UTF-8 of code point cp into b; returns its length. */
static int utf8_put(uint32_t cp, unsigned char *b) {
    if (cp < 0x80) return b[0] = (unsigned char)cp, 1;
    if (cp < 0x800) return b[0] = (unsigned char)(0xC0 | cp >> 6), b[1] = (unsigned char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return b[0] = (unsigned char)(0xE0 | cp >> 12), b[1] = (unsigned char)(0x80 | ((cp >> 6) & 63)),
               b[2] = (unsigned char)(0x80 | (cp & 63)), 3;
    b[0] = (unsigned char)(0xF0 | cp >> 18), b[1] = (unsigned char)(0x80 | ((cp >> 12) & 63));
    b[2] = (unsigned char)(0x80 | ((cp >> 6) & 63)), b[3] = (unsigned char)(0x80 | (cp & 63));
    return 4;
}

/* The code points [lo, hi] (no surrogates inside) as alternatives of byte-range sequences, each
 * appended to alts with an E_ALT before it (RE2's UTF-8 range split). */
static int utf8_alts(compiler *c, u32vec *alts, uint32_t lo, uint32_t hi) {
    static const uint32_t edge[3] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= edge[i] && hi > edge[i]) return utf8_alts(c, alts, lo, edge[i]) || utf8_alts(c, alts, edge[i] + 1, hi);
    if (hi >= 0x80)
        for (int i = 1; i < 4; i++) {
            uint32_t m = (1u << (6 * i)) - 1;
            if ((lo & ~m) != (hi & ~m)) {
                if ((lo & m) != 0) return utf8_alts(c, alts, lo, lo | m) || utf8_alts(c, alts, (lo | m) + 1, hi);
                if ((hi & m) != m) return utf8_alts(c, alts, lo, (hi & ~m) - 1) || utf8_alts(c, alts, hi & ~m, hi);
            }
        }
    unsigned char a[4], b[4];
    int n = utf8_put(lo, a);
    utf8_put(hi, b);
    if (alts->n && emit(c, alts, EL(E_ALT, 0))) return -1;
    for (int i = 0; i < n; i++) {
        int id = set_range(c, a[i], b[i]);
        if (id < 0 || emit(c, alts, EL(E_SET, id))) return -1;
    }
    return 0;
}

typedef struct {
    uint32_t lo, hi;
} cprange;

static int cmp_range(const void *a, const void *b) {
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* A set of code point ranges (negated or not) as one element appended to out: a byte set when it
 * is all ASCII, else a reference to a new rule of UTF-8 alternatives. */
static int emit_class(compiler *c, u32vec *out, cprange *r, size_t n, int negate) {
    qsort(r, n, sizeof *r, cmp_range);
    cprange m[1024];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) { /* merge */
        if (k && r[i].lo <= m[k - 1].hi + 1) {
            if (r[i].hi > m[k - 1].hi) m[k - 1].hi = r[i].hi;
        } else {
            m[k++] = r[i];
        }
    }
    cprange f[1030];
    size_t nf = 0;
    if (negate) {
        uint32_t next = 0;
        for (size_t i = 0; i < k; i++) {
            if (m[i].lo > next) f[nf++] = (cprange){next, m[i].lo - 1};
            next = m[i].hi + 1;
        }
        if (next <= 0x10FFFF) f[nf++] = (cprange){next, 0x10FFFF};
    } else {
        memcpy(f, m, k * sizeof *m);
        nf = k;
    }
    /* cut out the surrogates, and the ASCII part into one byte set */
    uint32_t ascii[8] = {0};
    int has_ascii = 0;
    u32vec alts = {0};
    int rc = 0;
    for (size_t i = 0; i < nf && !rc; i++) {
        uint32_t lo = f[i].lo, hi = f[i].hi;
        for (; lo <= hi && lo < 0x80; lo++) ascii[lo >> 5] |= 1u << (lo & 31), has_ascii = 1;
        if (lo > hi) continue;
        if (lo < 0xD800 && hi >= 0xD800) {
            rc = utf8_alts(c, &alts, lo, 0xD7FF);
            lo = 0xE000;
        }
        if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
        if (!rc && lo <= hi) rc = utf8_alts(c, &alts, lo, hi);
    }
    if (rc) goto done;
    int aid = has_ascii ? set_add(c, ascii) : -1;
    if (has_ascii && aid < 0) goto fail;
    if (alts.n == 0) {
        if (!has_ascii) { /* an empty class: a set that matches nothing */
            uint32_t none[8] = {0};
            aid = set_add(c, none);
            if (aid < 0) goto fail;
        }
        rc = emit(c, out, EL(E_SET, aid));
        goto done;
    }
    uint32_t rid = rule_anon(c);
    if (rid == NONE) goto fail;
    rule_def *rd = &c->rules[rid];
    rd->defined = 1;
    if (has_ascii && (emit(c, &rd->el, EL(E_SET, aid)) || emit(c, &rd->el, EL(E_ALT, 0)))) goto fail;
    if (vappend(&rd->el, alts.p, alts.n)) goto fail;
    rc = emit(c, out, EL(E_REF, rid));
    goto done;
fail:
    rc = -1;
done:
    free(alts.p);
    return rc;
}

static const char *skip_space(const char *p, const char *end, int newline_ok) {
    while (p < end) {
        if (*p == ' ' || *p == '\t' || (newline_ok && (*p == '\r' || *p == '\n'))) {
            p++;
        } else if (*p == '#') {
            while (p < end && *p != '\n' && *p != '\r') p++;
        } else {
            break;
        }
    }
    return p;
}

static int is_name_char(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_';
}

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* One character of a literal or class at *pp (escapes decoded, UTF-8 read whole) into *cp. */
static int parse_char(compiler *c, const char **pp, uint32_t *cp) {
    const char *p = *pp;
    if (p >= c->end) return at_err(c, p, "unexpected end of grammar", NULL);
    unsigned char ch = (unsigned char)*p;
    if (ch == '\\') {
        if (p + 1 >= c->end) return at_err(c, p, "unfinished escape", NULL);
        char e = p[1];
        int nhex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (nhex) {
            uint32_t v = 0;
            for (int i = 0; i < nhex; i++) {
                int h = p + 2 + i < c->end ? hexval(p[2 + i]) : -1;
                if (h < 0) return at_err(c, p, "bad hex escape", NULL);
                v = v * 16 + (uint32_t)h;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return at_err(c, p, "escape is not a Unicode scalar value", NULL);
            *cp = v, *pp = p + 2 + nhex;
            return 0;
        }
        switch (e) {
        case 'n': *cp = '\n'; break;
        case 'r': *cp = '\r'; break;
        case 't': *cp = '\t'; break;
        case '0': *cp = 0; break;
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '.': case '\'': *cp = (unsigned char)e; break;
        default: return at_err(c, p, "unknown escape", NULL);
        }
        *pp = p + 2;
        return 0;
    }
    int n = ch < 0x80 ? 1 : (ch >> 5) == 6 ? 2 : (ch >> 4) == 14 ? 3 : (ch >> 3) == 30 ? 4 : 0;
    if (!n || p + n > c->end) return at_err(c, p, "invalid UTF-8", NULL);
    uint32_t v = n == 1 ? ch : n == 2 ? ch & 31u : n == 3 ? ch & 15u : ch & 7u;
    for (int i = 1; i < n; i++) {
        if (((unsigned char)p[i] & 0xC0) != 0x80) return at_err(c, p, "invalid UTF-8", NULL);
        v = v << 6 | ((unsigned char)p[i] & 63u);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min_cp[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return at_err(c, p, "invalid UTF-8", NULL);
    *cp = v, *pp = p + n;
    return 0;
}

static int parse_alternates(compiler *c, const char **pp, u32vec *out, int nested, int depth);

/* x{min,max} in place of the symbol out[from..] (max < 0: unbounded), as llama.cpp expands it:
 * min copies, then a right-recursive rule (unbounded) or nested optional rules. */
static int repeat_symbol(compiler *c, u32vec *out, size_t from, long min, long max) {
    size_t n = out->n - from;
    uint32_t *sym = malloc((n ? n : 1) * sizeof *sym);
    if (!sym) return g4_fail("grammar: out of memory");
    memcpy(sym, out->p + from, n * sizeof *sym);
    out->n = from;
    int rc = 0;
    for (long i = 0; i < min && !rc; i++)
        for (size_t j = 0; j < n && !rc; j++) rc = emit(c, out, sym[j]);
    if (!rc && max < 0) {
        uint32_t r = rule_anon(c);
        if (r == NONE) rc = g4_fail("grammar: out of memory");
        for (size_t j = 0; j < n && !rc; j++) rc = emit(c, &c->rules[r].el, sym[j]);
        if (!rc) rc = emit(c, &c->rules[r].el, EL(E_REF, r)) || emit(c, &c->rules[r].el, EL(E_ALT, 0));
        if (!rc) c->rules[r].defined = 1, rc = emit(c, out, EL(E_REF, r));
    } else if (!rc && max > min) {
        uint32_t last = NONE;
        for (long i = 0; i < max - min && !rc; i++) {
            uint32_t r = rule_anon(c);
            if (r == NONE) {
                rc = g4_fail("grammar: out of memory");
                break;
            }
            for (size_t j = 0; j < n && !rc; j++) rc = emit(c, &c->rules[r].el, sym[j]);
            if (!rc && last != NONE) rc = emit(c, &c->rules[r].el, EL(E_REF, last));
            if (!rc) rc = emit(c, &c->rules[r].el, EL(E_ALT, 0));
            c->rules[r].defined = 1;
            last = r;
        }
        if (!rc) rc = emit(c, out, EL(E_REF, last));
    }
    free(sym);
    return rc;
}

static int parse_count(compiler *c, const char **pp, long *v) {
    const char *p = *pp;
    if (p >= c->end || *p < '0' || *p > '9') return at_err(c, p, "expected a number in {m,n}", NULL);
    long x = 0;
    while (p < c->end && *p >= '0' && *p <= '9') {
        x = x * 10 + (*p++ - '0');
        if (x > MAX_REP) return at_err(c, *pp, "repetition count over 10000", NULL);
    }
    *v = x, *pp = p;
    return 0;
}

/* A special token's bytes in a grammar and in the vocabulary's trie: 0xFF, which no UTF-8 text
 * holds (every literal and class here is UTF-8, and the trie leaves the byte-fallback <0xFF> token
 * out), then the id in 3 bytes. So text can never spell a special token, and a grammar reaches one
 * only through <[ID]>. */
#define G4_TOKEN_MARK_LEN 4
#define MAX_TOKEN_ID 0xFFFFFF
static void token_mark(int32_t id, unsigned char b[G4_TOKEN_MARK_LEN]) {
    b[0] = 0xFF, b[1] = (unsigned char)(id >> 16), b[2] = (unsigned char)(id >> 8), b[3] = (unsigned char)id;
}

static int parse_token_id(compiler *c, const char **pp, long *v) {
    const char *p = *pp;
    if (p >= c->end || *p < '0' || *p > '9') return at_err(c, p, "expected a token id in <[...]>", NULL);
    long x = 0;
    while (p < c->end && *p >= '0' && *p <= '9') {
        x = x * 10 + (*p++ - '0');
        if (x > MAX_TOKEN_ID) return at_err(c, *pp, "token id over 16777215", NULL);
    }
    *v = x, *pp = p;
    return 0;
}

static int parse_sequence(compiler *c, const char **pp, u32vec *out, int nested, int depth) {
    const char *p = *pp;
    size_t last_sym = out->n;
    int have_sym = 0;
    while (p < c->end) {
        const char *at = p;
        char ch = *p;
        if (ch == '"') {
            last_sym = out->n, have_sym = 1;
            p++;
            while (p < c->end && *p != '"') {
                uint32_t cp;
                unsigned char b[4];
                if (parse_char(c, &p, &cp)) return -1;
                int n = utf8_put(cp, b);
                for (int i = 0; i < n; i++)
                    if (emit_byte(c, out, b[i])) return -1;
            }
            if (p >= c->end) return at_err(c, at, "unterminated literal", NULL);
            p++;
        } else if (ch == '[') {
            last_sym = out->n, have_sym = 1;
            p++;
            int negate = p < c->end && *p == '^';
            if (negate) p++;
            cprange r[1024];
            size_t n = 0;
            while (p < c->end && *p != ']') {
                uint32_t lo, hi;
                if (parse_char(c, &p, &lo)) return -1;
                hi = lo;
                if (p + 1 < c->end && *p == '-' && p[1] != ']') {
                    p++;
                    if (parse_char(c, &p, &hi)) return -1;
                    if (hi < lo) return at_err(c, at, "class range out of order", NULL);
                }
                if (n == 1024) return at_err(c, at, "more than 1024 ranges in a class", NULL);
                r[n++] = (cprange){lo, hi};
            }
            if (p >= c->end) return at_err(c, at, "unterminated character class", NULL);
            p++;
            if (emit_class(c, out, r, n, negate)) return -1;
        } else if (ch == '<') { /* <[ID]>: one token by id (llama.cpp's token reference), as its marker bytes */
            last_sym = out->n, have_sym = 1;
            long id = 0;
            p++;
            if (p >= c->end || *p != '[') return at_err(c, at, "expected '<[' and a token id", NULL);
            p++;
            if (parse_token_id(c, &p, &id)) return -1;
            if (p + 1 >= c->end || p[0] != ']' || p[1] != '>') return at_err(c, at, "expected ']>' after the token id", NULL);
            p += 2;
            unsigned char b[G4_TOKEN_MARK_LEN];
            token_mark((int32_t)id, b);
            for (int i = 0; i < G4_TOKEN_MARK_LEN; i++)
                if (emit_byte(c, out, b[i])) return -1;
        } else if (ch == '.') {
            last_sym = out->n, have_sym = 1;
            p++;
            cprange all = {0, 0x10FFFF};
            if (emit_class(c, out, &all, 1, 0)) return -1;
        } else if (is_name_char(ch)) {
            last_sym = out->n, have_sym = 1;
            const char *s = p;
            while (p < c->end && is_name_char(*p)) p++;
            const char *q = skip_space(p, c->end, 1);
            if (q + 2 < c->end && q[0] == ':' && q[1] == ':' && q[2] == '=') {
                if (!nested) { /* the next rule's definition */
                    p = s;
                    break;
                }
                return at_err(c, s, "rule definition inside a group", NULL);
            }
            uint32_t r = rule_named(c, s, (size_t)(p - s));
            if (r == NONE) return g4_fail("grammar: out of memory");
            if (!c->rules[r].defined && !c->rules[r].ref_at) c->rules[r].ref_at = (size_t)(s - c->src) + 1;
            if (emit(c, out, EL(E_REF, r))) return -1;
        } else if (ch == '(') {
            if (depth >= MAX_NEST) return at_err(c, p, "groups nested more than 256 deep", NULL);
            last_sym = out->n, have_sym = 1;
            p = skip_space(p + 1, c->end, 1);
            uint32_t r = rule_anon(c);
            if (r == NONE) return g4_fail("grammar: out of memory");
            u32vec body = {0};
            int rc = parse_alternates(c, &p, &body, 1, depth + 1);
            c->rules[r].el = body; /* c->rules may have moved during the parse */
            c->rules[r].defined = 1;
            if (rc) return -1;
            if (p >= c->end || *p != ')') return at_err(c, at, "expected ')'", NULL);
            p++;
            if (emit(c, out, EL(E_REF, r))) return -1;
        } else if (ch == '*' || ch == '+' || ch == '?' || ch == '{') {
            if (!have_sym || last_sym == out->n) return at_err(c, p, "repetition without a preceding item", NULL);
            long min = 0, max = -1;
            p++;
            if (ch == '+') min = 1;
            else if (ch == '?') max = 1;
            else if (ch == '{') {
                p = skip_space(p, c->end, 0);
                if (parse_count(c, &p, &min)) return -1;
                p = skip_space(p, c->end, 0);
                max = min;
                if (p < c->end && *p == ',') {
                    p = skip_space(p + 1, c->end, 0);
                    max = -1;
                    if (p < c->end && *p >= '0' && *p <= '9' && parse_count(c, &p, &max)) return -1;
                    p = skip_space(p, c->end, 0);
                }
                if (p >= c->end || *p != '}') return at_err(c, at, "expected '}'", NULL);
                if (max >= 0 && max < min) return at_err(c, at, "{m,n} with n < m", NULL);
                p++;
            }
            if (repeat_symbol(c, out, last_sym, min, max)) return -1;
            have_sym = 0;
        } else {
            break;
        }
        p = skip_space(p, c->end, nested);
    }
    *pp = p;
    return 0;
}

static int parse_alternates(compiler *c, const char **pp, u32vec *out, int nested, int depth) {
    if (parse_sequence(c, pp, out, nested, depth)) return -1;
    while (*pp < c->end && **pp == '|') {
        if (emit(c, out, EL(E_ALT, 0))) return -1;
        *pp = skip_space(*pp + 1, c->end, 1);
        if (parse_sequence(c, pp, out, nested, depth)) return -1;
    }
    return 0;
}

static int parse_rules(compiler *c) {
    const char *p = skip_space(c->src, c->end, 1);
    while (p < c->end) {
        const char *s = p;
        while (p < c->end && is_name_char(*p)) p++;
        if (p == s) return at_err(c, s, "expected a rule name", NULL);
        uint32_t r = rule_named(c, s, (size_t)(p - s));
        if (r == NONE) return g4_fail("grammar: out of memory");
        if (c->rules[r].defined) return at_err(c, s, "rule defined twice: ", c->rules[r].name);
        p = skip_space(p, c->end, 0);
        if (p + 2 >= c->end || p[0] != ':' || p[1] != ':' || p[2] != '=') return at_err(c, p, "expected '::='", NULL);
        p = skip_space(p + 3, c->end, 1);
        u32vec body = {0};
        int rc = parse_alternates(c, &p, &body, 0, 0);
        free(c->rules[r].el.p);
        c->rules[r].el = body;
        c->rules[r].defined = 1;
        if (rc) return -1;
        if (p < c->end && *p != '\n' && *p != '\r' && !is_name_char(*p)) return at_err(c, p, "unexpected character", NULL);
        p = skip_space(p, c->end, 1);
    }
    return 0;
}

/* Rules that can match the empty string, by fixpoint. */
static void find_nullable(const g4_grammar *g, uint8_t *nullable) {
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t r = 0; r < g->n_rules; r++) {
            if (nullable[r]) continue;
            for (uint32_t a = g->alt_off[r]; a < g->alt_off[r + 1] && !nullable[r]; a++) {
                uint32_t pos = g->alt[a];
                while (EL_T(g->el[pos]) == E_REF && nullable[EL_V(g->el[pos])]) pos++;
                if (EL_T(g->el[pos]) == E_END || EL_T(g->el[pos]) == E_ALT) nullable[r] = 1, changed = 1;
            }
        }
    }
}

/* Depth-first search for a rule that reaches itself through leftmost references (after nullable
 * prefixes): the recognizer's expansion would never end. color: 0 new, 1 on the path, 2 done. */
static uint32_t left_cycle(const g4_grammar *g, const uint8_t *nullable, uint8_t *color, uint32_t r, int depth) {
    if (color[r] == 1) return r;
    if (color[r] == 2 || depth > 4096) return NONE; /* the recognizer's expansion budget covers the rest */
    color[r] = 1;
    for (uint32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++)
        for (uint32_t pos = g->alt[a]; EL_T(g->el[pos]) == E_REF; pos++) {
            uint32_t hit = left_cycle(g, nullable, color, EL_V(g->el[pos]), depth + 1);
            if (hit != NONE) return hit;
            if (!nullable[EL_V(g->el[pos])]) break;
        }
    color[r] = 2;
    return NONE;
}

static int link_grammar(compiler *c, g4_grammar *g) {
    size_t n_el = 0, n_alt = 0;
    for (size_t r = 0; r < c->n_rules; r++) {
        n_el += c->rules[r].el.n + 1;
        n_alt += 1;
        for (size_t i = 0; i < c->rules[r].el.n; i++) n_alt += EL_T(c->rules[r].el.p[i]) == E_ALT;
    }
    g->el = malloc(n_el * sizeof *g->el);
    g->alt = malloc(n_alt * sizeof *g->alt);
    g->alt_off = malloc((c->n_rules + 1) * sizeof *g->alt_off);
    if (!g->el || !g->alt || !g->alt_off) return g4_fail("grammar: out of memory");
    uint32_t pos = 0, na = 0;
    for (size_t r = 0; r < c->n_rules; r++) {
        g->alt_off[r] = na;
        g->alt[na++] = pos;
        for (size_t i = 0; i < c->rules[r].el.n; i++) {
            uint32_t e = c->rules[r].el.p[i];
            g->el[pos++] = e;
            if (EL_T(e) == E_ALT) g->alt[na++] = pos;
        }
        g->el[pos++] = EL(E_END, 0);
    }
    g->alt_off[c->n_rules] = na;
    g->n_el = pos;
    g->n_rules = (uint32_t)c->n_rules;
    g->sets = (uint32_t(*)[8])c->sets.p;
    g->n_sets = (uint32_t)(c->sets.n / 8);
    c->sets.p = NULL;
    return 0;
}

g4_grammar *g4_grammar_compile(const char *text, size_t len) {
    if (!text) len = 0;
    if (len > MAX_TEXT) {
        g4_fail("grammar: %zu bytes, more than the limit of %u", len, MAX_TEXT);
        return NULL;
    }
    compiler c = {.src = text ? text : "", .end = (text ? text : "") + len};
    g4_grammar *g = calloc(1, sizeof *g);
    int rc = g ? parse_rules(&c) : g4_fail("grammar: out of memory");
    if (!rc) {
        uint32_t root = NONE;
        for (size_t r = 0; r < c.n_rules && !rc; r++) {
            if (!c.rules[r].defined) {
                rc = at_err(&c, c.src + c.rules[r].ref_at - 1, "undefined rule: ", c.rules[r].name);
                break;
            }
            if (strcmp(c.rules[r].name, "root") == 0) root = (uint32_t)r;
        }
        if (!rc && root == NONE) rc = g4_fail("grammar: no rule named 'root'");
        if (!rc) g->root = root, rc = link_grammar(&c, g);
    }
    if (!rc) {
        uint8_t *nullable = calloc(g->n_rules, 1), *color = calloc(g->n_rules, 1);
        if (!nullable || !color) {
            rc = g4_fail("grammar: out of memory");
        } else {
            find_nullable(g, nullable);
            for (uint32_t r = 0; r < g->n_rules && !rc; r++) {
                uint32_t hit = left_cycle(g, nullable, color, r, 0);
                if (hit != NONE) {
                    const char *name = c.rules[hit].name;
                    rc = g4_fail(name[0] == ' ' ? "grammar: a repeated or grouped item is left-recursive (it can repeat without consuming a byte)"
                                                : "grammar: rule '%s' is left-recursive (it can reach itself without consuming a byte)",
                                 name);
                }
            }
        }
        free(nullable);
        free(color);
    }
    for (size_t r = 0; r < c.n_rules; r++) free(c.rules[r].name), free(c.rules[r].el.p);
    free(c.rules);
    free(c.sets.p);
    if (rc) {
        g4_grammar_free(g);
        return NULL;
    }
    return g;
}

void g4_grammar_free(g4_grammar *g) {
    if (!g) return;
    free(g->el);
    free(g->alt);
    free(g->alt_off);
    free(g->sets);
    free(g);
}

/* ---- the recognizer -------------------------------------------------------------------------- */

typedef struct {
    uint32_t pos, parent, depth;
} snode;

struct g4_grammar_state {
    const g4_grammar *g;
    snode *nodes;
    uint32_t n_nodes, cap_nodes;
    uint32_t *head, *next; /* interning: bucket heads (2^hbits), chain per node */
    uint32_t hbits;
    uint32_t *mark, stamp; /* per node: the stamp of the list it was last added to */
    u32vec tops;           /* the current stacks (COMPLETE for the empty one) */
    u32vec scratch;        /* lists of stacks being built */
    struct mask_cache *cache; /* token masks of cut-off stacks, by their positions (mask_entry) */
    u32vec escapes;        /* the trie nodes where the walk being cached escaped */
    int record_escapes;
    /* within one mask walk, the stacks after a byte from a list of stacks, by the list's content:
     * inside a string every character leads to the same list, so the walk is a table lookup */
    struct memo_slot *memo;
    u32vec memo_lists;     /* [in..., out...] per slot */
    uint32_t memo_used, memo_gen, walk_base;
    uint64_t escape_work;  /* trie nodes below the escapes so far: a walk stops past MAX_ESCAPE_WORK */
    size_t base;           /* where the list being built starts in its vector */
    uint32_t budget, live;
    int over;              /* a limit was hit during the last step */
};

static uint32_t hash_node(uint32_t pos, uint32_t parent, uint32_t bits) {
    uint64_t h = ((uint64_t)pos << 32 | parent) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> (64 - bits));
}

static int rehash(g4_grammar_state *st, uint32_t bits) {
    uint32_t *head = malloc(((size_t)1 << bits) * sizeof *head);
    if (!head) return -1;
    memset(head, 0xFF, ((size_t)1 << bits) * sizeof *head);
    for (uint32_t i = 0; i < st->n_nodes; i++) {
        uint32_t h = hash_node(st->nodes[i].pos, st->nodes[i].parent, bits);
        st->next[i] = head[h], head[h] = i;
    }
    free(st->head);
    st->head = head, st->hbits = bits;
    return 0;
}

static uint32_t intern(g4_grammar_state *st, uint32_t pos, uint32_t parent) {
    uint32_t h = hash_node(pos, parent, st->hbits);
    for (uint32_t i = st->head[h]; i != NONE; i = st->next[i])
        if (st->nodes[i].pos == pos && st->nodes[i].parent == parent) return i;
    uint32_t depth = parent >= BOTTOM ? 1 : st->nodes[parent].depth + 1;
    if (depth > MAX_DEPTH) {
        st->over = 1;
        return NONE;
    }
    if (st->n_nodes == st->cap_nodes) {
        uint32_t cap = st->cap_nodes * 2;
        snode *n = realloc(st->nodes, cap * sizeof *n);
        uint32_t *nx = n ? realloc(st->next, cap * sizeof *nx) : NULL;
        if (n) st->nodes = n;
        if (nx) st->next = nx;
        uint32_t *mk = nx ? realloc(st->mark, cap * sizeof *mk) : NULL;
        if (!mk) {
            st->over = 1;
            return NONE;
        }
        memset(mk + st->cap_nodes, 0, (cap - st->cap_nodes) * sizeof *mk);
        st->mark = mk, st->cap_nodes = cap;
    }
    uint32_t i = st->n_nodes++;
    st->nodes[i] = (snode){pos, parent, depth};
    st->mark[i] = 0;
    st->next[i] = st->head[h], st->head[h] = i;
    if (st->n_nodes > (2u << st->hbits) && st->hbits < 30) rehash(st, st->hbits + 1);
    return i;
}

/* Removes the nodes made after n (a mask walk's), newest first, so each is its bucket's head. */
static void rollback(g4_grammar_state *st, uint32_t n) {
    while (st->n_nodes > n) {
        uint32_t i = --st->n_nodes;
        uint32_t h = hash_node(st->nodes[i].pos, st->nodes[i].parent, st->hbits);
        st->head[h] = st->next[i];
    }
}

static void add_top(g4_grammar_state *st, u32vec *out, uint32_t node) {
    if (node >= ESCAPE) {
        for (size_t i = out->n; i-- > st->base;)
            if (out->p[i] == node) return;
    } else {
        if (st->mark[node] == st->stamp) return;
        st->mark[node] = st->stamp;
    }
    if (out->n - st->base >= MAX_STACKS || vpush(out, node)) st->over = 1;
}

/* All stacks whose top is a byte set reached from position pos over the stack parent: rules are
 * entered (pushing the return position unless it ends the rule: tail calls keep loops flat) and
 * ended rules return to their parent. */
static void expand(g4_grammar_state *st, uint32_t pos, uint32_t parent, u32vec *out, uint32_t level) {
    if (st->over || st->budget-- == 0 || level > 4 * MAX_DEPTH) { /* bounded time and C stack */
        st->over = 1;
        return;
    }
    const g4_grammar *g = st->g;
    uint32_t e = g->el[pos];
    switch (EL_T(e)) {
    case E_END:
    case E_ALT:
        if (parent == NONE) add_top(st, out, COMPLETE);
        else if (parent == BOTTOM) add_top(st, out, ESCAPE);
        else expand(st, st->nodes[parent].pos, st->nodes[parent].parent, out, level + 1);
        return;
    case E_REF: {
        uint32_t nx = g->el[pos + 1], ret = parent;
        if (EL_T(nx) != E_END && EL_T(nx) != E_ALT && (ret = intern(st, pos + 1, parent)) == NONE) return;
        uint32_t r = EL_V(e);
        for (uint32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) expand(st, g->alt[a], ret, out, level + 1);
        return;
    }
    default: { /* a stack whose top matches no byte (an empty class) is dropped: it leads nowhere */
        const uint32_t *set = g->sets[EL_V(e)];
        if (!(set[0] | set[1] | set[2] | set[3] | set[4] | set[5] | set[6] | set[7])) return;
        uint32_t n = intern(st, pos, parent);
        if (n != NONE) add_top(st, out, n);
    }
    }
}

static int set_has(const g4_grammar *g, uint32_t pos, unsigned b) {
    return (g->sets[EL_V(g->el[pos])][b >> 5] >> (b & 31)) & 1;
}

/* The stacks after byte b from the stacks in[0, n), appended to out. */
static void advance(g4_grammar_state *st, const uint32_t *in, size_t n, unsigned b, u32vec *out) {
    st->stamp++;
    if (st->stamp == 0) { /* wrapped: clear the marks */
        memset(st->mark, 0, st->cap_nodes * sizeof *st->mark);
        st->stamp = 1;
    }
    st->budget = EXPAND_BUDGET;
    st->base = out->n;
    for (size_t i = 0; i < n; i++) {
        uint32_t t = in[i];
        if (t >= ESCAPE || !set_has(st->g, st->nodes[t].pos, b)) continue;
        expand(st, st->nodes[t].pos + 1, st->nodes[t].parent, out, 0);
    }
}

static g4_grammar_state *state_alloc(const g4_grammar *g, uint32_t cap) {
    g4_grammar_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->g = g;
    st->cap_nodes = cap < 64 ? 64 : cap;
    st->nodes = malloc(st->cap_nodes * sizeof *st->nodes);
    st->next = malloc(st->cap_nodes * sizeof *st->next);
    st->mark = calloc(st->cap_nodes, sizeof *st->mark);
    if (!st->nodes || !st->next || !st->mark || rehash(st, 8)) {
        g4_grammar_state_free(st);
        return NULL;
    }
    return st;
}

g4_grammar_state *g4_grammar_start(const g4_grammar *g) {
    g4_grammar_state *st = g ? state_alloc(g, 64) : NULL;
    if (!st) {
        g4_fail("grammar: out of memory");
        return NULL;
    }
    st->stamp = 1;
    st->budget = EXPAND_BUDGET;
    for (uint32_t a = g->alt_off[g->root]; a < g->alt_off[g->root + 1]; a++) expand(st, g->alt[a], NONE, &st->tops, 0);
    if (st->over) {
        g4_fail("grammar: the start needs more than %u parse stacks or %u nested rules", MAX_STACKS, MAX_DEPTH);
        g4_grammar_state_free(st);
        return NULL;
    }
    return st;
}

static void cache_free(struct mask_cache *c);

void g4_grammar_state_free(g4_grammar_state *st) {
    if (!st) return;
    free(st->nodes);
    free(st->next);
    free(st->head);
    free(st->mark);
    free(st->tops.p);
    free(st->scratch.p);
    free(st->escapes.p);
    free(st->memo);
    free(st->memo_lists.p);
    cache_free(st->cache);
    free(st);
}

/* A state holding only the nodes reachable from src's stacks (renumbered), so that a long
 * generation does not keep every node it ever made. */
static g4_grammar_state *compact_copy(const g4_grammar_state *src) {
    uint32_t *map = malloc((size_t)(src->n_nodes ? src->n_nodes : 1) * sizeof *map);
    g4_grammar_state *st = map ? state_alloc(src->g, 64) : NULL;
    if (!st) {
        free(map);
        g4_fail("grammar: out of memory");
        return NULL;
    }
    memset(map, 0xFF, (size_t)src->n_nodes * sizeof *map);
    st->stamp = 1;
    for (size_t i = 0; i < src->tops.n; i++) {
        uint32_t t = src->tops.p[i];
        if (t == COMPLETE) {
            vpush(&st->tops, COMPLETE);
            continue;
        }
        /* copy the chain root first: parents always precede their children in the new state */
        uint32_t chain[MAX_DEPTH + 1], n = 0;
        for (uint32_t x = t; x != NONE && map[x] == NONE; x = src->nodes[x].parent) chain[n++] = x;
        while (n--) {
            uint32_t x = chain[n], p = src->nodes[x].parent;
            map[x] = intern(st, src->nodes[x].pos, p == NONE ? NONE : map[p]);
        }
        if (st->over || vpush(&st->tops, map[t])) {
            free(map);
            g4_grammar_state_free(st);
            g4_fail("grammar: out of memory");
            return NULL;
        }
    }
    free(map);
    return st;
}

static struct mask_cache *cache_share(struct mask_cache *c);

/* The copy shares the mask cache (its keys are grammar positions, not nodes; copied on the first
 * change), so a state warmed up once can be copied per request without paying the
 * whole-vocabulary walks again. */
g4_grammar_state *g4_grammar_state_copy(const g4_grammar_state *st) {
    g4_grammar_state *c = st ? compact_copy(st) : NULL;
    if (c && st->cache) c->cache = cache_share(st->cache);
    return c;
}

static void state_swap(g4_grammar_state *a, g4_grammar_state *b) {
    g4_grammar_state t = *a;
    *a = *b;
    *b = t;
}

int g4_grammar_accept_bytes(g4_grammar_state *st, const void *bytes, size_t n) {
    const unsigned char *b = bytes;
    u32vec cur = {0}, nxt = {0};
    if (vappend(&cur, st->tops.p, st->tops.n)) return -1;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        nxt.n = 0;
        st->over = 0;
        advance(st, cur.p, cur.n, b[i], &nxt);
        if (st->over) {
            rc = g4_fail("grammar: more than %u parse stacks or %u nested rules at byte %zu (an ambiguous or deeply "
                         "nested grammar)", MAX_STACKS, MAX_DEPTH, i);
            break;
        }
        if (nxt.n == 0) {
            rc = g4_fail("grammar: byte %zu (0x%02X) is not allowed here", i, b[i]);
            break;
        }
        u32vec t = cur;
        cur = nxt, nxt = t;
    }
    if (rc == 0) {
        u32vec t = st->tops;
        st->tops = cur, cur = t;
        if (st->n_nodes > 2 * st->live + 4096) { /* drop the dead nodes now and then */
            g4_grammar_state *c = compact_copy(st);
            if (c) {
                state_swap(st, c);
                st->cache = c->cache, c->cache = NULL; /* the cache is the grammar's, not the nodes' */
                g4_grammar_state_free(c);
                st->live = st->n_nodes;
            }
        }
    }
    free(cur.p);
    free(nxt.p);
    return rc;
}

int g4_grammar_is_complete(const g4_grammar_state *st) {
    for (size_t i = 0; st && i < st->tops.n; i++)
        if (st->tops.p[i] == COMPLETE) return 1;
    return 0;
}

int g4_grammar_can_continue(const g4_grammar_state *st) {
    for (size_t i = 0; st && i < st->tops.n; i++) {
        uint32_t t = st->tops.p[i];
        if (t == COMPLETE) continue;
        const uint32_t *s = st->g->sets[EL_V(st->g->el[st->nodes[t].pos])];
        for (int w = 0; w < 8; w++)
            if (s[w]) return 1;
    }
    return 0;
}

/* ---- token masks ----------------------------------------------------------------------------- */

typedef struct {
    uint32_t first_child, next_sibling, tok; /* tok: first token ending here (NONE if none) */
    uint32_t size;                           /* nodes in the subtree, this one included */
    uint8_t byte;
} tnode;

struct g4_grammar_vocab {
    size_t n_vocab;
    unsigned char *bytes; /* every token's bytes */
    uint32_t *off, *len;
    uint32_t *tok_next;   /* the next token with the same bytes */
    tnode *trie;
    uint32_t n_trie;
};

void g4_grammar_vocab_free(g4_grammar_vocab *v) {
    if (!v) return;
    free(v->bytes);
    free(v->off);
    free(v->len);
    free(v->tok_next);
    free(v->trie);
    free(v);
}

size_t g4_grammar_vocab_size(const g4_grammar_vocab *v) { return v ? v->n_vocab : 0; }

const unsigned char *g4_grammar_vocab_token(const g4_grammar_vocab *v, int32_t id, size_t *n) {
    if (!v || id < 0 || (size_t)id >= v->n_vocab) {
        *n = 0;
        return NULL;
    }
    *n = v->len[id];
    return v->bytes + v->off[id];
}

/* A token's bytes as the detokenizer renders them: "<0xNN>" byte-fallback pieces as the byte,
 * U+2581 as a space; a special token as its mark (token_mark: only <[ID]> in a grammar reaches
 * it); nothing for <0xFF>, whose byte begins the marks (no UTF-8 text needs it). */
static size_t token_bytes(const g4_tokenizer *tok, int32_t id, unsigned char *out, size_t cap) {
    const char *p = g4_tokenizer_id_to_piece(tok, id);
    if (!p) return 0;
    if (g4_tokenizer_is_special(tok, id)) {
        if (id > MAX_TOKEN_ID || cap < G4_TOKEN_MARK_LEN) return 0;
        token_mark(id, out);
        return G4_TOKEN_MARK_LEN;
    }
    size_t n = strlen(p), k = 0;
    if (n == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>' && hexval(p[3]) >= 0 && hexval(p[4]) >= 0) {
        out[0] = (unsigned char)(hexval(p[3]) * 16 + hexval(p[4]));
        return out[0] == 0xFF ? 0 : 1;
    }
    if (n > cap) return 0; /* longer than any real token: never allowed */
    for (size_t i = 0; i < n;) {
        if (i + 3 <= n && memcmp(p + i, "\xE2\x96\x81", 3) == 0) out[k++] = ' ', i += 3;
        else out[k++] = (unsigned char)p[i++];
    }
    return k;
}

typedef struct {
    const unsigned char *p;
    uint32_t len, id;
} tok_ref;

static int cmp_tok(const void *a, const void *b) {
    const tok_ref *x = a, *y = b;
    int c = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
    if (c) return c;
    return x->len != y->len ? (x->len < y->len ? -1 : 1) : (x->id < y->id ? -1 : x->id > y->id);
}

/* The trie of every token's bytes, built from the sorted byte strings: children in byte order. */
static int build_trie(g4_grammar_vocab *v) {
    tok_ref *order = malloc(v->n_vocab * sizeof *order);
    uint32_t n = 0;
    size_t total = 1;
    if (!order) return -1;
    for (size_t i = 0; i < v->n_vocab; i++)
        if (v->len[i]) order[n++] = (tok_ref){v->bytes + v->off[i], v->len[i], (uint32_t)i}, total += v->len[i];
    qsort(order, n, sizeof *order, cmp_tok);
    v->trie = malloc(total * sizeof *v->trie);
    if (!v->trie) {
        free(order);
        return -1;
    }
    v->trie[0] = (tnode){NONE, NONE, NONE, 1, 0};
    v->n_trie = 1;
    uint32_t path[4096], last_child[4096]; /* node at each depth; its newest child */
    path[0] = 0, last_child[0] = NONE;
    uint32_t prev = NONE;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t id = order[k].id, len = v->len[id];
        if (len > 4095) continue; /* longer than any real token: never allowed */
        const unsigned char *s = v->bytes + v->off[id];
        uint32_t lcp = 0;
        if (prev != NONE) {
            const unsigned char *q = v->bytes + v->off[prev];
            uint32_t pl = v->len[prev];
            while (lcp < len && lcp < pl && q[lcp] == s[lcp]) lcp++;
        }
        for (uint32_t d = lcp; d < len; d++) {
            uint32_t nn = v->n_trie++;
            v->trie[nn] = (tnode){NONE, NONE, NONE, 1, s[d]};
            if (last_child[d] == NONE) v->trie[path[d]].first_child = nn;
            else v->trie[last_child[d]].next_sibling = nn;
            last_child[d] = nn;
            path[d + 1] = nn, last_child[d + 1] = NONE;
        }
        tnode *end = &v->trie[path[len]];
        v->tok_next[id] = end->tok, end->tok = id;
        prev = id;
    }
    free(order);
    for (uint32_t i = v->n_trie; i-- > 0;) /* children come after their parent */
        for (uint32_t c = v->trie[i].first_child; c != NONE; c = v->trie[c].next_sibling) v->trie[i].size += v->trie[c].size;
    return 0;
}

g4_grammar_vocab *g4_grammar_vocab_new(const g4_tokenizer *tok) {
    g4_grammar_vocab *v = calloc(1, sizeof *v);
    size_t n = tok ? g4_tokenizer_vocab_size(tok) : 0, cap = 1 << 16, used = 0;
    if (!v || !n) goto fail;
    v->n_vocab = n;
    v->off = malloc(n * sizeof *v->off);
    v->len = malloc(n * sizeof *v->len);
    v->tok_next = malloc(n * sizeof *v->tok_next);
    v->bytes = malloc(cap);
    if (!v->off || !v->len || !v->tok_next || !v->bytes) goto fail;
    unsigned char buf[4096];
    for (size_t i = 0; i < n; i++) {
        size_t k = token_bytes(tok, (int32_t)i, buf, sizeof buf);
        if (used + k > cap) {
            while (used + k > cap) cap *= 2;
            unsigned char *b = realloc(v->bytes, cap);
            if (!b) goto fail;
            v->bytes = b;
        }
        memcpy(v->bytes + used, buf, k);
        v->off[i] = (uint32_t)used, v->len[i] = (uint32_t)k, v->tok_next[i] = NONE;
        used += k;
    }
    if (build_trie(v)) goto fail;
    return v;
fail:
    g4_grammar_vocab_free(v);
    g4_fail(tok ? "grammar: out of memory building the vocabulary trie" : "grammar: no tokenizer");
    return NULL;
}

/* Depth-first walk of the trie below node, with the stacks in st->scratch[from, to): every token
 * ending at a child the stacks accept is set in mask. */
#define MEMO_SLOTS 8192 /* a power of two */
#define MEMO_NODES (1u << 20) /* nodes a walk may keep before it rolls back and forgets */

struct memo_slot {
    uint64_t key;
    uint32_t off, in_n, out_n, gen; /* in use when gen is the state's memo_gen */
};

static void memo_clear(g4_grammar_state *st) {
    if (++st->memo_gen == 0 && st->memo) memset(st->memo, 0, MEMO_SLOTS * sizeof *st->memo), st->memo_gen = 1;
    st->memo_lists.n = 0;
    st->memo_used = 0;
}

static uint64_t list_hash(const uint32_t *l, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ l[i]) * 1099511628211ull;
    return h;
}

/* The slot of (list, byte): a match (used), or the empty slot to fill; NULL when full. */
static struct memo_slot *memo_find(g4_grammar_state *st, uint64_t key, const uint32_t *in, size_t n) {
    if (!st->memo && !(st->memo = calloc(MEMO_SLOTS, sizeof *st->memo))) return NULL;
    for (uint32_t i = 0, h = (uint32_t)(key >> 20); i < 64; i++, h++) {
        struct memo_slot *m = &st->memo[h & (MEMO_SLOTS - 1)];
        if (m->gen != st->memo_gen) return m;
        if (m->key == key && m->in_n == n && memcmp(st->memo_lists.p + m->off, in, n * sizeof *in) == 0) return m;
    }
    return NULL;
}

static void memo_put(g4_grammar_state *st, struct memo_slot *m, uint64_t key, const uint32_t *in, size_t n,
                     size_t out_from, size_t out_to) {
    if (st->memo_used > MEMO_SLOTS / 2) return;
    size_t off = st->memo_lists.n;
    if (vappend(&st->memo_lists, in, n) || vappend(&st->memo_lists, st->scratch.p + out_from, out_to - out_from)) {
        st->memo_lists.n = off;
        return;
    }
    *m = (struct memo_slot){key, (uint32_t)off, (uint32_t)n, (uint32_t)(out_to - out_from), st->memo_gen};
    st->memo_used++;
}

/* Depth-first walk of the trie below node, with the stacks in st->scratch[from, to): every token
 * ending at a child the stacks accept is set in mask. The nodes it makes stay until the caller
 * rolls back to st->walk_base (the memo refers to them), unless they grow past MEMO_NODES. */
static long walk(const g4_grammar_vocab *v, g4_grammar_state *st, uint32_t node, size_t from, size_t to, uint32_t *mask) {
    long count = 0;
    uint64_t lh = list_hash(st->scratch.p + from, to - from);
    uint32_t any[8] = {0}; /* the bytes some stack accepts: children outside it are skipped at once */
    for (size_t i = from; i < to; i++) {
        uint32_t t = st->scratch.p[i];
        if (t >= ESCAPE) continue;
        const uint32_t *s = st->g->sets[EL_V(st->g->el[st->nodes[t].pos])];
        for (int w = 0; w < 8; w++) any[w] |= s[w];
    }
    for (uint32_t c = v->trie[node].first_child; c != NONE; c = v->trie[c].next_sibling) {
        if (st->record_escapes == 1 && st->escape_work > MAX_ESCAPE_WORK) break; /* this cut is too shallow */
        unsigned b = v->trie[c].byte;
        if (!((any[b >> 5] >> (b & 31)) & 1)) continue;
        uint32_t saved = st->n_nodes;
        size_t start = st->scratch.n;
        st->over = 0;
        /* advance reads the input list while appending: copy it if the buffer may move */
        if (st->scratch.n + MAX_STACKS >= st->scratch.cap) {
            size_t cap = st->scratch.cap * 2 + MAX_STACKS * 2;
            uint32_t *p = realloc(st->scratch.p, cap * sizeof *p);
            if (!p) continue;
            st->scratch.p = p, st->scratch.cap = cap;
        }
        uint64_t key = (lh ^ b) * 0x9E3779B97F4A7C15ull;
        struct memo_slot *m = memo_find(st, key, st->scratch.p + from, to - from);
        if (m && m->gen == st->memo_gen) {
            if (vappend(&st->scratch, st->memo_lists.p + m->off + m->in_n, m->out_n)) continue;
        } else {
            advance(st, st->scratch.p + from, to - from, b, &st->scratch);
            if (m && !st->over) memo_put(st, m, key, st->scratch.p + from, to - from, start, st->scratch.n);
        }
        size_t end = st->scratch.n;
        for (size_t i = start; i < end; i++) /* a cut-off stack returned: the cache's caller goes on from c */
            if (st->scratch.p[i] == ESCAPE) {
                if (st->record_escapes) {
                    vpush(&st->escapes, c);
                    st->escape_work += v->trie[c].size;
                }
                st->scratch.p[i] = st->scratch.p[--end];
                st->scratch.p[end] = ESCAPE; /* still counts as accepting the bytes so far */
                break;
            }
        if (st->scratch.n > start && !st->over) {
            for (uint32_t id = v->trie[c].tok; id != NONE; id = v->tok_next[id]) mask[id >> 5] |= 1u << (id & 31), count++;
            if (v->trie[c].first_child != NONE && end > start) count += walk(v, st, c, start, end, mask);
        }
        st->scratch.n = start;
        if (st->n_nodes - st->walk_base > MEMO_NODES) { /* the memo refers to nodes made after saved */
            rollback(st, saved);
            memo_clear(st);
        }
    }
    return count;
}

/* Token masks are cached per cut-off stack: a stack's top K frames with a BOTTOM below them.
 * Walking the whole trie against it gives the tokens that it accepts whatever lies below (those
 * that stay inside the K frames, or end exactly as they return) and the trie nodes where it
 * returns below the bottom ("escapes"); a mask is then the cached bits plus walks of the escape
 * nodes' subtrees against the real frames below. K grows from 1 until the escapes are few
 * (inside a JSON string: once K reaches the string rule, only the closing quote escapes), so the
 * whole-vocabulary walk is paid once per distinct cut-off stack, not once per token. */
#define MAX_ENTRIES 1024

typedef struct {
    uint32_t hash, k, n_esc, final;
    uint32_t *key, *bits, *esc;
} centry;

struct mask_cache {
    atomic_int refs;      /* states sharing it; a state changes it only when it is the only one */
    const g4_grammar_vocab *v;
    centry *e;
    size_t n, cap;
};

static void cache_clear(struct mask_cache *c) {
    for (size_t i = 0; i < c->n; i++) free(c->e[i].key), free(c->e[i].bits), free(c->e[i].esc);
    c->n = 0;
}

static void cache_free(struct mask_cache *c) {
    if (!c || atomic_fetch_sub(&c->refs, 1) > 1) return;
    cache_clear(c);
    free(c->e);
    free(c);
}

static struct mask_cache *cache_share(struct mask_cache *c) {
    atomic_fetch_add(&c->refs, 1);
    return c;
}

static struct mask_cache *cache_copy(const struct mask_cache *c) {
    struct mask_cache *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    atomic_init(&d->refs, 1);
    d->v = c->v;
    d->e = malloc((c->n ? c->n : 1) * sizeof *d->e);
    if (!d->e) {
        free(d);
        return NULL;
    }
    d->cap = c->n ? c->n : 1;
    size_t words = c->v ? (c->v->n_vocab + 31) / 32 : 0;
    for (size_t i = 0; i < c->n; i++) {
        const centry *e = &c->e[i];
        centry x = *e;
        x.key = malloc(e->k * sizeof *x.key);
        x.bits = e->bits ? malloc(words * sizeof *x.bits) : NULL;
        x.esc = e->n_esc && e->esc ? malloc(e->n_esc * sizeof *x.esc) : NULL;
        if (!x.key || (e->bits && !x.bits) || (e->n_esc && e->esc && !x.esc)) {
            free(x.key), free(x.bits), free(x.esc);
            cache_free(d);
            return NULL;
        }
        memcpy(x.key, e->key, e->k * sizeof *x.key);
        if (x.bits) memcpy(x.bits, e->bits, words * sizeof *x.bits);
        if (x.esc) memcpy(x.esc, e->esc, e->n_esc * sizeof *x.esc);
        d->e[d->n++] = x;
    }
    return d;
}

static void expand_list(g4_grammar_state *st, uint32_t pos, uint32_t parent, u32vec *out) {
    if (++st->stamp == 0) {
        memset(st->mark, 0, st->cap_nodes * sizeof *st->mark);
        st->stamp = 1;
    }
    st->budget = EXPAND_BUDGET;
    st->base = out->n;
    expand(st, pos, parent, out, 0);
}

/* The cache entry of stack t cut to k frames (frames[0..k) from the top), computed if new. */
static centry *mask_entry(const g4_grammar_vocab *v, g4_grammar_state *st, const uint32_t *frames, uint32_t k) {
    struct mask_cache *c = st->cache;
    uint32_t h = 2166136261u;
    for (uint32_t i = 0; i < k; i++) h = (h ^ st->nodes[frames[i]].pos) * 16777619u;
    for (size_t i = 0; i < c->n; i++) {
        centry *e = &c->e[i];
        if (e->hash != h || e->k != k) continue;
        uint32_t j = 0;
        while (j < k && e->key[j] == st->nodes[frames[j]].pos) j++;
        if (j == k) return e;
    }
    if (c->n >= MAX_ENTRIES) cache_clear(c);
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        centry *e = realloc(c->e, cap * sizeof *e);
        if (!e) return NULL;
        c->e = e, c->cap = cap;
    }
    centry e = {h, k, 0, 0, malloc(k * sizeof(uint32_t)), calloc((v->n_vocab + 31) / 32, sizeof(uint32_t)), NULL};
    if (!e.key || !e.bits) {
        free(e.key), free(e.bits);
        return NULL;
    }
    for (uint32_t i = 0; i < k; i++) e.key[i] = st->nodes[frames[i]].pos;
    /* the cut-off copy, deepest frame first */
    uint32_t saved = st->n_nodes, x = BOTTOM;
    for (uint32_t i = k; i-- > 0 && x != NONE;) x = intern(st, st->nodes[frames[i]].pos, x);
    if (x == NONE) {
        rollback(st, saved);
        free(e.key), free(e.bits);
        return NULL;
    }
    st->scratch.n = 0;
    st->escapes.n = 0;
    vpush(&st->scratch, x);
    st->walk_base = st->n_nodes;
    memo_clear(st);
    int whole = st->nodes[frames[k - 1]].parent == NONE; /* nothing below: this walk must finish */
    st->record_escapes = whole ? 2 : 1;
    st->escape_work = 0;
    walk(v, st, 0, 0, 1, e.bits);
    st->record_escapes = 0;
    rollback(st, saved);
    memo_clear(st);
    e.n_esc = (uint32_t)st->escapes.n;
    e.final = whole || st->escape_work <= MAX_ESCAPE_WORK;
    if (!e.final) { /* too many escapes: only remember to cut deeper */
        free(e.bits);
        e.bits = NULL;
    } else if (e.n_esc) {
        e.esc = malloc(e.n_esc * sizeof *e.esc);
        if (!e.esc) {
            free(e.key), free(e.bits);
            return NULL;
        }
        memcpy(e.esc, st->escapes.p, e.n_esc * sizeof *e.esc);
    }
    c->e[c->n++] = e;
    return &c->e[c->n - 1];
}

/* Sets the bits of the tokens stack t accepts. */
static int mask_stack(const g4_grammar_vocab *v, g4_grammar_state *st, uint32_t t, uint32_t *mask) {
    uint32_t frames[MAX_DEPTH + 1], depth = 0;
    for (uint32_t x = t; x != NONE && depth <= MAX_DEPTH; x = st->nodes[x].parent) frames[depth++] = x;
    size_t words = (v->n_vocab + 31) / 32;
    for (uint32_t k = 1; k <= depth; k++) {
        centry *e = mask_entry(v, st, frames, k);
        if (!e) return g4_fail("grammar: out of memory computing a token mask");
        if (!e->final) continue;
        for (size_t w = 0; w < words; w++) mask[w] |= e->bits[w];
        uint32_t below = st->nodes[frames[k - 1]].parent;
        if (below == NONE) return 0;
        uint32_t n_esc = e->n_esc, *esc = e->esc; /* e may move when walks below add entries: no, walks do not */
        for (uint32_t i = 0; i < n_esc; i++) {
            uint32_t saved = st->n_nodes;
            st->scratch.n = 0;
            st->over = 0;
            expand_list(st, st->nodes[below].pos, st->nodes[below].parent, &st->scratch);
            size_t n = st->scratch.n;
            st->walk_base = st->n_nodes;
            memo_clear(st);
            if (!st->over && n) walk(v, st, esc[i], 0, n, mask);
            rollback(st, saved);
            memo_clear(st);
        }
        return 0;
    }
    return 0;
}

long g4_grammar_mask(const g4_grammar_vocab *v, g4_grammar_state *st, const int32_t *stop_ids, size_t n_stop,
                     uint32_t *mask) {
    if (!v || !st || !mask) return g4_fail("grammar: mask: no vocabulary, state or mask");
    size_t words = (v->n_vocab + 31) / 32;
    memset(mask, 0, words * sizeof *mask);
    if (!st->cache) {
        if (!(st->cache = calloc(1, sizeof *st->cache))) return g4_fail("grammar: out of memory");
        atomic_init(&st->cache->refs, 1);
    } else if (atomic_load(&st->cache->refs) > 1) { /* shared with copies: this state gets its own */
        struct mask_cache *own = cache_copy(st->cache);
        if (!own) return g4_fail("grammar: out of memory");
        cache_free(st->cache);
        st->cache = own;
    }
    if (st->cache->v != v) cache_clear(st->cache), st->cache->v = v;
    for (size_t i = 0; i < st->tops.n; i++) {
        uint32_t t = st->tops.p[i];
        if (t < ESCAPE && mask_stack(v, st, t, mask)) return -1;
    }
    if (g4_grammar_is_complete(st))
        for (size_t i = 0; i < n_stop; i++) {
            int32_t id = stop_ids[i];
            if (id >= 0 && (size_t)id < v->n_vocab) mask[id >> 5] |= 1u << (id & 31);
        }
    long count = 0;
    for (size_t w = 0; w < words; w++) count += __builtin_popcount(mask[w]);
    return count;
}

int g4_grammar_accept_token(const g4_grammar_vocab *v, g4_grammar_state *st, int32_t id) {
    size_t n;
    const unsigned char *b = g4_grammar_vocab_token(v, id, &n);
    if (!b || !n) return g4_fail("grammar: token %ld has no bytes (special or out of the vocabulary)", (long)id);
    return g4_grammar_accept_bytes(st, b, n);
}

int g4_grammar_state_keep_cache(g4_grammar_state *into, const g4_grammar_state *from) {
    if (!into || !from || into->g != from->g) return g4_fail("grammar: keep_cache: states of different grammars");
    if (!from->cache || from->cache == into->cache) return 0;
    cache_free(into->cache);
    into->cache = cache_share(from->cache);
    return 0;
}

const g4_grammar *g4_grammar_state_grammar(const g4_grammar_state *st) { return st ? st->g : NULL; }
