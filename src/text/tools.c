/* Tools in OpenAI's JSON form and in Gemma's tool syntax (g4.h): a tool's declaration as the
 * upstream E2B template (2026-07-09; tests/fixtures/chat/README.md says where it is) renders it
 * from the JSON schema, a call's text as the template renders an assistant message's tool_calls,
 * and the arguments of a call the model wrote back into JSON. The template's macros are
 * format_function_declaration, format_parameters and format_argument; each function below names
 * the one it follows, and the Jinja/Python behaviour it reproduces where that is not obvious
 * (dictsort ignores case, `{{ x }}` prints Python's str(x), `| upper` of a list upper-cases its
 * repr). */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "g4.h"
#include "text/chat.h"
#include "text/textbuf.h"
#include "util/err.h"

static const char QUOTE[] = "<|\"|>"; /* the tool syntax's string delimiter */
#define QUOTE_LEN (sizeof QUOTE - 1)
static const char OPEN_CALL[] = "<|tool_call>";
static const char CLOSE_CALL[] = "<tool_call|>";
/* Deeper JSON than this is refused: the renderers and the parser recurse once per level. */
#define MAX_DEPTH 64

/* ---------------------------------------------------------------- Python's str() of a JSON value */

/* Python's repr of a float: the shortest digits that read back to the same double, in fixed
 * notation for exponents in [-4, 16) (with ".0" when integral), else d.ddde[+-]XX. */
static int py_float_repr(double x, g4_textbuf *b) {
    char buf[64], digits[32];
    if (isinf(x)) return g4_textbuf_appends(b, x > 0 ? "inf" : "-inf");
    if (isnan(x)) return g4_textbuf_appends(b, "nan");
    int p = 1;
    for (; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, x);
        if (strtod(buf, NULL) == x) break;
    }
    snprintf(buf, sizeof buf, "%.*e", p - 1, x);
    const char *s = buf;
    int neg = *s == '-', nd = 0;
    if (neg) s++;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') digits[nd++] = *s;
    int exp10 = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    g4_textbuf t = {0};
    int rc = neg ? g4_textbuf_appends(&t, "-") : 0;
    if (exp10 < -4 || exp10 >= 16) {
        rc = rc || g4_textbuf_append(&t, digits, 1) || (nd > 1 && (g4_textbuf_appends(&t, ".") || g4_textbuf_append(&t, digits + 1, (size_t)nd - 1)));
        snprintf(buf, sizeof buf, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
        rc = rc || g4_textbuf_appends(&t, buf);
    } else if (exp10 < 0) {
        rc = rc || g4_textbuf_appends(&t, "0.");
        for (int i = 0; i < -exp10 - 1 && !rc; i++) rc = g4_textbuf_appends(&t, "0");
        rc = rc || g4_textbuf_append(&t, digits, (size_t)nd);
    } else {
        int int_digits = exp10 + 1;
        for (int i = 0; i < int_digits && !rc; i++) rc = g4_textbuf_append(&t, i < nd ? &digits[i] : "0", 1);
        rc = rc || g4_textbuf_appends(&t, ".");
        rc = rc || (nd > int_digits ? g4_textbuf_append(&t, digits + int_digits, (size_t)(nd - int_digits)) : g4_textbuf_appends(&t, "0"));
    }
    rc = rc || g4_textbuf_append(b, t.p, t.n);
    free(t.p);
    return rc ? -1 : 0;
}

/* A JSON number as Python prints what json.loads made of it. JSON keeps no int/float
 * distinction once parsed (cJSON holds a double): an integral value below 2^63 is taken for an
 * int ("2", where Python would print "2.0" for a literal 2.0). */
static int py_number(double x, g4_textbuf *b) {
    if (x == floor(x) && fabs(x) < 9.2e18) {
        char buf[32];
        snprintf(buf, sizeof buf, "%lld", (long long)x);
        return g4_textbuf_appends(b, buf);
    }
    return py_float_repr(x, b);
}

/* Python's repr of a str: single quotes unless it holds one and no double quote. */
static int py_str_repr(const char *s, g4_textbuf *b) {
    char q = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';
    int rc = g4_textbuf_append(b, &q, 1);
    for (const unsigned char *c = (const unsigned char *)s; *c && !rc; c++) {
        char esc[8];
        if (*c == '\\' || *c == (unsigned char)q) snprintf(esc, sizeof esc, "\\%c", *c);
        else if (*c == '\n') snprintf(esc, sizeof esc, "\\n");
        else if (*c == '\r') snprintf(esc, sizeof esc, "\\r");
        else if (*c == '\t') snprintf(esc, sizeof esc, "\\t");
        else if (*c < 0x20 || *c == 0x7f) snprintf(esc, sizeof esc, "\\x%02x", *c);
        else esc[0] = (char)*c, esc[1] = 0;
        rc = g4_textbuf_appends(b, esc);
    }
    return rc || g4_textbuf_append(b, &q, 1) ? -1 : 0;
}

static int py_repr(const cJSON *v, g4_textbuf *b, int depth);

/* Python's str(): what Jinja's {{ x }} prints. Containers print their elements' repr. */
static int py_str(const cJSON *v, g4_textbuf *b, int depth) {
    if (cJSON_IsString(v)) return g4_textbuf_appends(b, v->valuestring);
    return py_repr(v, b, depth);
}

static int py_repr(const cJSON *v, g4_textbuf *b, int depth) {
    if (depth > MAX_DEPTH) return g4_fail("tools: JSON nested deeper than %d levels", MAX_DEPTH);
    if (!v || cJSON_IsNull(v)) return g4_textbuf_appends(b, "None");
    if (cJSON_IsTrue(v)) return g4_textbuf_appends(b, "True");
    if (cJSON_IsFalse(v)) return g4_textbuf_appends(b, "False");
    if (cJSON_IsNumber(v)) return py_number(v->valuedouble, b);
    if (cJSON_IsString(v)) return py_str_repr(v->valuestring, b);
    int obj = cJSON_IsObject(v), rc = g4_textbuf_appends(b, obj ? "{" : "[");
    for (const cJSON *c = v->child; c && !rc; c = c->next) {
        if (c != v->child) rc = g4_textbuf_appends(b, ", ");
        if (obj && !rc) rc = py_str_repr(c->string, b) || g4_textbuf_appends(b, ": ");
        if (!rc) rc = py_repr(c, b, depth + 1);
    }
    return rc || g4_textbuf_appends(b, obj ? "}" : "]") ? -1 : 0;
}

/* ---------------------------------------------------------------- Jinja's view of a value */

/* Python truthiness: None, False, 0, "", [] and {} are false; a missing key too. */
static int truthy(const cJSON *v) {
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
    if (cJSON_IsNumber(v)) return v->valuedouble != 0;
    if (cJSON_IsString(v)) return v->valuestring[0] != 0;
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child != NULL;
    return 1;
}

/* value['key']: undefined (NULL) unless value is a mapping that has it (exact case). */
static const cJSON *get(const cJSON *v, const char *key) { return cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, key) : NULL; }

/* `x | upper` into out: Python's str(x).upper() (ASCII letters: the schema words); undefined is "". */
static int upper_of(const cJSON *v, g4_textbuf *out) {
    size_t from = out->n;
    if (v && py_str(v, out, 0)) return -1;
    for (size_t i = from; i < out->n; i++)
        if (out->p[i] >= 'a' && out->p[i] <= 'z') out->p[i] = (char)(out->p[i] - 'a' + 'A');
    return 0;
}

static int ascii_lower(int c) { return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c; }

/* dictsort's order: keys compared case-insensitively, equal ones kept in their order. */
int g4_chat_key_before(const char *a, const char *b) {
    for (;; a++, b++) {
        int x = ascii_lower((unsigned char)*a), y = ascii_lower((unsigned char)*b);
        if (x != y) return x < y;
        if (!x) return 0;
    }
}

/* The members of an object in dictsort order (an insertion sort: it keeps ties in place). The
 * array is malloc'd; *n its length. */
static int dictsort(const cJSON *obj, const cJSON ***out, int *n) {
    int count = cJSON_GetArraySize(obj);
    const cJSON **items = malloc(sizeof *items * (size_t)(count ? count : 1));
    if (!items) return g4_fail("tools: out of memory");
    int k = 0;
    for (const cJSON *c = obj->child; c; c = c->next) {
        int at = k++;
        for (; at > 0 && g4_chat_key_before(c->string, items[at - 1]->string); at--) items[at] = items[at - 1];
        items[at] = c;
    }
    *out = items;
    *n = k;
    return 0;
}

/* ---------------------------------------------------------------- format_argument */

static int quoted(g4_textbuf *b, const char *s) { return g4_textbuf_appends(b, QUOTE) || g4_textbuf_appends(b, s) || g4_textbuf_appends(b, QUOTE); }

/* The template's format_argument: strings in <|"|>, mappings in dictsort order with their keys
 * in <|"|> when escape_keys, numbers as Python prints them. */
static int format_argument(const cJSON *v, int escape_keys, g4_textbuf *b, int depth) {
    if (depth > MAX_DEPTH) return g4_fail("tools: JSON nested deeper than %d levels", MAX_DEPTH);
    if (!v || cJSON_IsNull(v)) return g4_textbuf_appends(b, "null");
    if (cJSON_IsString(v)) return quoted(b, v->valuestring);
    if (cJSON_IsBool(v)) return g4_textbuf_appends(b, cJSON_IsTrue(v) ? "true" : "false");
    if (cJSON_IsNumber(v)) return py_number(v->valuedouble, b);
    if (cJSON_IsArray(v)) {
        int rc = g4_textbuf_appends(b, "[");
        for (const cJSON *c = v->child; c && !rc; c = c->next)
            rc = (c != v->child && g4_textbuf_appends(b, ",")) || format_argument(c, escape_keys, b, depth + 1);
        return rc || g4_textbuf_appends(b, "]") ? -1 : 0;
    }
    const cJSON **items = NULL;
    int n = 0, rc = dictsort(v, &items, &n) || g4_textbuf_appends(b, "{");
    for (int i = 0; i < n && !rc; i++) {
        rc = (i && g4_textbuf_appends(b, ",")) || (escape_keys ? quoted(b, items[i]->string) : g4_textbuf_appends(b, items[i]->string)) ||
             g4_textbuf_appends(b, ":") || format_argument(items[i], escape_keys, b, depth + 1);
    }
    free((void *)items);
    return rc || g4_textbuf_appends(b, "}") ? -1 : 0;
}

/* ---------------------------------------------------------------- format_parameters */

/* The template's `{% if add_comma %},{% else %}{% set add_comma = true %}{% endif %}`. */
static int comma(g4_textbuf *b, int *add_comma) {
    if (*add_comma) return g4_textbuf_appends(b, ",");
    *add_comma = 1;
    return 0;
}

/* required:[<|"|>a<|"|>,...] of an array (any other value lists nothing). */
static int required_list(const cJSON *req, g4_textbuf *b, int depth) {
    int rc = g4_textbuf_appends(b, "required:[");
    for (const cJSON *c = cJSON_IsArray(req) ? req->child : NULL; c && !rc; c = c->next)
        rc = (c != req->child && g4_textbuf_appends(b, ",")) || g4_textbuf_appends(b, QUOTE) || py_str(c, b, depth) ||
             g4_textbuf_appends(b, QUOTE);
    return rc || g4_textbuf_appends(b, "]") ? -1 : 0;
}

static int format_parameters(const cJSON *properties, int filter_keys, g4_textbuf *b, int depth);

/* An array parameter's items:{...}: each member of the items mapping but nulls, in dictsort
 * order; properties, required and type have their own forms. */
static int format_items(const cJSON *items, g4_textbuf *b, int depth) {
    const cJSON **kv = NULL;
    int n = 0, first = 1, rc = dictsort(items, &kv, &n) || g4_textbuf_appends(b, "items:{");
    for (int i = 0; i < n && !rc; i++) {
        const cJSON *v = kv[i];
        const char *k = v->string;
        if (cJSON_IsNull(v)) continue;
        if (!first) rc = g4_textbuf_appends(b, ",");
        first = 0;
        if (rc) break;
        if (!strcmp(k, "properties")) {
            rc = g4_textbuf_appends(b, "properties:{") || (cJSON_IsObject(v) && format_parameters(v, 0, b, depth + 1)) ||
                 g4_textbuf_appends(b, "}");
        } else if (!strcmp(k, "required")) {
            rc = required_list(v, b, depth);
        } else if (!strcmp(k, "type")) {
            g4_textbuf up = {0};
            cJSON *as = NULL;
            if (cJSON_IsString(v)) {
                rc = upper_of(v, &up) || !(as = cJSON_CreateString(up.p ? up.p : ""));
            } else if ((as = cJSON_CreateArray())) { /* item_value | map('upper') | list */
                for (const cJSON *c = cJSON_IsArray(v) ? v->child : NULL; c && !rc; c = c->next) {
                    g4_textbuf_clear(&up);
                    cJSON *s = NULL;
                    rc = upper_of(c, &up) || !(s = cJSON_CreateString(up.p ? up.p : "")) || !cJSON_AddItemToArray(as, s);
                }
            }
            rc = rc || !as || g4_textbuf_appends(b, "type:") || format_argument(as, 1, b, depth + 1);
            cJSON_Delete(as);
            free(up.p);
        } else {
            rc = g4_textbuf_appends(b, k) || g4_textbuf_appends(b, ":") || format_argument(v, 1, b, depth + 1);
        }
    }
    free((void *)kv);
    return rc || g4_textbuf_appends(b, "}") ? -1 : 0;
}

/* One parameter, "key:{description,enum|items,nullable,properties,required,type}", the parts the
 * template writes for its type. */
static int format_parameter(const char *key, const cJSON *value, g4_textbuf *b, int depth) {
    int add_comma = 0, rc = g4_textbuf_appends(b, key) || g4_textbuf_appends(b, ":{");
    g4_textbuf type = {0};
    rc = rc || upper_of(get(value, "type"), &type) || g4_textbuf_append(&type, "", 0);
    const char *t = rc ? "" : type.p;
    const cJSON *desc = get(value, "description");
    if (!rc && truthy(desc)) {
        rc = g4_textbuf_appends(b, "description:") || g4_textbuf_appends(b, QUOTE) || py_str(desc, b, depth) || g4_textbuf_appends(b, QUOTE);
        add_comma = 1;
    }
    if (!rc && !strcmp(t, "STRING") && truthy(get(value, "enum")))
        rc = comma(b, &add_comma) || g4_textbuf_appends(b, "enum:") || format_argument(get(value, "enum"), 1, b, depth + 1);
    else if (!rc && !strcmp(t, "ARRAY") && cJSON_IsObject(get(value, "items")) && truthy(get(value, "items")))
        rc = comma(b, &add_comma) || format_items(get(value, "items"), b, depth + 1);
    if (!rc && truthy(get(value, "nullable"))) rc = comma(b, &add_comma) || g4_textbuf_appends(b, "nullable:true");
    if (!rc && !strcmp(t, "OBJECT")) {
        const cJSON *props = get(value, "properties");
        /* an object without a properties mapping lists its own keys but the schema words */
        int own = !cJSON_IsObject(props);
        if (cJSON_IsObject(own ? value : props))
            rc = comma(b, &add_comma) || g4_textbuf_appends(b, "properties:{") || format_parameters(own ? value : props, own, b, depth + 1) ||
                 g4_textbuf_appends(b, "}");
        if (!rc && truthy(get(value, "required"))) rc = comma(b, &add_comma) || required_list(get(value, "required"), b, depth);
    }
    rc = rc || comma(b, &add_comma) || g4_textbuf_appends(b, "type:") || g4_textbuf_appends(b, QUOTE) || g4_textbuf_appends(b, t) ||
         g4_textbuf_appends(b, QUOTE) || g4_textbuf_appends(b, "}");
    free(type.p);
    return rc ? -1 : 0;
}

/* The template's format_parameters: the parameters in dictsort order, comma-separated;
 * filter_keys leaves out the schema's own words. */
static int format_parameters(const cJSON *properties, int filter_keys, g4_textbuf *b, int depth) {
    static const char *const standard_keys[] = {"description", "type", "properties", "required", "nullable", NULL};
    if (depth > MAX_DEPTH) return g4_fail("tools: JSON nested deeper than %d levels", MAX_DEPTH);
    const cJSON **kv = NULL;
    int n = 0, first = 1, rc = dictsort(properties, &kv, &n);
    for (int i = 0; i < n && !rc; i++) {
        int standard = 0;
        for (int k = 0; filter_keys && standard_keys[k]; k++) standard |= !strcmp(kv[i]->string, standard_keys[k]);
        if (standard) continue;
        rc = (!first && g4_textbuf_appends(b, ",")) || format_parameter(kv[i]->string, kv[i], b, depth + 1);
        first = 0;
    }
    free((void *)kv);
    return rc ? -1 : 0;
}

/* ---------------------------------------------------------------- format_function_declaration */

static int format_declaration(const cJSON *function, g4_textbuf *b) {
    const cJSON *name = get(function, "name"), *params = get(function, "parameters");
    int rc = g4_textbuf_appends(b, "declaration:") || (name && py_str(name, b, 0)) || g4_textbuf_appends(b, "{description:") ||
             g4_textbuf_appends(b, QUOTE) || (get(function, "description") && py_str(get(function, "description"), b, 0)) ||
             g4_textbuf_appends(b, QUOTE);
    if (!rc && truthy(params)) {
        rc = g4_textbuf_appends(b, ",parameters:{");
        if (!rc && truthy(get(params, "properties")))
            rc = g4_textbuf_appends(b, "properties:{") || (cJSON_IsObject(get(params, "properties")) && format_parameters(get(params, "properties"), 0, b, 1)) ||
                 g4_textbuf_appends(b, "},");
        if (!rc && truthy(get(params, "required"))) rc = required_list(get(params, "required"), b, 1) || g4_textbuf_appends(b, ",");
        /* the template closes parameters:{ only when it writes the type */
        if (!rc && truthy(get(params, "type")))
            rc = g4_textbuf_appends(b, "type:") || g4_textbuf_appends(b, QUOTE) || upper_of(get(params, "type"), b) ||
                 g4_textbuf_appends(b, QUOTE) || g4_textbuf_appends(b, "}");
    }
    const cJSON *response = get(function, "response");
    if (!rc && response) {
        rc = g4_textbuf_appends(b, ",response:{");
        if (!rc && truthy(get(response, "description")))
            rc = g4_textbuf_appends(b, "description:") || g4_textbuf_appends(b, QUOTE) || py_str(get(response, "description"), b, 0) ||
                 g4_textbuf_appends(b, QUOTE) || g4_textbuf_appends(b, ",");
        g4_textbuf type = {0};
        rc = rc || upper_of(get(response, "type"), &type);
        if (!rc && type.p && !strcmp(type.p, "OBJECT"))
            rc = g4_textbuf_appends(b, "type:") || g4_textbuf_appends(b, QUOTE) || g4_textbuf_appends(b, "OBJECT") ||
                 g4_textbuf_appends(b, QUOTE) || g4_textbuf_appends(b, "}");
        free(type.p);
    }
    return rc || g4_textbuf_appends(b, "}") ? -1 : 0;
}

static cJSON *parse_json(const char *text, size_t len, const char *what) {
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j) g4_fail("tools: %s is not valid JSON", what);
    return j;
}

/* The trimmed text of b (the template applies `| trim`) into *out. */
static int take_trimmed(g4_textbuf *b, char **out) {
    size_t a, e;
    g4_chat_trim(b->p, b->n, &a, &e);
    memmove(b->p, b->p + a, e - a);
    b->n = e - a;
    b->p[b->n] = 0;
    return g4_textbuf_take(b, out, NULL);
}

int g4_tool_declaration(const char *tool_json, size_t len, char **out) {
    *out = NULL;
    cJSON *tool = parse_json(tool_json, len, "the tool");
    if (!tool) return -1;
    const cJSON *function = get(tool, "function");
    int rc = 0;
    if (!cJSON_IsObject(function)) rc = g4_fail("tools: a tool needs a \"function\" object");
    else if (!cJSON_IsString(get(function, "name")) || !get(function, "name")->valuestring[0])
        rc = g4_fail("tools: the function needs a non-empty \"name\" string");
    g4_textbuf b = {0};
    rc = rc || g4_textbuf_append(&b, "", 0) || format_declaration(function, &b) || take_trimmed(&b, out);
    free(b.p);
    cJSON_Delete(tool);
    return rc ? -1 : 0;
}

int g4_tool_call_text(const char *name, const char *args_json, size_t len, char **out) {
    *out = NULL;
    if (!name || !*name) return g4_fail("tools: a tool call needs a name");
    cJSON *args = NULL;
    size_t a, e;
    g4_chat_trim(args_json ? args_json : "", args_json ? len : 0, &a, &e);
    if (e > a && !(args = parse_json(args_json + a, e - a, "the call's arguments"))) return -1;
    int rc = 0;
    if (args && !cJSON_IsObject(args) && !cJSON_IsNull(args)) rc = g4_fail("tools: a call's arguments must be a JSON object");
    g4_textbuf b = {0};
    rc = rc || g4_textbuf_appends(&b, OPEN_CALL) || g4_textbuf_appends(&b, "call:") || g4_textbuf_appends(&b, name) || g4_textbuf_appends(&b, "{");
    if (!rc && cJSON_IsObject(args)) {
        /* the template's tool_calls loop: keys bare, in dictsort order */
        const cJSON **kv = NULL;
        int n = 0;
        rc = dictsort(args, &kv, &n);
        for (int i = 0; i < n && !rc; i++)
            rc = (i && g4_textbuf_appends(&b, ",")) || g4_textbuf_appends(&b, kv[i]->string) || g4_textbuf_appends(&b, ":") ||
                 format_argument(kv[i], 0, &b, 1);
        free((void *)kv);
    }
    rc = rc || g4_textbuf_appends(&b, "}") || g4_textbuf_appends(&b, CLOSE_CALL) || g4_textbuf_take(&b, out, NULL);
    free(b.p);
    cJSON_Delete(args);
    return rc ? -1 : 0;
}

/* ---------------------------------------------------------------- Gemma's syntax back to JSON */

typedef struct {
    const char *p, *end;
} cursor;

static void skip_space(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int at_quote(const cursor *c) { return (size_t)(c->end - c->p) >= QUOTE_LEN && !memcmp(c->p, QUOTE, QUOTE_LEN); }

/* <|"|>text<|"|>: everything up to the closing delimiter, as it is. */
static cJSON *gemma_string(cursor *c) {
    const char *s = c->p += QUOTE_LEN;
    while (c->p < c->end && !at_quote(c)) c->p++;
    if (c->p >= c->end) return g4_fail("tools: a string without its closing <|\"|>"), NULL;
    size_t n = (size_t)(c->p - s);
    c->p += QUOTE_LEN;
    char *copy = malloc(n + 1);
    if (!copy) return g4_fail("tools: out of memory"), NULL;
    memcpy(copy, s, n);
    copy[n] = 0;
    cJSON *j = cJSON_CreateString(copy);
    free(copy);
    return j;
}

/* A JSON "string" (a model may write one): cJSON reads it, escapes and all. */
static cJSON *json_string(cursor *c) {
    const char *s = c->p++;
    for (; c->p < c->end && *c->p != '"'; c->p++)
        if (*c->p == '\\' && c->p + 1 < c->end) c->p++;
    if (c->p >= c->end) return g4_fail("tools: a \"string\" without its closing quote"), NULL;
    c->p++;
    cJSON *j = cJSON_ParseWithLength(s, (size_t)(c->p - s));
    if (!j) g4_fail("tools: a \"string\" that is not valid JSON");
    return j;
}

/* A bare word up to the next , } ] (or :, for keys), trimmed: a number, true/false/null, or
 * else text the model left unquoted (taken as a string, as ollama's and vLLM's parsers do). */
static cJSON *bare_value(cursor *c, int key) {
    const char *s = c->p;
    while (c->p < c->end && *c->p != ',' && *c->p != '}' && *c->p != ']' && !(key && *c->p == ':') && !at_quote(c)) c->p++;
    size_t a, e;
    g4_chat_trim(s, (size_t)(c->p - s), &a, &e);
    if (e == a) return g4_fail("tools: a value is missing"), NULL;
    char *word = malloc(e - a + 1);
    if (!word) return g4_fail("tools: out of memory"), NULL;
    memcpy(word, s + a, e - a);
    word[e - a] = 0;
    cJSON *j = NULL;
    char *num_end;
    double x = strtod(word, &num_end);
    if (key) j = cJSON_CreateString(word);
    else if (!strcmp(word, "true") || !strcmp(word, "false")) j = cJSON_CreateBool(word[0] == 't');
    else if (!strcmp(word, "null")) j = cJSON_CreateNull();
    else if (*num_end == 0 && isfinite(x) && (word[0] == '-' || (word[0] >= '0' && word[0] <= '9'))) j = cJSON_CreateNumber(x);
    else j = cJSON_CreateString(word);
    free(word);
    return j;
}

static cJSON *gemma_value(cursor *c, int depth);

static int expect(cursor *c, char ch, const char *what) {
    skip_space(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 0;
    }
    return g4_fail("tools: expected '%c' %s", ch, what);
}

/* {key:value,...}, keys bare or in <|"|>. */
static cJSON *gemma_object(cursor *c, int depth) {
    cJSON *obj = cJSON_CreateObject();
    c->p++;
    skip_space(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return obj;
    }
    while (obj) {
        skip_space(c);
        cJSON *key = at_quote(c) ? gemma_string(c) : c->p < c->end && *c->p == '"' ? json_string(c) : bare_value(c, 1);
        cJSON *val = NULL;
        int ok = key && cJSON_IsString(key) && expect(c, ':', "after a key") == 0 && (val = gemma_value(c, depth + 1));
        if (ok) cJSON_AddItemToObject(obj, key->valuestring, val);
        cJSON_Delete(key);
        if (!ok) break;
        skip_space(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        if (expect(c, '}', "to close an object") == 0) return obj;
        break;
    }
    cJSON_Delete(obj);
    return NULL;
}

static cJSON *gemma_array(cursor *c, int depth) {
    cJSON *arr = cJSON_CreateArray();
    c->p++;
    skip_space(c);
    if (c->p < c->end && *c->p == ']') {
        c->p++;
        return arr;
    }
    while (arr) {
        cJSON *v = gemma_value(c, depth + 1);
        if (!v) break;
        cJSON_AddItemToArray(arr, v);
        skip_space(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        if (expect(c, ']', "to close an array") == 0) return arr;
        break;
    }
    cJSON_Delete(arr);
    return NULL;
}

static cJSON *gemma_value(cursor *c, int depth) {
    if (depth > MAX_DEPTH) return g4_fail("tools: arguments nested deeper than %d levels", MAX_DEPTH), NULL;
    skip_space(c);
    if (c->p >= c->end) return g4_fail("tools: the arguments end before a value"), NULL;
    if (at_quote(c)) return gemma_string(c);
    if (*c->p == '"') return json_string(c);
    if (*c->p == '{') return gemma_object(c, depth);
    if (*c->p == '[') return gemma_array(c, depth);
    return bare_value(c, 0);
}

int g4_tool_arguments_json(const char *args, size_t len, char **json) {
    *json = NULL;
    cursor c = {args, args + len};
    skip_space(&c);
    if (c.p >= c.end || *c.p != '{') return g4_fail("tools: a call's arguments must start with '{'");
    cJSON *obj = gemma_object(&c, 0);
    if (!obj) return -1;
    skip_space(&c);
    int rc = c.p != c.end ? g4_fail("tools: text after the call's arguments") : 0;
    if (!rc && !(*json = cJSON_PrintUnformatted(obj))) rc = g4_fail("tools: out of memory");
    cJSON_Delete(obj);
    return rc;
}

int g4_tool_call_parse(const char *text, size_t len, char **name, char **json) {
    static const char call[] = "call:";
    size_t open = sizeof OPEN_CALL - 1, close = sizeof CLOSE_CALL - 1, pre = sizeof call - 1;
    *name = *json = NULL;
    if (len < open + pre + close || memcmp(text, OPEN_CALL, open) || memcmp(text + len - close, CLOSE_CALL, close) ||
        memcmp(text + open, call, pre))
        return g4_fail("tools: a call is \"<|tool_call>call:NAME{...}<tool_call|>\"");
    const char *n0 = text + open + pre, *end = text + len - close;
    const char *brace = memchr(n0, '{', (size_t)(end - n0));
    if (!brace || brace == n0) return g4_fail("tools: a call needs a name and then '{'");
    if (g4_tool_arguments_json(brace, (size_t)(end - brace), json)) return -1;
    if (!(*name = malloc((size_t)(brace - n0) + 1))) {
        free(*json), *json = NULL;
        return g4_fail("tools: out of memory");
    }
    memcpy(*name, n0, (size_t)(brace - n0));
    (*name)[brace - n0] = 0;
    return 0;
}
