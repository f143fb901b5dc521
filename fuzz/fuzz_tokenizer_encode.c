/* Fuzz target: encoding arbitrary bytes with the real Gemma 4 tokenizer.
 *
 * Loads shared/data/tokenizers/gemma4/tokenizer.json once ($G4_SHARED, else ../shared or
 * ../../shared; binary cache under /tmp, see fz_load_gemma_tokenizer). Per input (any
 * bytes, NULs included), for parse_special 0 and 1:
 *   - encode succeeds, ids are in range and have pieces;
 *   - decode(encode(x)) equals x with each maximal invalid UTF-8 subpart replaced by U+FFFD
 *     (an independent WHATWG decoder) and each U+2581 turned into a space; for valid UTF-8
 *     without U+2581 that is x itself;
 *   - parse_special 0 never produces a special token (<bos>, <|turn>, <|channel>, ...):
 *     none of Gemma's is a merge result, so only added-token matching could, and it must
 *     not for untrusted text;
 *   - the streaming detokenizer, fed the ids one by one, gives whole UTF-8 characters per
 *     push and, with flush, exactly decode's output; a reset detokenizer can be reused. */
#include "g4.h"
#include "util/err.h"

#include "fuzz_common.h"

static g4_tokenizer *tok;
static g4_detokenizer *detok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g4_set_log(NULL, NULL);
    tok = fz_load_gemma_tokenizer();
    detok = g4_detokenizer_new(tok);
    if (!detok) fz_die("detokenizer_new");
    return 0;
}

/* x with every U+2581 replaced by a space (what decode gives for the piece's marker). */
static size_t unmark(char *s, size_t n) {
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        if (i + 3 <= n && memcmp(s + i, "\xE2\x96\x81", 3) == 0) s[w++] = ' ', i += 3;
        else s[w++] = s[i++];
    }
    s[w] = 0;
    return w;
}

/* With parse_special 0 a special token's id may only appear where the text spells it and the
 * model vocabulary itself produces it through BPE; Gemma's control tokens are not reachable
 * by merges, so no special id may appear at all. */
static void check_untrusted(const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        FZ_CHECK(!g4_tokenizer_is_special(tok, ids[i]), "parse_special=0 produced special token %d (%s) at %zu", ids[i],
                 g4_tokenizer_id_to_piece(tok, ids[i]), i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t vocab = g4_tokenizer_vocab_size(tok);
    size_t want_n;
    char *want = fz_utf8_replace(data, size, &want_n);
    want_n = unmark(want, want_n);
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        int rc = g4_tokenizer_encode(tok, (const char *)data, size, special, &ids, &n);
        FZ_CHECK(rc == 0, "encode failed (parse_special=%d): %s", special, g4_last_error());
        FZ_CHECK(ids != NULL, "encode gave NULL ids");
        FZ_CHECK(n <= 3 * size, "%zu ids for %zu bytes", n, size);
        for (size_t i = 0; i < n; i++)
            FZ_CHECK(ids[i] >= 0 && (size_t)ids[i] < vocab && g4_tokenizer_id_to_piece(tok, ids[i]), "bad id %d", ids[i]);
        if (!special) check_untrusted(ids, n);

        char *out = NULL;
        size_t out_n = 0;
        FZ_CHECK(g4_tokenizer_decode(tok, ids, n, &out, &out_n) == 0, "decode failed: %s", g4_last_error());
        /* decode-empty-nul: decoding zero ids returned an unterminated buffer. */
        if (n > 0 || !fz_ignored("decode-empty-nul"))
            FZ_CHECK(out[out_n] == 0, "decode output not NUL-terminated (%zu ids)", n);
        FZ_CHECK(out_n == want_n && memcmp(out, want, want_n) == 0,
                 "round trip differs (parse_special=%d): input %zu bytes, expected %zu bytes, decoded %zu bytes", special,
                 size, want_n, out_n);

        /* Streaming: reuse the one detokenizer (reset between inputs). */
        g4_detokenizer_reset(detok);
        size_t at = 0;
        for (size_t i = 0; i < n; i++) {
            const char *b;
            size_t bn;
            FZ_CHECK(g4_detokenizer_push(detok, ids[i], &b, &bn) == 0, "push failed");
            FZ_CHECK(fz_utf8_valid(b, bn), "push %zu gave a partial or invalid UTF-8 character", i);
            FZ_CHECK(at + bn <= out_n && memcmp(out + at, b, bn) == 0, "streaming differs from decode at id %zu", i);
            at += bn;
        }
        const char *b;
        size_t bn;
        FZ_CHECK(g4_detokenizer_flush(detok, &b, &bn) == 0, "flush failed");
        FZ_CHECK(at + bn == out_n && memcmp(out + at, b, bn) == 0, "streaming + flush differs from decode");
        free(out);
        free(ids);
    }
    free(want);
    return 0;
}
