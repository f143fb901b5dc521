/* JSON schema, JSON mode, regex and choice compiled to GBNF text, then to a grammar
 * (grammar.c). Each schema becomes a rule; what the compiler cannot enforce it refuses with the
 * keyword and its JSON pointer. Whitespace between tokens is bounded (ws below), so a constrained
 * generation cannot emit whitespace without end. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cjson/cJSON.h>

#include "g4.h"
#include "util/err.h"
#include "text/chat.h"

#define MAX_SCHEMA_BYTES (1u << 20)
#define MAX_COUNT 4096   /* minItems, maxItems, minLength, maxLength */
#define MAX_DEPTH 64     /* nested subschemas */
#define MAX_INT 1e15     /* integer bounds */

/* The value rules both syntaxes below share. A number has at most 16 integer digits and 16
 * fraction digits (its exponent: each syntax's json-number). */
static const char VALUE_RULES[] =
    "json-int ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
    "json-bool ::= \"true\" | \"false\"\n"
    "json-null ::= \"null\"\n"
    "json-value ::= json-object | json-array | json-string | json-number | json-bool | json-null\n";

/* JSON: whitespace between tokens is one space, or a newline and up to 20 spaces or tabs (llama.cpp's
 * json.gbnf rule: compact and pretty-printed documents pass). Not a run of spaces without a newline:
 * a small model pads every gap with as much as it may (the built-in model, whose spaces are a token
 * each, spent 21 tokens a gap and ran out of max_tokens before closing a 4-field object). */
static const char JSON_SYNTAX[] =
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n"
    "json-number ::= json-int (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n"
    "json-quote ::= \"\\\"\"\n"
    "json-char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "json-string ::= json-quote json-char* json-quote\n"
    "json-object ::= \"{\" ws (json-string ws \":\" ws json-value ws (\",\" ws json-string ws \":\" ws json-value ws)*)? \"}\"\n"
    "json-array ::= \"[\" ws (json-value ws (\",\" ws json-value ws)*)? \"]\"\n";

/* Gemma 4's tool-call syntax (src/text/tools.c, the template's format_argument) under the same
 * rule names, so that a schema's rules read either: no whitespace (the template writes none),
 * strings between <|"|> tokens (json-quote, written with the tokenizer's id) holding their
 * characters as they are but '<' (the call's reader would take a "<|"|>" or "<tool_call|>"
 * written as text for the token), object keys bare, exponents of 2 digits (the reader takes a
 * number past a double's range, 1e400, for a string). */
static const char GEMMA_SYNTAX[] =
    "ws ::= \"\"\n"
    "json-number ::= json-int (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?\n"
    "json-char ::= [^<]\n"
    "json-string ::= json-quote json-char* json-quote\n"
    "gemma-key ::= [^:,{}<\\x5B\\x5D\" \\t\\n\\r]+\n"
    "json-object ::= \"{\" (gemma-key \":\" json-value (\",\" gemma-key \":\" json-value)*)? \"}\"\n"
    "json-array ::= \"[\" (json-value (\",\" json-value)*)? \"]\"\n";

/* regular string formats (the common forms; RFC 3339 date/time, RFC 4122 uuid) */
static const char FORMAT_RULES[] =
    "fmt-date ::= [0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])\n"
    "fmt-time ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" ([0-5] [0-9] | \"60\") (\".\" [0-9]{1,9})? "
    "([zZ] | [-+] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n"
    "fmt-hex ::= [0-9a-fA-F]\n"
    "fmt-uuid ::= fmt-hex{8} \"-\" fmt-hex{4} \"-\" fmt-hex{4} \"-\" fmt-hex{4} \"-\" fmt-hex{12}\n"
    "fmt-email ::= [a-zA-Z0-9._%+-]{1,64} \"@\" [a-zA-Z0-9-]{1,63} (\".\" [a-zA-Z0-9-]{1,63}){1,8}\n";

/* ---- text buffers ---------------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->n + n + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_printf(sbuf *b, const char *fmt, ...) G4_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) b->oom = 1;
    else sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* One code point as GBNF source, inside a "literal" or a [class]: plain when it is a letter or
 * digit, else escaped (so no quoting rule can go wrong). */
static void sb_cp(sbuf *b, unsigned cp) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') || cp == ' ') sb_printf(b, "%c", (char)cp);
    else if (cp < 0x100) sb_printf(b, "\\x%02X", cp);
    else if (cp < 0x10000) sb_printf(b, "\\u%04X", cp);
    else sb_printf(b, "\\U%08X", cp);
}

/* Decodes one UTF-8 character of s[*i, n); a byte that starts no valid character stands for
 * itself. */
static unsigned utf8_next(const unsigned char *s, size_t n, size_t *i) {
    unsigned c = s[*i];
    int k = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    int ok = k > 0 && *i + (size_t)k < n;
    for (int j = 1; ok && j <= k; j++) ok = (s[*i + (size_t)j] & 0xC0) == 0x80;
    if (!ok) {
        (*i)++;
        return c;
    }
    unsigned v = k == 1 ? c & 31 : k == 2 ? c & 15 : c & 7;
    for (int j = 1; j <= k; j++) v = v << 6 | (s[*i + (size_t)j] & 63);
    *i += (size_t)k + 1;
    return v;
}

/* bytes as one GBNF literal */
static void sb_lit(sbuf *b, const char *s, size_t n) {
    sb_str(b, "\"");
    for (size_t i = 0; i < n;) sb_cp(b, utf8_next((const unsigned char *)s, n, &i));
    sb_str(b, "\"");
}

/* ---- the schema compiler --------------------------------------------------------------------- */

typedef struct {
    const cJSON *node;
    int rule;
} ref_memo;

typedef struct {
    const cJSON *root;
    sbuf rules;
    int n_rules;
    ref_memo *refs;
    size_t n_refs;
    int depth;
    int failed;
    cJSON *temps; /* merged allOf schemas: kept to the end, their nodes' addresses are memo keys */
    int gemma;    /* rules for GEMMA_SYNTAX (a tool call's arguments), not JSON_SYNTAX */
} schema_c;

static int sc_fail(schema_c *c, const char *ptr, const char *fmt, ...) G4_PRINTF(3, 4);
static int sc_fail(schema_c *c, const char *ptr, const char *fmt, ...) {
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char line[700];
    snprintf(line, sizeof line, "%s at %s", msg, *ptr ? ptr : "(root)");
    for (char *p = line; *p; p++) /* names from the schema may hold newlines: keep it one line */
        if ((unsigned char)*p < 0x20) *p = '?';
    if (!c->failed) g4_fail("json schema: %s", line);
    c->failed = 1;
    return -1;
}

/* ptr + "/" + key with JSON pointer escaping (~0, ~1), malloc'd */
static char *ptr_join(const char *ptr, const char *key) {
    size_t n = strlen(ptr), k = strlen(key);
    char *p = malloc(n + 2 * k + 2);
    if (!p) return NULL;
    memcpy(p, ptr, n);
    p[n++] = '/';
    for (size_t i = 0; i < k; i++) {
        if (key[i] == '~') p[n++] = '~', p[n++] = '0';
        else if (key[i] == '/') p[n++] = '~', p[n++] = '1';
        else p[n++] = key[i];
    }
    p[n] = 0;
    return p;
}

static char *ptr_index(const char *ptr, int i) {
    char k[16];
    snprintf(k, sizeof k, "%d", i);
    return ptr_join(ptr, k);
}

static int compile_schema(schema_c *c, const cJSON *s, const char *ptr);

/* A new rule "r<N> ::= body". */
static int add_rule(schema_c *c, int id, const sbuf *body) {
    if (body->oom) return sc_fail(c, "", "out of memory");
    sb_printf(&c->rules, "r%d ::= ", id);
    sb_str(&c->rules, body->p ? body->p : "");
    sb_str(&c->rules, "\n");
    return 0;
}

/* Whether a tool call can hold key bare (format_argument writes keys bare: its reader ends one at
 * the first of :,{}[] and trims it) or string s (its reader ends one at "<|\"|>"). */
static int gemma_bare_key(const char *key) {
    return key[0] && !strpbrk(key, ":,{}[]<\" \t\n\r");
}
static int gemma_string_ok(const char *s) { return !strchr(s, '<'); }

/* A JSON value's own serialization as a grammar: tokens in order, ws between them (gemma: as a
 * tool call writes it; 0, or -1 for a string or key it cannot hold). */
static int const_value(sbuf *b, const cJSON *v, int gemma) {
    int rc = 0;
    if (cJSON_IsArray(v)) {
        sb_str(b, "\"[\" ws ");
        int first = 1;
        for (const cJSON *e = v->child; e && !rc; e = e->next, first = 0) {
            if (!first) sb_str(b, "\",\" ws ");
            rc = const_value(b, e, gemma);
            sb_str(b, " ws ");
        }
        sb_str(b, "\"]\"");
    } else if (cJSON_IsObject(v)) {
        sb_str(b, "\"{\" ws ");
        int first = 1;
        for (const cJSON *e = v->child; e && !rc; e = e->next, first = 0) {
            if (!first) sb_str(b, "\",\" ws ");
            if (gemma) {
                if (!gemma_bare_key(e->string)) return -1;
                sb_lit(b, e->string, strlen(e->string));
            } else {
                cJSON *k = cJSON_CreateString(e->string);
                char *ks = k ? cJSON_PrintUnformatted(k) : NULL;
                if (ks) sb_lit(b, ks, strlen(ks));
                else b->oom = 1;
                free(ks);
                cJSON_Delete(k);
            }
            sb_str(b, " ws \":\" ws ");
            rc = const_value(b, e, gemma);
            sb_str(b, " ws ");
        }
        sb_str(b, "\"}\"");
    } else if (cJSON_IsNumber(v)) { /* exact: cJSON prints 15 significant digits */
        char t[64];
        double x = v->valuedouble;
        if (x == floor(x) && fabs(x) < 1e17) snprintf(t, sizeof t, "%.0f", x);
        else snprintf(t, sizeof t, "%.17g", x);
        sb_lit(b, t, strlen(t));
    } else if (gemma && cJSON_IsString(v)) {
        if (!gemma_string_ok(v->valuestring)) return -1;
        sb_str(b, "json-quote ");
        sb_lit(b, v->valuestring, strlen(v->valuestring));
        sb_str(b, " json-quote");
    } else {
        char *t = cJSON_PrintUnformatted(v);
        if (t) sb_lit(b, t, strlen(t));
        else b->oom = 1;
        free(t);
    }
    return rc;
}

enum { T_NULL = 1, T_BOOL = 2, T_OBJ = 4, T_ARR = 8, T_STR = 16, T_NUM = 32, T_INT = 64, T_ALL = 127 };

static int type_bit(const char *t) {
    static const char *names[] = {"null", "boolean", "object", "array", "string", "number", "integer"};
    for (int i = 0; i < 7; i++)
        if (strcmp(t, names[i]) == 0) return 1 << i;
    return 0;
}

static int value_type(const cJSON *v) {
    if (cJSON_IsNull(v)) return T_NULL;
    if (cJSON_IsBool(v)) return T_BOOL;
    if (cJSON_IsObject(v)) return T_OBJ;
    if (cJSON_IsArray(v)) return T_ARR;
    if (cJSON_IsString(v)) return T_STR;
    return v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) < 9e15 ? T_NUM | T_INT : T_NUM;
}

/* The "type" keyword as a set of T_* bits (T_ALL when absent); -1 on error. */
static int schema_types(schema_c *c, const cJSON *s, const char *ptr) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (!t) return T_ALL;
    int bits = 0;
    if (cJSON_IsString(t)) bits = type_bit(t->valuestring);
    else if (cJSON_IsArray(t))
        for (const cJSON *e = t->child; e; e = e->next) {
            int b = cJSON_IsString(e) ? type_bit(e->valuestring) : 0;
            if (!b) return sc_fail(c, ptr, "type: unknown type");
            bits |= b;
        }
    if (!bits) return sc_fail(c, ptr, "type: unknown type");
    return bits;
}

/* ---- integers in a range ---------------------------------------------------------------------- */

/* Digit strings of one length n from x to y (x <= y) as a GBNF expression. */
static void digits_between(sbuf *b, const char *x, const char *y, size_t n) {
    if (memcmp(x, y, n) == 0) {
        sb_put(b, "\"", 1), sb_put(b, x, n), sb_put(b, "\"", 1);
        return;
    }
    if (x[0] == y[0]) {
        sb_printf(b, "\"%c\" ", x[0]);
        digits_between(b, x + 1, y + 1, n - 1);
        return;
    }
    int x_zeros = 1, y_nines = 1, alts = 0;
    for (size_t i = 1; i < n; i++) x_zeros &= x[i] == '0', y_nines &= y[i] == '9';
    char lo = x[0], hi = y[0], nines[32], zeros[32];
    memset(nines, '9', sizeof nines), memset(zeros, '0', sizeof zeros);
    sb_str(b, "(");
    if (!x_zeros) { /* x[0] then x[1..] and above */
        sb_printf(b, "\"%c\" ", x[0]);
        digits_between(b, x + 1, nines, n - 1);
        alts++, lo++;
    }
    if (!y_nines) hi--;
    if (lo <= hi) {
        sb_printf(b, "%s[%c-%c]", alts++ ? " | " : "", lo, hi);
        if (n > 1) sb_printf(b, " [0-9]{%zu}", n - 1);
    }
    if (!y_nines) { /* y[0] then y[1..] and below */
        sb_printf(b, "%s\"%c\" ", alts++ ? " | " : "", y[0]);
        digits_between(b, zeros, y + 1, n - 1);
    }
    sb_str(b, ")");
}

/* The naturals a..b (b < 0: no upper bound; at most 16 digits) written without leading zeros. */
static void naturals(sbuf *b, long long a, long long hi) {
    long long p10 = 1;
    int first = 1;
    sb_str(b, "(");
    for (int len = 1; len <= 16; len++, p10 *= 10) {
        long long lo = len == 1 ? 0 : p10, top = p10 * 10 - 1;
        if (lo < a) lo = a;
        if (hi >= 0 && top > hi) top = hi;
        if (lo > top) continue;
        char x[32], y[32];
        snprintf(x, sizeof x, "%lld", lo);
        snprintf(y, sizeof y, "%lld", top);
        if (!first) sb_str(b, " | ");
        digits_between(b, x, y, (size_t)len);
        first = 0;
    }
    sb_str(b, ")");
}

/* An integer in [lo, hi] (has_lo/has_hi: bounded on that side). */
static void int_range(sbuf *b, int has_lo, long long lo, int has_hi, long long hi) {
    sb_str(b, "(");
    int any = 0;
    if (!has_lo || lo < 0) { /* negatives: "-" then the magnitudes max(1, -hi) .. -lo */
        long long mag_lo = has_hi && hi < 0 ? -hi : 1, mag_hi = has_lo ? -lo : -1;
        sb_str(b, "\"-\" ");
        naturals(b, mag_lo, mag_hi);
        any = 1;
    }
    if (!has_hi || hi >= 0) {
        if (any) sb_str(b, " | ");
        naturals(b, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
    }
    sb_str(b, ")");
}

static int number_bound(schema_c *c, const cJSON *s, const char *ptr, const char *key, int up, int *has, long long *v) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!m) return 0;
    if (!cJSON_IsNumber(m)) return sc_fail(c, ptr, "%s: not a number", key);
    if (fabs(m->valuedouble) > MAX_INT) return sc_fail(c, ptr, "%s: beyond the supported +-1e15", key);
    double x = m->valuedouble;
    int excl = key[0] == 'e';
    long long k = up ? (long long)floor(x) : (long long)ceil(x);
    if (excl && (double)k == x) k += up ? -1 : 1;
    if (!*has || (up ? k < *v : k > *v)) *v = k;
    *has = 1;
    return 0;
}

/* ---- strings ---------------------------------------------------------------------------------- */

/* Where a regex's text goes: plain (a whole regex constraint), a JSON string's inside (pattern:
 * `"`, `\` and controls escaped), a tool call's string (pattern: no '<', GEMMA_SYNTAX). */
enum { RX_PLAIN = 0, RX_JSON = 1, RX_GEMMA = 2 };
static int regex_to_gbnf(sbuf *out, const char *re, size_t n, int mode, char *err, size_t errlen);

/* A JSON string key that is none of keys[0, n): a trie over their characters, leaving it with a
 * plain character no key has there (no escapes before that, so an escaped spelling of a declared
 * key cannot pass as a different one). */
#define MAX_KEY 1024 /* bytes of a property name when additional properties must differ from it */

/* prefix: a MAX_KEY + 4 byte buffer, its first plen bytes the characters matched so far. */
static int other_key_rule(schema_c *c, const char **keys, size_t n, size_t depth, char *prefix, size_t plen) {
    int id = c->n_rules++;
    sbuf b = {0};
    int is_key = 0;
    unsigned kids[256];
    size_t nk = 0;
    for (size_t i = 0; i < n; i++) {
        size_t kl = strlen(keys[i]);
        if (kl < plen || memcmp(keys[i], prefix, plen) != 0) continue;
        if (kl == plen) {
            is_key = 1;
            continue;
        }
        size_t j = plen;
        unsigned cp = utf8_next((const unsigned char *)keys[i], kl, &j);
        int seen = 0;
        for (size_t k = 0; k < nk; k++) seen |= kids[k] == cp;
        if (!seen && nk == 256) return free(b.p), sc_fail(c, "", "more than 256 property names that differ at one character");
        if (!seen) kids[nk++] = cp;
    }
    sb_str(&b, "[^\"\\\\\\x00-\\x1F");
    for (size_t k = 0; k < nk; k++) sb_cp(&b, kids[k]);
    sb_str(&b, "] json-char* \"\\\"\"");
    if (!is_key) sb_str(&b, " | \"\\\"\"");
    for (size_t k = 0; k < nk && !c->failed; k++) {
        if (kids[k] == '"' || kids[k] == '\\' || kids[k] < 0x20) continue; /* escaped in JSON: no plain way in */
        unsigned char u[4];
        int ul = kids[k] < 0x80 ? (u[0] = (unsigned char)kids[k], 1)
               : kids[k] < 0x800 ? (u[0] = (unsigned char)(0xC0 | kids[k] >> 6), u[1] = (unsigned char)(0x80 | (kids[k] & 63)), 2)
               : kids[k] < 0x10000 ? (u[0] = (unsigned char)(0xE0 | kids[k] >> 12), u[1] = (unsigned char)(0x80 | ((kids[k] >> 6) & 63)), u[2] = (unsigned char)(0x80 | (kids[k] & 63)), 3)
               : (u[0] = (unsigned char)(0xF0 | kids[k] >> 18), u[1] = (unsigned char)(0x80 | ((kids[k] >> 12) & 63)), u[2] = (unsigned char)(0x80 | ((kids[k] >> 6) & 63)), u[3] = (unsigned char)(0x80 | (kids[k] & 63)), 4);
        if (plen + (size_t)ul > MAX_KEY) {
            free(b.p);
            return sc_fail(c, "", "a property name over %d bytes beside additional properties", MAX_KEY);
        }
        memcpy(prefix + plen, u, (size_t)ul); /* deeper calls write only past it */
        int sub = other_key_rule(c, keys, n, depth + 1, prefix, plen + (size_t)ul);
        if (sub < 0) {
            free(b.p);
            return -1;
        }
        sb_str(&b, " | \"");
        sb_cp(&b, kids[k]);
        sb_printf(&b, "\" r%d", sub);
    }
    int rc = c->failed ? -1 : add_rule(c, id, &b) ? -1 : id;
    free(b.p);
    return rc;
}

static int string_rule(schema_c *c, const cJSON *s, const char *ptr, sbuf *b) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minLength"), *mx = cJSON_GetObjectItemCaseSensitive(s, "maxLength");
    if ((fmt != NULL) + (pat != NULL) + (mn || mx) > 1)
        return sc_fail(c, ptr, "%s: only one of format, pattern and minLength/maxLength per string", fmt ? "format" : "pattern");
    if (fmt) {
        static const char *ok[] = {"date", "time", "date-time", "uuid", "email"};
        const char *f = cJSON_IsString(fmt) ? fmt->valuestring : "";
        int i = 0;
        while (i < 5 && strcmp(f, ok[i]) != 0) i++;
        if (i == 5) return sc_fail(c, ptr, "format: '%s' is not supported (date, time, date-time, uuid, email)", f);
        sb_str(b, "json-quote ");
        sb_str(b, i == 2 ? "fmt-date [tT] fmt-time" : i == 0 ? "fmt-date" : i == 1 ? "fmt-time" : i == 3 ? "fmt-uuid" : "fmt-email");
        sb_str(b, " json-quote");
        return 0;
    }
    if (pat) {
        if (!cJSON_IsString(pat)) return sc_fail(c, ptr, "pattern: not a string");
        char err[200];
        sb_str(b, "json-quote ");
        if (regex_to_gbnf(b, pat->valuestring, strlen(pat->valuestring), c->gemma ? RX_GEMMA : RX_JSON, err, sizeof err))
            return sc_fail(c, ptr, "pattern: %s", err);
        sb_str(b, " json-quote");
        return 0;
    }
    long long lo = 0, hi = -1;
    if (mn && (!cJSON_IsNumber(mn) || mn->valuedouble < 0 || mn->valuedouble > MAX_COUNT))
        return sc_fail(c, ptr, "minLength: not a count up to %d", MAX_COUNT);
    if (mx && (!cJSON_IsNumber(mx) || mx->valuedouble < 0 || mx->valuedouble > MAX_COUNT))
        return sc_fail(c, ptr, "maxLength: not a count up to %d", MAX_COUNT);
    if (mn) lo = (long long)ceil(mn->valuedouble);
    if (mx) hi = (long long)floor(mx->valuedouble);
    if (hi >= 0 && hi < lo) return sc_fail(c, ptr, "maxLength: below minLength (no string fits)");
    if (!mn && !mx) sb_str(b, "json-string");
    else if (hi < 0) sb_printf(b, "json-quote json-char{%lld,} json-quote", lo);
    else sb_printf(b, "json-quote json-char{%lld,%lld} json-quote", lo, hi);
    return 0;
}

/* ---- objects and arrays ----------------------------------------------------------------------- */

static int is_false(const cJSON *s) { return cJSON_IsFalse(s); }

static int object_rule(schema_c *c, const cJSON *s, const char *ptr, sbuf *b) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return sc_fail(c, ptr, "properties: not an object");
    if (req && !cJSON_IsArray(req)) return sc_fail(c, ptr, "required: not an array");
    /* the keys in order: the declared properties, then required names not declared (any value) */
    size_t n = 0, cap = (size_t)cJSON_GetArraySize(props) + (size_t)cJSON_GetArraySize(req) + 1;
    const char **keys = calloc(cap, sizeof *keys);
    const cJSON **vals = calloc(cap, sizeof *vals);
    int *required = calloc(cap, sizeof *required), *kv = calloc(cap, sizeof *kv);
    char **ptrs = calloc(cap, sizeof *ptrs);
    int rc = 0;
    if (!keys || !vals || !required || !kv || !ptrs) {
        rc = sc_fail(c, ptr, "out of memory");
        goto done;
    }
    char *pp = ptr_join(ptr, "properties");
    for (const cJSON *p = props ? props->child : NULL; p && pp; p = p->next) {
        keys[n] = p->string, vals[n] = p, ptrs[n] = ptr_join(pp, p->string), n++;
    }
    free(pp);
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r)) {
            rc = sc_fail(c, ptr, "required: not an array of strings");
            goto done;
        }
        size_t i = 0;
        while (i < n && strcmp(keys[i], r->valuestring) != 0) i++;
        if (i == n) keys[n] = r->valuestring, vals[n] = NULL, ptrs[n] = ptr_join(ptr, "required"), n++;
        required[i] = 1;
    }
    if (c->gemma) { /* a call's keys: bare, in the template's dictsort order (what the model saw) */
        for (size_t i = 0; i < n && !rc; i++)
            if (!gemma_bare_key(keys[i]))
                rc = sc_fail(c, ptrs[i] ? ptrs[i] : ptr, "property name '%.80s' cannot be written bare in a tool call (:,{}[]<\" or spaces)", keys[i]);
        for (size_t i = 1; i < n; i++)
            for (size_t j = i; j > 0 && g4_chat_key_before(keys[j], keys[j - 1]); j--) {
                const char *k = keys[j]; keys[j] = keys[j - 1], keys[j - 1] = k;
                const cJSON *v = vals[j]; vals[j] = vals[j - 1], vals[j - 1] = v;
                char *q = ptrs[j]; ptrs[j] = ptrs[j - 1], ptrs[j - 1] = q;
                int r = required[j]; required[j] = required[j - 1], required[j - 1] = r;
            }
    }
    for (size_t i = 0; i < n && !rc; i++) {
        int v;
        if (vals[i] && is_false(vals[i])) {
            if (required[i]) {
                rc = sc_fail(c, ptrs[i], "a required property whose schema is false (no object fits)");
                break;
            }
            kv[i] = -1; /* may not appear */
            continue;
        }
        v = vals[i] ? compile_schema(c, vals[i], ptrs[i]) : -2;
        if (v == -1) {
            rc = -1;
            break;
        }
        kv[i] = c->n_rules++;
        sbuf kb = {0};
        cJSON *k = c->gemma ? NULL : cJSON_CreateString(keys[i]);
        char *ks = k ? cJSON_PrintUnformatted(k) : NULL;
        if (c->gemma) sb_lit(&kb, keys[i], strlen(keys[i]));
        else if (ks) sb_lit(&kb, ks, strlen(ks));
        else kb.oom = 1;
        free(ks);
        cJSON_Delete(k);
        if (v >= 0) sb_printf(&kb, " ws \":\" ws r%d ws", v);
        else sb_str(&kb, " ws \":\" ws json-value ws");
        rc = add_rule(c, kv[i], &kb);
        free(kb.p);
    }
    if (rc) goto done;
    /* additional properties: after the declared ones, with a name none of them has */
    int addv = -3; /* -3 none, -2 any value, else a rule */
    char *ap = ptr_join(ptr, "additionalProperties");
    /* a tool call holds the declared properties only: a subset of what the schema allows (its
     * reader would need other keys bare and apart from the declared ones) */
    if (c->gemma) addv = -3;
    else if (!add || cJSON_IsTrue(add)) addv = -2;
    else if (!is_false(add)) addv = compile_schema(c, add, ap ? ap : ptr);
    free(ap);
    if (addv == -1) {
        rc = -1;
        goto done;
    }
    int addkv = -1;
    if (addv != -3) {
        char prefix[MAX_KEY + 4];
        int other = n ? other_key_rule(c, keys, n, 0, prefix, 0) : -1;
        if (n && other < 0) {
            rc = -1;
            goto done;
        }
        addkv = c->n_rules++;
        sbuf kb = {0};
        if (other >= 0) sb_printf(&kb, "\"\\\"\" r%d", other);
        else sb_str(&kb, "json-string");
        if (addv >= 0) sb_printf(&kb, " ws \":\" ws r%d ws", addv);
        else sb_str(&kb, " ws \":\" ws json-value ws");
        rc = add_rule(c, addkv, &kb);
        free(kb.p);
        if (rc) goto done;
    }
    /* head_i: properties i.. with none written yet; tail_i: with one written (commas first) */
    int head = -1, tail = -1;
    {
        int h = c->n_rules++, t = c->n_rules++;
        sbuf hb = {0}, tb = {0};
        if (addkv >= 0) {
            sb_printf(&hb, "(r%d (\",\" ws r%d)*)?", addkv, addkv);
            sb_printf(&tb, "(\",\" ws r%d)*", addkv);
        }
        if (add_rule(c, h, &hb) || add_rule(c, t, &tb)) rc = -1;
        free(hb.p), free(tb.p);
        head = h, tail = t;
    }
    for (size_t i = n; i-- > 0 && !rc;) {
        if (kv[i] < 0) continue;
        int h = c->n_rules++, t = c->n_rules++;
        sbuf hb = {0}, tb = {0};
        if (required[i]) {
            sb_printf(&hb, "r%d r%d", kv[i], tail);
            sb_printf(&tb, "\",\" ws r%d r%d", kv[i], tail);
        } else {
            sb_printf(&hb, "r%d r%d | r%d", kv[i], tail, head);
            sb_printf(&tb, "(\",\" ws r%d)? r%d", kv[i], tail);
        }
        if (add_rule(c, h, &hb) || add_rule(c, t, &tb)) rc = -1;
        free(hb.p), free(tb.p);
        head = h, tail = t;
    }
    if (!rc) sb_printf(b, "\"{\" ws r%d \"}\"", head);
done:
    for (size_t i = 0; ptrs && i < n; i++) free(ptrs[i]);
    free(ptrs), free(keys), free(vals), free(required), free(kv);
    return rc;
}

static int count_kw(schema_c *c, const cJSON *s, const char *ptr, const char *key, long long *v) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!m) return 0;
    if (!cJSON_IsNumber(m) || m->valuedouble < 0 || m->valuedouble > MAX_COUNT || m->valuedouble != floor(m->valuedouble))
        return sc_fail(c, ptr, "%s: not a count up to %d", key, MAX_COUNT);
    *v = (long long)m->valuedouble;
    return 0;
}

static int array_rule(schema_c *c, const cJSON *s, const char *ptr, sbuf *b) {
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    long long lo = 0, hi = -1;
    if (count_kw(c, s, ptr, "minItems", &lo) || count_kw(c, s, ptr, "maxItems", &hi)) return -1;
    if (prefix && !cJSON_IsArray(prefix)) return sc_fail(c, ptr, "prefixItems: not an array");
    int k = prefix ? cJSON_GetArraySize(prefix) : 0;
    if (k > MAX_COUNT) return sc_fail(c, ptr, "prefixItems: more than %d", MAX_COUNT);
    int *el = calloc((size_t)k + 1, sizeof *el);
    if (!el) return sc_fail(c, ptr, "out of memory");
    int rc = 0, i = 0;
    char *pp = ptr_join(ptr, "prefixItems");
    for (const cJSON *e = prefix ? prefix->child : NULL; e && !rc; e = e->next, i++) {
        char *ep = pp ? ptr_index(pp, i) : NULL;
        el[i] = is_false(e) ? -3 : compile_schema(c, e, ep ? ep : ptr);
        if (el[i] == -1) rc = -1;
        free(ep);
    }
    free(pp);
    int rest = -2; /* -2 any, -3 none */
    if (!rc && items) {
        char *ip = ptr_join(ptr, "items");
        rest = is_false(items) ? -3 : cJSON_IsTrue(items) ? -2 : compile_schema(c, items, ip ? ip : ptr);
        free(ip);
        if (rest == -1) rc = -1;
    }
    /* a false prefix item ends the array before it */
    int limit = -1;
    for (int j = 0; j < k; j++)
        if (el[j] == -3) {
            limit = j;
            break;
        }
    if (limit < 0 && rest == -3) limit = k;
    if (limit >= 0 && (hi < 0 || hi > limit)) hi = limit;
    if (!rc && hi >= 0 && hi < lo) rc = sc_fail(c, ptr, "minItems: more items than the schema allows (no array fits)");
    if (rc) {
        free(el);
        return -1;
    }
    /* after_j: the elements from position j on, j written already (so each after a comma):
     * none at the maximum; a plain loop once past the prefix items and minItems; else one more
     * (required below minItems, optional above) and after_{j+1} */
    long long last = hi >= 0 ? hi : (k > lo ? k : lo);
    if (last < 1) last = 1;
    int after = c->n_rules++;
    sbuf ab = {0};
#define PUT_ELEM(sb, j) ((j) < k && el[j] >= 0 ? sb_printf(sb, "r%d ws", el[j]) : (j) >= k && rest >= 0 ? sb_printf(sb, "r%d ws", rest) : sb_str(sb, "json-value ws"))
    if (hi < 0) {
        sb_str(&ab, "(\",\" ws ");
        PUT_ELEM(&ab, last);
        sb_str(&ab, ")*");
    }
    rc = add_rule(c, after, &ab);
    free(ab.p);
    for (long long j = last - 1; j >= 1 && !rc; j--) {
        int r = c->n_rules++;
        sbuf rb = {0};
        sb_str(&rb, j < lo ? "\",\" ws " : "(\",\" ws ");
        PUT_ELEM(&rb, j);
        sb_printf(&rb, " r%d%s", after, j < lo ? "" : ")?");
        rc = add_rule(c, r, &rb);
        free(rb.p);
        after = r;
    }
    if (!rc) {
        sb_str(b, "\"[\" ws ");
        if (hi != 0) {
            sb_str(b, lo > 0 ? "" : "(");
            PUT_ELEM(b, 0);
            sb_printf(b, " r%d%s", after, lo > 0 ? "" : ")?");
        }
        sb_str(b, " \"]\"");
    }
#undef PUT_ELEM
    free(el);
    return rc;
}

/* ---- one schema ------------------------------------------------------------------------------- */

static const char *ANNOTATIONS[] = {"title", "description", "$schema", "$comment", "default", "examples", "deprecated",
                                    "readOnly", "writeOnly", "$defs", "definitions", "contentMediaType",
                                    "contentEncoding", "contentSchema", NULL};
static const char *ASSERTIONS[] = {"type", "properties", "required", "additionalProperties", "items", "prefixItems",
                                   "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "format", "pattern",
                                   "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                   "$ref", NULL};

static int in_list(const char *k, const char **list) {
    for (int i = 0; list[i]; i++)
        if (strcmp(k, list[i]) == 0) return 1;
    return 0;
}

/* The number of assertion keywords of s (annotations not counted). */
static int n_assertions(const cJSON *s) {
    int n = 0;
    for (const cJSON *k = s->child; k; k = k->next) n += !in_list(k->string, ANNOTATIONS) && strcmp(k->string, "$id") != 0;
    return n;
}

static const cJSON *resolve_ref(schema_c *c, const char *ref, const char *ptr) {
    if (ref[0] != '#') {
        sc_fail(c, ptr, "$ref: only references inside the schema (#...) are supported, not '%s'", ref);
        return NULL;
    }
    const cJSON *n = c->root;
    const char *p = ref + 1;
    while (*p == '/' && n) {
        p++;
        char key[256];
        size_t k = 0;
        while (*p && *p != '/' && k < sizeof key - 1) {
            if (p[0] == '~' && p[1] == '0') key[k++] = '~', p += 2;
            else if (p[0] == '~' && p[1] == '1') key[k++] = '/', p += 2;
            else if (p[0] == '%') { /* percent-encoding of the URI fragment */
                int h = 0;
                for (int i = 1; i <= 2; i++) {
                    char ch = p[i];
                    h = h * 16 + (ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : 0);
                    if (!ch) break;
                }
                key[k++] = (char)h, p += p[1] && p[2] ? 3 : 1;
            } else key[k++] = *p++;
        }
        key[k] = 0;
        if (cJSON_IsArray(n)) {
            char *end;
            long i = strtol(key, &end, 10);
            n = *end || end == key ? NULL : cJSON_GetArrayItem(n, (int)i);
        } else {
            n = cJSON_IsObject(n) ? cJSON_GetObjectItemCaseSensitive(n, key) : NULL;
        }
    }
    if (!n || *p) {
        sc_fail(c, ptr, "$ref: '%s' does not resolve inside the schema", ref);
        return NULL;
    }
    return n;
}

/* Whether two schemas' values can never overlap, decided from their types or constants:
 * what oneOf needs to be compiled as anyOf. */
static int value_kinds(const cJSON *s, const cJSON **consts) {
    if (!cJSON_IsObject(s)) return T_ALL;
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const"), *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    *consts = cst ? cst : en;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    int bits = 0;
    if (cJSON_IsString(t)) bits = type_bit(t->valuestring);
    else if (cJSON_IsArray(t))
        for (const cJSON *e = t->child; e; e = e->next) bits |= cJSON_IsString(e) ? type_bit(e->valuestring) : 0;
    else bits = T_ALL;
    if (bits & T_NUM) bits |= T_INT;
    if (bits & T_INT) bits |= T_NUM;
    return bits;
}

static int consts_overlap(const cJSON *a, const cJSON *b) {
    const cJSON *la = a, *lb = b;
    int a_list = cJSON_IsArray(a) && a->string && strcmp(a->string, "enum") == 0;
    int b_list = cJSON_IsArray(b) && b->string && strcmp(b->string, "enum") == 0;
    for (const cJSON *x = a_list ? la->child : la; x; x = a_list ? x->next : NULL)
        for (const cJSON *y = b_list ? lb->child : lb; y; y = b_list ? y->next : NULL)
            if (cJSON_Compare(x, y, 1)) return 1;
    return 0;
}

static int oneof_disjoint(const cJSON *list) {
    for (const cJSON *a = list->child; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next) {
            const cJSON *ca = NULL, *cb = NULL;
            int ta = value_kinds(a, &ca), tb = value_kinds(b, &cb);
            if (!(ta & tb)) continue;
            if (ca && cb && !consts_overlap(ca, cb)) continue;
            return 0;
        }
    return 1;
}

/* Adds part's keywords to m: a keyword new to m, or the same value; required lists are joined;
 * properties are joined when their names differ. Keywords that read a sibling (items reads
 * prefixItems, additionalProperties reads properties) must come from one part. */
static int merge_part(schema_c *c, cJSON *m, const cJSON *part, const char *ptr) {
    for (const cJSON *k = part->child; k; k = k->next) {
        if (in_list(k->string, ANNOTATIONS) || strcmp(k->string, "$id") == 0) continue;
        cJSON *have = cJSON_GetObjectItemCaseSensitive(m, k->string);
        if (have && cJSON_Compare(have, k, 1)) continue;
        if (have && strcmp(k->string, "required") == 0 && cJSON_IsArray(have) && cJSON_IsArray(k)) {
            for (const cJSON *e = k->child; e; e = e->next) cJSON_AddItemToArray(have, cJSON_Duplicate(e, 1));
            continue;
        }
        if (have && strcmp(k->string, "properties") == 0 && cJSON_IsObject(have) && cJSON_IsObject(k)) {
            for (const cJSON *e = k->child; e; e = e->next) {
                if (cJSON_GetObjectItemCaseSensitive(have, e->string))
                    return sc_fail(c, ptr, "allOf: property '%s' in more than one part", e->string);
                cJSON_AddItemToObject(have, e->string, cJSON_Duplicate(e, 1));
            }
            continue;
        }
        if (have)
            return sc_fail(c, ptr, "allOf: keyword '%s' in more than one part (only parts with different keywords are merged)", k->string);
        cJSON_AddItemToObject(m, k->string, cJSON_Duplicate(k, 1));
    }
    return 0;
}

/* allOf (or $ref with sibling keywords) as one schema holding every part's keywords, when they
 * do not interact; kept in c->temps. NULL with the failure recorded otherwise. */
static cJSON *merge_allof(schema_c *c, const cJSON *s, const cJSON *ref_target, const char *ptr) {
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (!ref_target && (!cJSON_IsArray(all) || !all->child)) {
        sc_fail(c, ptr, "allOf: not a non-empty array");
        return NULL;
    }
    cJSON *m = cJSON_CreateObject(), *own = cJSON_CreateObject();
    cJSON_AddItemToArray(c->temps, m);
    cJSON_AddItemToArray(c->temps, own);
    for (const cJSON *k = s->child; k; k = k->next)
        if (strcmp(k->string, ref_target ? "$ref" : "allOf") != 0) cJSON_AddItemToObject(own, k->string, cJSON_Duplicate(k, 1));
    const cJSON *parts[260];
    int n = 0;
    parts[n++] = own;
    if (ref_target) parts[n++] = ref_target;
    for (const cJSON *p = ref_target ? NULL : all->child; p; p = p->next) {
        if (n == 260) {
            sc_fail(c, ptr, "allOf: more than 256 parts");
            return NULL;
        }
        parts[n++] = p;
    }
    /* additionalProperties reads its part's properties, items its part's prefixItems */
    static const char *pairs[2][2] = {{"properties", "additionalProperties"}, {"prefixItems", "items"}};
    for (int g = 0; g < 2; g++) {
        int with_either = 0, with_reader = 0;
        for (int i = 0; i < n; i++) {
            if (!cJSON_IsObject(parts[i])) continue;
            int a = cJSON_GetObjectItemCaseSensitive(parts[i], pairs[g][0]) != NULL;
            int b = cJSON_GetObjectItemCaseSensitive(parts[i], pairs[g][1]) != NULL;
            with_either += a || b, with_reader += b;
        }
        if (with_reader && with_either > 1) {
            sc_fail(c, ptr, "%s: %s and %s in different parts", ref_target ? "$ref" : "allOf", pairs[g][1], pairs[g][0]);
            return NULL;
        }
    }
    for (int i = 0; i < n; i++) {
        if (cJSON_IsTrue(parts[i])) continue;
        if (!cJSON_IsObject(parts[i])) {
            sc_fail(c, ptr, "%s: a part that is not an object schema", ref_target ? "$ref" : "allOf");
            return NULL;
        }
        if (merge_part(c, m, parts[i], ptr)) return NULL;
    }
    return m;
}

static int alternatives(schema_c *c, const cJSON *list, const char *ptr, const char *kw, sbuf *b) {
    if (!cJSON_IsArray(list) || !list->child) return sc_fail(c, ptr, "%s: not a non-empty array", kw);
    char *lp = ptr_join(ptr, kw);
    int i = 0, rc = 0;
    sb_str(b, "(");
    for (const cJSON *e = list->child; e && !rc; e = e->next, i++) {
        char *ep = lp ? ptr_index(lp, i) : NULL;
        if (is_false(e)) { /* matches nothing: leave it out */
            free(ep);
            continue;
        }
        int r = compile_schema(c, e, ep ? ep : ptr);
        free(ep);
        if (r < 0) {
            rc = -1;
            break;
        }
        if (b->p[b->n - 1] != '(') sb_str(b, " | ");
        sb_printf(b, "r%d", r);
    }
    free(lp);
    if (!rc && b->p[b->n - 1] == '(') rc = sc_fail(c, ptr, "%s: every alternative is false (nothing fits)", kw);
    sb_str(b, ")");
    return rc;
}

static int schema_body(schema_c *c, const cJSON *s, const char *ptr, sbuf *b) {
    if (cJSON_IsTrue(s)) {
        sb_str(b, "json-value");
        return 0;
    }
    if (cJSON_IsFalse(s)) return sc_fail(c, ptr, "the schema false matches nothing");
    if (!cJSON_IsObject(s)) return sc_fail(c, ptr, "a schema must be an object or a boolean");
    for (const cJSON *k = s->child; k; k = k->next) {
        if (strcmp(k->string, "$id") == 0 && s == c->root) continue;
        if (!in_list(k->string, ANNOTATIONS) && !in_list(k->string, ASSERTIONS))
            return sc_fail(c, ptr, "keyword '%s' is not supported", k->string);
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf"), *one = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    const cJSON *target = NULL;
    if (ref && n_assertions(s) > 1) { /* $ref with siblings: both apply, as in allOf */
        if (!cJSON_IsString(ref)) return sc_fail(c, ptr, "$ref: not a string");
        if (!(target = resolve_ref(c, ref->valuestring, ptr))) return -1;
    }
    if (all || target) {
        if (c->depth >= MAX_DEPTH) return sc_fail(c, ptr, "subschemas nested more than %d deep", MAX_DEPTH);
        cJSON *m = merge_allof(c, s, target, ptr);
        if (!m) return -1;
        char *ap = ptr_join(ptr, all ? "allOf" : "$ref");
        c->depth++;
        int rc = schema_body(c, m, ap ? ap : ptr, b);
        c->depth--;
        free(ap);
        return rc;
    }
    if (ref || any || one) {
        const char *kw = ref ? "$ref" : any ? "anyOf" : "oneOf";
        if (n_assertions(s) > 1) return sc_fail(c, ptr, "%s: with other assertion keywords beside it", kw);
        if (ref) {
            if (!cJSON_IsString(ref)) return sc_fail(c, ptr, "$ref: not a string");
            const cJSON *t = resolve_ref(c, ref->valuestring, ptr);
            if (!t) return -1;
            char *rp = ptr_join(ptr, "$ref");
            int r = compile_schema(c, t, rp ? rp : ptr);
            free(rp);
            if (r < 0) return -1;
            sb_printf(b, "r%d", r);
            return 0;
        }
        if (one && cJSON_IsArray(one) && !oneof_disjoint(one))
            return sc_fail(c, ptr, "oneOf: alternatives that may overlap (only disjoint types or constants are supported)");
        return alternatives(c, any ? any : one, ptr, kw, b);
    }
    int types = schema_types(c, s, ptr);
    if (types < 0) return -1;
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const"), *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (cst || en) {
        if (cst && en) return sc_fail(c, ptr, "const: together with enum");
        if (n_assertions(s) > 1 + (cJSON_GetObjectItemCaseSensitive(s, "type") != NULL))
            return sc_fail(c, ptr, "%s: with assertion keywords other than type", cst ? "const" : "enum");
        if (en && !cJSON_IsArray(en)) return sc_fail(c, ptr, "enum: not an array");
        int n = 0;
        sb_str(b, "(");
        for (const cJSON *v = cst ? cst : en->child; v; v = cst ? NULL : v->next) {
            if (!(value_type(v) & types)) continue;
            if (n++) sb_str(b, " | ");
            if (const_value(b, v, c->gemma))
                return sc_fail(c, ptr, "%s: a value a tool call cannot hold (a '<' in a string, a key with :,{}[]<\" or spaces)",
                               cst ? "const" : "enum");
        }
        sb_str(b, ")");
        if (!n) return sc_fail(c, ptr, "%s: no value of the allowed types", cst ? "const" : "enum");
        return 0;
    }
    if (types & T_NUM) types &= ~T_INT;
    int has_lo = 0, has_hi = 0;
    long long lo = 0, hi = 0;
    int bounded = cJSON_GetObjectItemCaseSensitive(s, "minimum") || cJSON_GetObjectItemCaseSensitive(s, "maximum") ||
                  cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum") || cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum");
    if (bounded && (types & T_NUM))
        return sc_fail(c, ptr, "minimum/maximum: only integers can be bounded (\"type\": \"integer\")");
    if (number_bound(c, s, ptr, "minimum", 0, &has_lo, &lo) || number_bound(c, s, ptr, "exclusiveMinimum", 0, &has_lo, &lo) ||
        number_bound(c, s, ptr, "maximum", 1, &has_hi, &hi) || number_bound(c, s, ptr, "exclusiveMaximum", 1, &has_hi, &hi))
        return -1;
    if (has_lo && has_hi && lo > hi) return sc_fail(c, ptr, "minimum: above maximum (no integer fits)");
    int n = 0;
    sb_str(b, "(");
#define ALT() (n++ ? sb_str(b, " | ") : (void)0)
    if (types & T_NULL) ALT(), sb_str(b, "json-null");
    if (types & T_BOOL) ALT(), sb_str(b, "json-bool");
    if (types & T_NUM) ALT(), sb_str(b, "json-number");
    if (types & T_INT) {
        ALT();
        if (has_lo || has_hi) int_range(b, has_lo, lo, has_hi, hi);
        else sb_str(b, "json-int");
    }
    if (types & T_STR) {
        ALT();
        if (string_rule(c, s, ptr, b)) return -1;
    }
    if (types & T_OBJ) {
        ALT();
        if (object_rule(c, s, ptr, b)) return -1;
    }
    if (types & T_ARR) {
        ALT();
        if (array_rule(c, s, ptr, b)) return -1;
    }
#undef ALT
    sb_str(b, ")");
    return 0;
}

/* The rule for schema s: a new one, or the one made before for the same schema node (so that
 * $ref cycles become recursive rules). */
static int compile_schema(schema_c *c, const cJSON *s, const char *ptr) {
    for (size_t i = 0; i < c->n_refs; i++)
        if (c->refs[i].node == s) return c->refs[i].rule;
    if (c->depth >= MAX_DEPTH) return sc_fail(c, ptr, "subschemas nested more than %d deep", MAX_DEPTH);
    if (c->n_rules > 200000) return sc_fail(c, ptr, "the schema needs more than 200000 rules");
    int id = c->n_rules++;
    ref_memo *m = realloc(c->refs, (c->n_refs + 1) * sizeof *m);
    if (!m) return sc_fail(c, ptr, "out of memory");
    c->refs = m;
    c->refs[c->n_refs++] = (ref_memo){s, id};
    sbuf b = {0};
    c->depth++;
    int rc = schema_body(c, s, ptr, &b);
    c->depth--;
    if (!rc) rc = add_rule(c, id, &b);
    free(b.p);
    return rc ? -1 : id;
}

char *g4_grammar_json_schema_to_gbnf(const char *text, size_t len) {
    if (!text || len > MAX_SCHEMA_BYTES) {
        g4_fail("json schema: %s", text ? "more than 1 MiB" : "none given");
        return NULL;
    }
    size_t ok = g4_text_utf8_prefix(text, len);
    if (ok != len) { /* the grammar speaks UTF-8 only: such a string could never be generated */
        g4_fail("json schema: not valid UTF-8 (at byte %zu)", ok);
        return NULL;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) {
        g4_fail("json schema: not valid JSON (near byte %zu)", (size_t)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - text : 0));
        return NULL;
    }
    schema_c c = {.root = root, .temps = cJSON_CreateArray()};
    int r = compile_schema(&c, root, "");
    char *out = NULL;
    if (r >= 0) {
        sbuf g = {0};
        sb_printf(&g, "root ::= r%d\n", r);
        sb_str(&g, JSON_SYNTAX);
        sb_str(&g, VALUE_RULES);
        sb_str(&g, FORMAT_RULES);
        sb_put(&g, c.rules.p ? c.rules.p : "", c.rules.n);
        if (g.oom || c.rules.oom) {
            free(g.p);
            g4_fail("json schema: out of memory");
        } else {
            out = g.p;
        }
    }
    free(c.rules.p);
    free(c.refs);
    cJSON_Delete(c.temps);
    cJSON_Delete(root);
    return out;
}

/* ---- tool calls -------------------------------------------------------------------------------- */

/* One tool's call after "call:": its name (unless named, where the prompt holds it) and its
 * arguments, the parameters schema compiled into c's rules for GEMMA_SYNTAX. */
static int tool_call_alt(schema_c *c, const cJSON *fn, int with_name, sbuf *alts) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    if (!cJSON_IsString(name) || !name->valuestring[0] || strpbrk(name->valuestring, "{<"))
        return sc_fail(c, "", "the function needs a name without '{' or '<'");
    cJSON *none = NULL;
    if (!params || cJSON_IsNull(params)) params = none = cJSON_CreateObject(); /* no arguments: {} */
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(params, "type");
    int rc = 0, r = -1;
    if (!params) rc = sc_fail(c, "", "out of memory");
    else if (!none && !(cJSON_IsString(type) && !strcmp(type->valuestring, "object")))
        rc = sc_fail(c, "", "a call's arguments are an object: the schema needs \"type\": \"object\"");
    if (!rc) {
        c->root = params, c->n_refs = 0; /* $ref "#..." is the function's parameters' */
        r = none ? -2 : compile_schema(c, params, "");
    }
    if (r != -1) {
        if (alts->n) sb_str(alts, " | ");
        if (with_name) sb_lit(alts, name->valuestring, strlen(name->valuestring)), sb_str(alts, " ");
        if (r >= 0) sb_printf(alts, "r%d", r);
        else sb_str(alts, "\"{}\"");
    }
    cJSON_Delete(none);
    return rc || r == -1 ? -1 : 0;
}

static int is_strict(const cJSON *fn) { return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fn, "strict")); }

/* The calls' grammar: after "call:" [NAME] (reply 0: g4_tool_call_gbnf), or a whole reply, text
 * then calls, strict functions' arguments by their schemas (reply 1: g4_tool_reply_gbnf). */
static char *tool_gbnf(const g4_tokenizer *tok, const char *tools_json, size_t len, const char *name, int reply, int *bad_tool) {
    *bad_tool = -1;
    int32_t quote = tok ? g4_tokenizer_piece_to_id(tok, "<|\"|>") : -1, close = tok ? g4_tokenizer_piece_to_id(tok, "<tool_call|>") : -1;
    int32_t open = tok ? g4_tokenizer_piece_to_id(tok, "<|tool_call>") : -1;
    if (quote < 0 || close < 0 || open < 0 || !g4_tokenizer_is_special(tok, quote) || !g4_tokenizer_is_special(tok, close) ||
        !g4_tokenizer_is_special(tok, open)) {
        g4_fail("tool call grammar: the tokenizer has no special <|\"|>, <|tool_call> and <tool_call|> tokens");
        return NULL;
    }
    cJSON *tools = tools_json && len <= MAX_SCHEMA_BYTES ? cJSON_ParseWithLength(tools_json, len) : NULL;
    if (!cJSON_IsArray(tools)) {
        cJSON_Delete(tools);
        g4_fail("tool call grammar: the tools are not a JSON array");
        return NULL;
    }
    schema_c c = {.gemma = 1, .temps = cJSON_CreateArray()};
    sbuf alts = {0};
    int i = 0, n = 0, n_strict = 0, rc = 0;
    for (const cJSON *t = tools->child; t && !rc; t = t->next, i++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *fname = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (name && !(cJSON_IsString(fname) && !strcmp(fname->valuestring, name))) continue;
        n++;
        if (reply && !is_strict(fn)) { /* not strict: a call of it with any arguments */
            if (!cJSON_IsString(fname) || !fname->valuestring[0] || strpbrk(fname->valuestring, "{<")) {
                rc = sc_fail(&c, "", "the function needs a name without '{' or '<'");
                *bad_tool = i;
                break;
            }
            if (alts.n) sb_str(&alts, " | ");
            sb_lit(&alts, fname->valuestring, strlen(fname->valuestring));
            sb_str(&alts, " json-object");
            continue;
        }
        n_strict++;
        if ((rc = tool_call_alt(&c, fn, !name, &alts))) *bad_tool = i;
    }
    char *out = NULL;
    if (!rc && (!n || (reply && !n_strict))) g4_fail("tool call grammar: %s", name ? "no tool has that name" : reply ? "no strict tools" : "no tools");
    else if (!rc) {
        sbuf g = {0};
        if (reply) /* text (UTF-8: never a token's mark; no "<|", which the reply's reader would take for a written
                    * <|tool_call>, an unconstrained call), then calls, one after another */
            sb_printf(&g, "root ::= ([^<] | \"<\"+ [^<|])* \"<\"* (<[%d]> \"call:\" (", (int)open);
        else
            sb_str(&g, "root ::= (");
        sb_put(&g, alts.p ? alts.p : "", alts.n);
        sb_printf(&g, ") <[%d]>%s\njson-quote ::= <[%d]>\n", (int)close, reply ? ")*" : "", (int)quote);
        sb_str(&g, GEMMA_SYNTAX);
        sb_str(&g, VALUE_RULES);
        sb_str(&g, FORMAT_RULES);
        sb_put(&g, c.rules.p ? c.rules.p : "", c.rules.n);
        if (g.oom || c.rules.oom || alts.oom) free(g.p), g4_fail("tool call grammar: out of memory");
        else out = g.p;
    }
    free(alts.p), free(c.rules.p), free(c.refs);
    cJSON_Delete(c.temps);
    cJSON_Delete(tools);
    return out;
}

char *g4_tool_call_gbnf(const g4_tokenizer *tok, const char *tools_json, size_t len, const char *name, int *bad_tool) {
    return tool_gbnf(tok, tools_json, len, name, 0, bad_tool);
}

char *g4_tool_reply_gbnf(const g4_tokenizer *tok, const char *tools_json, size_t len, int *bad_tool) {
    return tool_gbnf(tok, tools_json, len, NULL, 1, bad_tool);
}

g4_grammar *g4_grammar_from_json_schema(const char *text, size_t len) {
    char *gbnf = g4_grammar_json_schema_to_gbnf(text, len);
    if (!gbnf) return NULL;
    g4_grammar *g = g4_grammar_compile(gbnf, strlen(gbnf));
    if (!g) g4_fail_prefix("json schema: ");
    free(gbnf);
    return g;
}

g4_grammar *g4_grammar_json(int objects_only) {
    sbuf g = {0};
    sb_str(&g, objects_only ? "root ::= json-object\n" : "root ::= json-value\n");
    sb_str(&g, JSON_SYNTAX);
    sb_str(&g, VALUE_RULES);
    g4_grammar *gr = g.oom ? NULL : g4_grammar_compile(g.p, g.n);
    free(g.p);
    return gr;
}

g4_grammar *g4_grammar_from_choice(const char *const *choices, size_t n) {
    if (!n || !choices) {
        g4_fail("choice: no strings to choose from");
        return NULL;
    }
    sbuf g = {0};
    sb_str(&g, "root ::= ");
    for (size_t i = 0; i < n; i++) {
        if (!choices[i] || g4_text_utf8_prefix(choices[i], strlen(choices[i])) != strlen(choices[i])) {
            free(g.p);
            g4_fail("choice: string %zu is %s", i, choices[i] ? "not valid UTF-8" : "missing");
            return NULL;
        }
        if (i) sb_str(&g, " | ");
        sb_lit(&g, choices[i], strlen(choices[i]));
    }
    sb_str(&g, "\n");
    g4_grammar *gr = g.oom ? NULL : g4_grammar_compile(g.p, g.n);
    free(g.p);
    return gr;
}

/* ---- regular expressions ---------------------------------------------------------------------- */

/* The subset: literals, escapes (\d \D \w \W \s \S, \n \r \t \f \v, \uHHHH, \xHH, escaped
 * punctuation), classes [...] and [^...] with ranges and those escapes, `.`, groups (...) and
 * (?:...), |, * + ? {m} {m,} {m,n} (lazy forms the same), ^ at the very start and $ at the very
 * end. Refused: backreferences, lookaround, \b, named groups, flags. In a JSON string (pattern),
 * a `"`, `\` or control character is matched in its escaped form, and classes leave those out. */
typedef struct {
    const unsigned char *s;
    size_t n, i;
    int json;
    sbuf *out;
    char *err;
    size_t errlen;
    int depth;
} rx;

static int rx_err(rx *r, const char *msg) {
    snprintf(r->err, r->errlen, "%s (at character %zu)", msg, r->i);
    return -1;
}

typedef struct {
    unsigned lo, hi;
} rrange;

/* one literal code point (JSON: in its serialized form; a tool call's string has no '<') */
static int rx_lit(rx *r, unsigned cp) {
    if (r->json == RX_GEMMA && cp == '<') return rx_err(r, "'<' cannot be written in a tool call's string");
    if (r->json == RX_JSON && (cp == '"' || cp == '\\' || cp < 0x20)) {
        static const char *named = "\b\f\n\r\t";
        const char *sh = "bfnrt";
        const char *p = cp ? strchr(named, (int)cp) : NULL;
        sb_str(r->out, "\"\\x5C");
        if (cp == '"' || cp == '\\') sb_cp(r->out, cp);
        else if (p) sb_cp(r->out, (unsigned char)sh[p - named]);
        else sb_printf(r->out, "u00%c%c", "0123456789abcdef"[cp >> 4], "0123456789abcdef"[cp & 15]);
        sb_str(r->out, "\"");
        return 0;
    }
    sb_str(r->out, "\"");
    sb_cp(r->out, cp);
    sb_str(r->out, "\"");
    return 0;
}

static int rx_class_escape(unsigned e, rrange *rg, size_t *n, int *neg) {
    *neg = 0;
    switch (e) {
    case 'D': *neg = 1; /* fall through */
    case 'd': rg[(*n)++] = (rrange){'0', '9'}; return 1;
    case 'W': *neg = 1; /* fall through */
    case 'w':
        rg[(*n)++] = (rrange){'a', 'z'}, rg[(*n)++] = (rrange){'A', 'Z'}, rg[(*n)++] = (rrange){'0', '9'}, rg[(*n)++] = (rrange){'_', '_'};
        return 1;
    case 'S': *neg = 1; /* fall through */
    case 's':
        rg[(*n)++] = (rrange){' ', ' '}, rg[(*n)++] = (rrange){'\t', '\r'};
        return 1;
    }
    return 0;
}

static int rx_escape_char(rx *r, unsigned e, unsigned *cp) {
    switch (e) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case 'x': case 'u': {
        int k = e == 'x' ? 2 : 4;
        unsigned v = 0;
        for (int j = 0; j < k; j++) {
            if (r->i >= r->n) return rx_err(r, "short hex escape");
            unsigned char ch = r->s[r->i++];
            int h = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
            if (h < 0) return rx_err(r, "bad hex escape");
            v = v * 16 + (unsigned)h;
        }
        if (v >= 0xD800 && v <= 0xDFFF) return rx_err(r, "surrogate escapes are not supported");
        *cp = v;
        return 0;
    }
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
        return rx_err(r, "unsupported escape (backreference, \\b or unknown)");
    *cp = e;
    return 0;
}

/* a class of ranges as GBNF (JSON: without `"`, `\` and controls, which appear escaped) */
static void rx_class_out(rx *r, const rrange *rg, size_t n, int neg) {
    sb_str(r->out, neg ? "[^" : "[");
    for (size_t i = 0; i < n; i++) {
        unsigned lo = rg[i].lo, hi = rg[i].hi;
        if (r->json && !neg) { /* leave the escaped ones out (a tool call's '<') by splitting around them */
            unsigned cuts[3][2] = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
            if (r->json == RX_GEMMA) cuts[0][0] = cuts[0][1] = cuts[1][0] = cuts[1][1] = cuts[2][0] = cuts[2][1] = '<';
            unsigned a = lo;
            while (a <= hi) {
                int moved = 0;
                for (int k = 0; k < 3; k++)
                    if (a >= cuts[k][0] && a <= cuts[k][1]) a = cuts[k][1] + 1, moved = 1;
                if (moved) continue;
                unsigned b = hi;
                for (int k = 0; k < 3; k++)
                    if (cuts[k][0] > a && cuts[k][0] <= b) b = cuts[k][0] - 1;
                sb_cp(r->out, a);
                if (b > a) sb_str(r->out, "-"), sb_cp(r->out, b);
                a = b + 1;
            }
            continue;
        }
        sb_cp(r->out, lo);
        if (hi > lo) sb_str(r->out, "-"), sb_cp(r->out, hi);
    }
    if (r->json && neg) sb_str(r->out, r->json == RX_GEMMA ? "<" : "\"\\\\\\x00-\\x1F");
    sb_str(r->out, "]");
}

static int rx_alt(rx *r);

static int rx_atom(rx *r) {
    unsigned ch = utf8_next(r->s, r->n, &r->i);
    if (ch == '(') {
        if (++r->depth > 100) return rx_err(r, "groups nested too deep");
        if (r->i < r->n && r->s[r->i] == '?') {
            if (r->i + 1 < r->n && r->s[r->i + 1] == ':') r->i += 2;
            else return rx_err(r, "lookaround, named groups and flags are not supported");
        }
        sb_str(r->out, "(");
        if (rx_alt(r)) return -1;
        if (r->i >= r->n || r->s[r->i] != ')') return rx_err(r, "missing ')'");
        r->i++;
        r->depth--;
        sb_str(r->out, ")");
        return 0;
    }
    if (ch == '[') {
        rrange rg[512];
        size_t n = 0;
        int neg = r->i < r->n && r->s[r->i] == '^';
        if (neg) r->i++;
        int first = 1;
        while (r->i < r->n && (r->s[r->i] != ']' || first)) {
            first = 0;
            if (n > 500) return rx_err(r, "class too large");
            unsigned lo = utf8_next(r->s, r->n, &r->i), hi;
            if (lo == '\\') {
                if (r->i >= r->n) return rx_err(r, "trailing backslash");
                unsigned e = utf8_next(r->s, r->n, &r->i);
                int eneg;
                if (rx_class_escape(e, rg, &n, &eneg)) {
                    if (eneg) return rx_err(r, "negated escapes (\\D \\W \\S) inside a class are not supported");
                    continue;
                }
                if (e == 'b') lo = '\b';
                else if (rx_escape_char(r, e, &lo)) return -1;
            }
            hi = lo;
            if (r->i + 1 < r->n && r->s[r->i] == '-' && r->s[r->i + 1] != ']') {
                r->i++;
                hi = utf8_next(r->s, r->n, &r->i);
                if (hi == '\\') {
                    if (r->i >= r->n) return rx_err(r, "trailing backslash");
                    if (rx_escape_char(r, utf8_next(r->s, r->n, &r->i), &hi)) return -1;
                }
                if (hi < lo) return rx_err(r, "class range out of order");
            }
            rg[n++] = (rrange){lo, hi};
        }
        if (r->i >= r->n) return rx_err(r, "missing ']'");
        r->i++;
        rx_class_out(r, rg, n, neg);
        return 0;
    }
    if (ch == '.') {
        sb_str(r->out, r->json == RX_JSON ? "[^\"\\\\\\x00-\\x1F]" : r->json == RX_GEMMA ? "[^<\\n]" : "[^\\n]");
        return 0;
    }
    if (ch == '\\') {
        if (r->i >= r->n) return rx_err(r, "trailing backslash");
        unsigned e = utf8_next(r->s, r->n, &r->i);
        rrange rg[8];
        size_t n = 0;
        int neg;
        if (rx_class_escape(e, rg, &n, &neg)) {
            rx_class_out(r, rg, n, neg);
            return 0;
        }
        unsigned cp;
        if (rx_escape_char(r, e, &cp)) return -1;
        return rx_lit(r, cp);
    }
    if (ch == '^' || ch == '$') return rx_err(r, "^ and $ are supported only at the very start and end");
    if (ch == '*' || ch == '+' || ch == '?' || ch == '{' || ch == ')' || ch == '|') return rx_err(r, "misplaced operator");
    return rx_lit(r, ch);
}

static int rx_count(rx *r, long *v) {
    if (r->i >= r->n || r->s[r->i] < '0' || r->s[r->i] > '9') return rx_err(r, "bad {m,n}");
    long x = 0;
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') {
        x = x * 10 + (r->s[r->i++] - '0');
        if (x > MAX_COUNT) return rx_err(r, "repetition count over 4096");
    }
    *v = x;
    return 0;
}

static int rx_seq(rx *r) {
    int any = 0;
    while (r->i < r->n && r->s[r->i] != '|' && r->s[r->i] != ')') {
        if (r->s[r->i] == '$' && r->i + 1 == r->n && r->depth == 0) break;
        sb_str(r->out, any ? " (" : "(");
        if (rx_atom(r)) return -1;
        sb_str(r->out, ")");
        any = 1;
        if (r->i < r->n) {
            unsigned char q = r->s[r->i];
            if (q == '*' || q == '+' || q == '?') {
                sb_printf(r->out, "%c", q);
                r->i++;
            } else if (q == '{') {
                r->i++;
                long m, x;
                if (rx_count(r, &m)) return -1;
                x = m;
                if (r->i < r->n && r->s[r->i] == ',') {
                    r->i++;
                    x = -1;
                    if (r->i < r->n && r->s[r->i] != '}' && rx_count(r, &x)) return -1;
                }
                if (r->i >= r->n || r->s[r->i] != '}') return rx_err(r, "missing '}'");
                if (x >= 0 && x < m) return rx_err(r, "{m,n} with n < m");
                r->i++;
                if (x < 0) sb_printf(r->out, "{%ld,}", m);
                else sb_printf(r->out, "{%ld,%ld}", m, x);
            } else {
                continue;
            }
            if (r->i < r->n && (r->s[r->i] == '?' || r->s[r->i] == '+')) r->i++; /* lazy/possessive: same language */
            if (r->i < r->n && strchr("*+?{", r->s[r->i])) return rx_err(r, "nested quantifier");
        }
    }
    if (!any) sb_str(r->out, "\"\"");
    return 0;
}

static int rx_alt(rx *r) {
    if (rx_seq(r)) return -1;
    while (r->i < r->n && r->s[r->i] == '|') {
        r->i++;
        sb_str(r->out, " | ");
        if (rx_seq(r)) return -1;
    }
    return 0;
}

/* A regex as one GBNF expression. JSON (pattern): unanchored sides match any characters. */
static int regex_to_gbnf(sbuf *out, const char *re, size_t n, int mode, char *err, size_t errlen) {
    rx r = {(const unsigned char *)re, n, 0, mode, out, err, errlen, 0};
    int json_string = mode != RX_PLAIN;
    size_t start = n && re[0] == '^';
    int end = n > start && re[n - 1] == '$' && (n < 2 || re[n - 2] != '\\');
    if (start) r.i = 1;
    const char *any = json_string ? "json-char*" : "";
    if (json_string && !start) sb_printf(out, "%s ", any);
    sb_str(out, "(");
    if (rx_alt(&r)) return -1;
    if (r.i < r.n && r.s[r.i] == '$' && end && r.i + 1 == r.n) r.i++;
    if (r.i != r.n) return rx_err(&r, r.s[r.i] == ')' ? "unbalanced ')'" : "unexpected character");
    sb_str(out, ")");
    if (json_string && !end) sb_printf(out, " %s", any);
    return 0;
}

g4_grammar *g4_grammar_from_regex(const char *re, size_t len) {
    if (!re || len > MAX_SCHEMA_BYTES) {
        g4_fail("regex: %s", re ? "more than 1 MiB" : "none given");
        return NULL;
    }
    if (g4_text_utf8_prefix(re, len) != len) {
        g4_fail("regex: not valid UTF-8 (at byte %zu)", g4_text_utf8_prefix(re, len));
        return NULL;
    }
    sbuf g = {0};
    char err[200];
    sb_str(&g, "root ::= ");
    /* matched whole: anchors at the ends are accepted and change nothing */
    size_t s = len && re[0] == '^', e = len > s && re[len - 1] == '$' && (len < 2 || re[len - 2] != '\\');
    if (regex_to_gbnf(&g, re + s, len - s - e, 0, err, sizeof err)) {
        free(g.p);
        g4_fail("regex: %s", err);
        return NULL;
    }
    sb_str(&g, "\n");
    g4_grammar *gr = g.oom ? NULL : g4_grammar_compile(g.p, g.n);
    free(g.p);
    return gr;
}
