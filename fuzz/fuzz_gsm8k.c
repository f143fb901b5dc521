/* Fuzz target: the GSM8K answer extractor (dev/eval/gsm8k.h).
 *
 * Input: a model reply (any bytes). g4_gsm8k_extract runs on all of it; the C-string
 * functions run on the NUL-separated parts: a = text before the first NUL, b = the next part.
 * Checked:
 *   - extract succeeds; a value only with status marker/last_number; the value is canonical
 *     (normalize(value) == value, is_correct(value, value)) and plain ASCII "-?digits[.digits]";
 *   - normalize(a) is NULL or canonical in the same way, and equals gold("####" + a);
 *   - is_correct is symmetric, false for NULL, and implies equal normalize results;
 *   - g4_gsm8k_prompt ends with the question. */
#include "eval/gsm8k.h"
#include "util/err.h"

#include "fuzz_common.h"

static g4_gsm8k_extractor *ex;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g4_set_log(NULL, NULL);
    if (g4_gsm8k_extractor_open(&ex) != 0) fz_die("extractor_open: %s", g4_last_error());
    return 0;
}

/* "-?[0-9]+(\.[0-9]*[1-9])?" with no leading zero (except "0" itself, "0.x"), no "-0". */
static int canonical_shape(const char *v) {
    const char *p = v;
    if (*p == '-') p++;
    if (!(*p >= '0' && *p <= '9')) return 0;
    if (*p == '0' && p[1] >= '0' && p[1] <= '9') return 0;
    while (*p >= '0' && *p <= '9') p++;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9')) return 0;
        while (*p >= '0' && *p <= '9') p++;
        if (p[-1] == '0') return 0;
    }
    if (*p) return 0;
    if (strcmp(v, "-0") == 0) return 0;
    return 1;
}

/* normalize prints integers of up to 10^6 digits ("1e999999" gives a 1 MB string, ~50 ms
 * in a release build, seconds under ASan): re-reading such values is skipped to keep the
 * target fast. Extracted values never have an exponent, so they are never that long. */
#define HUGE_VALUE 4096

static void check_canonical(const char *v, const char *what) {
    FZ_CHECK(canonical_shape(v), "%s \"%.80s\" is not canonical", what, v);
    if (strlen(v) > HUGE_VALUE) return;
    char *again = g4_gsm8k_normalize(v);
    FZ_CHECK(again && strcmp(again, v) == 0, "%s: normalize(\"%.80s\") = \"%.80s\"", what, v, again ? again : "(null)");
    free(again);
    FZ_CHECK(g4_gsm8k_is_correct(v, v) == 1, "%s: is_correct(v, v) is 0", what);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    g4_gsm8k_answer ans;
    FZ_CHECK(g4_gsm8k_extract(ex, (const char *)data, size, &ans) == 0, "extract failed: %s", g4_last_error());
    const char *status = g4_gsm8k_status_name(ans.status);
    FZ_CHECK(strcmp(status, "unknown") != 0, "status %d", (int)ans.status);
    if (ans.value) {
        FZ_CHECK(ans.status == G4_GSM8K_MARKER || ans.status == G4_GSM8K_LAST_NUMBER, "value with status %s", status);
        check_canonical(ans.value, "extracted value");
    }

    char *parts[2];
    size_t lens[2];
    int n = fz_split_nul(data, size, parts, lens, 2);
    const char *a = parts[0], *b = n > 1 ? parts[1] : "";

    char *na = g4_gsm8k_normalize(a), *nb = g4_gsm8k_normalize(b);
    if (na) check_canonical(na, "normalize(a)");
    if (nb) check_canonical(nb, "normalize(b)");

    /* gold("####" + a): the same reading as normalize minus the '$' / '**' / U+2212 clean-up,
     * so when a has none of those characters (and no "####") the two agree. */
    int huge = (na && strlen(na) > HUGE_VALUE) || (nb && strlen(nb) > HUGE_VALUE);
    char *sol = malloc(lens[0] + 5);
    memcpy(sol, "####", 4);
    memcpy(sol + 4, a, lens[0] + 1);
    char *gold = huge ? NULL : g4_gsm8k_gold(sol);
    if (gold) check_canonical(gold, "gold");
    if (!huge && !strchr(a, '$') && !strstr(a, "**") && !strstr(a, "\xE2\x88\x92") && !strstr(a, "####") && !strstr(a, "#"))
        FZ_CHECK((na == NULL) == (gold == NULL) && (!na || strcmp(na, gold) == 0), "normalize(a) = %s, gold = %s",
                 na ? na : "(null)", gold ? gold : "(null)");
    free(sol);
    free(gold);

    /* Exact equality implies equal canonical forms (normalize rounds non-integers to 28
     * digits, so the converse does not hold). */
    int ab = g4_gsm8k_is_correct(a, b), ba = g4_gsm8k_is_correct(b, a);
    FZ_CHECK(ab == ba, "is_correct not symmetric");
    FZ_CHECK(g4_gsm8k_is_correct(NULL, b) == 0 && g4_gsm8k_is_correct(a, NULL) == 0, "NULL is correct");
    if (ab && na && nb) FZ_CHECK(strcmp(na, nb) == 0, "is_correct(a, b) but normalize gives %.40s / %.40s", na, nb);
    if (ans.value && na && g4_gsm8k_is_correct(ans.value, a))
        FZ_CHECK(strcmp(ans.value, na) == 0, "is_correct(value, a) but normalize(a) = %.40s", na);
    free(na);
    free(nb);

    char *prompt = g4_gsm8k_prompt(a);
    FZ_CHECK(prompt && strlen(prompt) >= lens[0] && strcmp(prompt + strlen(prompt) - lens[0], a) == 0,
             "prompt does not end with the question");
    free(prompt);

    g4_gsm8k_answer_free(&ans);
    FZ_CHECK(ans.value == NULL, "answer_free left the value");
    for (int i = 0; i < n; i++) free(parts[i]);
    return 0;
}
