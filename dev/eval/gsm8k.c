/* GSM8K answer extraction and number normalisation: a port of
 * shared/fixtures/gsm8k/extractor_ref.py (gsm8k-protocol.md §5).
 *
 * The reference runs Python `re` and `decimal` on str; their semantics are reproduced here on
 * purpose, because a runtime's score must not depend on which extractor read its outputs:
 *   - \d, \w and \s are Unicode classes in Python, and re.I also folds 'ſ' (U+017F) with 's'
 *     and 'İ', 'ı' (U+0130, U+0131) with 'i'. The patterns spell these sets out instead of
 *     relying on PCRE2_UCP, whose \w changed meaning between PCRE2 versions (Mn added in 10.43).
 *   - finditer/findall keep non-overlapping matches found left to right (so the last match is
 *     not always the rightmost one), and NUM.search runs on a new string, the marker's line, so
 *     its lookbehind cannot see the text before that line.
 *   - Decimal() strips whitespace, ignores '_', takes '+', an exponent and any Unicode decimal
 *     digit; Decimal.normalize() rounds to the default context's 28 digits, half-even.
 * Deliberate differences, all on input where the reference raises, goes out of its decimal
 * context's range or never gets:
 *   - NaN and Infinity are not numbers (the reference gives "NaN", or raises OverflowError);
 *   - a number whose leading digit is beyond 10^±999999 (context Emax/Emin) is not a number
 *     (the reference raises, or rounds subnormally); integers of 4301 to 10^6 digits are
 *     printed where Python >= 3.11 raises on int->str; exponent fields over 10^15 are rejected;
 *   - the reference's thought removal is quadratic in the number of stray "<channel|>"; this
 *     one is linear. */
#include "gsm8k.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

/* ------------------------------------------------------------------ Unicode tables ---- */

/* Python's str.isspace() set (Unicode 14): what \s, str.strip() and Decimal() treat as space. */
static const uint32_t PY_SPACE_RANGES[][2] = {
    {0x09, 0x0D},     {0x1C, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},     {0x1680, 0x1680},
    {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
};
/* The same set as a regex class; keep the two in step. */
#define PY_SPACE "[\\t-\\r\\x1c-\\x20\\x85\\xa0\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}]"
/* What re.I lets match a pattern's 'i' and 's' beyond the ASCII case pair. */
#define PY_I "[i\\x{130}\\x{131}]"
#define PY_S "[s\\x{17f}]"

/* First code point of each run of decimal digits 0..9 (Unicode 14 category Nd: what Python's
 * \d matches and Decimal() reads; PCRE2 10.42's \p{Nd} is the same set, tests check it). Each
 * run is ten consecutive code points in digit order. */
static const uint32_t ND_ZEROS[] = {
    0x0030,  0x0660,  0x06F0,  0x07C0,  0x0966,  0x09E6,  0x0A66,  0x0AE6,  0x0B66,  0x0BE6,
    0x0C66,  0x0CE6,  0x0D66,  0x0DE6,  0x0E50,  0x0ED0,  0x0F20,  0x1040,  0x1090,  0x17E0,
    0x1810,  0x1946,  0x19D0,  0x1A80,  0x1A90,  0x1B50,  0x1BB0,  0x1C40,  0x1C50,  0xA620,
    0xA8D0,  0xA900,  0xA9D0,  0xA9F0,  0xAA50,  0xABF0,  0xFF10,  0x104A0, 0x10D30, 0x11066,
    0x110F0, 0x11136, 0x111D0, 0x112F0, 0x11450, 0x114D0, 0x11650, 0x116C0, 0x11730, 0x118E0,
    0x11950, 0x11C50, 0x11D50, 0x11DA0, 0x16A60, 0x16AC0, 0x16B50, 0x1D7CE, 0x1D7D8, 0x1D7E2,
    0x1D7EC, 0x1D7F6, 0x1E140, 0x1E2F0, 0x1E950, 0x1FBF0,
};

static int is_py_space(uint32_t cp) {
    for (size_t i = 0; i < sizeof PY_SPACE_RANGES / sizeof PY_SPACE_RANGES[0]; i++)
        if (cp >= PY_SPACE_RANGES[i][0] && cp <= PY_SPACE_RANGES[i][1]) return 1;
    return 0;
}

/* Value 0..9 of a decimal digit code point, or -1. */
static int digit_value(uint32_t cp) {
    size_t lo = 0, hi = sizeof ND_ZEROS / sizeof ND_ZEROS[0];
    while (lo < hi) { /* first run starting after cp */
        size_t mid = lo + (hi - lo) / 2;
        if (ND_ZEROS[mid] <= cp) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0 || cp - ND_ZEROS[lo - 1] > 9) return -1;
    return (int)(cp - ND_ZEROS[lo - 1]);
}

/* Length (1..4) of the valid UTF-8 sequence at s, storing its code point, or 0. Overlong forms,
 * surrogates and values above U+10FFFF are invalid, as in Python's decoder. */
static size_t utf8_sequence(const unsigned char *s, size_t n, uint32_t *cp) {
    uint32_t c, min;
    size_t len;
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    if (s[0] >= 0xC2 && s[0] <= 0xDF) len = 2, c = s[0] & 0x1Fu, min = 0x80;
    else if (s[0] >= 0xE0 && s[0] <= 0xEF) len = 3, c = s[0] & 0x0Fu, min = 0x800;
    else if (s[0] >= 0xF0 && s[0] <= 0xF4) len = 4, c = s[0] & 0x07u, min = 0x10000;
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = c << 6 | (s[i] & 0x3Fu);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    *cp = c;
    return len;
}

/* Copy of s (NUL-terminated) with each byte that starts no valid UTF-8 sequence replaced by
 * U+FFFD. PCRE2's UTF mode is undefined on invalid input, and this is what the reference reads
 * after a lossy decode. Python puts one U+FFFD per maximal invalid run where this puts one per
 * byte; no result can differ, U+FFFD being no digit, word, space, '.', ')', ']' or marker. */
static char *sanitize_utf8(const char *s, size_t n, size_t *out_len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t bad = 0;
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_sequence(u + i, n - i, &cp);
        if (k) i += k;
        else bad++, i++;
    }
    if (bad > (SIZE_MAX - 1 - n) / 2) {
        g4_fail("gsm8k: reply too large (%zu bytes)", n);
        return NULL;
    }
    char *out = malloc(n + 2 * bad + 1);
    if (!out) {
        g4_fail("gsm8k: out of memory for a %zu-byte reply", n);
        return NULL;
    }
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_sequence(u + i, n - i, &cp);
        if (k) {
            memcpy(out + w, s + i, k);
            w += k, i += k;
        } else {
            memcpy(out + w, "\xEF\xBF\xBD", 3);
            w += 3, i++;
        }
    }
    out[w] = 0;
    *out_len = w;
    return out;
}

/* ---------------------------------------------------------------- text clean-up ---- */

static const char THOUGHT_OPEN[] = "<|channel>";
static const char THOUGHT_CLOSE[] = "<channel|>";
#define OPEN_LEN (sizeof THOUGHT_OPEN - 1)
#define CLOSE_LEN (sizeof THOUGHT_CLOSE - 1)

/* Offset of the first needle (m > 0 bytes) in s[from, n), or n when there is none. */
static size_t find_bytes(const char *s, size_t n, size_t from, const char *needle, size_t m) {
    while (from <= n && n - from >= m) {
        const char *p = memchr(s + from, needle[0], n - from - m + 1);
        if (!p) return n;
        if (memcmp(p, needle, m) == 0) return (size_t)(p - s);
        from = (size_t)(p - s) + 1;
    }
    return n;
}

/* The reference's strip_thoughts: deletes each <|channel>...<channel|> span; a <channel|> with
 * no opener before it means the reply began inside a prefilled thought, so all text before it
 * goes too. Returns 0 with the visible text in *out, 1 if a thought is never closed, -1 on
 * allocation failure. The next opener and closer are remembered between rounds (the reference
 * searches again from each position), which keeps this linear on adversarial replies. */
static int strip_thoughts(const char *s, size_t n, char **out, size_t *out_len) {
    char *vis = malloc(n + 1);
    if (!vis) return g4_fail("gsm8k: out of memory for a %zu-byte reply", n);
    size_t w = 0, i = 0;
    size_t open = find_bytes(s, n, 0, THOUGHT_OPEN, OPEN_LEN);
    size_t close = find_bytes(s, n, 0, THOUGHT_CLOSE, CLOSE_LEN);
    for (;;) {
        if (open < i) open = find_bytes(s, n, i, THOUGHT_OPEN, OPEN_LEN);
        if (close < i) close = find_bytes(s, n, i, THOUGHT_CLOSE, CLOSE_LEN);
        if (close < open) { /* stray closer (open == n when there is no opener) */
            w = 0;
            i = close + CLOSE_LEN;
            continue;
        }
        if (open == n) break;
        memcpy(vis + w, s + i, open - i);
        w += open - i;
        size_t end = find_bytes(s, n, open, THOUGHT_CLOSE, CLOSE_LEN);
        if (end == n) {
            free(vis);
            return 1;
        }
        i = end + CLOSE_LEN;
    }
    memcpy(vis + w, s + i, n - i);
    w += n - i;
    vis[w] = 0;
    *out = vis;
    *out_len = w;
    return 0;
}

/* Replaces each U+2212 MINUS SIGN (E2 88 92) by '-'. In place; returns the new length. */
static size_t replace_minus_sign(char *s, size_t n) {
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        if (n - i >= 3 && memcmp(s + i, "\xE2\x88\x92", 3) == 0) {
            s[w++] = '-';
            i += 3;
        } else {
            s[w++] = s[i++];
        }
    }
    return w;
}

/* Deletes each non-overlapping occurrence of needle (1 or 2 bytes), scanning left to right
 * like str.replace(needle, ""). In place; returns the new length. */
static size_t delete_all(char *s, size_t n, const char *needle, size_t m) {
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        if (n - i >= m && memcmp(s + i, needle, m) == 0) i += m;
        else s[w++] = s[i++];
    }
    return w;
}

/* The reference's prep, three passes in its order: "*$*" loses its '$' first and then, having
 * become "**", disappears. In place, keeps s NUL-terminated; returns the new length. */
static size_t prep(char *s, size_t n) {
    n = replace_minus_sign(s, n);
    n = delete_all(s, n, "$", 1);
    n = delete_all(s, n, "**", 2);
    s[n] = 0;
    return n;
}

/* Deletes every comma (normalize_number's first step). In place; returns the new length. */
static size_t delete_commas(char *s, size_t n) {
    n = delete_all(s, n, ",", 1);
    s[n] = 0;
    return n;
}

/* ---------------------------------------------------------------- exact decimals ---- */

#define CONTEXT_PREC 28      /* Python's default decimal context: significant digits */
#define CONTEXT_EMAX 999999  /* ... and largest adjusted exponent (Emin = -Emax) */
#define MAX_EXPONENT 1000000000000000LL

/* (-1)^neg × digits × 10^exp, exactly. digits are ASCII with no leading or trailing zeros, so
 * equal values have equal fields; zero is n == 0, neg == 0, exp == 0. */
typedef struct {
    int neg;
    char *digits;
    size_t n;
    long long exp;
} decimal;

/* Reads the code point at s[*i] (valid or not) and advances past it; invalid bytes give
 * U+FFFD, which no numeral contains. */
static uint32_t next_code_point(const char *s, size_t n, size_t *i) {
    uint32_t cp;
    size_t k = utf8_sequence((const unsigned char *)s + *i, n - *i, &cp);
    *i += k ? k : 1;
    return k ? cp : 0xFFFD;
}

/* Python's Decimal(str) front end: strips surrounding whitespace, drops every '_', maps Unicode
 * decimal digits to ASCII. Returns a malloc'd ASCII string, or NULL when some character can be
 * no part of a numeral or allocation fails (*oom tells which). */
static char *numeral_to_ascii(const char *s, size_t n, int *oom) {
    size_t start = n, end = n, i = 0;
    while (i < n) { /* [start, end): first to last non-space character */
        size_t at = i;
        if (is_py_space(next_code_point(s, n, &i))) continue;
        if (start == n) start = at;
        end = i;
    }
    if (start == n) start = end = 0;
    char *a = malloc(end - start + 1);
    *oom = !a;
    if (!a) return NULL;
    size_t w = 0;
    for (i = start; i < end;) {
        uint32_t cp = next_code_point(s, end, &i);
        int d = digit_value(cp);
        if (cp == '_') continue;
        if (d >= 0) {
            a[w++] = (char)('0' + d);
        } else if (cp > 0 && cp < 0x80) {
            a[w++] = (char)cp; /* syntax checked later, as libmpdec does */
        } else {
            free(a);
            return NULL;
        }
    }
    a[w] = 0;
    return a;
}

static size_t skip_digits(const char *a, size_t i) {
    while (a[i] >= '0' && a[i] <= '9') i++;
    return i;
}

/* Exponent field after 'e': optional sign, at least one digit. Returns 0, or 1 if malformed or
 * beyond MAX_EXPONENT (such values are no GSM8K answer and would overflow the arithmetic). */
static int parse_exponent(const char *a, size_t *i, long long *e) {
    size_t j = *i;
    int neg = 0;
    if (a[j] == '+' || a[j] == '-') neg = a[j++] == '-';
    if (a[j] < '0' || a[j] > '9') return 1;
    long long v = 0;
    for (; a[j] >= '0' && a[j] <= '9'; j++) {
        v = v * 10 + (a[j] - '0');
        if (v > MAX_EXPONENT) return 1;
    }
    *i = j;
    *e = neg ? -v : v;
    return 0;
}

/* Drops leading zeros, moves trailing zeros into the exponent, and gives zero its one form. */
static void strip_zeros(decimal *d) {
    size_t lead = 0;
    while (lead < d->n && d->digits[lead] == '0') lead++;
    memmove(d->digits, d->digits + lead, d->n - lead);
    d->n -= lead;
    while (d->n > 0 && d->digits[d->n - 1] == '0') d->n--, d->exp++;
    if (d->n == 0) d->neg = 0, d->exp = 0;
    d->digits[d->n] = 0;
}

/* libmpdec's numeric-string syntax, minus NaN and Infinity:
 * [sign] (digits ['.' [digits]] | '.' digits) [('e'|'E') [sign] digits].
 * Returns 0, 1 if a is not such a string, -1 on allocation failure. */
static int parse_ascii_decimal(const char *a, decimal *d) {
    size_t i = 0;
    memset(d, 0, sizeof *d);
    if (a[i] == '+' || a[i] == '-') d->neg = a[i++] == '-';
    size_t int_start = i, int_end = skip_digits(a, i);
    size_t frac_start = int_end, frac_end = int_end;
    i = int_end;
    if (a[i] == '.') {
        frac_start = i + 1;
        frac_end = skip_digits(a, frac_start);
        i = frac_end;
    }
    if (int_end == int_start && frac_end == frac_start) return 1;
    long long e = 0;
    if ((a[i] == 'e' || a[i] == 'E') && (i++, parse_exponent(a, &i, &e))) return 1;
    if (a[i] != 0) return 1;
    size_t n_int = int_end - int_start, n_frac = frac_end - frac_start;
    d->digits = malloc(n_int + n_frac + 1);
    if (!d->digits) return g4_fail("gsm8k: out of memory reading a number");
    memcpy(d->digits, a + int_start, n_int);
    memcpy(d->digits + n_int, a + frac_start, n_frac);
    d->n = n_int + n_frac;
    d->exp = e - (long long)n_frac;
    strip_zeros(d);
    return 0;
}

/* Rounds to prec significant digits, half to even, as the default context does in
 * Decimal.normalize(). */
static void round_half_even(decimal *d, size_t prec) {
    if (d->n <= prec) return;
    char first_dropped = d->digits[prec];
    int more_dropped = d->n > prec + 1; /* the last digit is non-zero, so anything after counts */
    int last_kept_odd = (d->digits[prec - 1] - '0') % 2;
    int up = first_dropped > '5' || (first_dropped == '5' && (more_dropped || last_kept_odd));
    d->exp += (long long)(d->n - prec);
    d->n = prec;
    if (up) {
        size_t i = prec;
        while (i > 0 && d->digits[i - 1] == '9') d->digits[--i] = '0';
        if (i > 0) {
            d->digits[i - 1]++;
        } else { /* 99...9 + 1 */
            d->digits[0] = '1';
            d->n = 1;
            d->exp += (long long)prec;
        }
    }
    strip_zeros(d);
}

/* normalize_number's output: str(int(d)) when d is integral, else the 28-digit normalize()
 * in fixed notation. Returns 0, 1 when the value lies outside the context's exponent range,
 * -1 on allocation failure. */
static int format_decimal(decimal *d, char **out) {
    if (d->n > 0 && d->exp < 0) round_half_even(d, CONTEXT_PREC);
    long long adjusted = d->exp + (long long)d->n - 1;
    if (d->n > 0 && (adjusted > CONTEXT_EMAX || adjusted < -CONTEXT_EMAX)) return 1;
    size_t n = d->n;
    size_t int_digits = d->n > 0 && adjusted >= 0 ? (size_t)adjusted + 1 : 0;
    size_t frac_digits = d->exp < 0 ? (size_t)-d->exp : 0;
    char *s = malloc((size_t)d->neg + (int_digits ? int_digits : 1) + 1 + frac_digits + 1);
    if (!s) return g4_fail("gsm8k: out of memory printing a number");
    char *p = s;
    if (d->neg) *p++ = '-';
    if (int_digits == 0) *p++ = '0';
    size_t k = int_digits < n ? int_digits : n; /* mantissa digits before the point */
    memcpy(p, d->digits, k);
    p += k;
    for (size_t z = k; z < int_digits; z++) *p++ = '0';
    if (frac_digits) {
        *p++ = '.';
        for (size_t z = n - k; z < frac_digits; z++) *p++ = '0';
        memcpy(p, d->digits + k, n - k);
        p += n - k;
    }
    *p = 0;
    *out = s;
    return 0;
}

/* Reads s[0, n) as a number: the reference's prep first when clean is set (the lenient public
 * entry points), then normalize_number's comma removal and Decimal(). Returns 0, 1 if it is not
 * a number (g4_last_error says so), -1 on allocation failure. */
static int read_number(const char *s, size_t n, int clean, decimal *d) {
    memset(d, 0, sizeof *d);
    char *copy = malloc(n + 1);
    if (!copy) return g4_fail("gsm8k: out of memory reading a number");
    memcpy(copy, s, n);
    copy[n] = 0;
    if (clean) n = prep(copy, n);
    n = delete_commas(copy, n);
    int oom;
    char *ascii = numeral_to_ascii(copy, n, &oom);
    int rc = ascii ? parse_ascii_decimal(ascii, d) : oom ? -1 : 1;
    if (oom) g4_fail("gsm8k: out of memory reading a number");
    if (rc == 1) g4_fail("gsm8k: not a number: \"%.60s\"", copy);
    free(ascii);
    free(copy);
    return rc;
}

/* normalize_number on s[0, n) (after prep when clean is set): 0 with *out malloc'd, 1 when it
 * is not a number in range (*out NULL, g4_last_error says why), -1 on allocation failure. */
static int normalize_span(const char *s, size_t n, int clean, char **out) {
    decimal d;
    *out = NULL;
    int rc = read_number(s, n, clean, &d);
    if (rc == 0) {
        rc = format_decimal(&d, out);
        if (rc == 1) g4_fail("gsm8k: number out of range: \"%.*s\"", (int)(n < 60 ? n : 60), s);
    }
    free(d.digits);
    return rc;
}

char *g4_gsm8k_normalize(const char *s) {
    char *out = NULL;
    if (s) normalize_span(s, strlen(s), 1, &out);
    return out;
}

/* The text after the last "####" as str.split("####")[-1] finds it: occurrences are counted
 * left to right without overlap, so "#####5" leaves "#5", not "5". */
static const char *after_last_hashes(const char *s, size_t n) {
    const char *tail = s;
    for (size_t at = find_bytes(s, n, 0, "####", 4); at < n; at = find_bytes(s, n, at + 4, "####", 4))
        tail = s + at + 4;
    return tail;
}

char *g4_gsm8k_gold(const char *solution) {
    char *out = NULL;
    if (!solution) return NULL;
    size_t n = strlen(solution);
    const char *tail = after_last_hashes(solution, n);
    normalize_span(tail, n - (size_t)(tail - solution), 0, &out);
    return out;
}

int g4_gsm8k_is_correct(const char *pred, const char *gold) {
    if (!pred || !gold) return 0;
    decimal a = {0}, b = {0};
    int ok = read_number(pred, strlen(pred), 1, &a) == 0 && read_number(gold, strlen(gold), 1, &b) == 0;
    int equal = ok && a.neg == b.neg && a.n == b.n && a.exp == b.exp && memcmp(a.digits, b.digits, a.n) == 0;
    free(a.digits);
    free(b.digits);
    return equal;
}

/* ------------------------------------------------------------------------- regexes ---- */

/* MARKERS of the reference, compiled caseless: \boxed{ | #### | final answer\s*(?:is)?\s*:? |
 * the answer is\s*:? | answer\s*: with Python's \s and re.I letter sets written out. */
static const char MARKER_PATTERN[] =
    "\\\\boxed\\{"
    "|####"
    "|f" PY_I "nal an" PY_S "wer" PY_SPACE "*(?:" PY_I PY_S ")?" PY_SPACE "*:?"
    "|the an" PY_S "wer " PY_I PY_S PY_SPACE "*:?"
    "|an" PY_S "wer" PY_SPACE "*:";

/* NUM of the reference. Python's \w is exactly [\p{L}\p{N}_] and \d is \p{Nd} (Unicode 14). */
static const char NUMBER_PATTERN[] =
    "(?<![\\p{L}\\p{N}_.)\\]])-?(?:(?:\\p{Nd}{1,3}(?:,\\p{Nd}{3})+|\\p{Nd}+)(?:\\.\\p{Nd}+)?|\\.\\p{Nd}+)";

struct g4_gsm8k_extractor {
    pcre2_code *marker;
    pcre2_code *number;
};

static int compile_pattern(const char *pattern, uint32_t options, pcre2_code **out) {
    int code;
    PCRE2_SIZE offset;
    *out = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, options | PCRE2_UTF, &code, &offset, NULL);
    if (*out) return 0;
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(code, msg, sizeof msg);
    return g4_fail("gsm8k: regex does not compile at offset %zu: %s", (size_t)offset, (const char *)msg);
}

int g4_gsm8k_extractor_open(g4_gsm8k_extractor **out) {
    *out = NULL;
    g4_gsm8k_extractor *ex = calloc(1, sizeof *ex);
    if (!ex) return g4_fail("gsm8k: out of memory");
    if (compile_pattern(MARKER_PATTERN, PCRE2_CASELESS, &ex->marker) ||
        compile_pattern(NUMBER_PATTERN, 0, &ex->number)) {
        g4_gsm8k_extractor_close(ex);
        return -1;
    }
    *out = ex;
    return 0;
}

void g4_gsm8k_extractor_close(g4_gsm8k_extractor *ex) {
    if (!ex) return;
    pcre2_code_free(ex->marker);
    pcre2_code_free(ex->number);
    free(ex);
}

/* Per-call matching state; the compiled patterns stay shared and read-only. */
typedef struct {
    pcre2_match_data *md;
    pcre2_match_context *mc;
} matcher;

/* Both patterns match in time linear in the text, but PCRE2 keeps a backtracking frame
 * (~170 bytes) per repeat of the comma group, and its default heap limit is 20 GB. A cap keeps
 * memory bounded; only a single number of some 400k comma groups (1.5 MB) reaches it, and
 * that reply then fails with an error instead of exhausting memory. */
#define MATCH_HEAP_LIMIT_KIB (64u * 1024u)

static int matcher_open(matcher *m) {
    m->md = pcre2_match_data_create(1, NULL);
    m->mc = pcre2_match_context_create(NULL);
    if (!m->md || !m->mc) return g4_fail("gsm8k: out of memory");
    pcre2_set_heap_limit(m->mc, MATCH_HEAP_LIMIT_KIB);
    return 0;
}

static void matcher_close(matcher *m) {
    pcre2_match_data_free(m->md);
    pcre2_match_context_free(m->mc);
}

/* One search of s[0, n) from offset `from`. The subject is only ever a whole buffer or the
 * marker's line, both valid UTF-8 starting on a character (sanitize_utf8), so the per-call
 * UTF check, which would make repeated searches quadratic, is skipped. Returns 1 with the
 * match in [*start, *end), 0 for none, -1 on an engine error (resource limits). */
static int search(const pcre2_code *re, const matcher *m, const char *s, size_t n, size_t from, size_t *start,
                  size_t *end) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, m->md, m->mc);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return g4_fail("gsm8k: regex match failed on a %zu-byte reply: %s", n, (const char *)msg);
    }
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
    *start = ov[0];
    *end = ov[1];
    return 1;
}

/* Last of the non-overlapping matches found left to right, as the reference's finditer and
 * findall loops see them. Neither pattern matches the empty string, so each round advances. */
static int search_last(const pcre2_code *re, const matcher *m, const char *s, size_t n, size_t *start,
                       size_t *end) {
    size_t from = 0, ms, me;
    int found = 0, rc;
    while ((rc = search(re, m, s, n, from, &ms, &me)) == 1 && me > from) {
        found = 1;
        *start = ms;
        *end = me;
        from = me;
    }
    return rc < 0 ? -1 : found;
}

/* Length of the text after a marker that the reference searches: up to the first '}' for a
 * match starting "\boxed" (compared case-sensitively, as its startswith is), else to the end
 * of the line. */
static size_t marker_scope(const char *marker, size_t marker_len, const char *tail, size_t tail_len) {
    int boxed = marker_len >= 6 && memcmp(marker, "\\boxed", 6) == 0;
    const char *stop = memchr(tail, boxed ? '}' : '\n', tail_len);
    return stop ? (size_t)(stop - tail) : tail_len;
}

/* Records the answer found at s[0, n). A number that normalize_number cannot print (outside
 * the decimal context's range, where the reference raises) leaves no value, keeping status. */
static int set_answer(const char *s, size_t n, g4_gsm8k_status status, g4_gsm8k_answer *out) {
    out->status = status;
    return normalize_span(s, n, 0, &out->value) < 0 ? -1 : 0;
}

/* Steps 3 and 4 of §5 on the cleaned, thought-free text t[0, n). */
static int find_answer(const g4_gsm8k_extractor *ex, const matcher *m, const char *t, size_t n,
                       g4_gsm8k_answer *out) {
    size_t ms, me, ns, ne;
    int rc = search_last(ex->marker, m, t, n, &ms, &me);
    if (rc < 0) return -1;
    if (rc == 1) {
        const char *tail = t + me;
        size_t scope = marker_scope(t + ms, me - ms, tail, n - me);
        rc = search(ex->number, m, tail, scope, 0, &ns, &ne);
        if (rc < 0) return -1;
        if (rc == 1) return set_answer(tail + ns, ne - ns, G4_GSM8K_MARKER, out);
    }
    rc = search_last(ex->number, m, t, n, &ns, &ne);
    if (rc < 0) return -1;
    if (rc == 1) return set_answer(t + ns, ne - ns, G4_GSM8K_LAST_NUMBER, out);
    out->status = G4_GSM8K_NO_NUMBER;
    return 0;
}

int g4_gsm8k_extract(const g4_gsm8k_extractor *ex, const char *text, size_t len, g4_gsm8k_answer *out) {
    out->value = NULL;
    out->status = G4_GSM8K_NO_NUMBER;
    size_t n = 0, vn = 0;
    char *vis = NULL, *clean = sanitize_utf8(text ? text : "", text ? len : 0, &n);
    if (!clean) return -1;
    int rc = strip_thoughts(clean, n, &vis, &vn);
    free(clean);
    if (rc < 0) return -1;
    if (rc == 1) {
        out->status = G4_GSM8K_THOUGHT_UNCLOSED;
        return 0;
    }
    vn = prep(vis, vn);
    matcher m;
    rc = matcher_open(&m);
    if (rc == 0) rc = find_answer(ex, &m, vis, vn, out);
    matcher_close(&m);
    free(vis);
    if (rc < 0) g4_gsm8k_answer_free(out);
    return rc;
}

void g4_gsm8k_answer_free(g4_gsm8k_answer *a) {
    free(a->value);
    a->value = NULL;
}

const char *g4_gsm8k_status_name(g4_gsm8k_status s) {
    switch (s) {
    case G4_GSM8K_MARKER: return "marker";
    case G4_GSM8K_LAST_NUMBER: return "last_number";
    case G4_GSM8K_NO_NUMBER: return "no_number";
    case G4_GSM8K_THOUGHT_UNCLOSED: return "thought_unclosed";
    }
    return "unknown";
}

/* ---------------------------------------------------------------------------- prompt ---- */

static const char PROMPT_HEAD[] =
    "Solve the following math problem. Reason step by step, and end your reply with a final line of the "
    "form \"The final answer is N\", where N is just the number.\n\nProblem: ";

char *g4_gsm8k_prompt(const char *question) {
    if (!question) question = "";
    size_t head = sizeof PROMPT_HEAD - 1, q = strlen(question);
    char *s = malloc(head + q + 1);
    if (!s) {
        g4_fail("gsm8k: out of memory for a prompt");
        return NULL;
    }
    memcpy(s, PROMPT_HEAD, head);
    memcpy(s + head, question, q + 1);
    return s;
}
