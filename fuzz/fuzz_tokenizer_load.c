/* Fuzz target: tokenizer.json loading (src/text/tokenizer.c).
 *
 * Input: the bytes of a tokenizer.json, loaded with g4_tokenizer_load_ex(path,
 * G4_TOKENIZER_NO_CACHE) (no cache file is read or written). A tokenizer that loads is then
 * used: every id (up to 4096) through id_to_piece / piece_to_id / is_special, encode and
 * decode of fixed texts and of its own pieces, and the streaming detokenizer, which must
 * agree with decode. Decoded text must always be valid UTF-8. */
#include "g4.h"
#include "util/err.h"

#include "fuzz_common.h"

#include <cjson/cJSON.h>

static fz_memfile file;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g4_set_log(NULL, NULL);
    fz_memfile_open(&file, "tokenizer.json");
    return 0;
}

/* Decodes ids with decode and with the streaming decoder; both must succeed or fail alike
 * and give the same valid UTF-8. */
static void check_decode(const g4_tokenizer *tok, const int32_t *ids, size_t n) {
    char *out = NULL;
    size_t out_n = 0;
    int rc = g4_tokenizer_decode(tok, ids, n, &out, &out_n);
    g4_detokenizer *d = g4_detokenizer_new(tok);
    FZ_CHECK(d != NULL, "detokenizer_new");
    char *cat = malloc(1);
    size_t cat_n = 0;
    int src = 0;
    for (size_t i = 0; i < n && src == 0; i++) {
        const char *b;
        size_t bn;
        src = g4_detokenizer_push(d, ids[i], &b, &bn);
        if (src) break;
        FZ_CHECK(fz_utf8_valid(b, bn), "detokenizer push gave invalid UTF-8");
        cat = realloc(cat, cat_n + bn + 1);
        memcpy(cat + cat_n, b, bn), cat_n += bn;
    }
    if (src == 0) {
        const char *b;
        size_t bn;
        src = g4_detokenizer_flush(d, &b, &bn);
        if (src == 0) {
            cat = realloc(cat, cat_n + bn + 1);
            memcpy(cat + cat_n, b, bn), cat_n += bn;
        }
    }
    g4_detokenizer_free(d);
    FZ_CHECK((rc == 0) == (src == 0), "decode rc %d, streaming rc %d", rc, src);
    if (rc == 0) {
        FZ_CHECK(out != NULL, "decode gave NULL");
        if (n > 0 || !fz_ignored("decode-empty-nul"))
            FZ_CHECK(out[out_n] == 0, "decode output not NUL-terminated (%zu ids)", n);
        FZ_CHECK(fz_utf8_valid(out, out_n), "decode gave invalid UTF-8");
        FZ_CHECK(cat_n == out_n && memcmp(cat, out, out_n) == 0, "streaming decode differs from decode");
    }
    free(cat);
    free(out);
}

static void check_encode(const g4_tokenizer *tok, const char *text, size_t n) {
    size_t vocab = g4_tokenizer_vocab_size(tok);
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t k = 0;
        if (g4_tokenizer_encode(tok, text, n, special, &ids, &k) != 0) {
            FZ_CHECK(ids == NULL, "failed encode returned ids");
            continue;
        }
        FZ_CHECK(ids != NULL, "encode returned NULL ids");
        for (size_t i = 0; i < k; i++)
            FZ_CHECK(ids[i] >= 0 && (size_t)ids[i] < vocab && g4_tokenizer_id_to_piece(tok, ids[i]),
                     "encode produced id %d (vocab %zu) without a piece", ids[i], vocab);
        check_decode(tok, ids, k);
        free(ids);
    }
}

/* Known bug "merge-buf-overflow": resolve_merges writes one byte past its stack buffer when
 * a merge joins pieces of exactly 8193 bytes, which needs an added token of 4096+ bytes.
 * With G4_FUZZ_IGNORE=merge-buf-overflow, inputs with such a token are skipped. */
static int skip_known(const uint8_t *data, size_t size) {
    if (!fz_ignored("merge-buf-overflow")) return 0;
    cJSON *root = cJSON_ParseWithLength((const char *)data, size);
    int bad = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(root, "added_tokens")) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (cJSON_IsString(c) && strlen(c->valuestring) >= 4096) bad = 1;
    }
    cJSON_Delete(root);
    return bad;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (skip_known(data, size)) return 0;
    fz_memfile_set(&file, data, size);
    g4_tokenizer *tok = g4_tokenizer_load_ex(file.path, G4_TOKENIZER_NO_CACHE);
    if (!tok) {
        FZ_CHECK(g4_last_error()[0] != 0, "load failed without a message");
        return 0;
    }
    FZ_CHECK(!g4_tokenizer_loaded_from_cache(tok), "NO_CACHE load came from a cache");
    size_t vocab = g4_tokenizer_vocab_size(tok);
    FZ_CHECK(vocab >= 1, "empty vocab");
    size_t lim = vocab < 4096 ? vocab : 4096;
    int32_t *all = malloc(lim * sizeof *all);
    size_t n_all = 0;
    char *pieces = NULL;
    size_t pieces_n = 0;
    for (size_t id = 0; id < lim; id++) {
        const char *p = g4_tokenizer_id_to_piece(tok, (int32_t)id);
        int sp = g4_tokenizer_is_special(tok, (int32_t)id);
        if (!p) {
            FZ_CHECK(!sp, "id %zu without a piece is special", id);
            continue;
        }
        FZ_CHECK(fz_utf8_valid(p, strlen(p)), "piece %zu is not valid UTF-8", id);
        FZ_CHECK(g4_tokenizer_piece_to_id(tok, p) == (int32_t)id, "piece_to_id(id_to_piece(%zu)) = %d", id,
                 g4_tokenizer_piece_to_id(tok, p));
        all[n_all++] = (int32_t)id;
        if (pieces_n < 2048) {
            size_t pn = strlen(p);
            pieces = realloc(pieces, pieces_n + pn + 2);
            memcpy(pieces + pieces_n, p, pn);
            pieces_n += pn;
            pieces[pieces_n++] = ' ';
            pieces[pieces_n] = 0;
        }
    }
    FZ_CHECK(g4_tokenizer_id_to_piece(tok, -1) == NULL && g4_tokenizer_id_to_piece(tok, (int32_t)vocab) == NULL,
             "out-of-range id has a piece");
    check_decode(tok, all, n_all);
    int32_t bad[3] = {0, (int32_t)vocab, -5};
    check_decode(tok, bad, 3);
    free(all);

    static const char *const texts[] = {
        "Hello world", "  two  spaces\n\nand\ttabs ", "<bos><|turn>user\nHi<turn|>\n", "\xE2\x96\x81x \xE2\x96\x81",
        "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80", "\xFF\xFE\xC3\x28\xE2\x82", "",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) check_encode(tok, texts[i], strlen(texts[i]));
    check_encode(tok, "a\0b", 3);
    if (pieces) check_encode(tok, pieces, pieces_n);
    free(pieces);
    g4_tokenizer_free(tok);
    return 0;
}
