/* Tokenizer tests: golden ids from independent implementations (the JavaScript tokenizers
 * of shared/data/tokenizers/README.md, and Hugging Face tokenizers for a few extra cases),
 * round trips on random input, the streaming decoder, untrusted-input mode, the binary
 * cache and clean errors on broken files.
 * Environment: G4_SHARED (shared dir), G4_TEST_GSM8K_ROWS (limit the GSM8K golden rows,
 * e.g. under sanitizers; default all). */
#define _POSIX_C_SOURCE 200809L

#include "check.h"
#include "g4.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0, *len = (size_t)n;
    return buf;
}

static int spit(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, len, f);
    return fclose(f) == 0 && w == len ? 0 : -1;
}

static int spit_str(const char *path, const char *s) { return spit(path, s, strlen(s)); }

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* Length of the valid UTF-8 character at s, or 0. Written independently of the library. */
static size_t valid_char_len(const unsigned char *s, size_t n) {
    if (s[0] < 0x80) return 1;
    size_t len = s[0] >= 0xF8 ? 0 : s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC0 ? 2 : 0;
    if (len == 0 || len > n) return 0;
    uint32_t cp = s[0] & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

static int is_valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t k = valid_char_len((const unsigned char *)s + i, n - i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

/* Number of bytes at s that are a proper prefix of some valid character (the "maximal
 * subpart" that becomes one U+FFFD); at least 1. */
static size_t invalid_subpart_len(const unsigned char *s, size_t n) {
    size_t best = 1;
    for (size_t k = 2; k <= 3 && k <= n; k++) {
        unsigned char probe[4];
        memcpy(probe, s, k);
        /* Completing with 0x80.. bytes must be able to give a valid character. */
        int ok = 0;
        for (size_t total = k + 1; total <= 4 && !ok; total++) {
            for (unsigned c = 0x80; c <= 0xBF && !ok; c++) {
                memset(probe + k, (int)c, total - k);
                ok = valid_char_len(probe, total) == total;
            }
        }
        if (!ok) break;
        best = k;
    }
    return best;
}

/* What decode(encode(s)) must give: invalid UTF-8 replaced WHATWG-style, U+2581 -> space. */
static char *expected_round_trip(const char *s, size_t n, size_t *out_n) {
    char *out = malloc(n * 3 + 1);
    size_t o = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = valid_char_len(u + i, n - i);
        if (k == 3 && memcmp(u + i, "\xE2\x96\x81", 3) == 0) {
            out[o++] = ' ';
        } else if (k) {
            memcpy(out + o, u + i, k), o += k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3), o += 3;
            k = invalid_subpart_len(u + i, n - i);
        }
        i += k;
    }
    out[o] = 0;
    *out_n = o;
    return out;
}

static int ids_equal_json(const int32_t *ids, size_t n, const cJSON *arr) {
    if (!cJSON_IsArray(arr) || (size_t)cJSON_GetArraySize(arr) != n) return 0;
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) if (!cJSON_IsNumber(e) || e->valueint != ids[i++]) return 0;
    return 1;
}

static void dump_bytes(const char *label, const char *s, size_t n) {
    fprintf(stderr, "  %s:", label);
    for (size_t i = 0; s && i < n && i < 80; i++) fprintf(stderr, " %02x", (unsigned char)s[i]);
    fprintf(stderr, n > 80 ? " ...\n" : "\n");
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s:", label);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

/* Streams ids through the detokenizer; checks every chunk is whole UTF-8 characters. */
static char *stream_decode(const g4_tokenizer *tok, const int32_t *ids, size_t n, size_t *out_n, int *chunks_ok) {
    g4_detokenizer *d = g4_detokenizer_new(tok);
    char *out = malloc(n * 16 + 16);
    size_t o = 0;
    *chunks_ok = 1;
    for (size_t i = 0; i <= n; i++) {
        const char *b;
        size_t len;
        int rc = i < n ? g4_detokenizer_push(d, ids[i], &b, &len) : g4_detokenizer_flush(d, &b, &len);
        if (rc) {
            *chunks_ok = 0;
            break;
        }
        if (!is_valid_utf8(b, len)) *chunks_ok = 0;
        memcpy(out + o, b, len), o += len;
    }
    g4_detokenizer_free(d);
    out[o] = 0;
    *out_n = o;
    return out;
}

/* ---------------------------------------------------------------- golden files */

struct golden_stats {
    size_t rows, bytes;
    double encode_s, encode_cpu_s; /* CPU time too: wall time is noisy on shared machines */
};

/* One JSONL row {"text", "ids", ["decoded"]}: exact ids, decode and streaming decode. */
static void check_golden_row(const g4_tokenizer *tok, const cJSON *row, const char *file, size_t line,
                             struct golden_stats *st) {
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(row, "text");
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(row, "ids");
    const cJSON *decoded = cJSON_GetObjectItemCaseSensitive(row, "decoded");
    if (!cJSON_IsString(text) || !cJSON_IsArray(want)) {
        CHECK(0, "%s:%zu: row lacks text/ids", file, line);
        return;
    }
    size_t len = strlen(text->valuestring);
    int32_t *ids = NULL;
    size_t n = 0;
    double t0 = now_s();
    clock_t c0 = clock();
    int rc = g4_tokenizer_encode(tok, text->valuestring, len, 1, &ids, &n);
    st->encode_cpu_s += (double)(clock() - c0) / CLOCKS_PER_SEC;
    st->encode_s += now_s() - t0;
    st->bytes += len, st->rows++;
    CHECK(rc == 0, "%s:%zu: encode failed: %s", file, line, g4_last_error());
    int same = rc == 0 && ids_equal_json(ids, n, want);
    CHECK(same, "%s:%zu: ids differ for \"%.60s\"", file, line, text->valuestring);
    if (!same && rc == 0) print_ids("got", ids, n);

    size_t want_n = 0;
    char *want_text = expected_round_trip(text->valuestring, len, &want_n);
    const char *expect = cJSON_IsString(decoded) ? decoded->valuestring : want_text;
    char *out = NULL;
    size_t out_n = 0;
    rc = g4_tokenizer_decode(tok, ids, n, &out, &out_n);
    CHECK(rc == 0 && out_n == strlen(expect) && memcmp(out, expect, out_n) == 0, "%s:%zu: decode differs: \"%.60s\"", file,
          line, out ? out : "(null)");
    int chunks_ok;
    size_t s_n;
    char *streamed = stream_decode(tok, ids, n, &s_n, &chunks_ok);
    CHECK(chunks_ok && out && s_n == out_n && memcmp(streamed, out, s_n) == 0, "%s:%zu: streaming decode differs", file, line);
    free(streamed);
    free(out);
    free(want_text);
    free(ids);
}

static void check_golden_file(const g4_tokenizer *tok, const char *path, size_t max_rows, struct golden_stats *st) {
    size_t len;
    char *buf = slurp(path, &len);
    CHECK(buf != NULL, "cannot read %s", path);
    if (!buf) return;
    size_t line = 0, rows = 0;
    for (char *p = buf; *p && rows < max_rows;) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = 0;
        line++;
        if (*p) {
            cJSON *row = cJSON_Parse(p);
            CHECK(row != NULL, "%s:%zu: bad JSON", path, line);
            if (row) check_golden_row(tok, row, path, line, st);
            cJSON_Delete(row);
            rows++;
        }
        if (!nl) break;
        p = nl + 1;
    }
    CHECK(rows > 0, "%s: no rows", path);
    free(buf);
}

static size_t env_rows(void) {
    const char *s = getenv("G4_TEST_GSM8K_ROWS");
    return s && *s ? (size_t)strtoull(s, NULL, 10) : (size_t)-1;
}

/* ---------------------------------------------------------------- random round trips */

static void check_round_trip(const g4_tokenizer *tok, const char *s, size_t n, int parse_special, const char *what) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = g4_tokenizer_encode(tok, s, n, parse_special, &ids, &n_ids);
    CHECK(rc == 0, "%s: encode failed: %s", what, g4_last_error());
    if (rc) return;
    int in_range = 1;
    for (size_t i = 0; i < n_ids; i++) in_range &= ids[i] >= 0 && (size_t)ids[i] < g4_tokenizer_vocab_size(tok);
    CHECK(in_range, "%s: id out of range", what);
    char *out = NULL;
    size_t out_n = 0, want_n = 0;
    rc = g4_tokenizer_decode(tok, ids, n_ids, &out, &out_n);
    char *want = expected_round_trip(s, n, &want_n);
    int same = rc == 0 && out_n == want_n && memcmp(out, want, want_n) == 0;
    CHECK(same, "%s: round trip differs (len %zu)", what, n);
    if (!same) dump_bytes("input", s, n), dump_bytes("got", out, out_n), dump_bytes("want", want, want_n);
    int chunks_ok;
    size_t s_n;
    char *streamed = stream_decode(tok, ids, n_ids, &s_n, &chunks_ok);
    CHECK(chunks_ok && out && s_n == out_n && memcmp(streamed, out, s_n) == 0, "%s: streaming decode differs", what);
    free(streamed);
    free(want);
    free(out);
    free(ids);
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) return o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | (cp >> 6 & 0x3F)), o[2] = (char)(0x80 | (cp & 0x3F)), 3;
    o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F)), o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static uint32_t random_code_point(void) {
    static const uint32_t ranges[][2] = {
        {0x20, 0x7E}, {0x20, 0x20}, {0x0A, 0x0A}, {0x09, 0x0D}, {0x00, 0x1F}, {0xA0, 0x17F}, {0x300, 0x36F},
        {0x370, 0x3FF}, {0x400, 0x4FF}, {0x590, 0x6FF}, {0x900, 0x97F}, {0x2000, 0x206F}, {0x2581, 0x2581},
        {0x3040, 0x30FF}, {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0xE000, 0xF8FF}, {0xFFF0, 0xFFFF},
        {0x1F300, 0x1F6FF}, {0x10000, 0x10FFFF},
    };
    const size_t nr = sizeof ranges / sizeof *ranges;
    const uint32_t *r = ranges[rng() % nr];
    return r[0] + rng() % (r[1] - r[0] + 1);
}

static void check_random_unicode(const g4_tokenizer *tok, int count) {
    static const char *const literals[] = {"<|turn>", "<turn|>", "<bos>", "<|channel>", "<unused7>", "<table>", "\n\n\n", "\t\t", "  "};
    char buf[1024], what[64];
    for (int it = 0; it < count; it++) {
        size_t n = 0, want = rng() % 60;
        for (size_t k = 0; k < want; k++) {
            if (rng() % 10 == 0) {
                const char *lit = literals[rng() % (sizeof literals / sizeof *literals)];
                memcpy(buf + n, lit, strlen(lit)), n += strlen(lit);
            } else {
                n += put_utf8(buf + n, random_code_point());
            }
        }
        snprintf(what, sizeof what, "random unicode #%d", it);
        check_round_trip(tok, buf, n, (int)(it & 1), what);
    }
}

static void check_random_bytes(const g4_tokenizer *tok, int count) {
    char buf[256], what[64];
    for (int it = 0; it < count; it++) {
        size_t n = rng() % 80;
        for (size_t k = 0; k < n; k++) {
            uint32_t r = rng();
            /* Bias towards bytes that matter: ASCII, space, '<', and UTF-8 lead/continuation bytes. */
            static const unsigned char interesting[4] = {' ', '<', '|', '\n'};
            uint32_t v = (r >> 8);
            switch (r % 4) {
            case 0: buf[k] = (char)(0x80 + v % 0x80); break;
            case 1: buf[k] = (char)interesting[v % 4]; break;
            case 2: buf[k] = (char)(0xC0 + v % 0x40); break;
            default: buf[k] = (char)(v & 0xFF); break;
            }
        }
        snprintf(what, sizeof what, "random bytes #%d", it);
        check_round_trip(tok, buf, n, (int)(it & 1), what);
    }
}

/* Random id streams, mostly byte tokens: exercises invalid/incomplete UTF-8 in decode. */
static void check_random_id_streams(const g4_tokenizer *tok, int count) {
    int32_t ids[64];
    int32_t byte0 = g4_tokenizer_piece_to_id(tok, "<0x00>");
    size_t vocab = g4_tokenizer_vocab_size(tok);
    for (int it = 0; it < count; it++) {
        size_t n = rng() % 64;
        for (size_t k = 0; k < n; k++) {
            int32_t id = rng() % 10 < 7 ? byte0 + (int32_t)(rng() % 256) : (int32_t)(rng() % vocab);
            ids[k] = g4_tokenizer_id_to_piece(tok, id) ? id : byte0;
        }
        char *out = NULL;
        size_t out_n = 0, s_n = 0;
        int chunks_ok;
        int rc = g4_tokenizer_decode(tok, ids, n, &out, &out_n);
        char *streamed = stream_decode(tok, ids, n, &s_n, &chunks_ok);
        CHECK(rc == 0 && is_valid_utf8(out, out_n), "random ids #%d: decode invalid", it);
        CHECK(chunks_ok && rc == 0 && s_n == out_n && memcmp(out, streamed, s_n) == 0, "random ids #%d: stream differs", it);
        free(out);
        free(streamed);
    }
}

/* ---------------------------------------------------------------- specific behaviour */

static void expect_encode(const g4_tokenizer *tok, const char *text, int parse_special, const int32_t *want, size_t want_n) {
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = g4_tokenizer_encode(tok, text, strlen(text), parse_special, &ids, &n);
    int same = rc == 0 && n == want_n && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    CHECK(same, "encode(\"%s\", parse_special=%d)", text, parse_special);
    if (!same && rc == 0) print_ids("got", ids, n);
    free(ids);
}

/* Ids from the Hugging Face `tokenizers` library (0.23.3) for cases the golden files barely
 * cover: words longer than the short-word fast path (heap merging), CJK without spaces,
 * HTML-ish text where a piece spans "> <" (">\xE2\x96\x81</"), and untrusted mode. */
static void check_reference_cases(const g4_tokenizer *tok) {
    char a100[101];
    memset(a100, 'a', 100), a100[100] = 0;
    const int32_t a100_ids[] = {128820, 128820, 128820, 128820, 128820, 128820, 128820, 128820, 128820, 128820, 128820, 128820, 50354};
    expect_encode(tok, a100, 1, a100_ids, 13);
    const int32_t cjk[] = {94951, 236945, 95830, 237048, 177698, 47987, 237007, 153232, 142546, 184613,
                           236924, 118981, 172121, 237835, 237497, 240455, 241375, 237009, 161961};
    expect_encode(tok,
                  "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88"
                  "\xE3\x81\xAF\xE7\xA9\xBA\xE7\x99\xBD\xE3\x81\xAA\xE3\x81\x97\xE3\x81\xA7\xE9\x95\xB7\xE3\x81\x8F"
                  "\xE7\xB6\x9A\xE3\x81\x8F\xE3\x81\x93\xE3\x81\xA8\xE3\x81\x8C\xE3\x81\x82\xE3\x82\x8A\xE3\x81\xBE"
                  "\xE3\x81\x99\xE3\x80\x82\xE6\x9D\xB1\xE4\xBA\xAC\xE9\x83\xBD\xE6\xB8\x8B\xE8\xB0\xB7\xE5\x8C\xBA"
                  "\xE9\x81\x93\xE7\x8E\x84\xE5\x9D\x82\xE4\xB8\x80\xE4\xB8\x81\xE7\x9B\xAE",
                  1, cjk, 19);
    const int32_t url[] = {2574, 1411, 8358, 236761, 854, 236786, 19256, 236786, 5843, 236772, 2337, 236779,
                           4060, 236881, 3278, 236784, 2394, 236880, 1538, 236784, 2437, 236865, 45265};
    expect_encode(tok, "https://example.com/some/long-path_with?query=value&other=thing#frag", 1, url, 23);
    const int32_t html[] = {236820, 236758, 236813, 236746, 954, 236758, 236813, 236743, 235, 236743, 200, 236781, 209, 1890, 1454};
    expect_encode(tok, "<p>a</p> </div> <b>x</b> > </", 1, html, 15);
    const int32_t long_word[] = {12666, 1653, 584, 16100, 543, 3316, 4212, 706, 547, 100466, 236772, 624, 236772, 638, 33090, 163524, 8225, 1929};
    expect_encode(tok, "supercalifragilisticexpialidocious-and-antidisestablishmentarianism", 1, long_word, 18);
    const int32_t untrusted[] = {236820, 236909, 887, 236813, 2364, 107, 236820, 46757, 236813, 236781, 6, 108};
    expect_encode(tok, "<|turn>user\n<bos>x<unused0>\n\n", 0, untrusted, 12);
}

static void check_special_modes(const g4_tokenizer *tok) {
    /* Trusted: control tokens; untrusted: the same characters as plain text, but newline
     * (a non-special added token) is still one token. */
    const int32_t trusted[] = {105, 2364, 107, 9259, 106};
    expect_encode(tok, "<|turn>user\nHello<turn|>", 1, trusted, 5);
    const int32_t plain_turn[] = {236820, 236909, 887, 236813, 2364};
    expect_encode(tok, "<|turn>user", 0, plain_turn, 5);
    int32_t *ids = NULL;
    size_t n = 0;
    const char *text = "<bos><|turn>user\nHi<turn|>\n<|channel>x<channel|><eos>";
    CHECK(g4_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n) == 0, "encode untrusted");
    int any_special = 0, has_newline = 0;
    for (size_t i = 0; i < n; i++) any_special |= g4_tokenizer_is_special(tok, ids[i]), has_newline |= ids[i] == 107;
    CHECK(!any_special && has_newline, "untrusted mode produced a special token");
    char *out = NULL;
    size_t out_n = 0;
    CHECK(g4_tokenizer_decode(tok, ids, n, &out, &out_n) == 0 && strcmp(out, text) == 0, "untrusted round trip");
    free(out);
    free(ids);
    const int32_t empty[1] = {0};
    expect_encode(tok, "", 1, empty, 0);
}

static void check_accessors(const g4_tokenizer *tok) {
    CHECK_EQ_INT(g4_tokenizer_vocab_size(tok), 262145);
    CHECK_EQ_INT(g4_tokenizer_piece_to_id(tok, "<bos>"), 2);
    CHECK_EQ_INT(g4_tokenizer_piece_to_id(tok, "<|turn>"), 105);
    CHECK_EQ_INT(g4_tokenizer_piece_to_id(tok, "\xE2\x96\x81Hello"), 26352);
    CHECK_EQ_INT(g4_tokenizer_piece_to_id(tok, "no such piece at all"), -1);
    CHECK(g4_tokenizer_id_to_piece(tok, 106) && strcmp(g4_tokenizer_id_to_piece(tok, 106), "<turn|>") == 0, "id 106");
    CHECK(g4_tokenizer_id_to_piece(tok, -1) == NULL && g4_tokenizer_id_to_piece(tok, 262145) == NULL, "out of range piece");
    CHECK(g4_tokenizer_is_special(tok, 1) && g4_tokenizer_is_special(tok, 106) && !g4_tokenizer_is_special(tok, 107) &&
              !g4_tokenizer_is_special(tok, 9259) && !g4_tokenizer_is_special(tok, -5),
          "is_special");
    int32_t bad[] = {9259, 262145};
    char *out = NULL;
    size_t out_n;
    CHECK(g4_tokenizer_decode(tok, bad, 2, &out, &out_n) == -1 && strstr(g4_last_error(), "262145"), "decode rejects bad id");
    free(out);
    /* Byte fallback pieces decode to their bytes; a lone lead byte becomes U+FFFD. */
    int32_t llama[] = {478, 397, 404, 391}, lone[] = {478, 9259};
    CHECK(g4_tokenizer_decode(tok, llama, 4, &out, &out_n) == 0 && strcmp(out, "\xF0\x9F\xA6\x99") == 0, "byte fallback decode");
    free(out);
    CHECK(g4_tokenizer_decode(tok, lone, 2, &out, &out_n) == 0 && strcmp(out, "\xEF\xBF\xBDHello") == 0, "lone lead byte");
    free(out);
}

/* The streaming decoder holds an incomplete character back and releases it whole. */
static void check_stream_holdback(const g4_tokenizer *tok) {
    g4_detokenizer *d = g4_detokenizer_new(tok);
    const char *b;
    size_t n;
    int32_t llama[] = {478, 397, 404, 391};
    for (int i = 0; i < 3; i++) CHECK(g4_detokenizer_push(d, llama[i], &b, &n) == 0 && n == 0, "held back byte %d", i);
    CHECK(g4_detokenizer_push(d, llama[3], &b, &n) == 0 && n == 4 && memcmp(b, "\xF0\x9F\xA6\x99", 4) == 0, "released");
    CHECK(g4_detokenizer_push(d, 478, &b, &n) == 0 && n == 0, "pending lead");
    CHECK(g4_detokenizer_flush(d, &b, &n) == 0 && n == 3 && memcmp(b, "\xEF\xBF\xBD", 3) == 0, "flush incomplete");
    CHECK(g4_detokenizer_push(d, 26352, &b, &n) == 0 && n == 6 && memcmp(b, " Hello", 6) == 0, "space mark");
    CHECK(g4_detokenizer_push(d, -3, &b, &n) == -1, "stream rejects bad id");
    g4_detokenizer_free(d);
}

/* ---------------------------------------------------------------- synthetic tokenizers */

static char tmp_dir[256];

static void tmp_path(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", tmp_dir, name); }

#define SMALL_HEAD                                                                                                          \
    "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},"                             \
    "{\"id\":1,\"content\":\"<s>\",\"special\":true},{\"id\":11,\"content\":\"<x>\",\"special\":false}],"                   \
    "\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"},"                          \
    "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"MergedWithPrevious\",\"invert\":false}," \
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},\"content\":\" \"}," \
    "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]},"

#define SMALL_VOCAB                                                                                                        \
    "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"<0xC3>\":2,\"<0xA9>\":3,\"a\":4,\"b\":5,\"aa\":6,\"ab\":7,\"\\u2581\":8,"           \
    "\"\\u2581a\":9,\"aab\":10,\"<x>\":11}"

static const char *small_json(int byte_fallback, int string_merges) {
    static char buf[4096];
    snprintf(buf, sizeof buf,
             SMALL_HEAD "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\",\"fuse_unk\":true,"
                        "\"byte_fallback\":%s," SMALL_VOCAB ",\"merges\":%s}}",
             byte_fallback ? "true" : "false",
             string_merges ? "[\"a a\",\"a b\",\"\\u2581 a\",\"aa b\"]"
                           : "[[\"a\",\"a\"],[\"a\",\"b\"],[\"\\u2581\",\"a\"],[\"aa\",\"b\"]]");
    return buf;
}

static void check_small_bpe(void) {
    char path[512];
    tmp_path(path, sizeof path, "small.json");
    for (int variant = 0; variant < 2; variant++) {
        spit_str(path, small_json(1, variant));
        g4_tokenizer *tok = g4_tokenizer_load_ex(path, G4_TOKENIZER_NO_CACHE);
        CHECK(tok != NULL, "small tokenizer: %s", g4_last_error());
        if (!tok) return;
        const int32_t leftmost[] = {6, 4};      /* "aaa": equal ranks, leftmost pair first */
        const int32_t by_rank[] = {10};         /* "aab": a+a (rank 0) before a+b (rank 1) */
        const int32_t spaces[] = {7, 9};        /* "ab a" */
        const int32_t bytes[] = {2, 3, 4};      /* "éa": é not in vocab -> <0xC3><0xA9> */
        const int32_t unk[] = {4, 0, 1, 11, 0}; /* "acc<s><x>c": no byte token for c -> fused unk */
        expect_encode(tok, "aaa", 1, leftmost, 2);
        expect_encode(tok, "aab", 1, by_rank, 1);
        expect_encode(tok, "ab a", 1, spaces, 2);
        expect_encode(tok, "\xC3\xA9" "a", 1, bytes, 3);
        expect_encode(tok, "acc<s><x>c", 1, unk, 5);
        g4_tokenizer_free(tok);
    }
    spit_str(path, small_json(0, 0));
    g4_tokenizer *tok = g4_tokenizer_load_ex(path, G4_TOKENIZER_NO_CACHE);
    CHECK(tok != NULL, "small tokenizer without byte fallback: %s", g4_last_error());
    if (!tok) return;
    const int32_t fused[] = {0, 4}; /* "éa" without byte fallback: one fused unk */
    expect_encode(tok, "\xC3\xA9\xC3\xA9" "a", 1, fused, 2);
    g4_tokenizer_free(tok);
}

/* Each broken file must fail to load with a message naming the file and the problem. */
static void expect_load_error(const char *name, const char *content, const char *phrase) {
    char path[512];
    tmp_path(path, sizeof path, name);
    if (content) spit_str(path, content);
    g4_clear_error();
    g4_tokenizer *tok = g4_tokenizer_load_ex(path, G4_TOKENIZER_NO_CACHE);
    const char *err = g4_last_error();
    CHECK(tok == NULL && strstr(err, path) && strstr(err, phrase), "%s: got \"%s\", want \"%s\"", name, err, phrase);
    g4_tokenizer_free(tok);
}

static char *replace_once(const char *s, const char *from, const char *to) {
    const char *at = strstr(s, from);
    if (!at) return NULL;
    size_t n = strlen(s) - strlen(from) + strlen(to);
    char *out = malloc(n + 1);
    size_t pre = (size_t)(at - s);
    memcpy(out, s, pre);
    strcpy(out + pre, to);
    strcat(out, at + strlen(from));
    return out;
}

static void expect_mutation_error(const char *name, const char *from, const char *to, const char *phrase) {
    char *json = replace_once(small_json(1, 0), from, to);
    CHECK(json != NULL, "%s: mutation pattern not found", name);
    if (json) expect_load_error(name, json, phrase);
    free(json);
}

static void check_broken_files(void) {
    expect_load_error("missing.json", NULL, "cannot open");
    expect_load_error("empty.json", "", "empty file");
    expect_load_error("notjson.json", "this is not json {", "not valid JSON");
    expect_load_error("truncated.json", "{\"model\": {\"vocab\": {\"a\": 0", "not valid JSON");
    expect_load_error("array.json", "[1, 2, 3]", "not a JSON object");
    expect_load_error("nomodel.json", "{\"version\": \"1.0\"}", "missing \"model\"");
    expect_load_error("novocab.json", "{\"model\": {\"type\": \"BPE\", \"merges\": []}}", "model.vocab");
    expect_load_error("nomerges.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", "model.merges");
    expect_mutation_error("badid.json", "\"b\":5", "\"b\":\"five\"", "not an integer");
    expect_mutation_error("negid.json", "\"b\":5", "\"b\":-5", "not an integer");
    expect_mutation_error("dupid.json", "\"b\":5", "\"b\":4", "used twice");
    expect_mutation_error("badmerge.json", "[\"a\",\"b\"]", "[\"a\",\"zz\"]", "not in the vocab");
    expect_mutation_error("mergeresult.json", "[\"aa\",\"b\"]", "[\"b\",\"aa\"]", "merged piece");
    expect_mutation_error("mergeshape.json", "[\"aa\",\"b\"]", "[\"aa\"]", "model.merges[3]");
    expect_mutation_error("wordpiece.json", "\"type\":\"BPE\"", "\"type\":\"WordPiece\"", "model.type");
    expect_mutation_error("nfkc.json", "\"normalizer\":{\"type\":\"Replace\"", "\"normalizer\":{\"type\":\"NFKC\"", "normalizer");
    expect_mutation_error("decoder.json", "{\"type\":\"Fuse\"}", "{\"type\":\"Strip\"}", "decoder");
    expect_mutation_error("lstrip.json", "\"content\":\"<s>\",", "\"content\":\"<s>\",\"lstrip\":true,", "lstrip");
    expect_mutation_error("addedmismatch.json", "\"content\":\"<s>\"", "\"content\":\"<t>\"", "differs");
    expect_mutation_error("unk.json", "\"unk_token\":\"<unk>\"", "\"unk_token\":\"<nope>\"", "unk_token");
}

static void set_mtime(const char *path, const struct stat *like) {
    struct timespec ts[2] = {like->st_atim, like->st_mtim};
    utimensat(AT_FDCWD, path, ts, 0);
}

static void flip_byte(const char *path, long offset) {
    size_t n;
    char *buf = slurp(path, &n);
    if (!buf) return;
    if (offset < 0) offset += (long)n;
    buf[offset] ^= 0x5A;
    spit(path, buf, n);
    free(buf);
}

static int load_small(const char *path, const char *input, const int32_t *want, size_t want_n) {
    g4_tokenizer *tok = g4_tokenizer_load(path);
    CHECK(tok != NULL, "load %s: %s", path, g4_last_error());
    if (!tok) return -1;
    expect_encode(tok, input, 1, want, want_n);
    int from_cache = g4_tokenizer_loaded_from_cache(tok);
    g4_tokenizer_free(tok);
    return from_cache;
}

/* G4_TOKENIZER_CACHE=off: the default load neither reads the valid cache beside path nor
 * writes a new one; "on" (and unset) bring it back, and so does an unknown value (with a warning). */
static void check_cache_env(const char *path, const char *cache) {
    const int32_t a_ab[] = {4, 7};
    setenv("G4_TOKENIZER_CACHE", "off", 1);
    CHECK_EQ_INT(load_small(path, "aab", a_ab, 2), 0);
    unlink(cache);
    CHECK_EQ_INT(load_small(path, "aab", a_ab, 2), 0);
    CHECK(!file_exists(cache), "G4_TOKENIZER_CACHE=off wrote %s", cache);
    setenv("G4_TOKENIZER_CACHE", "on", 1);
    CHECK_EQ_INT(load_small(path, "aab", a_ab, 2), 0);
    CHECK(file_exists(cache), "G4_TOKENIZER_CACHE=on wrote no cache");
    CHECK_EQ_INT(load_small(path, "aab", a_ab, 2), 1);
    g4_set_log(NULL, NULL); /* the warning is for users; here only its effect matters */
    setenv("G4_TOKENIZER_CACHE", "bogus", 1);
    CHECK_EQ_INT(load_small(path, "aab", a_ab, 2), 1);
    g4_set_log(g4_log_stderr, NULL);
    unsetenv("G4_TOKENIZER_CACHE");
}

/* Cache: written on first load, used next, ignored (and rewritten) when the source changes
 * (even with the same size and mtime) or the cache is damaged; skipped in a read-only dir. */
static void check_cache(void) {
    char path[512], cache[600];
    tmp_path(path, sizeof path, "cached.json");
    snprintf(cache, sizeof cache, "%s.g4cache", path);
    unlink(cache);
    const int32_t aab[] = {10};
    spit_str(path, small_json(1, 0));
    CHECK_EQ_INT(load_small(path, "aab", aab, 1), 0);
    CHECK(file_exists(cache), "cache file written");
    CHECK_EQ_INT(load_small(path, "aab", aab, 1), 1);

    /* Same size and mtime, different content: only the content hash can notice. Swapping
     * the ranks of merges a+a and a+b changes "aab" from [aab] to [a, ab]. */
    struct stat before;
    stat(path, &before);
    char *swapped = replace_once(small_json(1, 0), "[[\"a\",\"a\"],[\"a\",\"b\"]", "[[\"a\",\"b\"],[\"a\",\"a\"]");
    spit_str(path, swapped);
    free(swapped);
    set_mtime(path, &before);
    const int32_t a_ab[] = {4, 7};
    CHECK_EQ_INT(load_small(path, "aab", a_ab, 2), 0);
    CHECK_EQ_INT(load_small(path, "aab", a_ab, 2), 1);

    flip_byte(cache, -5); /* damaged payload */
    CHECK_EQ_INT(load_small(path, "aab", a_ab, 2), 0);
    CHECK_EQ_INT(load_small(path, "aab", a_ab, 2), 1);
    CHECK(truncate(cache, 100) == 0, "truncate cache");
    CHECK_EQ_INT(load_small(path, "aab", a_ab, 2), 0);
    spit_str(cache, "garbage");
    CHECK_EQ_INT(load_small(path, "aab", a_ab, 2), 0);
    CHECK_EQ_INT(load_small(path, "aab", a_ab, 2), 1);

    g4_tokenizer *tok = g4_tokenizer_load_ex(path, G4_TOKENIZER_NO_CACHE);
    CHECK(tok && !g4_tokenizer_loaded_from_cache(tok), "NO_CACHE ignores the cache");
    g4_tokenizer_free(tok);
    check_cache_env(path, cache);

    char ro_dir[512], ro_path[600], ro_cache[700];
    tmp_path(ro_dir, sizeof ro_dir, "ro");
    mkdir(ro_dir, 0755);
    snprintf(ro_path, sizeof ro_path, "%s/tokenizer.json", ro_dir);
    snprintf(ro_cache, sizeof ro_cache, "%s.g4cache", ro_path);
    spit_str(ro_path, small_json(1, 0));
    chmod(ro_dir, 0555);
    CHECK_EQ_INT(load_small(ro_path, "aab", aab, 1), 0);
    CHECK(!file_exists(ro_cache), "no cache in a read-only directory");
    chmod(ro_dir, 0755);
    unlink(ro_path);
    rmdir(ro_dir);
}

/* ---------------------------------------------------------------- main */

/* Everything the test wrote lives in one private directory (flat, plus "ro"). */
static void remove_tmp_dir(void) {
    DIR *d = opendir(tmp_dir);
    char path[800];
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", tmp_dir, e->d_name);
        if (unlink(path) != 0) rmdir(path);
    }
    if (d) closedir(d);
    rmdir(tmp_dir);
}

/* Loads the Gemma 4 tokenizer from a private copy so the cache can be exercised without
 * writing into the shared directory; returns the cached (second) load. */
static g4_tokenizer *load_gemma4(const char *shared, g4_tokenizer **cold) {
    char src[512], dst[512];
    snprintf(src, sizeof src, "%s/data/tokenizers/gemma4/tokenizer.json", shared);
    tmp_path(dst, sizeof dst, "tokenizer.json");
    size_t n;
    char *json = slurp(src, &n);
    CHECK(json != NULL, "cannot read %s (set G4_SHARED)", src);
    if (!json) return NULL;
    spit(dst, json, n);
    free(json);
    double t0 = now_s();
    *cold = g4_tokenizer_load(dst);
    double t1 = now_s();
    g4_tokenizer *warm = g4_tokenizer_load(dst);
    double t2 = now_s();
    CHECK(*cold && warm, "load gemma4 tokenizer: %s", g4_last_error());
    if (*cold && warm) {
        CHECK(!g4_tokenizer_loaded_from_cache(*cold) && g4_tokenizer_loaded_from_cache(warm), "second load uses the cache");
        printf("tokenizer: load %.3f s from JSON, %.3f s from cache\n", t1 - t0, t2 - t1);
    }
    return warm;
}

int main(void) {
    const char *shared = check_shared_dir();
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/g4-test-tokenizer-XXXXXX");
    if (!mkdtemp(tmp_dir)) return 2;
    /* a G4_TOKENIZER_CACHE=off from the caller would defeat the cache checks below */
    unsetenv("G4_TOKENIZER_CACHE");

    check_small_bpe();
    check_broken_files();
    check_cache();

    g4_tokenizer *cold = NULL, *tok = load_gemma4(shared, &cold);
    if (tok && cold) {
        char path[512];
        struct golden_stats fixture = {0}, gsm = {0}, gsm_cold = {0};
        snprintf(path, sizeof path, "%s/fixtures/tokenizer/gemma4_golden_ids.jsonl", shared);
        check_golden_file(tok, path, (size_t)-1, &fixture);
        check_golden_file(cold, path, (size_t)-1, &fixture);
        snprintf(path, sizeof path, "%s/data/tokenizers/gemma4/golden-gsm8k-test.jsonl", shared);
        size_t rows = env_rows();
        check_golden_file(tok, path, rows, &gsm);
        check_golden_file(cold, path, rows < 200 ? rows : 200, &gsm_cold);
        printf("tokenizer: %zu fixture rows, %zu GSM8K rows (%.2f MB) encoded at %.1f MB/s wall, %.1f MB/s CPU\n",
               fixture.rows / 2, gsm.rows, gsm.bytes / 1e6, gsm.bytes / 1e6 / (gsm.encode_s > 0 ? gsm.encode_s : 1e-9),
               gsm.bytes / 1e6 / (gsm.encode_cpu_s > 0 ? gsm.encode_cpu_s : 1e-9));
        check_reference_cases(tok);
        check_special_modes(tok);
        check_accessors(tok);
        check_stream_holdback(tok);
        check_random_unicode(tok, 3000);
        check_random_bytes(tok, 3000);
        check_random_id_streams(tok, 2000);
    }
    g4_tokenizer_free(tok);
    g4_tokenizer_free(cold);
    remove_tmp_dir();
    return check_report("tokenizer");
}
