/* The constraint engine (src/generate/grammar.c, json_schema.c) against references nobody here
 * wrote: llama.cpp's example grammars (json.gbnf, arithmetic.gbnf, list.gbnf, from their
 * documented text) on hand-picked strings; the official JSON-Schema-Test-Suite (draft 2020-12):
 * for each schema the compiler accepts, every valid instance (compact and pretty-printed) is
 * accepted and every invalid one rejected, except the deviations listed below with their reasons;
 * and token masks on the real Gemma 4 tokenizer against a brute-force pass over the whole
 * vocabulary. `test_grammar --bench` prints the mask and compile times (README figures). */
#include <dirent.h>
#include <stdint.h>
#include <time.h>
#include <cjson/cJSON.h>
#include "g4.h"
#include "util/file.h"
#include "testutil.h"

static int accepts(const g4_grammar *g, const char *s, size_t n) {
    g4_grammar_state *st = g4_grammar_start(g);
    int ok = st && g4_grammar_accept_bytes(st, s, n) == 0 && g4_grammar_is_complete(st);
    g4_grammar_state_free(st);
    return ok;
}

static void expect(const g4_grammar *g, const char *what, const char *s, int want) {
    CHECK(accepts(g, s, strlen(s)) == want, "%s: \"%s\" should be %s", what, s, want ? "accepted" : "rejected");
}

/* llama.cpp's grammars/json.gbnf, arithmetic.gbnf and list.gbnf (their documented text). */
static const char JSON_GBNF[] =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
    "  )* \"\\\"\" ws\n"
    "\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "\n"
    "# Optional space: by convention, applied in this grammar after literal chars when allowed\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const char ARITH_GBNF[] =
    "root  ::= (expr \"=\" ws term \"\\n\")+\n"
    "expr  ::= term ([-+*/] term)*\n"
    "term  ::= ident | num | \"(\" ws expr \")\" ws\n"
    "ident ::= [a-z] [a-z0-9_]* ws\n"
    "num   ::= [0-9]+ ws\n"
    "ws    ::= [ \\t\\n]*\n";

static const char LIST_GBNF[] =
    "root ::= item+\n"
    "\n"
    "# Excludes various line break characters\n"
    "item ::= \"- \" [^\\r\\n\\x0b\\x0c\\x85\\u2028\\u2029]+ \"\\n\"\n";

static void test_examples(void) {
    g4_grammar *g = g4_grammar_compile(JSON_GBNF, strlen(JSON_GBNF));
    CHECK(g != NULL, "json.gbnf: %s", g4_last_error());
    if (g) {
        expect(g, "json", "{}", 1);
        expect(g, "json", "{\"a\": [1, 2.5e3, \"x\\u00e9\", true, null], \"b\": {\"c\": -0.5}}", 1);
        expect(g, "json", "{\n  \"k\": \"caf\xC3\xA9\"\n}", 1);
        expect(g, "json", "[1]", 0);           /* root is an object */
        expect(g, "json", "{\"a\" 1}", 0);     /* no colon */
        expect(g, "json", "{\"a\": 01}", 0);   /* leading zero: [0-9] | [1-9][0-9]*, "0" then "1" */
        expect(g, "json", "{\"a\": \"\x01\"}", 0);
        expect(g, "json", "{\"a\": \"\\q\"}", 0);
        expect(g, "json", "{\"a\": 1,}", 0);
        expect(g, "json", "{\"a\": \"\xC3\"}", 0); /* a cut UTF-8 character */
        /* a character split across two calls, as tokens split it */
        g4_grammar_state *st = g4_grammar_start(g);
        CHECK(st && g4_grammar_accept_bytes(st, "{\"k\": \"\xE2\x82", 9) == 0, "split UTF-8: first half");
        CHECK(st && !g4_grammar_is_complete(st) && g4_grammar_can_continue(st), "split UTF-8: incomplete");
        CHECK(st && g4_grammar_accept_bytes(st, "\xFF", 1) != 0, "split UTF-8: a bad continuation accepted");
        CHECK(st && g4_grammar_accept_bytes(st, "\xAC\"}", 3) == 0 && g4_grammar_is_complete(st), "split UTF-8: rest");
        g4_grammar_state_free(st);
        /* a rejected call leaves the state as it was, even when its first bytes fit */
        st = g4_grammar_start(g);
        CHECK(st && g4_grammar_accept_bytes(st, "{\"k\"x", 5) != 0, "a bad byte after good ones accepted");
        CHECK(st && g4_grammar_accept_bytes(st, "{}", 2) == 0 && g4_grammar_is_complete(st), "a rejected call moved the state");
        g4_grammar_state_free(st);
    }
    g4_grammar_free(g);
    g = g4_grammar_compile(ARITH_GBNF, strlen(ARITH_GBNF));
    CHECK(g != NULL, "arithmetic.gbnf: %s", g4_last_error());
    if (g) {
        expect(g, "arith", "x = 1\n", 1);
        expect(g, "arith", "(a +b2) *3 = c\nd=4\n", 1);
        expect(g, "arith", "x = 1", 0);
        expect(g, "arith", "1 + = 2\n", 0);
        expect(g, "arith", "X = 1\n", 0);
    }
    g4_grammar_free(g);
    g = g4_grammar_compile(LIST_GBNF, strlen(LIST_GBNF));
    CHECK(g != NULL, "list.gbnf: %s", g4_last_error());
    if (g) {
        expect(g, "list", "- one\n- two \xE2\x9C\x93\n", 1);
        expect(g, "list", "- one\n", 1);
        expect(g, "list", "- \n", 0);
        expect(g, "list", "- a\xE2\x80\xA8" "b\n", 0); /* U+2028 excluded */
        expect(g, "list", "- a\xC2\x85\n", 0);          /* U+0085 excluded */
        expect(g, "list", "* one\n", 0);
    }
    g4_grammar_free(g);
}

static void expect_error(const char *gbnf, const char *want) {
    g4_grammar *g = g4_grammar_compile(gbnf, strlen(gbnf));
    CHECK(g == NULL && strstr(g4_last_error(), want), "grammar \"%s\": error \"%s\" lacks \"%s\"", gbnf,
          g ? "(compiled)" : g4_last_error(), want);
    g4_grammar_free(g);
}

static void test_dialect(void) {
    expect_error("root ::= \"a\" foo\n", "line 1 column 14: undefined rule: foo");
    expect_error("root ::= \"a\"\nx ::= [ab\n", "line 2 column 7: unterminated character class");
    expect_error("root ::= \"a\" )\n", "line 1 column 14");
    expect_error("root ::= root \"a\" | \"b\"\n", "rule 'root' is left-recursive");
    expect_error("root ::= a\na ::= b? a \"x\"\nb ::= \"y\"\n", "rule 'a' is left-recursive");
    expect_error("root ::= (\"a\"?)*\n", "left-recursive");
    expect_error("root ::= \"a\"{3,2}\n", "n < m");
    expect_error("root ::= \"a\"{20000}\n", "over 10000");
    expect_error("x ::= \"a\"\n", "no rule named 'root'");
    expect_error("root ::= \"\\q\"\n", "unknown escape");
    expect_error("root ::= \"a\"\nroot ::= \"b\"\n", "defined twice");
    /* repetition counts, classes, negation, escapes, `.` */
    const char *dia = "root ::= [a-c]{2,3} \"-\" [^a-z\\u00e9]+ . \"\\x41\\t\" # comment\n";
    g4_grammar *g = g4_grammar_compile(dia, strlen(dia));
    CHECK(g != NULL, "dialect grammar: %s", g4_last_error());
    if (g) {
        expect(g, "rep", "ab-XY\xE2\x82\xAC" "A\t", 1);
        expect(g, "rep", "abc-1!A\t", 1);
        expect(g, "rep", "a-1!A\t", 0);    /* {2,3}: one is too few */
        expect(g, "rep", "abca-1!A\t", 0); /* four too many */
        expect(g, "rep", "ab-\xC3\xA9!A\t", 0); /* negated U+00E9 */
        expect(g, "rep", "ab-x!A\t", 0);
    }
    g4_grammar_free(g);
    /* an ambiguous grammar hits the stack limit with an error, not memory without end */
    const char *amb = "root ::= x*\nx ::= \"a\" | \"a\" \"a\" | y\ny ::= \"a\" x \"b\"? \n";
    g = g4_grammar_compile(amb, strlen(amb));
    CHECK(g != NULL, "ambiguous grammar: %s", g4_last_error());
    if (g) {
        g4_grammar_state *st = g4_grammar_start(g);
        char as[3000];
        memset(as, 'a', sizeof as);
        int rc = st ? g4_grammar_accept_bytes(st, as, sizeof as) : 0;
        CHECK(rc == 0 || strstr(g4_last_error(), "parse stacks"), "ambiguous: %s", g4_last_error());
        g4_grammar_state_free(st);
    }
    g4_grammar_free(g);
    /* JSON mode, regex and choice */
    g = g4_grammar_json(1);
    CHECK(g != NULL, "json mode: %s", g4_last_error());
    if (g) {
        expect(g, "json mode", "{\"a\": [1, {}], \"b\": null}", 1);
        expect(g, "json mode", "[1]", 0);
        char ws[64] = "{";
        memset(ws + 1, ' ', 40);
        strcpy(ws + 41, "}");
        expect(g, "json mode", ws, 0); /* whitespace is bounded */
    }
    g4_grammar_free(g);
    g = g4_grammar_from_regex("^(\\d{3})-[A-Z]{2,}(x|yz)?$", 25);
    CHECK(g != NULL, "regex: %s", g4_last_error());
    if (g) {
        expect(g, "regex", "123-AB", 1);
        expect(g, "regex", "123-ABCyz", 1);
        expect(g, "regex", "123-A", 0);
        expect(g, "regex", "12-AB", 0);
    }
    g4_grammar_free(g);
    CHECK(g4_grammar_from_regex("(a)\\1", 5) == NULL && strstr(g4_last_error(), "backreference"), "backreference: %s", g4_last_error());
    CHECK(g4_grammar_from_regex("(?=a)", 5) == NULL && strstr(g4_last_error(), "lookaround"), "lookaround: %s", g4_last_error());
    /* a string that is not UTF-8 could never be matched (fuzz_grammar's first finding) */
    const char *bad_utf8[] = {"ok", "a\xFF"};
    CHECK(g4_grammar_from_choice(bad_utf8, 2) == NULL && strstr(g4_last_error(), "string 1 is not valid UTF-8"),
          "choice of invalid UTF-8: %s", g4_last_error());
    CHECK(g4_grammar_from_json_schema("{\"const\":\"\xC3\"}", 13) == NULL && strstr(g4_last_error(), "not valid UTF-8"),
          "schema of invalid UTF-8: %s", g4_last_error());
    const char *ch[] = {"yes", "no", "n/a"};
    g = g4_grammar_from_choice(ch, 3);
    CHECK(g != NULL, "choice: %s", g4_last_error());
    if (g) {
        expect(g, "choice", "n/a", 1);
        expect(g, "choice", "no", 1);
        expect(g, "choice", "n", 0);
        expect(g, "choice", "yes ", 0);
    }
    g4_grammar_free(g);
}

static g4_grammar *schema(const char *s) { return g4_grammar_from_json_schema(s, strlen(s)); }

static void expect_refused(const char *s, const char *want) {
    g4_grammar *g = schema(s);
    CHECK(g == NULL && strstr(g4_last_error(), want), "schema %s: error \"%s\" lacks \"%s\"", s, g ? "(compiled)" : g4_last_error(), want);
    g4_grammar_free(g);
}

static void test_schema_units(void) {
    g4_grammar *g = schema("{\"type\":\"integer\",\"minimum\":-15,\"exclusiveMaximum\":120}");
    CHECK(g != NULL, "int range: %s", g4_last_error());
    if (g) {
        char buf[16];
        int bad = 0;
        for (int i = -200; i <= 200; i++) {
            snprintf(buf, sizeof buf, "%d", i);
            bad += accepts(g, buf, strlen(buf)) != (i >= -15 && i < 120);
        }
        CHECK(bad == 0, "integer range [-15, 120): %d of 401 wrong", bad);
        expect(g, "int", "1.0", 0); /* a known deviation from JSON Schema: integers are written without a fraction */
        expect(g, "int", "007", 0);
    }
    g4_grammar_free(g);
    g = schema("{\"type\":\"integer\",\"minimum\":1000,\"maximum\":23456}");
    if (g) {
        int bad = 0;
        char buf[16];
        for (int i = 0; i <= 30000; i += 7) {
            snprintf(buf, sizeof buf, "%d", i);
            bad += accepts(g, buf, strlen(buf)) != (i >= 1000 && i <= 23456);
        }
        CHECK(bad == 0, "integer range [1000, 23456]: %d wrong", bad);
    }
    CHECK(g != NULL, "int range 2: %s", g4_last_error());
    g4_grammar_free(g);
    g = schema("{\"type\":\"integer\",\"minimum\":123,\"maximum\":4567}");
    if (g) {
        int bad = 0;
        char buf[16];
        for (int i = 0; i <= 5000; i++) {
            snprintf(buf, sizeof buf, "%d", i);
            bad += accepts(g, buf, strlen(buf)) != (i >= 123 && i <= 4567);
        }
        CHECK(bad == 0, "integer range [123, 4567]: %d wrong", bad);
    }
    CHECK(g != NULL, "int range 3: %s", g4_last_error());
    g4_grammar_free(g);
    g = schema("{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date-time\"},"
               "\"u\":{\"type\":\"string\",\"format\":\"uuid\"},\"p\":{\"type\":\"string\",\"pattern\":\"^[a-z]+\\\\d?$\"}},"
               "\"required\":[\"d\"],\"additionalProperties\":false}");
    CHECK(g != NULL, "formats: %s", g4_last_error());
    if (g) {
        expect(g, "formats", "{\"d\":\"2024-02-29T12:30:00Z\",\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"p\":\"abc1\"}", 1);
        expect(g, "formats", "{\"d\":\"2024-13-29T12:30:00Z\"}", 0);
        expect(g, "formats", "{\"d\":\"2024-02-29T12:30:00Z\",\"p\":\"abc12\"}", 0);
        expect(g, "formats", "{\"u\":\"123e4567-e89b-12d3-a456-426614174000\"}", 0); /* d required */
        expect(g, "formats", "{\"d\":\"2024-02-29T12:30:00+01:00\",\"x\":1}", 0);      /* no additional */
    }
    g4_grammar_free(g);
    expect_refused("{\"type\":\"string\",\"format\":\"hostname\"}", "format: 'hostname' is not supported");
    expect_refused("{\"properties\":{\"a\":{\"multipleOf\":2}}}", "keyword 'multipleOf' is not supported at /properties/a");
    expect_refused("{\"oneOf\":[{\"type\":\"number\"},{\"type\":\"integer\"}]}", "oneOf: alternatives that may overlap");
    expect_refused("{\"$ref\":\"http://x/y.json\"}", "$ref: only references inside the schema");
    expect_refused("{\"type\":\"number\",\"minimum\":1.5}", "only integers can be bounded");
    expect_refused("{\"type\":\"string\",\"pattern\":\"(?<n>a)\"}", "pattern: lookaround");
    expect_refused("{\"type\":\"array\",\"maxItems\":100000}", "maxItems: not a count up to 4096");
    expect_refused("{\"$ref\":\"#\"}", "left-recursive");
    /* recursion through $defs */
    g = schema("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
               "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"],"
               "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}");
    CHECK(g != NULL, "recursive schema: %s", g4_last_error());
    if (g) {
        expect(g, "tree", "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[]}]}", 1);
        expect(g, "tree", "{\"v\":1,\"kids\":[{\"kids\":[]}]}", 0);
    }
    g4_grammar_free(g);
}

/* ---- JSON-Schema-Test-Suite ------------------------------------------------------------------- */

/* Known deviations: (file, schema description, test description) whose result differs from the
 * suite's, with the reason. The run fails on a deviation not listed and on a listed one that no
 * longer happens, so the list stays exact. */
static const char *const DEVIATIONS[][4] = {
#include "test_grammar_deviations.h"
    {NULL, NULL, NULL, NULL}};

typedef struct {
    int files, schemas, accepted, instances, passed, deviations, unexpected;
    char refused_kw[64][48];
    int refused_n[64], n_kw;
    int *seen; /* per DEVIATIONS entry */
} suite_report;

static int deviation_index(const char *file, const char *schema_desc, const char *test_desc) {
    for (int i = 0; DEVIATIONS[i][0]; i++)
        if (strcmp(DEVIATIONS[i][0], file) == 0 && strcmp(DEVIATIONS[i][1], schema_desc) == 0 &&
            strcmp(DEVIATIONS[i][2], test_desc) == 0)
            return i;
    return -1;
}

static void count_refusal(suite_report *r, const char *err) {
    /* "json schema: KEYWORD: ..." or "json schema: keyword 'X' is not supported ..." */
    char kw[48] = "other";
    const char *p = strstr(err, "json schema: ");
    if (p) {
        p += 13;
        if (strncmp(p, "keyword '", 9) == 0) p += 9;
        size_t n = strcspn(p, ":' ");
        if (n && n < sizeof kw) memcpy(kw, p, n), kw[n] = 0;
    }
    for (int i = 0; i < r->n_kw; i++)
        if (strcmp(r->refused_kw[i], kw) == 0) {
            r->refused_n[i]++;
            return;
        }
    if (r->n_kw < 64) strcpy(r->refused_kw[r->n_kw], kw), r->refused_n[r->n_kw++] = 1;
}

typedef struct {
    char *p;
    size_t n, cap;
} tbuf;

static void tput(tbuf *b, const char *s) {
    size_t k = strlen(s);
    if (b->n + k + 1 > b->cap) {
        b->cap = (b->n + k + 1) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, k + 1);
    b->n += k;
}

static void tindent(tbuf *b, int pretty, int depth) {
    if (!pretty) return;
    tput(b, "\n");
    for (int i = 0; i < depth; i++) tput(b, "  ");
}

/* A JSON value's text, compact or pretty (2-space indents): numbers exact (cJSON prints 15
 * significant digits, which would change large integers), strings as cJSON escapes them. */
static void serialize(tbuf *b, const cJSON *v, int pretty, int depth) {
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        int obj = cJSON_IsObject(v);
        tput(b, obj ? "{" : "[");
        for (const cJSON *e = v->child; e; e = e->next) {
            if (e != v->child) tput(b, ",");
            tindent(b, pretty, depth + 1);
            if (obj) {
                cJSON *key = cJSON_CreateString(e->string);
                char *ks = cJSON_PrintUnformatted(key);
                tput(b, ks);
                tput(b, pretty ? ": " : ":");
                free(ks);
                cJSON_Delete(key);
            }
            serialize(b, e, pretty, depth + 1);
        }
        if (v->child) tindent(b, pretty, depth);
        tput(b, obj ? "}" : "]");
    } else if (cJSON_IsNumber(v)) {
        char t[64];
        double x = v->valuedouble;
        if (x == floor(x) && fabs(x) < 1e17) snprintf(t, sizeof t, "%.0f", x);
        else snprintf(t, sizeof t, "%.17g", x);
        tput(b, t);
    } else {
        char *t = cJSON_PrintUnformatted(v);
        tput(b, t);
        free(t);
    }
}

static char *json_text(const cJSON *v, int pretty) {
    tbuf b = {0};
    tput(&b, "");
    serialize(&b, v, pretty, 0);
    return b.p;
}

static void run_suite_file(suite_report *r, const char *dir, const char *file) {
    char path[2100];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    cJSON *cases = read_json(path);
    r->files++;
    for (const cJSON *cs = cases->child; cs; cs = cs->next) {
        const cJSON *sch = cJSON_GetObjectItem(cs, "schema"), *tests = cJSON_GetObjectItem(cs, "tests");
        const char *sdesc = cJSON_GetStringValue(cJSON_GetObjectItem(cs, "description"));
        char *stext = json_text(sch, 0);
        r->schemas++;
        g4_grammar *g = g4_grammar_from_json_schema(stext, strlen(stext));
        free(stext);
        if (!g) {
            count_refusal(r, g4_last_error());
            continue;
        }
        r->accepted++;
        for (const cJSON *t = tests->child; t; t = t->next) {
            const cJSON *data = cJSON_GetObjectItem(t, "data");
            const char *tdesc = cJSON_GetStringValue(cJSON_GetObjectItem(t, "description"));
            int valid = cJSON_IsTrue(cJSON_GetObjectItem(t, "valid"));
            char *compact = json_text(data, 0), *pretty = json_text(data, 1);
            int ok = accepts(g, compact, strlen(compact)) == valid && accepts(g, pretty, strlen(pretty)) == valid;
            r->instances++;
            int dev = deviation_index(file, sdesc, tdesc);
            if (ok) {
                r->passed++;
                CHECK(dev < 0, "%s / %s / %s: listed as a deviation but passes", file, sdesc, tdesc);
            } else if (dev >= 0) {
                r->deviations++;
                r->seen[dev] = 1;
            } else {
                r->unexpected++;
                CHECK(0, "%s / %s / %s: %s instance %s %s", file, sdesc, tdesc, valid ? "valid" : "invalid", compact,
                      valid ? "rejected" : "accepted");
            }
            free(compact), free(pretty);
        }
        g4_grammar_free(g);
    }
    cJSON_Delete(cases);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void test_schema_suite(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/data/json-schema-test-suite/draft2020-12", check_shared_dir());
    DIR *d = opendir(dir);
    CHECK(d != NULL, "cannot open %s", dir);
    if (!d) return;
    char *names[256];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < 256;) {
        size_t l = strlen(e->d_name);
        if (l > 5 && strcmp(e->d_name + l - 5, ".json") == 0) {
            names[n] = malloc(l + 1);
            memcpy(names[n++], e->d_name, l + 1);
        }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    int n_dev = 0;
    while (DEVIATIONS[n_dev][0]) n_dev++;
    suite_report r = {0};
    r.seen = calloc((size_t)n_dev + 1, sizeof *r.seen);
    for (int i = 0; i < n; i++) run_suite_file(&r, dir, names[i]), free(names[i]);
    printf("JSON-Schema-Test-Suite draft2020-12: %d files, %d schemas, %d compiled, %d refused\n", r.files, r.schemas,
           r.accepted, r.schemas - r.accepted);
    printf("  refused by keyword:");
    for (int i = 0; i < r.n_kw; i++) printf(" %s %d%s", r.refused_kw[i], r.refused_n[i], i + 1 < r.n_kw ? "," : "\n");
    printf("  instances of compiled schemas: %d, agreeing with the suite: %d (%.1f %%), known deviations: %d, "
           "unexpected: %d\n", r.instances, r.passed, r.instances ? 100.0 * r.passed / r.instances : 0.0, r.deviations,
           r.unexpected);
    CHECK(r.files >= 40 && r.accepted >= 120, "suite: only %d files, %d schemas compiled", r.files, r.accepted);
    for (int i = 0; i < n_dev; i++)
        CHECK(r.seen[i], "deviation %s / %s / %s no longer happens: remove it", DEVIATIONS[i][0], DEVIATIONS[i][1],
              DEVIATIONS[i][2]);
    free(r.seen);
}

/* ---- token masks ------------------------------------------------------------------------------ */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* The mask against accepting each token on a copy of the state: all tokens (brute) or a sample. */
static void check_mask_state(const g4_grammar_vocab *v, g4_grammar_state *st, const char *what, int brute) {
    size_t V = g4_grammar_vocab_size(v);
    uint32_t *mask = calloc((V + 31) / 32, sizeof *mask);
    long n = g4_grammar_mask(v, st, NULL, 0, mask);
    CHECK(n >= 0, "%s: mask: %s", what, g4_last_error());
    long wrong = 0, allowed = 0;
    for (size_t id = 0; id < V; id++) {
        int bit = (mask[id >> 5] >> (id & 31)) & 1;
        allowed += bit;
        if (!brute && !bit && rnd() % 64) continue; /* every allowed token, 1/64 of the others */
        g4_grammar_state *c = g4_grammar_state_copy(st);
        int ok = g4_grammar_accept_token(v, c, (int32_t)id) == 0;
        g4_grammar_state_free(c);
        if (ok != bit) {
            if (wrong++ < 3) {
                size_t tl;
                const unsigned char *tb = g4_grammar_vocab_token(v, (int32_t)id, &tl);
                fprintf(stderr, "  %s: token %zu (%.*s) mask %d, accepted %d\n", what, id, (int)tl, (const char *)tb, bit, ok);
            }
        }
    }
    CHECK(wrong == 0 && allowed == n, "%s: %ld tokens where the mask and the recognizer disagree (%ld allowed)", what, wrong, n);
    /* a copy keeps the mask cache and gives the same mask */
    g4_grammar_state *c = g4_grammar_state_copy(st);
    uint32_t *mask2 = calloc((V + 31) / 32, sizeof *mask2);
    CHECK(c && g4_grammar_mask(v, c, NULL, 0, mask2) == n && memcmp(mask, mask2, (V + 31) / 32 * sizeof *mask) == 0,
          "%s: the state's copy gives another mask", what);
    g4_grammar_state_free(c);
    free(mask2);
    free(mask);
}

static const char SMALL_SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\",\"minimum\":0,"
    "\"maximum\":150},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":4}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";

/* A 40-property object: 24 scalars of every kind and 4 nested objects of 4 properties. */
static char *large_schema(void) {
    static char buf[16384];
    size_t n = 0;
    n += (size_t)snprintf(buf + n, sizeof buf - n, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 36; i++) {
        const char *t[] = {"{\"type\":\"string\"}", "{\"type\":\"integer\",\"minimum\":0,\"maximum\":9999}",
                           "{\"type\":\"boolean\"}", "{\"enum\":[\"red\",\"green\",\"blue\"]}", "{\"type\":\"number\"}",
                           "{\"type\":\"array\",\"items\":{\"type\":\"string\"}}", "{\"type\":\"string\",\"format\":\"date\"}",
                           "{\"type\":[\"string\",\"null\"]}", "{\"type\":\"string\",\"maxLength\":20}"};
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s\"field_%02d\":%s", i ? "," : "", i, t[i % 9]);
    }
    for (int i = 0; i < 4; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n,
                              ",\"group_%d\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},"
                              "\"label\":{\"type\":\"string\"},\"score\":{\"type\":\"number\"},\"ok\":{\"type\":\"boolean\"}},"
                              "\"required\":[\"id\",\"label\"],\"additionalProperties\":false}",
                              i);
    n += (size_t)snprintf(buf + n, sizeof buf - n, "},\"required\":[\"field_00\",\"field_01\",\"group_0\"],\"additionalProperties\":false}");
    return buf;
}

static char *large_document(void) {
    static char buf[16384];
    size_t n = 0;
    n += (size_t)snprintf(buf + n, sizeof buf - n, "{");
    for (int i = 0; i < 36; i++) {
        const char *v[] = {"\"The quick brown fox jumps over the lazy dog\"", "4711", "true", "\"green\"", "-12.5e3",
                           "[\"alpha\", \"beta\", \"gamma\"]", "\"2024-06-30\"", "null", "\"short text\""};
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s\"field_%02d\": %s", i ? ", " : "", i, v[i % 9]);
    }
    for (int i = 0; i < 4; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, ", \"group_%d\": {\"id\": %d, \"label\": \"caf\xC3\xA9 \xE2\x82\xAC%d\", \"score\": 0.%d, \"ok\": false}", i, i * 17, i, i + 1);
    snprintf(buf + n, sizeof buf - n, "}");
    return buf;
}

static g4_tokenizer *load_gemma4(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/data/tokenizers/gemma4/tokenizer.json", check_shared_dir());
    g4_tokenizer *tok = g4_tokenizer_load(path);
    CHECK(tok != NULL, "%s: %s", path, g4_last_error());
    return tok;
}

static void test_masks(g4_tokenizer *tok, const g4_grammar_vocab *v) {
    /* byte-fallback tokens stand for their byte */
    int32_t b0 = g4_tokenizer_piece_to_id(tok, "<0xE2>");
    size_t bl;
    const unsigned char *bb = g4_grammar_vocab_token(v, b0, &bl);
    CHECK(b0 >= 0 && bb && bl == 1 && bb[0] == 0xE2, "<0xE2> is not the byte 0xE2");
    struct {
        const char *name;
        g4_grammar *g;
        const char *doc;
    } cases[] = {
        {"small schema", schema(SMALL_SCHEMA), "{\"name\": \"Zo\xC3\xAB \xE2\x82\xAC\", \"age\": 42, \"tags\": [\"a b\", \"c\"]}"},
        {"large schema", schema(large_schema()), large_document()},
        {"json.gbnf", g4_grammar_compile(JSON_GBNF, strlen(JSON_GBNF)), "{\"k\": [1, -2.5, \"\xE6\x97\xA5\xE6\x9C\xAC\"]}"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        CHECK(cases[c].g != NULL, "%s: %s", cases[c].name, g4_last_error());
        if (!cases[c].g) continue;
        CHECK(accepts(cases[c].g, cases[c].doc, strlen(cases[c].doc)), "%s: its document is rejected", cases[c].name);
        /* walk the document's tokens; a brute-force check at the start and at three random
         * positions, a sampled one at every 5th */
        int32_t *ids;
        size_t n;
        CHECK(g4_tokenizer_encode(tok, cases[c].doc, strlen(cases[c].doc), 0, &ids, &n) == 0, "encode");
        g4_grammar_state *st = g4_grammar_start(cases[c].g);
        size_t pick[3] = {rnd() % n, rnd() % n, rnd() % n};
        for (size_t i = 0; i <= n; i++) {
            char what[96];
            snprintf(what, sizeof what, "%s, token %zu of %zu", cases[c].name, i, n);
            int brute = i == 0 || i == pick[0] || (c == 0 && (i == pick[1] || i == pick[2]));
            if (brute || i % 5 == 0) check_mask_state(v, st, what, brute);
            if (i == n) break;
            CHECK(g4_grammar_accept_token(v, st, ids[i]) == 0, "%s: the document's token rejected: %s", what, g4_last_error());
        }
        CHECK(g4_grammar_is_complete(st), "%s: incomplete at the end", cases[c].name);
        /* stop ids only when complete */
        size_t V = g4_grammar_vocab_size(v);
        uint32_t *mask = calloc((V + 31) / 32, sizeof *mask);
        int32_t stop = 1;
        g4_grammar_mask(v, st, &stop, 1, mask);
        CHECK(mask[0] & 2, "%s: the stop token is not allowed at the end", cases[c].name);
        g4_grammar_state *s0 = g4_grammar_start(cases[c].g);
        g4_grammar_mask(v, s0, &stop, 1, mask);
        CHECK(!(mask[0] & 2), "%s: the stop token is allowed at the start", cases[c].name);
        /* a random walk of allowed tokens stays accepted */
        int steps = 0, bad = 0;
        for (; steps < 60 && !g4_grammar_is_complete(s0); steps++) {
            long k = g4_grammar_mask(v, s0, NULL, 0, mask);
            if (k <= 0) break;
            long want = (long)(rnd() % (uint32_t)k);
            int32_t id = -1;
            for (size_t t = 0; t < V && want >= 0; t++)
                if ((mask[t >> 5] >> (t & 31)) & 1 && want-- == 0) id = (int32_t)t;
            bad += g4_grammar_accept_token(v, s0, id) != 0;
        }
        CHECK(bad == 0 && steps > 0, "%s: random walk: %d allowed tokens rejected", cases[c].name, bad);
        g4_grammar_state_free(s0);
        free(mask);
        free(ids);
        g4_grammar_state_free(st);
        g4_grammar_free(cases[c].g);
    }
}

/* ---- figures ---------------------------------------------------------------------------------- */

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One request's masks over a document's tokens from a g4_grammar_cache: the first mask's time
 * (start state included) and the whole walk's, in ms; the state handed back warm. */
static void cached_request(g4_grammar_cache *c, const char *schema_text, const int32_t *ids, size_t n, uint32_t *mask, double *first,
                           double *total) {
    const g4_grammar_vocab *v = g4_grammar_cache_vocab(c);
    double t0 = now_ms();
    g4_grammar_state *st = g4_grammar_cache_start(c, G4_CONSTRAINT_JSON_SCHEMA, schema_text, strlen(schema_text));
    g4_grammar_state *run = st ? g4_grammar_state_copy(st) : NULL;
    for (size_t i = 0; run && i < n; i++) {
        g4_grammar_mask(v, run, NULL, 0, mask);
        if (i == 0) *first = now_ms() - t0;
        g4_grammar_accept_token(v, run, ids[i]);
    }
    *total = now_ms() - t0;
    g4_grammar_cache_done(c, st, run);
    g4_grammar_state_free(run);
}

/* First-mask latency of a new request without and with g4_grammar_cache (the second request of a
 * schema reuses the compile and the first's vocabulary walks). */
static void bench_cache(g4_tokenizer *tok, const char *const *schemas, const char *const *docs, const char *const *names) {
    double t0 = now_ms();
    g4_grammar_cache *c = g4_grammar_cache_new(tok, 16);
    printf("grammar cache: trie built once in %.1f ms\n", now_ms() - t0);
    size_t V = g4_grammar_vocab_size(g4_grammar_cache_vocab(c));
    uint32_t *mask = calloc((V + 31) / 32, sizeof *mask);
    for (int s = 0; s < 2; s++) {
        int32_t *ids;
        size_t n;
        g4_tokenizer_encode(tok, docs[s], strlen(docs[s]), 0, &ids, &n);
        double first[3], total[3];
        for (int r = 0; r < 3; r++) cached_request(c, schemas[s], ids, n, mask, &first[r], &total[r]);
        printf("%s schema: request 1 (cold): first mask %.2f ms, all %zu masks %.1f ms; request 2 (cached): first %.3f ms, all %.2f ms; "
               "request 3: first %.3f ms, all %.2f ms\n",
               names[s], first[0], n, total[0], first[1], total[1], first[2], total[2]);
        free(ids);
    }
    free(mask);
    g4_grammar_cache_free(c);
}

static void bench(g4_tokenizer *tok, const g4_grammar_vocab *v, double vocab_ms) {
    printf("vocabulary trie: %zu tokens, built in %.1f ms\n", g4_grammar_vocab_size(v), vocab_ms);
    const char *names[2] = {"small", "large (40 properties, nested)"};
    const char *schemas[2] = {SMALL_SCHEMA, large_schema()};
    const char *docs[2] = {"{\"name\": \"Zo\xC3\xAB Smith\", \"age\": 42, \"tags\": [\"a b\", \"c\"]}", large_document()};
    size_t V = g4_grammar_vocab_size(v);
    uint32_t *mask = calloc((V + 31) / 32, sizeof *mask);
    for (int s = 0; s < 2; s++) {
        double t0 = now_ms();
        g4_grammar *g = schema(schemas[s]);
        double compile = now_ms() - t0;
        if (!g) continue;
        int32_t *ids;
        size_t n;
        g4_tokenizer_encode(tok, docs[s], strlen(docs[s]), 0, &ids, &n);
        double *ms = malloc(n * sizeof *ms);
        g4_grammar_state *st = g4_grammar_start(g);
        for (size_t i = 0; i < n; i++) {
            t0 = now_ms();
            g4_grammar_mask(v, st, NULL, 0, mask);
            ms[i] = now_ms() - t0;
            g4_grammar_accept_token(v, st, ids[i]);
        }
        qsort(ms, n, sizeof *ms, cmp_dbl);
        printf("%s schema: compile %.2f ms; mask over %zu document tokens: median %.3f ms, p90 %.3f ms, max %.3f ms\n",
               names[s], compile, n, ms[n / 2], ms[n * 9 / 10], ms[n - 1]);
        free(ms);
        free(ids);
        g4_grammar_state_free(st);
        g4_grammar_free(g);
    }
    free(mask);
    bench_cache(tok, schemas, docs, names);
}

int main(int argc, char **argv) {
    int bench_only = argc > 1 && strcmp(argv[1], "--bench") == 0;
    if (!bench_only) {
        test_examples();
        test_dialect();
        test_schema_units();
        test_schema_suite();
    }
    g4_tokenizer *tok = load_gemma4();
    if (tok) {
        double t0 = now_ms();
        g4_grammar_vocab *v = g4_grammar_vocab_new(tok);
        double vocab_ms = now_ms() - t0;
        CHECK(v != NULL, "vocab: %s", g4_last_error());
        if (v && bench_only) bench(tok, v, vocab_ms);
        else if (v) test_masks(tok, v);
        g4_grammar_vocab_free(v);
        g4_tokenizer_free(tok);
    }
    return check_report("grammar");
}
