/* g4 serve's token endpoints (tokens.h): /tokenize, /detokenize and /v1/embeddings' request and
 * reply. */
#define _POSIX_C_SOURCE 200809L
#include "serve/tokens.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static const char INVALID[] = "invalid_request_error";

/* The body as a JSON object, or NULL with e filled. */
static cJSON *parse_object(const char *body, size_t len, serve_error *e) {
    if (serve_check_body(body, len, e)) return NULL;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        serve_fail(e, 400, INVALID, NULL, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* A boolean field: *out unchanged when absent or null; -1 with e filled when not a boolean. */
static int opt_bool(const cJSON *root, const char *name, int *out, serve_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return serve_fail(e, 400, INVALID, NULL, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

static char *print_and_free(cJSON *root) {
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

/* One id's text (llama-server's with_pieces form): a byte token (<0xHH>) as its byte's value in an
 * array, as it is no whole character; any other as its text. */
static cJSON *piece_json(const g4_tokenizer *tok, int32_t id) {
    const char *piece = g4_tokenizer_id_to_piece(tok, id);
    unsigned byte;
    char end;
    if (piece && strlen(piece) == 6 && sscanf(piece, "<0x%2X%c", &byte, &end) == 2 && end == '>') {
        cJSON *v = cJSON_CreateArray();
        cJSON_AddItemToArray(v, cJSON_CreateNumber(byte));
        return v;
    }
    char *text;
    size_t len;
    if (g4_tokenizer_decode(tok, &id, 1, &text, &len)) return NULL;
    cJSON *v = cJSON_CreateString(text);
    free(text);
    return v;
}

char *serve_tokenize(const char *body, size_t len, const g4_tokenizer *tok, serve_error *e) {
    cJSON *root = parse_object(body, len, e);
    if (!root) return NULL;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(root, "content");
    int add_special = 0, parse_special = 1, with_pieces = 0;
    int32_t *ids = NULL;
    size_t n = 0;
    cJSON *out = NULL;
    if (!cJSON_IsString(content)) serve_fail(e, 400, INVALID, NULL, "content", "'content' must be a string");
    else if (opt_bool(root, "add_special", &add_special, e) || opt_bool(root, "parse_special", &parse_special, e) ||
             opt_bool(root, "with_pieces", &with_pieces, e)) {
    } else if (g4_tokenizer_encode(tok, content->valuestring, strlen(content->valuestring), parse_special, &ids, &n)) {
        serve_fail(e, 500, "server_error", NULL, NULL, "%s", g4_last_error());
    } else {
        out = cJSON_CreateObject();
        cJSON *arr = cJSON_AddArrayToObject(out, "tokens");
        int32_t bos = g4_tokenizer_piece_to_id(tok, "<bos>");
        for (size_t i = add_special && bos >= 0 ? 0 : 1; i <= n; i++) {
            int32_t id = i == 0 ? bos : ids[i - 1];
            cJSON *item = cJSON_CreateNumber(id);
            if (with_pieces) {
                cJSON *obj = cJSON_CreateObject();
                cJSON_AddItemToObject(obj, "id", item);
                cJSON_AddItemToObject(obj, "piece", piece_json(tok, id));
                item = obj;
            }
            cJSON_AddItemToArray(arr, item);
        }
    }
    free(ids);
    cJSON_Delete(root);
    char *s = print_and_free(out);
    if (out && !s) serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return s;
}

/* An array of token ids in [0, vocab) into *ids (malloc'd); param names it in errors. */
static int read_ids(const cJSON *arr, int vocab, const char *param, int32_t **ids, int *n, serve_error *e) {
    int k = cJSON_GetArraySize(arr), i = 0;
    *ids = malloc(sizeof **ids * (size_t)(k ? k : 1));
    *n = k;
    if (!*ids) return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (const cJSON *v = arr->child; v; v = v->next, i++) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < vocab) || v->valuedouble != floor(v->valuedouble)) {
            free(*ids);
            *ids = NULL;
            return serve_fail(e, 400, INVALID, NULL, param, "'%s' must hold token ids: integers in [0, %d)", param, vocab);
        }
        (*ids)[i] = (int32_t)v->valuedouble;
    }
    return 0;
}

char *serve_detokenize(const char *body, size_t len, const g4_tokenizer *tok, serve_error *e) {
    cJSON *root = parse_object(body, len, e);
    if (!root) return NULL;
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    int32_t *ids = NULL;
    int n = 0;
    char *text = NULL, *s = NULL;
    size_t text_len;
    if (!cJSON_IsArray(tokens)) serve_fail(e, 400, INVALID, NULL, "tokens", "'tokens' must be an array of token ids");
    else if (read_ids(tokens, (int)g4_tokenizer_vocab_size(tok), "tokens", &ids, &n, e)) {
    } else if (g4_tokenizer_decode(tok, ids, (size_t)n, &text, &text_len)) {
        serve_fail(e, 500, "server_error", NULL, NULL, "%s", g4_last_error());
    } else {
        /* the decoder's text is UTF-8 (U+FFFD for invalid bytes), but a <0x00> token gives a NUL,
         * where a cJSON string would end: it becomes U+FFFD too */
        char *clean = malloc(3 * text_len + 1);
        size_t k = 0;
        for (size_t i = 0; clean && i < text_len; i++)
            if (text[i]) clean[k++] = text[i];
            else memcpy(clean + k, "\xEF\xBF\xBD", 3), k += 3;
        if (clean) clean[k] = 0;
        cJSON *out = cJSON_CreateObject();
        cJSON_AddStringToObject(out, "content", clean ? clean : "");
        free(clean);
        if (!(s = print_and_free(out))) serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    free(text);
    free(ids);
    cJSON_Delete(root);
    return s;
}

/* ---------------------------------------------------------------- /v1/embeddings */

void serve_embed_request_free(serve_embed_request *r) {
    for (int i = 0; r->ids && i < r->n_inputs; i++) free(r->ids[i]);
    free(r->ids), free(r->n_ids);
    memset(r, 0, sizeof *r);
}

/* A text input: BOS and its tokens (control tokens parsed, as the completions' text prompts). */
static int text_ids(const g4_tokenizer *tok, const char *text, const char *param, int32_t **ids, int *n, serve_error *e) {
    int32_t *t;
    size_t k;
    if (!*text) return serve_fail(e, 400, INVALID, NULL, param, "'%s' must not be empty", param);
    if (g4_tokenizer_encode(tok, text, strlen(text), 1, &t, &k)) return serve_fail(e, 500, "server_error", NULL, NULL, "%s", g4_last_error());
    int32_t bos = g4_tokenizer_piece_to_id(tok, "<bos>");
    if (!(*ids = malloc(sizeof **ids * (k + 1)))) {
        free(t);
        return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    (*ids)[0] = bos >= 0 ? bos : 2;
    memcpy(*ids + 1, t, sizeof *t * k);
    free(t);
    *n = (int)k + 1;
    return 0;
}

/* input[i]: a text or an array of ids. */
static int read_input(const cJSON *v, const char *param, const g4_tokenizer *tok, int vocab, int32_t **ids, int *n, serve_error *e) {
    if (cJSON_IsString(v)) {
        if (text_ids(tok, v->valuestring, param, ids, n, e)) return -1;
        for (int i = 0; i < *n; i++)
            if ((*ids)[i] < 0 || (*ids)[i] >= vocab)
                return serve_fail(e, 400, INVALID, NULL, param, "'%s' has token %d, which the model's vocabulary (%d) lacks", param, (*ids)[i], vocab);
        return 0;
    }
    if (!cJSON_IsArray(v)) return serve_fail(e, 400, INVALID, NULL, param, "'%s' must be a string or an array of token ids", param);
    if (!v->child) return serve_fail(e, 400, INVALID, NULL, param, "'%s' must not be empty", param);
    return read_ids(v, vocab, param, ids, n, e);
}

int serve_parse_embeddings(const char *body, size_t len, const g4_tokenizer *tok, int vocab, const serve_limits *lim, serve_embed_request *r,
                           serve_error *e) {
    memset(r, 0, sizeof *r);
    cJSON *root = parse_object(body, len, e);
    if (!root) return -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model"), *input = cJSON_GetObjectItemCaseSensitive(root, "input");
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "encoding_format");
    int rc = -1;
    /* one input: a text or an array of numbers; several: an array of texts or of arrays */
    int many = cJSON_IsArray(input) && input->child && (cJSON_IsString(input->child) || cJSON_IsArray(input->child));
    int n = many ? cJSON_GetArraySize(input) : 1;
    if (model && !cJSON_IsNull(model) && !cJSON_IsString(model)) serve_fail(e, 400, INVALID, NULL, "model", "'model' must be a string");
    else if (serve_check_model(cJSON_IsString(model) ? model->valuestring : NULL, lim, e)) {
    } else if (format && !cJSON_IsNull(format) &&
             (!cJSON_IsString(format) || (strcmp(format->valuestring, "float") != 0 && strcmp(format->valuestring, "base64") != 0)))
        serve_fail(e, 400, INVALID, NULL, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
    else if (!input || cJSON_IsNull(input)) serve_fail(e, 400, INVALID, NULL, "input", "you must provide an input");
    else if (cJSON_IsArray(input) && !input->child) serve_fail(e, 400, INVALID, NULL, "input", "'input' must not be empty");
    else if (n > SERVE_MAX_EMBED_INPUTS) serve_fail(e, 400, INVALID, NULL, "input", "'input' holds %d inputs, over the limit of %d", n, SERVE_MAX_EMBED_INPUTS);
    else if (!(r->ids = calloc((size_t)n, sizeof *r->ids)) || !(r->n_ids = calloc((size_t)n, sizeof *r->n_ids)))
        serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    else {
        r->base64 = cJSON_IsString(format) && !strcmp(format->valuestring, "base64");
        r->n_inputs = n;
        rc = 0;
        const cJSON *v = many ? input->child : input;
        for (int i = 0; !rc && i < n; i++, v = v->next) {
            char param[32];
            snprintf(param, sizeof param, many ? "input[%d]" : "input", i);
            rc = read_input(v, param, tok, vocab, &r->ids[i], &r->n_ids[i], e);
            if (!rc && r->n_ids[i] > lim->ctx)
                rc = serve_fail(e, 400, INVALID, "context_length_exceeded", param,
                                "This model's maximum context length is %d tokens. However, %s has %d tokens.", lim->ctx, param, r->n_ids[i]);
        }
    }
    cJSON_Delete(root);
    if (rc) serve_embed_request_free(r);
    return rc;
}

void serve_pool_add(double *acc, const float *hidden, int dim, serve_pooling pooling) {
    for (int i = 0; i < dim; i++) acc[i] = pooling == SERVE_POOL_LAST ? hidden[i] : acc[i] + hidden[i];
}

void serve_pool_finish(const double *acc, int dim, int n_rows, serve_pooling pooling, float *out) {
    double scale = pooling == SERVE_POOL_MEAN && n_rows > 0 ? 1.0 / n_rows : 1.0, norm = 0;
    for (int i = 0; i < dim; i++) norm += acc[i] * scale * (acc[i] * scale);
    norm = sqrt(norm);
    for (int i = 0; i < dim; i++) out[i] = (float)(norm > 0 ? acc[i] * scale / norm : 0.0);
}

/* The vector's float32 bytes, little-endian, in base64 (what OpenAI's clients decode). */
static char *base64_floats(const float *v, int dim) {
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = (size_t)dim * 4;
    unsigned char *b = malloc(n ? n : 1);
    char *out = malloc((n + 2) / 3 * 4 + 1);
    if (!b || !out) {
        free(b), free(out);
        return NULL;
    }
    for (int i = 0; i < dim; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++) b[4 * i + k] = (unsigned char)(u >> (8 * k));
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t x = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
        out[o++] = digits[x >> 18 & 63];
        out[o++] = digits[x >> 12 & 63];
        out[o++] = i + 1 < n ? digits[x >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? digits[x & 63] : '=';
    }
    out[o] = 0;
    free(b);
    return out;
}

char *serve_embeddings_json(const serve_embed_request *r, const float *vecs, int dim, const char *model_id) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    long tokens = 0;
    int ok = 1;
    for (int i = 0; ok && i < r->n_inputs; i++) {
        cJSON *item = cJSON_CreateObject();
        cJSON_AddStringToObject(item, "object", "embedding");
        cJSON_AddNumberToObject(item, "index", i);
        const float *v = vecs + (size_t)i * dim;
        if (r->base64) {
            char *s = base64_floats(v, dim);
            ok = s != NULL;
            cJSON_AddStringToObject(item, "embedding", s ? s : "");
            free(s);
        } else {
            cJSON *arr = cJSON_AddArrayToObject(item, "embedding");
            /* 9 significant digits: each float32 exactly again when read back as one (cJSON's own
             * printing of the double may land an ulp off) */
            for (int k = 0; k < dim; k++) {
                char num[32];
                snprintf(num, sizeof num, "%.9g", v[k]);
                cJSON_AddItemToArray(arr, cJSON_CreateRaw(num));
            }
        }
        cJSON_AddItemToArray(data, item);
        tokens += r->n_ids[i];
    }
    cJSON_AddStringToObject(root, "model", model_id);
    cJSON *usage = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(usage, "prompt_tokens", (double)tokens);
    cJSON_AddNumberToObject(usage, "total_tokens", (double)tokens);
    char *s = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}
