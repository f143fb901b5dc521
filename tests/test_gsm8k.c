/* GSM8K extractor tests: the protocol's edge-case table, gold recovery on all 1319 reference
 * solutions, number normalisation, and robustness on random, invalid and huge input.
 * Expected values beyond the fixture were produced by shared/fixtures/gsm8k/extractor_ref.py. */
#include "check.h"

#include <stdint.h>
#include <time.h>

#include <cjson/cJSON.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "eval/gsm8k.h"
#include "util/err.h"

/* ------------------------------------------------------------------------ helpers ---- */

static char *read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            char *bigger = realloc(buf, 2 * cap + 1);
            if (!bigger) free(buf);
            buf = bigger;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

typedef void (*jsonl_fn)(const cJSON *row, int line, void *ctx);

/* Calls fn for each line of a JSONL file in shared/; returns the number of rows, -1 if the
 * file cannot be read. A line that is not JSON is a failed check. */
static int for_each_jsonl(const char *rel_path, jsonl_fn fn, void *ctx) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", check_shared_dir(), rel_path);
    size_t len;
    char *text = read_text(path, &len);
    CHECK(text != NULL, "cannot read %s (set G4_SHARED?)", path);
    if (!text) return -1;
    int rows = 0;
    for (char *line = text, *next; *line; line = next) {
        char *nl = strchr(line, '\n');
        next = nl ? nl + 1 : line + strlen(line);
        if (nl) *nl = 0;
        if (!*line) continue;
        cJSON *row = cJSON_Parse(line);
        CHECK(row != NULL, "%s:%d is not JSON", rel_path, rows + 1);
        if (row) fn(row, ++rows, ctx);
        cJSON_Delete(row);
    }
    free(text);
    return rows;
}

static const char *json_string(const cJSON *row, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(row, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int same_answer(const char *got, const char *want) {
    return got && want ? strcmp(got, want) == 0 : got == want;
}

/* Extracts and compares value and status with what the reference gives. */
static void check_extract(const g4_gsm8k_extractor *ex, const char *text, size_t len, const char *value,
                          const char *status) {
    g4_gsm8k_answer a;
    int rc = g4_gsm8k_extract(ex, text, len, &a);
    CHECK(rc == 0, "extract failed on \"%.60s\": %s", text, g4_last_error());
    CHECK(same_answer(a.value, value), "\"%.60s\": got %s, want %s", text, a.value ? a.value : "none",
          value ? value : "none");
    CHECK(strcmp(g4_gsm8k_status_name(a.status), status) == 0, "\"%.60s\": status %s, want %s", text,
          g4_gsm8k_status_name(a.status), status);
    g4_gsm8k_answer_free(&a);
}

/* ----------------------------------------------------------------- reference data ---- */

static void check_fixture_row(const cJSON *row, int line, void *ctx) {
    const char *output = json_string(row, "output"), *how = json_string(row, "how");
    CHECK(output && how, "extractor_cases.jsonl:%d lacks output or how", line);
    if (output && how) check_extract(ctx, output, strlen(output), json_string(row, "expected"), how);
}

static void test_fixture_cases(const g4_gsm8k_extractor *ex) {
    int rows = for_each_jsonl("fixtures/gsm8k/extractor_cases.jsonl", check_fixture_row, (void *)ex);
    CHECK_EQ_INT(rows, 30);
}

/* The spec's gold rule read independently: after the last "####", trimmed, commas dropped. */
static void spec_gold(const char *answer, char *out, size_t cap) {
    const char *tail = answer;
    for (const char *p = strstr(answer, "####"); p; p = strstr(p + 4, "####")) tail = p + 4;
    size_t n = 0;
    for (const char *p = tail; *p && n + 1 < cap; p++)
        if (*p != ',' && *p != ' ' && *p != '\n') out[n++] = *p;
    out[n] = 0;
}

typedef struct {
    const g4_gsm8k_extractor *ex;
    int recovered;
} solutions_ctx;

static void check_solution_row(const cJSON *row, int line, void *vctx) {
    solutions_ctx *ctx = vctx;
    const char *answer = json_string(row, "answer");
    CHECK(answer != NULL, "test.jsonl:%d has no answer", line);
    if (!answer) return;
    char want[64];
    spec_gold(answer, want, sizeof want);
    char *gold = g4_gsm8k_gold(answer);
    CHECK(gold && strcmp(gold, want) == 0, "test.jsonl:%d gold %s, spec says %s", line, gold ? gold : "none", want);
    g4_gsm8k_answer a;
    int rc = g4_gsm8k_extract(ctx->ex, answer, strlen(answer), &a);
    int ok = rc == 0 && a.status == G4_GSM8K_MARKER && g4_gsm8k_is_correct(a.value, gold);
    CHECK(ok, "test.jsonl:%d: extracted %s (%s), gold %s", line, a.value ? a.value : "none",
          g4_gsm8k_status_name(a.status), gold ? gold : "none");
    ctx->recovered += ok;
    g4_gsm8k_answer_free(&a);
    free(gold);
}

static void test_reference_solutions(const g4_gsm8k_extractor *ex) {
    solutions_ctx ctx = {ex, 0};
    int rows = for_each_jsonl("data/gsm8k/test.jsonl", check_solution_row, &ctx);
    CHECK_EQ_INT(rows, 1319);
    CHECK_EQ_INT(ctx.recovered, 1319);
}

/* ------------------------------------------------------------------- unit tables ---- */

typedef struct {
    const char *text;
    size_t len;
    const char *value;
    const char *status;
} extract_case;

#define X(lit, value, status) {lit, sizeof lit - 1, value, status}

/* Beyond the spec table: reference-code quirks and Python semantics a port could miss. */
static const extract_case EXTRACT_CASES[] = {
    /* the \boxed scope applies only when the match starts with lower-case "\boxed" */
    X("\\BOXED{} 7\n 9", "7", "marker"),
    X("\\boxed{} 7\n 9", "9", "last_number"),
    X("\\boxed{\\frac{1}{2}}", "1", "marker"),
    X("#####5", "5", "marker"),
    X("Answer:\n42", "42", "last_number"),
    X("The answer is 5\nbut 7", "5", "marker"),
    X("The answer is 12 dollars\nTotal: 15", "12", "marker"),
    X("Final answer is: 5 or 6", "5", "marker"),
    X("final answer:5", "5", "marker"),
    X("final answeris 4, 5", "4", "marker"),
    X("####", NULL, "no_number"),
    X("Answer: none", NULL, "no_number"),
    /* sign and lookbehind */
    X("x-5", "5", "last_number"),
    X("(3)-2", "2", "last_number"),
    X("[1]-4", "4", "last_number"),
    X("- 5", "5", "last_number"),
    X("5-", "5", "last_number"),
    X("a5", NULL, "no_number"),
    X("x.5", NULL, "no_number"),
    X("_5", NULL, "no_number"),
    X("\xc3\xa9" "5", NULL, "no_number"),       /* é is a word character */
    X("e\xcc\x81" "5", "5", "last_number"),     /* a combining mark is not (Python's \w) */
    X("1.2.3", "1.2", "last_number"),
    X("I have 1,234,5678 apples", "1234567", "last_number"),
    X("The answer is 1,0000", "1000", "marker"),
    X("Answer: ,5", "5", "marker"),
    X("Answer: 5%", "5", "marker"),
    X("Answer: 12,345,678.90", "12345678.9", "marker"),
    X("the answer is 1,000.5.", "1000.5", "marker"),
    X("The answer is -.5", "-0.5", "marker"),
    X("It is -0.0", "0", "last_number"),
    X("Answer: -0.50", "-0.5", "marker"),
    X("0007", "7", "last_number"),
    /* clean-up order: '$' goes before "**" */
    X("1*$*2", "12", "last_number"),
    X("-$5", "-5", "last_number"),
    X("$-5", "-5", "last_number"),
    X("3 ** 2 = 9", "9", "last_number"),
    X("The answer is \xe2\x88\x92 3", "3", "marker"),
    /* Unicode: digits, spaces and re.I letters as Python sees them */
    X("The answer is \xd9\xa4\xd9\xa2", "42", "marker"),
    X("\xef\xbc\x91\xef\xbc\x92\xef\xbc\x93", "123", "last_number"),
    X("\xf0\x9d\x9f\x8f\xf0\x9d\x9f\x90", "12", "last_number"),
    X("ANSWER\xe3\x80\x80: 8 then 9", "8", "marker"),
    X("answer\xe2\x80\x8b: 8 then 9", "9", "last_number"), /* U+200B is not \s */
    X("answer\x1c: 3 4", "3", "marker"),
    X("\xe2\x80\xa8" "answer: 1", "1", "marker"),
    X("the an\xc5\xbfwer is 3, then 4", "3", "marker"), /* ſ folds to s */
    X("F\xc4\xb0NAL ANSWER 6 and 7", "6", "marker"),    /* İ folds to i */
    /* decimal rounding of normalize(): 28 digits, half to even */
    X("Answer: 3.14159265358979323846264338327950", "3.141592653589793238462643383", "marker"),
    X("The answer is 0.99999999999999999999999999999", "1", "marker"),
    X("The answer is 0.99999999999999999999999999995", "1", "marker"),
    X("The answer is 0.12345678901234567890123456785", "0.1234567890123456789012345678", "marker"),
    X("The answer is 0.12345678901234567890123456775", "0.1234567890123456789012345678", "marker"),
    /* thought channels */
    X("<|channel>a<channel|>b<|channel>c<channel|>The answer is 5", "5", "marker"),
    X("x<channel|>y<channel|>The answer is 5 <|channel>7<channel|>", "5", "marker"),
    X("<|channel>a<channel|>b 8<channel|>c 9", "9", "last_number"),
    /* a stray closer means the reply began inside a prefilled thought: all text before it goes,
     * a marker included, and so does visible text already kept before an earlier thought
     * (extractor_ref.py's answers) */
    X("The answer is 3<channel|>so 4", "4", "last_number"),
    X("The answer is 3 <|channel>t<channel|>x<channel|>so 4", "4", "last_number"),
    X("The answer is 3.<|channel>t<channel|><channel|>Done.", NULL, "no_number"),
    X("9 <|channel>a", NULL, "thought_unclosed"),
    X("<|channel>x<channel|><|channel>y", NULL, "thought_unclosed"),
    /* NUL and invalid UTF-8 (read as U+FFFD, as a lossy decode gives the reference) */
    X("5\0 3", "3", "last_number"),
    X("The answer is 4\0 2", "4", "marker"),
    X("5\xff" "5", "5", "last_number"),
    X("The answer is \xc0\xaf 7", "7", "marker"),
    X("\xe2\x88" "5", "5", "last_number"),
    X("\xe2\x88\x92" "5", "-5", "last_number"),
    X("1\xed\xa0\x80" "2", "2", "last_number"),
    X("\xf4\x90\x80\x80" "3", "3", "last_number"),
    X("The answer is 8\xe2", "8", "marker"),
};

static void test_extract_cases(const g4_gsm8k_extractor *ex) {
    for (size_t i = 0; i < sizeof EXTRACT_CASES / sizeof EXTRACT_CASES[0]; i++) {
        const extract_case *c = &EXTRACT_CASES[i];
        check_extract(ex, c->text, c->len, c->value, c->status);
    }
}

static const struct {
    const char *in, *out; /* out NULL: not a number */
} NORMALIZE_CASES[] = {
    {"26.00", "26"},
    {"$1,200", "1200"},
    {"1200.", "1200"},
    {"1200", "1200"},
    {"2.50", "2.5"},
    {".5", "0.5"},
    {"-3", "-3"},
    {"-0", "0"},
    {"-0.0", "0"},
    {"-0.50", "-0.5"},
    {"+7", "7"},
    {"1,000,000", "1000000"},
    {"1,2,3", "123"},
    {"18.0", "18"},
    {"0007", "7"},
    {"1e3", "1000"},
    {"1E-3", "0.001"},
    {"12.5e1", "125"},
    {"-1.5e-7", "-0.00000015"},
    {"0.000001", "0.000001"},
    {"1_000", "1000"},
    {" 42\n", "42"},
    {"\xe3\x80\x80" "42", "42"},
    {"\xe2\x88\x92" "5", "-5"},
    {"**64**", "64"},
    {"\xd9\xa4\xd9\xa2", "42"},
    {"\xef\xbc\x91\xef\xbc\x92", "12"},
    {"0.12345678901234567890123456785", "0.1234567890123456789012345678"},
    {"123456789012345678901234567890", "123456789012345678901234567890"}, /* integers: exact */
    {"12345678901234567890123456789.5", "12345678901234567890123456790"},
    {"", NULL},
    {" ", NULL},
    {"abc", NULL},
    {"50%", NULL},
    {"1/2", NULL},
    {"1.2.3", NULL},
    {"--5", NULL},
    {"5-", NULL},
    {".", NULL},
    {"-", NULL},
    {"e5", NULL},
    {"1e", NULL},
    {"1 2", NULL},
    {"0x10", NULL},
    {"\xc2\xbd", NULL},     /* ½ is numeric but not a decimal digit */
    {"\xe2\x85\xab", NULL}, /* Ⅻ likewise */
    {"inf", NULL},          /* the reference raises */
    {"Infinity", NULL},
    {"nan", NULL},          /* the reference returns "NaN" */
    {"1e1000000", NULL},    /* beyond the decimal context's Emax; the reference raises */
    {"1e99999999999999999999", NULL},
    {"5\xff", NULL},
};

static void test_normalize(void) {
    for (size_t i = 0; i < sizeof NORMALIZE_CASES / sizeof NORMALIZE_CASES[0]; i++) {
        char *got = g4_gsm8k_normalize(NORMALIZE_CASES[i].in);
        const char *want = NORMALIZE_CASES[i].out;
        CHECK(same_answer(got, want), "normalize(\"%s\") = %.60s, want %s", NORMALIZE_CASES[i].in, got ? got : "none",
              want ? want : "none");
        free(got);
    }
}

static void test_is_correct(void) {
    CHECK_EQ_INT(g4_gsm8k_is_correct("26", "26.00"), 1);
    CHECK_EQ_INT(g4_gsm8k_is_correct("1200", "1,200"), 1);
    CHECK_EQ_INT(g4_gsm8k_is_correct("0.5", ".5"), 1);
    CHECK_EQ_INT(g4_gsm8k_is_correct("-0", "0"), 1);
    CHECK_EQ_INT(g4_gsm8k_is_correct("100", "1e2"), 1);
    CHECK_EQ_INT(g4_gsm8k_is_correct("7", "7"), 1);
    CHECK_EQ_INT(g4_gsm8k_is_correct("12", "12.5"), 0);
    CHECK_EQ_INT(g4_gsm8k_is_correct("18", "-18"), 0);
    CHECK_EQ_INT(g4_gsm8k_is_correct("10", "1"), 0);
    CHECK_EQ_INT(g4_gsm8k_is_correct(NULL, "5"), 0);
    CHECK_EQ_INT(g4_gsm8k_is_correct("5", NULL), 0);
    CHECK_EQ_INT(g4_gsm8k_is_correct("5", "abc"), 0);
    CHECK_EQ_INT(g4_gsm8k_is_correct("abc", "abc"), 0);
    /* exact comparison: no 28-digit rounding here, as in Decimal == Decimal */
    CHECK_EQ_INT(g4_gsm8k_is_correct("0.1234567890123456789012345678", "0.12345678901234567890123456785"), 0);
}

static void test_gold(void) {
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"a #### 1,234", "1234"},       {"x ####5 #### -7 ", "-7"}, {"#### 3.50", "3.5"},
        {"####\n 12 \n", "12"},         {"#### 1_000", "1000"},      {"#### \xd9\xa3", "3"},
        {"#####5", NULL}, /* split("####") leaves "#5" */
        {"no hashes 42", NULL},         {"#### ", NULL},
        {"#### $5", NULL}, /* gold_of has no '$' clean-up */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = g4_gsm8k_gold(cases[i].in);
        CHECK(same_answer(got, cases[i].out), "gold(\"%s\") = %s", cases[i].in, got ? got : "none");
        free(got);
    }
}

static void test_prompt(void) {
    char *p = g4_gsm8k_prompt("What is 2+2?");
    CHECK_STREQ(p, "Solve the following math problem. Reason step by step, and end your reply with a final line "
                   "of the form \"The final answer is N\", where N is just the number.\n\nProblem: What is 2+2?");
    free(p);
}

static void test_status_names(void) {
    CHECK_STREQ(g4_gsm8k_status_name(G4_GSM8K_MARKER), "marker");
    CHECK_STREQ(g4_gsm8k_status_name(G4_GSM8K_LAST_NUMBER), "last_number");
    CHECK_STREQ(g4_gsm8k_status_name(G4_GSM8K_NO_NUMBER), "no_number");
    CHECK_STREQ(g4_gsm8k_status_name(G4_GSM8K_THOUGHT_UNCLOSED), "thought_unclosed");
}

/* --------------------------------------------------------------- Unicode coverage ---- */

static size_t utf8_encode(uint32_t cp, char *b) {
    if (cp < 0x80) return b[0] = (char)cp, 1;
    if (cp < 0x800) return b[0] = (char)(0xC0 | cp >> 6), b[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return b[0] = (char)(0xE0 | cp >> 12), b[1] = (char)(0x80 | (cp >> 6 & 63)), b[2] = (char)(0x80 | (cp & 63)), 3;
    b[0] = (char)(0xF0 | cp >> 18), b[1] = (char)(0x80 | (cp >> 12 & 63));
    b[2] = (char)(0x80 | (cp >> 6 & 63)), b[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* The extractor's regex finds digits with PCRE2's \p{Nd}, and reads their values from its own
 * table: the two must hold the same code points, or a digit would be found but not read (or
 * the reverse) once the system PCRE2 moves to another Unicode version. */
static void test_digit_table_matches_pcre2(void) {
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR) "^\\p{Nd}$", PCRE2_ZERO_TERMINATED, PCRE2_UTF, &err, &off, NULL);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    int mismatches = 0, digits = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        char b[5];
        size_t n = utf8_encode(cp, b);
        b[n] = 0;
        int is_digit = pcre2_match(re, (PCRE2_SPTR)b, n, 0, 0, md, NULL) > 0;
        char *v = cp ? g4_gsm8k_normalize(b) : NULL;
        int read = v && strlen(v) == 1 && v[0] >= '0' && v[0] <= '9';
        digits += is_digit;
        if (is_digit != read && mismatches++ < 5) fprintf(stderr, "U+%04X: PCRE2 digit %d, read %s\n", cp, is_digit, v);
        free(v);
    }
    CHECK_EQ_INT(mismatches, 0);
    CHECK_EQ_INT(digits, 660);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
}

/* --------------------------------------------------------------------- robustness ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15u;

static uint32_t rng(void) { /* xorshift64*: fixed seed, same inputs every run */
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Du) >> 32);
}

static const char *const PIECES[] = {
    "The answer is ", "Final Answer: ", "####", "\\boxed{", "}", "<|channel>", "<channel|>", "\n", " ", "$", "**",
    "-", "\xe2\x88\x92", ".", ",", "1", "23", "456", "1,234", "0.5", "\xd9\xa3", "\xef\xbc\x91", "answer:", ")", "x",
};

/* Random mix of answer-like pieces and raw bytes, including NUL and invalid UTF-8. */
static size_t random_reply(char *buf, size_t cap) {
    size_t n = 0, pieces = rng() % 200;
    for (size_t i = 0; i < pieces; i++) {
        const char *p = PIECES[rng() % (sizeof PIECES / sizeof PIECES[0])];
        size_t len = strlen(p);
        if (rng() % 4 == 0) p = NULL, len = 1 + rng() % 8;
        if (n + len > cap) break;
        for (size_t k = 0; k < len; k++) buf[n + k] = p ? p[k] : (char)rng();
        n += len;
    }
    return n;
}

/* A value is canonical when normalising it again changes nothing. */
static int is_canonical(const char *v) {
    char *again = g4_gsm8k_normalize(v);
    int same = again && strcmp(again, v) == 0;
    free(again);
    return same;
}

static void test_random_input(const g4_gsm8k_extractor *ex) {
    char buf[4096];
    int failures = 0, noncanonical = 0;
    for (int i = 0; i < 5000; i++) {
        size_t n = random_reply(buf, sizeof buf - 1);
        g4_gsm8k_answer a;
        failures += g4_gsm8k_extract(ex, buf, n, &a) != 0;
        noncanonical += a.value && !is_canonical(a.value);
        noncanonical += !a.value && (a.status == G4_GSM8K_MARKER || a.status == G4_GSM8K_LAST_NUMBER);
        g4_gsm8k_answer_free(&a);
        buf[n] = 0; /* the string entry points too: they must merely not crash */
        free(g4_gsm8k_normalize(buf));
        free(g4_gsm8k_gold(buf));
        (void)g4_gsm8k_is_correct(buf, buf);
    }
    CHECK_EQ_INT(failures, 0);
    CHECK_EQ_INT(noncanonical, 0);
}

/* Builds `unit` repeated to about `size` bytes, then `suffix`, and extracts with a time bound:
 * the reference's own thought loop is quadratic, a port must not be. */
static void check_huge(const g4_gsm8k_extractor *ex, const char *unit, size_t size, const char *suffix, int want_rc,
                       const char *want_value) {
    size_t u = strlen(unit), s = strlen(suffix), n = 0;
    char *buf = malloc(size + u + s);
    if (!buf) return;
    while (n + u <= size) memcpy(buf + n, unit, u), n += u;
    memcpy(buf + n, suffix, s);
    n += s;
    clock_t t0 = clock();
    g4_gsm8k_answer a;
    int rc = g4_gsm8k_extract(ex, buf, n, &a);
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    CHECK(rc == want_rc, "huge \"%s\"...: rc %d (%s)", unit, rc, rc ? g4_last_error() : "");
    if (want_rc == 0) CHECK(same_answer(a.value, want_value), "huge \"%s\"...: got %s", unit, a.value ? a.value : "none");
    CHECK(secs < 30, "huge \"%s\"...: %.1f s", unit, secs);
    g4_gsm8k_answer_free(&a);
    free(buf);
}

static void test_huge_input(const g4_gsm8k_extractor *ex) {
    const size_t mb = 1 << 20;
    check_huge(ex, "<channel|>", 4 * mb, "The answer is 7", 0, "7");
    check_huge(ex, "<|channel>x<channel|>", 4 * mb, "7", 0, "7");
    check_huge(ex, "answer: ", 4 * mb, "7", 0, "7");
    check_huge(ex, "\\boxed{", 4 * mb, "7", 0, "7");
    check_huge(ex, "-", 4 * mb, "7", 0, "-7");
    check_huge(ex, "\xff", 4 * mb, "7", 0, "7");
    check_huge(ex, "12 ", 4 * mb, "", 0, "12");
    /* one number of 2 MB digits: past the decimal context's 10^999999, as the reference raises */
    check_huge(ex, "1", 2 * mb, "", 0, NULL);
    /* one number of 4 MB comma groups: the regex memory cap answers with an error */
    check_huge(ex, "111,", 4 * mb, "111", -1, NULL);
    char *long_int = malloc(500001);
    if (long_int) {
        memset(long_int, '9', 500000);
        long_int[500000] = 0;
        g4_gsm8k_answer a;
        CHECK_EQ_INT(g4_gsm8k_extract(ex, long_int, 500000, &a), 0);
        CHECK(a.value && strcmp(a.value, long_int) == 0, "500000-digit integer not kept whole");
        g4_gsm8k_answer_free(&a);
        free(long_int);
    }
}

int main(void) {
    g4_gsm8k_extractor *ex;
    if (g4_gsm8k_extractor_open(&ex) != 0) {
        fprintf(stderr, "%s\n", g4_last_error());
        return 1;
    }
    test_fixture_cases(ex);
    test_reference_solutions(ex);
    test_extract_cases(ex);
    test_normalize();
    test_is_correct();
    test_gold();
    test_prompt();
    test_status_names();
    test_digit_table_matches_pcre2();
    test_random_input(ex);
    test_huge_input(ex);
    g4_gsm8k_extractor_close(ex);
    return check_report("gsm8k");
}
