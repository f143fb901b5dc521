/* Fuzz target: the grammar compiler and recognizer, and the JSON schema, regex and choice
 * compilers (src/generate/grammar.c, json_schema.c).
 *
 * Input: a flag byte (bits 0-1: 0 GBNF, 1 JSON schema, 2 regex, 3 choice), then the text, then
 * optionally a NUL and bytes to feed the compiled grammar (at most 64). For choice the text's
 * lines are the strings. Checked:
 *   - compiling fails with a one-line message naming what failed, or gives a grammar;
 *   - a schema's GBNF (g4_grammar_json_schema_to_gbnf) compiles whenever the schema does, and
 *     a schema that compiles has GBNF text;
 *   - feeding the bytes one by one accepts the same prefix as feeding them at once, a copy of the
 *     state taken half way agrees with the original, and a complete state is never asked for
 *     more than the grammar allows (can_continue or is_complete holds after every accepted byte);
 *   - for choice: each string is accepted whole. */
#include <stdlib.h>
#include <string.h>

#include "g4.h"
#include "util/err.h"

#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g4_set_log(NULL, NULL);
    return 0;
}

static void check_error(const char *what) {
    const char *e = g4_last_error();
    FZ_CHECK(e && *e && !strchr(e, '\n'), "%s: error message \"%s\"", what, e ? e : "(null)");
}

static void feed(const g4_grammar *g, const unsigned char *b, size_t n) {
    g4_grammar_state *whole = g4_grammar_start(g), *one = g4_grammar_start(g), *half = NULL;
    if (!whole || !one) { /* the start itself can exceed the stack limits */
        g4_grammar_state_free(whole), g4_grammar_state_free(one);
        return;
    }
    int whole_ok = g4_grammar_accept_bytes(whole, b, n) == 0;
    size_t i = 0;
    for (; i < n; i++) {
        if (i == n / 2) half = g4_grammar_state_copy(one);
        if (g4_grammar_accept_bytes(one, b + i, 1) != 0) break;
        FZ_CHECK(g4_grammar_can_continue(one) || g4_grammar_is_complete(one), "a state with no way on at byte %zu", i);
    }
    /* one-shot acceptance is all-or-nothing; the limits can only make the one-shot run fail */
    FZ_CHECK(!whole_ok || i == n, "all %zu bytes accepted at once, byte %zu rejected alone", n, i);
    if (whole_ok) FZ_CHECK(g4_grammar_is_complete(whole) == g4_grammar_is_complete(one), "completion differs");
    if (half) {
        int ok = g4_grammar_accept_bytes(half, b + n / 2, n - n / 2) == 0;
        FZ_CHECK(!ok || i == n, "the copy accepted what the original rejected");
        if (ok && i == n) FZ_CHECK(g4_grammar_is_complete(half) == g4_grammar_is_complete(one), "copy completion differs");
    }
    g4_grammar_state_free(whole), g4_grammar_state_free(one), g4_grammar_state_free(half);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int kind = data[0] & 3;
    const char *text = (const char *)data + 1;
    size_t len = size - 1, tlen = 0;
    while (tlen < len && text[tlen]) tlen++;
    const unsigned char *in = tlen < len ? (const unsigned char *)text + tlen + 1 : NULL;
    size_t in_len = in ? len - tlen - 1 : 0;
    if (in_len > 64) in_len = 64;
    g4_grammar *g = NULL;
    if (kind == 0) {
        g = g4_grammar_compile(text, tlen);
        if (!g) check_error("gbnf");
    } else if (kind == 1) {
        char *gbnf = g4_grammar_json_schema_to_gbnf(text, tlen);
        g = g4_grammar_from_json_schema(text, tlen);
        if (!g) check_error("json schema");
        FZ_CHECK(!g || gbnf, "a schema compiled without GBNF text");
        if (gbnf && !g)
            FZ_CHECK(strstr(g4_last_error(), "left-recursive") || strstr(g4_last_error(), "more than"),
                     "the schema's GBNF does not compile: %s", g4_last_error());
        free(gbnf);
    } else if (kind == 2) {
        g = g4_grammar_from_regex(text, tlen);
        if (!g) check_error("regex");
    } else {
        char *copy = malloc(tlen + 1);
        const char *strs[16];
        size_t n = 0;
        memcpy(copy, text, tlen);
        copy[tlen] = 0;
        for (char *p = copy; n < 16;) {
            strs[n++] = p;
            char *nl = strchr(p, '\n');
            if (!nl) break;
            *nl = 0, p = nl + 1;
        }
        g = g4_grammar_from_choice(strs, n);
        if (!g) check_error("choice");
        for (size_t i = 0; g && i < n; i++) {
            g4_grammar_state *st = g4_grammar_start(g);
            FZ_CHECK(st && g4_grammar_accept_bytes(st, strs[i], strlen(strs[i])) == 0 && g4_grammar_is_complete(st),
                     "choice %zu not accepted", i);
            g4_grammar_state_free(st);
        }
        free(copy);
    }
    if (g && in) feed(g, in, in_len);
    g4_grammar_free(g);
    return 0;
}
