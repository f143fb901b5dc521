/* g4 serve's request parser (request.h): OpenAI's chat-completions and completions fields, each
 * checked for its type and range, into g4's messages, tools, sampling and stop strings. */
#define _POSIX_C_SOURCE 200809L
#include "serve/request.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "g4dev.h"

static const char INVALID[] = "invalid_request_error";

int serve_fail(serve_error *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    /* one line of whole UTF-8 characters, whatever of the request it quotes and wherever the
     * buffer's end cut it */
    for (char *c = e->message; *c; c++)
        if ((unsigned char)*c < 0x20) *c = ' ';
    e->message[g4_text_utf8_prefix(e->message, strlen(e->message))] = 0;
    return -1;
}

char *serve_error_json(const serve_error *e) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "server_error");
    if (e->param[0]) cJSON_AddStringToObject(err, "param", e->param);
    else cJSON_AddNullToObject(err, "param");
    if (e->code) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNullToObject(err, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static int bad(serve_error *e, const char *param, const char *fmt, const char *arg) {
    return serve_fail(e, 400, INVALID, NULL, param, fmt, arg);
}

/* ---------------------------------------------------------------- the body before JSON */

/* cJSON takes any bytes inside strings and cuts a string at an escaped NUL without a word: the
 * body must be UTF-8 (the messages go to the tokenizer as text) and free of \u0000. */
static int check_body_text(const char *body, size_t len, serve_error *e) {
    size_t ok = g4_text_utf8_prefix(body, len);
    if (ok < len) return serve_fail(e, 400, INVALID, "invalid_utf8", NULL, "the request body is not valid UTF-8 (byte %zu)", ok);
    for (size_t i = 0; i + 1 < len; i++) {
        if (body[i] != '\\') continue;
        if (body[i + 1] == 'u' && i + 5 < len && !memcmp(body + i + 2, "0000", 4))
            return serve_fail(e, 400, INVALID, NULL, NULL, "strings may not hold NUL characters (\\u0000 at byte %zu)", i);
        i++; /* the escaped character is not the start of another escape */
    }
    return 0;
}

/* ---------------------------------------------------------------- typed fields */

typedef struct {
    const cJSON *root;
    serve_error *e;
} fields;

/* The field, or NULL when absent or null (OpenAI's clients send null for "not given"). */
static const cJSON *field(const fields *f, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->root, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static int get_bool(const fields *f, const char *name, int *out) {
    const cJSON *v = field(f, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return bad(f->e, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 1;
}

/* A number in [lo, hi]; returns 1 when given, 0 when absent, -1 (e filled) when wrong. */
static int get_number(const fields *f, const char *name, double lo, double hi, double *out) {
    const cJSON *v = field(f, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        return serve_fail(f->e, 400, INVALID, NULL, name, "'%s' must be a number in [%g, %g]", name, lo, hi);
    *out = v->valuedouble;
    return 1;
}

static int get_int(const fields *f, const char *name, double lo, double hi, long long *out) {
    double x;
    int rc = get_number(f, name, lo, hi, &x);
    if (rc == 1 && x != floor(x)) return serve_fail(f->e, 400, INVALID, NULL, name, "'%s' must be an integer", name);
    if (rc == 1) *out = (long long)x;
    return rc;
}

static int get_string(const fields *f, const char *name, const char **out) {
    const cJSON *v = field(f, name);
    if (!v) return 0;
    if (!cJSON_IsString(v)) return bad(f->e, name, "'%s' must be a string", name);
    *out = v->valuestring;
    return 1;
}

/* ---------------------------------------------------------------- sampling, budget, stop */

static int read_sampling(const fields *f, serve_request *r) {
    double x;
    long long i;
    int rc;
    if ((rc = get_number(f, "temperature", 0, 2, &x)) < 0) return -1;
    if (rc) r->sampling.temperature = (float)x, r->sampling_given |= G4_SAMPLE_TEMP;
    if ((rc = get_number(f, "top_p", 0, 1, &x)) < 0) return -1;
    if (rc && x <= 0) return bad(f->e, "top_p", "'%s' must be greater than 0", "top_p");
    if (rc) r->sampling.top_p = (float)x, r->sampling_given |= G4_SAMPLE_TOP_P;
    if ((rc = get_int(f, "top_k", -1, 1 << 30, &i)) < 0) return -1;
    if (rc) r->sampling.top_k = i < 0 ? 0 : (int)i, r->sampling_given |= G4_SAMPLE_TOP_K; /* -1: off, as vLLM takes it */
    if ((rc = get_number(f, "min_p", 0, 1, &x)) < 0) return -1;
    if (rc) r->sampling.min_p = (float)x, r->sampling_given |= G4_SAMPLE_MIN_P;
    if ((rc = get_number(f, "repetition_penalty", 0, 100, &x)) < 0) return -1;
    if (rc && x <= 0) return bad(f->e, "repetition_penalty", "'%s' must be greater than 0", "repetition_penalty");
    if (rc) r->sampling.repeat_penalty = (float)x, r->sampling_given |= G4_SAMPLE_PENALTY;
    if ((rc = get_int(f, "seed", 0, 9007199254740991.0, &i)) < 0) return -1;
    if (rc) r->sampling.seed = (uint64_t)i, r->seed_given = 1;
    if ((rc = get_number(f, "frequency_penalty", -2, 2, &x)) < 0) return -1;
    if (rc) r->sampling.frequency_penalty = (float)x, r->sampling_given |= G4_SAMPLE_FREQUENCY;
    if ((rc = get_number(f, "presence_penalty", -2, 2, &x)) < 0) return -1;
    if (rc) r->sampling.presence_penalty = (float)x, r->sampling_given |= G4_SAMPLE_PRESENCE;
    return 0;
}

/* logit_bias: {"TOKEN_ID": BIAS, ...}, the ids decimal integers of the vocabulary, the biases in
 * [-100, 100] (OpenAI's). */
static int read_logit_bias(const fields *f, serve_request *r, const serve_limits *lim) {
    const cJSON *bias = field(f, "logit_bias");
    if (!bias) return 0;
    if (!cJSON_IsObject(bias)) return bad(f->e, "logit_bias", "'%s' must be an object of token ids to numbers", "logit_bias");
    int n = cJSON_GetArraySize(bias);
    if (n == 0) return 0;
    if (n > SERVE_MAX_LOGIT_BIAS)
        return serve_fail(f->e, 400, INVALID, NULL, "logit_bias", "'logit_bias' holds %d entries; at most %d", n, SERVE_MAX_LOGIT_BIAS);
    r->bias_ids = malloc(sizeof *r->bias_ids * (size_t)n);
    r->bias_values = malloc(sizeof *r->bias_values * (size_t)n);
    if (!r->bias_ids || !r->bias_values) return serve_fail(f->e, 500, "server_error", NULL, NULL, "out of memory");
    int i = 0;
    for (const cJSON *b = bias->child; b; b = b->next, i++) {
        char *end;
        const char *key = b->string;
        long id = key[0] >= '0' && key[0] <= '9' ? strtol(key, &end, 10) : -1;
        if (id < 0 || *end || id > INT32_MAX || (lim->vocab > 0 && id >= lim->vocab))
            return serve_fail(f->e, 400, INVALID, NULL, "logit_bias", "'logit_bias': '%.40s' is not a token id (0..%d)", key, lim->vocab - 1);
        if (!cJSON_IsNumber(b) || !(b->valuedouble >= -100 && b->valuedouble <= 100))
            return serve_fail(f->e, 400, INVALID, NULL, "logit_bias", "'logit_bias': the bias of token %ld must be a number in [-100, 100]", id);
        r->bias_ids[i] = (int32_t)id, r->bias_values[i] = (float)b->valuedouble;
    }
    r->sampling.bias_ids = r->bias_ids, r->sampling.bias_values = r->bias_values, r->sampling.n_bias = n;
    r->sampling_given |= G4_SAMPLE_BIAS;
    return 0;
}

/* Chat: logprobs (a boolean) and top_logprobs (0..20, which needs logprobs). Completions:
 * logprobs N (0..20), the chosen token's and the N most likely. */
static int read_logprobs(const fields *f, serve_request *r) {
    long long n = 0;
    int rc;
    if (r->kind == SERVE_COMPLETION) {
        if ((rc = get_int(f, "logprobs", 0, G4_MAX_TOP_LOGPROBS, &n)) < 0) return -1;
        r->logprobs = rc, r->top_logprobs = (int)n;
        return 0;
    }
    if (get_bool(f, "logprobs", &r->logprobs) < 0 || (rc = get_int(f, "top_logprobs", 0, G4_MAX_TOP_LOGPROBS, &n)) < 0) return -1;
    if (rc && !r->logprobs) return bad(f->e, "top_logprobs", "'%s' needs 'logprobs' true", "top_logprobs");
    r->top_logprobs = (int)n;
    return 0;
}

static int read_budget(const fields *f, serve_request *r, const serve_limits *lim) {
    long long n;
    int rc;
    r->max_tokens = -1;
    const char *names[] = {"max_completion_tokens", "max_tokens"};
    for (int k = 0; k < 2 && r->max_tokens < 0; k++) {
        if ((rc = get_int(f, names[k], 1, 1e9, &n)) < 0) return -1;
        if (rc && n > lim->ctx)
            return serve_fail(f->e, 400, INVALID, "context_length_exceeded", names[k], "'%s' is %lld but the context holds %d tokens", names[k], n,
                              lim->ctx);
        if (rc) r->max_tokens = (int)n;
    }
    return 0;
}

static int add_stop(serve_request *r, const char *s, const char *param, const serve_limits *lim, serve_error *e) {
    size_t n = strlen(s);
    if (n == 0) return bad(e, param, "'%s': a stop string may not be empty", param);
    if (n > (size_t)lim->max_stop_len) return serve_fail(e, 400, INVALID, NULL, param, "'%s': a stop string is at most %d bytes", param, lim->max_stop_len);
    if (r->n_stop >= lim->max_stop) return serve_fail(e, 400, INVALID, NULL, "stop", "'stop' takes at most %d strings", lim->max_stop);
    if (!(r->stop[r->n_stop] = strdup(s))) return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    r->n_stop++;
    return 0;
}

static int read_stop(const fields *f, serve_request *r, const serve_limits *lim) {
    const cJSON *v = field(f, "stop");
    if (!v) return 0;
    if (!cJSON_IsString(v) && !cJSON_IsArray(v)) return bad(f->e, "stop", "'%s' must be a string or an array of strings", "stop");
    if (!(r->stop = calloc((size_t)lim->max_stop + 1, sizeof *r->stop))) return serve_fail(f->e, 500, "server_error", NULL, NULL, "out of memory");
    if (cJSON_IsString(v)) return add_stop(r, v->valuestring, "stop", lim, f->e);
    char param[32];
    int i = 0;
    for (const cJSON *s = v->child; s; s = s->next, i++) {
        snprintf(param, sizeof param, "stop[%d]", i);
        if (!cJSON_IsString(s)) return bad(f->e, param, "'%s' must be a string", param);
        if (add_stop(r, s->valuestring, param, lim, f->e)) return -1;
    }
    return 0;
}

/* The prompt cache's scope (vLLM's field): requests with different salts never share a prefix. */
static int read_cache_salt(const fields *f, serve_request *r) {
    const char *salt = NULL;
    if (get_string(f, "cache_salt", &salt) < 0) return -1;
    if (!salt) return 0;
    if (!salt[0] || strlen(salt) > 1024) return bad(f->e, "cache_salt", "'%s' must be a string of 1 to 1024 bytes", "cache_salt");
    if (!(r->cache_salt = strdup(salt))) return serve_fail(f->e, 500, "server_error", NULL, NULL, "out of memory");
    return 0;
}

/* A request's `model` (NULL: none given): a one-model server takes any name (clients send their
 * default, e.g. gpt-3.5-turbo) unless --strict-model; the reply names the model it ran. */
int serve_check_model(const char *model, const serve_limits *lim, serve_error *e) {
    if (!lim->strict_model) return 0;
    if (!model) return serve_fail(e, 400, INVALID, NULL, "model", "you must provide a model parameter ('%s')", lim->model_id);
    if (strcmp(model, lim->model_id) != 0)
        return serve_fail(e, 404, INVALID, "model_not_found", "model", "The model '%.200s' does not exist (this server has '%.200s')", model,
                          lim->model_id);
    return 0;
}

/* ---------------------------------------------------------------- structured output */

/* The request's one constraint (a second is refused by name: which would win is a guess). */
static int take_constraint(const fields *f, serve_request *r, const char *param, g4_constraint_kind kind, char *text) {
    if (!text) return serve_fail(f->e, 500, "server_error", NULL, NULL, "out of memory");
    if (r->constraint_kind >= 0) {
        free(text);
        return serve_fail(f->e, 400, INVALID, NULL, param, "'%s' and '%s' both ask for a constraint: give one", r->constraint_param, param);
    }
    r->constraint_kind = (int)kind;
    r->constraint_text = text;
    snprintf(r->constraint_param, sizeof r->constraint_param, "%s", param);
    return 0;
}

/* A JSON schema given as an object (or, as vLLM also takes it, as a string of JSON). */
static int take_schema(const fields *f, serve_request *r, const char *param, const cJSON *v) {
    if (cJSON_IsString(v)) return take_constraint(f, r, param, G4_CONSTRAINT_JSON_SCHEMA, strdup(v->valuestring));
    if (!cJSON_IsObject(v) && !cJSON_IsBool(v)) return bad(f->e, param, "'%s' must be a JSON schema (an object)", param);
    return take_constraint(f, r, param, G4_CONSTRAINT_JSON_SCHEMA, cJSON_PrintUnformatted(v));
}

static int take_text(const fields *f, serve_request *r, const char *param, g4_constraint_kind kind, const cJSON *v) {
    if (!cJSON_IsString(v) || !v->valuestring[0]) return bad(f->e, param, "'%s' must be a non-empty string", param);
    return take_constraint(f, r, param, kind, strdup(v->valuestring));
}

/* guided_choice: one of the strings exactly, as a GBNF grammar of literal alternatives. */
static int take_choice(const fields *f, serve_request *r, const char *param, const cJSON *v) {
    if (!cJSON_IsArray(v) || !v->child) return bad(f->e, param, "'%s' must be a non-empty array of strings", param);
    g4_textbuf b = {0};
    g4_textbuf_appends(&b, "root ::= ");
    for (const cJSON *c = v->child; c; c = c->next) {
        if (!cJSON_IsString(c)) {
            free(b.p);
            return bad(f->e, param, "'%s' must be a non-empty array of strings", param);
        }
        g4_textbuf_appends(&b, c == v->child ? "\"" : " | \"");
        for (const unsigned char *p = (const unsigned char *)c->valuestring; *p; p++) {
            char esc[8];
            if (*p == '"' || *p == '\\') snprintf(esc, sizeof esc, "\\%c", *p);
            else if (*p < 0x20 || *p == 0x7f) snprintf(esc, sizeof esc, "\\x%02X", *p);
            else esc[0] = (char)*p, esc[1] = 0;
            g4_textbuf_appends(&b, esc);
        }
        g4_textbuf_appends(&b, "\"");
    }
    char *text = b.p ? strdup(b.p) : NULL;
    free(b.p);
    return take_constraint(f, r, param, G4_CONSTRAINT_GBNF, text);
}

/* response_format: text (none), json_object, json_schema {name, schema, strict}. */
static int read_response_format(const fields *f, serve_request *r) {
    const cJSON *rf = field(f, "response_format");
    if (!rf) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type)) return bad(f->e, "response_format", "'%s' must be an object with a 'type'", "response_format");
    if (!strcmp(type->valuestring, "text")) return 0;
    if (!strcmp(type->valuestring, "json_object")) return take_constraint(f, r, "response_format", G4_CONSTRAINT_JSON_OBJECT, strdup(""));
    if (strcmp(type->valuestring, "json_schema"))
        return bad(f->e, "response_format.type", "'response_format' of type '%.40s' is not supported (text, json_object, json_schema)",
                   type->valuestring);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js)) return bad(f->e, "response_format.json_schema", "'%s' must be an object {name, schema, strict}", "response_format.json_schema");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema"), *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
        return bad(f->e, "response_format.json_schema.strict", "'%s' must be a boolean", "response_format.json_schema.strict");
    if (!schema) return bad(f->e, "response_format.json_schema.schema", "'%s' is required", "response_format.json_schema.schema");
    return take_schema(f, r, "response_format.json_schema.schema", schema);
}

/* vLLM's structured_outputs {json | regex | choice | grammar | json_object}. */
static int read_structured_outputs(const fields *f, serve_request *r) {
    const cJSON *so = field(f, "structured_outputs");
    if (!so) return 0;
    if (!cJSON_IsObject(so)) return bad(f->e, "structured_outputs", "'%s' must be an object", "structured_outputs");
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(so, "json")) && take_schema(f, r, "structured_outputs.json", v)) return -1;
    if ((v = cJSON_GetObjectItemCaseSensitive(so, "regex")) && take_text(f, r, "structured_outputs.regex", G4_CONSTRAINT_REGEX, v)) return -1;
    if ((v = cJSON_GetObjectItemCaseSensitive(so, "choice")) && take_choice(f, r, "structured_outputs.choice", v)) return -1;
    if ((v = cJSON_GetObjectItemCaseSensitive(so, "grammar")) && take_text(f, r, "structured_outputs.grammar", G4_CONSTRAINT_GBNF, v)) return -1;
    if ((v = cJSON_GetObjectItemCaseSensitive(so, "json_object")) && cJSON_IsTrue(v) &&
        take_constraint(f, r, "structured_outputs.json_object", G4_CONSTRAINT_JSON_OBJECT, strdup("")))
        return -1;
    for (const cJSON *k = so->child; k; k = k->next) {
        static const char *const known[] = {"json", "regex", "choice", "grammar", "json_object", NULL};
        int ok = 0;
        for (int i = 0; known[i]; i++) ok |= !strcmp(k->string, known[i]);
        if (!ok) return bad(f->e, "structured_outputs", "'structured_outputs.%.40s' is not supported (json, regex, choice, grammar, json_object)", k->string);
    }
    if (r->constraint_kind < 0) return bad(f->e, "structured_outputs", "'%s' asks for no constraint", "structured_outputs");
    return 0;
}

/* Constrained decoding as OpenAI (response_format), llama.cpp (grammar, json_schema) and vLLM
 * (guided_*, structured_outputs) ask for it: every field read, none ignored. */
static int read_constraint(const fields *f, serve_request *r) {
    r->constraint_kind = -1;
    const cJSON *v;
    if (read_response_format(f, r) || read_structured_outputs(f, r)) return -1;
    if ((v = field(f, "grammar")) && take_text(f, r, "grammar", G4_CONSTRAINT_GBNF, v)) return -1;
    if ((v = field(f, "guided_grammar")) && take_text(f, r, "guided_grammar", G4_CONSTRAINT_GBNF, v)) return -1;
    if ((v = field(f, "json_schema")) && take_schema(f, r, "json_schema", v)) return -1;
    if ((v = field(f, "guided_json")) && take_schema(f, r, "guided_json", v)) return -1;
    if ((v = field(f, "guided_regex")) && take_text(f, r, "guided_regex", G4_CONSTRAINT_REGEX, v)) return -1;
    if ((v = field(f, "guided_choice")) && take_choice(f, r, "guided_choice", v)) return -1;
    return 0;
}

/* What every request may carry: model, n, stream, sampling, budget, stop, and the features g4
 * lacks, refused by name. */
static int read_common(const fields *f, serve_request *r, const serve_limits *lim) {
    const char *model = NULL;
    if (get_string(f, "model", &model) < 0) return -1;
    if (serve_check_model(model, lim, f->e) || read_constraint(f, r)) return -1;
    long long n = 1;
    if (get_int(f, "n", 1, 1e9, &n) < 0) return -1;
    int max_n = lim->max_n > 0 ? lim->max_n : 1;
    if (n > max_n)
        return serve_fail(f->e, 400, INVALID, NULL, "n", "'n' is %lld but this server runs at most %d sequences at once (--parallel)", n, max_n);
    r->n = (int)n;
    if (get_bool(f, "stream", &r->stream) < 0) return -1;
    const cJSON *so = field(f, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return bad(f->e, "stream_options", "'%s' must be an object", "stream_options");
        if (!r->stream) return bad(f->e, "stream_options", "'%s' is only allowed when 'stream' is true", "stream_options");
        fields sf = {so, f->e};
        if (get_bool(&sf, "include_usage", &r->include_usage) < 0) return -1;
    }
    return read_logprobs(f, r) || read_sampling(f, r) || read_logit_bias(f, r, lim) || read_budget(f, r, lim) || read_stop(f, r, lim) ||
           read_cache_salt(f, r) ? -1 : 0;
}

/* ---------------------------------------------------------------- messages */

/* ---------------------------------------------------------------- media parts */

/* Standard base64 (RFC 4648, padding optional, no other characters) into *out (malloc'd). */
static int decode_base64(const char *s, size_t n, unsigned char **out, size_t *len) {
    while (n > 0 && s[n - 1] == '=') n--;
    if (n % 4 == 1) return -1;
    unsigned char *b = malloc(n / 4 * 3 + 3);
    if (!b) return -1;
    size_t k = 0;
    uint32_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int v = c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? c - 'a' + 26 : c >= '0' && c <= '9' ? c - '0' + 52 : c == '+' ? 62 : c == '/' ? 63 : -1;
        if (v < 0) {
            free(b);
            return -1;
        }
        acc = acc << 6 | (uint32_t)v;
        if (i % 4 == 3) b[k++] = (unsigned char)(acc >> 16), b[k++] = (unsigned char)(acc >> 8), b[k++] = (unsigned char)acc;
    }
    if (n % 4 == 2) b[k++] = (unsigned char)(acc >> 4);
    else if (n % 4 == 3) b[k++] = (unsigned char)(acc >> 10), b[k++] = (unsigned char)(acc >> 2);
    *out = b, *len = k;
    return 0;
}

/* What a message's content list is read into: its text, and the request's media parts. */
typedef struct {
    serve_request *r;
    const serve_limits *lim;
    size_t msg;
    g4_chat_role role;
} content_ctx;

/* One image_url or input_audio part (p: "messages[i].content[k]"): its bytes decoded into a new
 * entry of r->media. Only data: URLs: the server fetches nothing. */
static int read_media_part(const cJSON *part, const char *type, const char *p, const content_ctx *cx, serve_error *e) {
    int image = !strcmp(type, "image_url");
    char q[192];
    if (cx->role != G4_CHAT_USER)
        return serve_fail(e, 400, INVALID, NULL, p, "'%s': %s parts are taken in user messages only", p, image ? "image" : "audio");
    if (cx->r->n_media >= cx->lim->max_media)
        return serve_fail(e, 400, INVALID, NULL, p, "'%s': at most %d image and audio parts a request", p, cx->lim->max_media);
    const cJSON *obj = cJSON_GetObjectItemCaseSensitive(part, type);
    snprintf(q, sizeof q, "%s.%s", p, type);
    if (!cJSON_IsObject(obj)) return bad(e, q, "'%s' must be an object", q);
    const char *b64;
    size_t n;
    int budget = 0;
    if (image) {
        const cJSON *url = cJSON_GetObjectItemCaseSensitive(obj, "url"), *detail = cJSON_GetObjectItemCaseSensitive(obj, "detail");
        if (detail && (!cJSON_IsString(detail) || (strcmp(detail->valuestring, "low") && strcmp(detail->valuestring, "high") && strcmp(detail->valuestring, "auto")))) {
            snprintf(q, sizeof q, "%s.image_url.detail", p);
            return bad(e, q, "'%s' must be \"low\", \"high\" or \"auto\"", q);
        }
        if (detail && !strcmp(detail->valuestring, "low")) budget = 70;
        snprintf(q, sizeof q, "%s.image_url.url", p);
        if (!cJSON_IsString(url)) return bad(e, q, "'%s' must be a string", q);
        const char *u = url->valuestring, *comma = strchr(u, ',');
        if (strncmp(u, "data:", 5) != 0)
            return bad(e, q, "'%s': only data: URLs (data:image/png;base64,...) are taken; the server fetches no URL", q);
        if (!comma || (size_t)(comma - u) < 12 || strncmp(comma - 7, ";base64", 7) != 0 || strncmp(u + 5, "image/", 6) != 0)
            return bad(e, q, "'%s': expected data:image/<type>;base64,<data>", q);
        b64 = comma + 1, n = strlen(comma + 1);
    } else {
        const cJSON *data = cJSON_GetObjectItemCaseSensitive(obj, "data"), *format = cJSON_GetObjectItemCaseSensitive(obj, "format");
        snprintf(q, sizeof q, "%s.input_audio.format", p);
        if (!cJSON_IsString(format) || strcmp(format->valuestring, "wav") != 0) return bad(e, q, "'%s' must be \"wav\"", q);
        snprintf(q, sizeof q, "%s.input_audio.data", p);
        if (!cJSON_IsString(data)) return bad(e, q, "'%s' must be a base64 string", q);
        b64 = data->valuestring, n = strlen(data->valuestring);
    }
    unsigned char *bytes;
    size_t len;
    if (decode_base64(b64, n, &bytes, &len)) return bad(e, q, "'%s': not valid base64", q);
    if (len == 0) {
        free(bytes);
        return bad(e, q, "'%s': the file is empty", q);
    }
    serve_media *m = realloc(cx->r->media, sizeof *m * (size_t)(cx->r->n_media + 1));
    if (!m) {
        free(bytes);
        return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    cx->r->media = m;
    m += cx->r->n_media++;
    *m = (serve_media){.msg = cx->msg, .kind = image ? G4_MEDIA_IMAGE : G4_MEDIA_AUDIO, .bytes = bytes, .len = len, .budget = budget};
    snprintf(m->param, sizeof m->param, "%s", q);
    return 0;
}

/* A message's content: a string, an array of parts, or null (""). Text parts are trimmed and
 * joined as the template joins them; image_url and input_audio parts (cx: user messages) go to
 * the request's media, before the message's text as the template puts them. */
static int read_content(const cJSON *c, const char *param, const content_ctx *cx, char **out, serve_error *e) {
    g4_textbuf t = {0};
    int rc = g4_textbuf_append(&t, "", 0);
    if (!c || cJSON_IsNull(c)) {
    } else if (cJSON_IsString(c)) {
        rc = rc || g4_textbuf_appends(&t, c->valuestring);
    } else if (cJSON_IsArray(c)) {
        int i = 0;
        for (const cJSON *part = c->child; part && !rc; part = part->next, i++) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type"), *text = cJSON_GetObjectItemCaseSensitive(part, "text");
            char p[128];
            snprintf(p, sizeof p, "%s[%d]", param, i);
            if (!cJSON_IsObject(part) || !cJSON_IsString(type)) rc = bad(e, p, "'%s' must be an object with a 'type'", p);
            else if (!strcmp(type->valuestring, "image_url") || !strcmp(type->valuestring, "input_audio"))
                rc = read_media_part(part, type->valuestring, p, cx, e);
            else if (strcmp(type->valuestring, "text") != 0)
                rc = serve_fail(e, 400, INVALID, NULL, p, "'%s': content of type '%.40s' is not supported (text, image_url, input_audio)", p,
                                type->valuestring);
            else if (!cJSON_IsString(text)) rc = bad(e, p, "'%s' needs a 'text' string", p);
            else {
                size_t a, b;
                g4_chat_trim(text->valuestring, strlen(text->valuestring), &a, &b);
                rc = g4_textbuf_append(&t, text->valuestring + a, b - a);
            }
        }
    } else {
        rc = bad(e, param, "'%s' must be a string, an array of content parts or null", param);
    }
    if (rc == 0) return g4_textbuf_take(&t, out, NULL) ? serve_fail(e, 500, "server_error", NULL, NULL, "out of memory") : 0;
    free(t.p);
    return -1;
}

/* An assistant message's tool_calls, each written the way the model writes a call (they go before
 * its text, as the template renders them); ids[k] (borrowed) the calls' ids, for ordering the tool
 * messages that answer them. */
static int read_tool_calls(const cJSON *calls, const char *param, g4_textbuf *text, const char **ids, int max_ids, int *n_ids, serve_error *e) {
    if (!cJSON_IsArray(calls)) return bad(e, param, "'%s' must be an array", param);
    int i = 0;
    for (const cJSON *c = calls->child; c; c = c->next, i++) {
        char p[128];
        snprintf(p, sizeof p, "%s[%d]", param, i);
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name"), *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
        if (!cJSON_IsObject(c) || !cJSON_IsObject(fn) || !cJSON_IsString(name) || !name->valuestring[0])
            return bad(e, p, "'%s' needs a 'function' with a 'name'", p);
        if (args && !cJSON_IsNull(args) && !cJSON_IsString(args)) return bad(e, p, "'%s': 'function.arguments' must be a JSON string", p);
        const char *a = cJSON_IsString(args) ? args->valuestring : "";
        char *call;
        if (g4_tool_call_text(name->valuestring, a, strlen(a), &call))
            return serve_fail(e, 400, INVALID, NULL, p, "'%s': %s", p, g4_last_error());
        int rc = g4_textbuf_appends(text, call);
        free(call);
        if (rc) return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        if (*n_ids < max_ids) ids[(*n_ids)++] = cJSON_IsString(id) ? id->valuestring : NULL;
    }
    return 0;
}

#define MAX_CALLS 64

/* The tool messages msgs[from, to) answer the calls ids[0, n) of the model message before them.
 * Gemma's calls carry no ids (a response answers the call in its place), so when every one names
 * a call by tool_call_id they are put in the calls' order. */
static void order_tool_responses(g4_chat_message *msgs, const char **tool_ids, size_t from, size_t to, const char **ids, int n) {
    size_t count = to - from;
    if (count < 2) return;
    int rank[MAX_CALLS];
    for (size_t i = 0; i < count; i++) {
        rank[i] = -1;
        for (int k = 0; tool_ids[from + i] && k < n; k++)
            if (ids[k] && !strcmp(ids[k], tool_ids[from + i])) rank[i] = k;
        if (rank[i] < 0) return;
    }
    for (size_t i = 1; i < count; i++) /* insertion sort: stable */
        for (size_t j = i; j > 0 && rank[j - 1] > rank[j]; j--) {
            g4_chat_message m = msgs[from + j];
            msgs[from + j] = msgs[from + j - 1], msgs[from + j - 1] = m;
            int t = rank[j];
            rank[j] = rank[j - 1], rank[j - 1] = t;
        }
}

static int read_message(const cJSON *m, int i, serve_request *r, const serve_limits *lim, const char **ids, int *n_ids, const char **tool_id,
                        serve_error *e) {
    char p[64], pr[80];
    snprintf(p, sizeof p, "messages[%d]", i);
    snprintf(pr, sizeof pr, "messages[%d].role", i);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    if (!cJSON_IsObject(m)) return bad(e, p, "'%s' must be an object", p);
    if (!cJSON_IsString(role)) return bad(e, pr, "'%s' must be a string", pr);
    g4_chat_role rl;
    if (!strcmp(role->valuestring, "model") || g4_chat_role_parse(role->valuestring, &rl))
        return serve_fail(e, 400, INVALID, NULL, pr, "'%s': unknown role '%.40s' (system, developer, user, assistant or tool)", pr,
                          role->valuestring);
    snprintf(pr, sizeof pr, "messages[%d].content", i);
    char *content = NULL;
    content_ctx cx = {r, lim, r->n_msgs, rl};
    if (read_content(cJSON_GetObjectItemCaseSensitive(m, "content"), pr, &cx, &content, e)) return -1;
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (rl == G4_CHAT_MODEL && calls && !cJSON_IsNull(calls)) {
        g4_textbuf t = {0};
        snprintf(pr, sizeof pr, "messages[%d].tool_calls", i);
        *n_ids = 0;
        int rc = g4_textbuf_append(&t, "", 0) || read_tool_calls(calls, pr, &t, ids, MAX_CALLS, n_ids, e) || g4_textbuf_appends(&t, content);
        free(content);
        content = t.p;
        if (rc) {
            free(content);
            return e->status ? -1 : serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
    }
    const cJSON *tid = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
    *tool_id = rl == G4_CHAT_TOOL && cJSON_IsString(tid) ? tid->valuestring : NULL;
    r->msgs[r->n_msgs++] = (g4_chat_message){rl, content};
    return 0;
}

static int read_messages(const fields *f, serve_request *r, const serve_limits *lim) {
    const cJSON *msgs = field(f, "messages");
    if (!cJSON_IsArray(msgs)) return bad(f->e, "messages", "'%s' must be an array of messages", "messages");
    int n = cJSON_GetArraySize(msgs);
    if (n == 0) return bad(f->e, "messages", "'%s' must hold at least one message", "messages");
    if (n > lim->max_messages) return serve_fail(f->e, 400, INVALID, NULL, "messages", "'messages' holds %d messages; at most %d", n, lim->max_messages);
    const char **tool_ids = calloc((size_t)n, sizeof *tool_ids), *ids[MAX_CALLS];
    if (!(r->msgs = calloc((size_t)n, sizeof *r->msgs)) || !tool_ids) {
        free(tool_ids);
        return serve_fail(f->e, 500, "server_error", NULL, NULL, "out of memory");
    }
    int i = 0, n_ids = 0, rc = 0;
    size_t run = 0; /* where the tool messages after the last model message begin */
    for (const cJSON *m = msgs->child; m && !rc; m = m->next, i++) {
        rc = read_message(m, i, r, lim, ids, &n_ids, &tool_ids[i], f->e);
        if (rc) break;
        g4_chat_role rl = r->msgs[i].role;
        if (rl != G4_CHAT_TOOL) {
            if (i > 0) order_tool_responses(r->msgs, tool_ids, run, (size_t)i, ids, n_ids);
            run = (size_t)i + 1;
            if (rl != G4_CHAT_MODEL) n_ids = 0;
        }
    }
    if (!rc) order_tool_responses(r->msgs, tool_ids, run, (size_t)i, ids, n_ids);
    free(tool_ids);
    if (rc) return -1;
    g4_chat_options o = g4_chat_default_options();
    if (g4_chat_check(r->msgs, r->n_msgs, &o)) return bad(f->e, "messages", "'messages': %s", g4_last_error());
    return 0;
}

/* ---------------------------------------------------------------- thinking and tools */

/* chat_template_kwargs.enable_thinking (vLLM's, SGLang's) wins over reasoning_effort (OpenAI's):
 * "none" and "minimal" switch thinking off, "low", "medium" and "high" on. Off by default, as the
 * template has it. */
static int read_thinking(const fields *f, serve_request *r) {
    const char *effort = NULL;
    if (get_string(f, "reasoning_effort", &effort) < 0) return -1;
    if (effort) {
        static const char *const off[] = {"none", "minimal"}, *const on[] = {"low", "medium", "high"};
        int known = 0;
        for (int k = 0; k < 2; k++) known |= !strcmp(effort, off[k]);
        for (int k = 0; k < 3; k++)
            if (!strcmp(effort, on[k])) known = 1, r->thinking = 1;
        if (!known) return bad(f->e, "reasoning_effort", "'reasoning_effort' must be none, minimal, low, medium or high, not '%.40s'", effort);
    }
    const cJSON *kw = field(f, "chat_template_kwargs");
    if (kw) {
        if (!cJSON_IsObject(kw)) return bad(f->e, "chat_template_kwargs", "'%s' must be an object", "chat_template_kwargs");
        fields kf = {kw, f->e};
        if (get_bool(&kf, "enable_thinking", &r->thinking) < 0) return serve_fail(f->e, 400, INVALID, NULL, "chat_template_kwargs.enable_thinking",
                                                                                  "'chat_template_kwargs.enable_thinking' must be a boolean");
    }
    return 0;
}

static int read_tools(const fields *f, serve_request *r, const serve_limits *lim) {
    const cJSON *tools = field(f, "tools");
    if (tools) {
        if (!cJSON_IsArray(tools)) return bad(f->e, "tools", "'%s' must be an array", "tools");
        int n = cJSON_GetArraySize(tools);
        if (n > lim->max_tools) return serve_fail(f->e, 400, INVALID, NULL, "tools", "'tools' holds %d tools; at most %d", n, lim->max_tools);
        if (!(r->tools = calloc((size_t)(n ? n : 1), sizeof *r->tools))) return serve_fail(f->e, 500, "server_error", NULL, NULL, "out of memory");
        int i = 0;
        for (const cJSON *t = tools->child; t; t = t->next, i++) {
            char p[32];
            snprintf(p, sizeof p, "tools[%d]", i);
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
            if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function"))
                return bad(f->e, p, "'%s' must be an object of type 'function'", p);
            char *json = cJSON_PrintUnformatted(t);
            int rc = json ? g4_tool_declaration(json, strlen(json), &r->tools[i]) : -1;
            free(json);
            if (rc) return serve_fail(f->e, 400, INVALID, NULL, p, "'%s': %s", p, g4_last_error());
            r->strict_tools |= cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "strict"));
            r->n_tools++;
        }
        if (!(r->tools_json = cJSON_PrintUnformatted(tools))) return serve_fail(f->e, 500, "server_error", NULL, NULL, "out of memory");
    }
    int parallel = 1; /* OpenAI's default: the model may make several calls in one reply */
    if (get_bool(f, "parallel_tool_calls", &parallel) < 0) return -1;
    r->one_call = !parallel;
    const cJSON *choice = field(f, "tool_choice");
    if (!choice) return 0;
    if (cJSON_IsString(choice)) {
        static const char *const names[] = {"auto", "none", "required"};
        for (int k = 0; k < 3; k++)
            if (!strcmp(choice->valuestring, names[k])) r->tool_choice = (serve_tool_choice)k;
        if (strcmp(choice->valuestring, "auto") && r->tool_choice == SERVE_TOOLS_AUTO)
            return bad(f->e, "tool_choice", "'tool_choice' must be auto, none, required or a function, not '%.40s'", choice->valuestring);
    } else {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(choice, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(choice) || !cJSON_IsString(name)) return bad(f->e, "tool_choice", "'%s' must be a string or {\"type\":\"function\",\"function\":{\"name\":...}}", "tool_choice");
        r->tool_choice = SERVE_TOOLS_NAMED;
        if (!(r->tool_name = strdup(name->valuestring))) return serve_fail(f->e, 500, "server_error", NULL, NULL, "out of memory");
        int found = 0;
        for (const cJSON *t = tools ? tools->child : NULL; t; t = t->next) {
            const cJSON *tn = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
            found |= cJSON_IsString(tn) && !strcmp(tn->valuestring, name->valuestring);
        }
        if (!found) return bad(f->e, "tool_choice", "'tool_choice' names the function '%.80s', which 'tools' does not declare", name->valuestring);
    }
    if (r->tool_choice == SERVE_TOOLS_REQUIRED && r->n_tools == 0) return bad(f->e, "tool_choice", "'tool_choice' is '%s' but no tools are declared", "required");
    return 0;
}

static int read_chat(const fields *f, serve_request *r, const serve_limits *lim) {
    if (read_messages(f, r, lim) || read_thinking(f, r) || read_tools(f, r, lim)) return -1;
    /* a tool call is Gemma's own syntax, not the answer's format: the two do not mix (yet) */
    if (r->constraint_kind >= 0 && r->n_tools > 0 && r->tool_choice != SERVE_TOOLS_NONE)
        return serve_fail(f->e, 400, INVALID, NULL, r->constraint_param,
                          "'%s' with tools: a constrained answer cannot also call a tool; set 'tool_choice' to 'none' or leave the constraint out",
                          r->constraint_param);
    return 0;
}

/* ---------------------------------------------------------------- completions */

/* A prompt is a string, an array of one string, or an array of token ids. */
static int read_prompt(const fields *f, serve_request *r) {
    const cJSON *p = field(f, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(p->child)) p = p->child;
    if (cJSON_IsString(p)) {
        if (!p->valuestring[0]) return bad(f->e, "prompt", "'%s' may not be empty", "prompt");
        return (r->prompt = strdup(p->valuestring)) ? 0 : serve_fail(f->e, 500, "server_error", NULL, NULL, "out of memory");
    }
    if (!cJSON_IsArray(p) || !p->child || (!cJSON_IsNumber(p->child)))
        return bad(f->e, "prompt", "'%s' must be a string or an array of token ids (one prompt per request)", "prompt");
    int n = cJSON_GetArraySize(p), i = 0;
    if (!(r->prompt_ids = malloc(sizeof *r->prompt_ids * (size_t)n))) return serve_fail(f->e, 500, "server_error", NULL, NULL, "out of memory");
    for (const cJSON *t = p->child; t; t = t->next, i++) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 || t->valuedouble > INT32_MAX)
            return serve_fail(f->e, 400, INVALID, NULL, "prompt", "'prompt[%d]' must be a token id (a non-negative integer)", i);
        r->prompt_ids[i] = (int32_t)t->valuedouble;
    }
    r->n_prompt_ids = n;
    return 0;
}

static int read_completion(const fields *f, serve_request *r) {
    int echo = 0;
    long long best_of = 1;
    if (get_bool(f, "echo", &echo) < 0) return -1;
    if (echo) return bad(f->e, "echo", "'%s' is not supported", "echo");
    if (field(f, "suffix")) return bad(f->e, "suffix", "'%s' is not supported", "suffix");
    if (get_int(f, "best_of", 1, 1e9, &best_of) < 0) return -1;
    if (best_of != 1) return bad(f->e, "best_of", "'%s' > 1 is not supported", "best_of");
    return read_prompt(f, r);
}

/* ---------------------------------------------------------------- the request */

size_t serve_json_values(const char *body, size_t len) {
    size_t n = 1;
    int in_string = 0;
    for (size_t i = 0; i < len; i++) {
        char c = body[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = 0;
        } else if (c == '"') in_string = 1;
        else if (c == '[' || c == ',' || c == ':') n++;
    }
    return n;
}

int serve_parse_request(const char *body, size_t len, serve_kind kind, const serve_limits *lim, serve_request *r, serve_error *e) {
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    r->kind = kind;
    g4_sampling_default(&r->sampling);
    if (check_body_text(body, len, e)) return -1;
    size_t values = lim->max_json_values > 0 ? serve_json_values(body, len) : 0;
    if (values > (size_t)lim->max_json_values)
        return serve_fail(e, 413, INVALID, "request_too_large", NULL, "the request body has %zu JSON values, over the limit of %d (--max-json-values)",
                          values, lim->max_json_values);
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) return serve_fail(e, 400, INVALID, NULL, NULL, "the request body is not valid JSON");
    fields f = {root, e};
    int rc = !cJSON_IsObject(root) ? serve_fail(e, 400, INVALID, NULL, NULL, "the request body must be a JSON object") : 0;
    rc = rc || read_common(&f, r, lim) || (kind == SERVE_CHAT ? read_chat(&f, r, lim) : read_completion(&f, r));
    cJSON_Delete(root);
    if (rc) serve_request_free(r);
    return rc ? -1 : 0;
}

void serve_request_free(serve_request *r) {
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    for (size_t i = 0; i < r->n_msgs; i++) free((char *)r->msgs[i].content);
    free(r->msgs);
    for (size_t i = 0; i < r->n_tools; i++) free(r->tools[i]);
    free(r->tools);
    free(r->tool_name);
    free(r->tools_json);
    free(r->prompt);
    free(r->prompt_ids);
    free(r->cache_salt);
    free(r->constraint_text);
    free(r->bias_ids);
    free(r->bias_values);
    for (int i = 0; i < r->n_media; i++) free(r->media[i].bytes), free(r->media[i].embd);
    free(r->media);
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- the prompt's tokens */

/* The opening of the call tool_choice asks for, or NULL for none (the rest of the call is
 * serve_tool_constraint's). */
static char *call_prefill(const serve_request *r) {
    if (r->tool_choice != SERVE_TOOLS_REQUIRED && r->tool_choice != SERVE_TOOLS_NAMED) return NULL;
    g4_textbuf t = {0};
    if (g4_textbuf_appends(&t, "<|tool_call>call:") || (r->tool_choice == SERVE_TOOLS_NAMED && g4_textbuf_appends(&t, r->tool_name))) {
        free(t.p);
        return NULL;
    }
    return t.p;
}

static int chat_ids(const serve_request *r, const g4_tokenizer *tok, g4_chat_form form, int32_t **ids, size_t *n, int *opens_thought,
                    char **prefill, serve_error *e) {
    g4_chat_options o = g4_chat_default_options();
    o.form = form;
    o.thinking = r->thinking;
    if (r->tool_choice != SERVE_TOOLS_NONE) o.tools = (const char *const *)r->tools, o.n_tools = r->n_tools;
    g4_chat_media *media = r->n_media ? calloc((size_t)r->n_media, sizeof *media) : NULL;
    if (r->n_media && !media) return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (int k = 0; k < r->n_media; k++) media[k] = (g4_chat_media){r->media[k].msg, r->media[k].kind, r->media[k].n};
    int rc = g4_chat_encode_media(tok, r->msgs, r->n_msgs, 0, &o, media, (size_t)r->n_media, ids, n, opens_thought);
    free(media);
    if (rc) return serve_fail(e, 400, INVALID, NULL, "messages", "'messages': %s", g4_last_error());
    /* a prompt that leaves a thought open (after a tool response, thinking on) lets the model
     * finish its thought: no call is forced into it */
    *prefill = *opens_thought ? NULL : call_prefill(r);
    if (!*prefill) return 0;
    /* a call opened right after the generation prompt: "<|tool_call>" is a control token, the
     * name the request's text */
    int32_t *more = NULL;
    size_t n_more = 0;
    const char *name_part = *prefill + strlen("<|tool_call>");
    int32_t open = g4_tokenizer_piece_to_id(tok, "<|tool_call>");
    rc = open < 0 || g4_tokenizer_encode(tok, name_part, strlen(name_part), 0, &more, &n_more);
    int32_t *all = rc ? NULL : realloc(*ids, sizeof **ids * (*n + 1 + n_more));
    if (!all) {
        free(more);
        return serve_fail(e, 500, "server_error", NULL, NULL, "the tokenizer has no <|tool_call> token, or out of memory");
    }
    all[*n] = open;
    memcpy(all + *n + 1, more, sizeof *more * n_more);
    *ids = all;
    *n += 1 + n_more;
    free(more);
    return 0;
}

/* A reply without max_tokens: the server's default (--max-tokens), cut to what the context leaves
 * (every generated token but the last takes a place), so that it neither runs to the context's
 * end unasked nor is refused for a default nobody asked for. */
static int default_budget(const serve_request *r, const serve_limits *lim, int n_prompt) {
    int want = lim->max_tokens > 0 ? lim->max_tokens : r->kind == SERVE_CHAT ? SERVE_DEFAULT_CHAT_TOKENS : SERVE_DEFAULT_COMPLETION_TOKENS;
    int room = lim->ctx - n_prompt + 1;
    return want < room || room < 1 ? want : room;
}

int serve_prompt(const serve_request *r, const g4_tokenizer *tok, g4_chat_form form, int vocab, const serve_limits *lim,
                 int32_t **ids, int *n_ids, int *opens_thought, char **prefill, int *max_tokens, serve_error *e) {
    int32_t *p = NULL;
    size_t n = 0;
    *ids = NULL, *n_ids = 0, *opens_thought = 0, *prefill = NULL;
    if (r->kind == SERVE_CHAT) {
        if (chat_ids(r, tok, form, &p, &n, opens_thought, prefill, e)) return -1;
    } else if (r->prompt) {
        if (g4_tokenizer_encode(tok, r->prompt, strlen(r->prompt), 1, &p, &n))
            return serve_fail(e, 400, INVALID, NULL, "prompt", "'prompt': %s", g4_last_error());
    } else {
        if (!(p = malloc(sizeof *p * (size_t)r->n_prompt_ids))) return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(p, r->prompt_ids, sizeof *p * (size_t)r->n_prompt_ids);
        n = (size_t)r->n_prompt_ids;
    }
    for (size_t i = 0; i < n; i++)
        if (p[i] < 0 || p[i] >= vocab) {
            int32_t id = p[i];
            free(p), free(*prefill), *prefill = NULL;
            return serve_fail(e, 400, INVALID, NULL, "prompt", "token id %d is outside the vocabulary (0..%d)", id, vocab - 1);
        }
    /* every generated token but the last takes a place in the context */
    int budget = r->max_tokens > 0 ? r->max_tokens : default_budget(r, lim, (int)n);
    const char *what = r->kind == SERVE_CHAT ? "messages" : "prompt";
    if (n == 0 || (long)n > lim->ctx || (long)n + budget - 1 > lim->ctx) {
        int rc;
        if (r->max_tokens <= 0) /* no max_tokens: the default budget is cut to what the prompt leaves, and it leaves nothing */
            rc = serve_fail(e, 400, INVALID, "context_length_exceeded", what,
                            "This model's maximum context length is %d tokens. However, your %s resulted in %zu tokens. Please reduce the "
                            "length of the %s.", lim->ctx, what, n, what);
        else
            rc = serve_fail(e, 400, INVALID, "context_length_exceeded", what,
                            "This model's maximum context length is %d tokens. However, you requested %ld tokens (%zu in the %s, %d in the "
                            "completion). Please reduce the length of the %s or the completion.",
                            lim->ctx, (long)n + budget, n, what, budget, what);
        if (n == 0) rc = serve_fail(e, 400, INVALID, NULL, "prompt", "the prompt is empty");
        free(p), free(*prefill), *prefill = NULL;
        return rc;
    }
    *ids = p;
    *n_ids = (int)n;
    *max_tokens = budget;
    return 0;
}

int serve_tool_constraint(serve_request *r, const g4_tokenizer *tok, int in_call, serve_error *e) {
    int bad;
    size_t len = r->tools_json ? strlen(r->tools_json) : 0;
    if (!in_call && !(r->tool_choice == SERVE_TOOLS_AUTO && r->strict_tools && r->n_tools)) return 0;
    char *gbnf = in_call ? g4_tool_call_gbnf(tok, r->tools_json, len, r->tool_choice == SERVE_TOOLS_NAMED ? r->tool_name : NULL, &bad)
                         : g4_tool_reply_gbnf(tok, r->tools_json, len, &bad);
    if (!gbnf) {
        char param[64];
        snprintf(param, sizeof param, "%s", in_call ? "tool_choice" : "tools");
        if (bad >= 0) snprintf(param, sizeof param, "tools[%d].function.parameters", bad);
        return serve_fail(e, 400, INVALID, NULL, param, "'%s': %s", param, g4_last_error());
    }
    free(r->constraint_text);
    r->constraint_kind = G4_CONSTRAINT_GBNF, r->constraint_text = gbnf;
    snprintf(r->constraint_param, sizeof r->constraint_param, "%s", in_call ? "tool_choice" : "tools");
    return 0;
}

int serve_check_body(const char *body, size_t len, serve_error *e) { return check_body_text(body, len, e); }

int serve_media_spans(const serve_request *r, const g4_tokenizer *tok, const int32_t *ids, int n_ids, g4_embd_span **spans, serve_error *e) {
    *spans = malloc(sizeof **spans * (size_t)(r->n_media ? r->n_media : 1));
    if (!*spans) return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    int at = 0;
    for (int k = 0; k < r->n_media; k++) {
        int32_t mk[3];
        const serve_media *m = &r->media[k];
        if (g4_media_marker_ids(tok, m->kind, mk)) {
            free(*spans), *spans = NULL;
            return serve_fail(e, 400, INVALID, NULL, m->param, "'%s': %s", m->param, g4_last_error());
        }
        while (at + m->n + 1 < n_ids && !(ids[at] == mk[0] && ids[at + 1] == mk[1] && ids[at + m->n + 1] == mk[2])) at++;
        if (!m->embd || at + m->n + 1 >= n_ids) {
            free(*spans), *spans = NULL;
            return serve_fail(e, 500, "server_error", NULL, m->param, "'%s': its soft tokens are not in the rendered prompt", m->param);
        }
        (*spans)[k] = (g4_embd_span){.at = at + 1, .n = m->n, .embd = m->embd};
        at += m->n + 2;
    }
    return 0;
}
