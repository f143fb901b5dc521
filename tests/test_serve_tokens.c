/* g4 serve's token endpoints (tools/serve/tokens.c), without HTTP or the model's weights (the
 * built-in model's tokenizer only):
 *  - /tokenize gives the tokenizer's ids (g4_tokenizer_encode, what `g4 tokenize` prints), BOS
 *    first with add_special, the text's own tokens with parse_special false, pieces that spell
 *    the text (a byte token's as its byte); /detokenize gives the text back;
 *  - /v1/embeddings' inputs in their four forms, each as token ids (a text: BOS and its ids), and
 *    every refusal naming its field;
 *  - pooling on worked examples (mean and last, L2-normalised), the base64 encoding on a worked
 *    example (1.0f is 00 00 80 3F, "AACAPw=="), and the reply's shape and usage. */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <math.h>

#include "serve/tokens.h"

#define TOKENIZER "models/gemma4-tiny-math/tokenizer.json"

static g4_tokenizer *tok;
static const serve_limits LIM = {.model_id = "m", .strict_model = 1, .ctx = 16, .max_messages = 8, .max_tools = 2, .max_stop = 4, .max_stop_len = 16};

static cJSON *reply_of(char *json) {
    cJSON *j = json ? cJSON_Parse(json) : NULL;
    free(json);
    return j;
}

/* The ids array of a /tokenize reply (ids of {"id"} objects with pieces), and the pieces' bytes joined. */
static int reply_ids(const cJSON *r, int32_t *ids, int cap, char *joined, size_t jcap) {
    int n = 0;
    size_t k = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(r, "tokens")) {
        const cJSON *id = cJSON_IsObject(t) ? cJSON_GetObjectItem(t, "id") : t, *piece = cJSON_GetObjectItem(t, "piece");
        if (n < cap) ids[n++] = (int32_t)id->valuedouble;
        if (cJSON_IsString(piece)) {
            size_t l = strlen(piece->valuestring);
            if (k + l < jcap) memcpy(joined + k, piece->valuestring, l), k += l;
        } else if (cJSON_IsArray(piece)) {
            const cJSON *b;
            cJSON_ArrayForEach(b, piece) if (k + 1 < jcap) joined[k++] = (char)(int)b->valuedouble;
        }
    }
    if (joined) joined[k] = 0;
    return n;
}

static void check_tokenize(void) {
    const char *texts[] = {"Hello world", "unicode \xe5\xaa\xbd and emoji \xf0\x9f\xa4\x97", "<start_of_turn>user\nhi", " two  spaces\tand tab"};
    int32_t bos = g4_tokenizer_piece_to_id(tok, "<bos>");
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        for (int special = 0; special < 2; special++) {
            const char *text = texts[i];
            int32_t *want;
            size_t n_want;
            CHECK(g4_tokenizer_encode(tok, text, strlen(text), special, &want, &n_want) == 0, "%s", g4_last_error());
            cJSON *req = cJSON_CreateObject();
            cJSON_AddStringToObject(req, "content", text);
            cJSON_AddBoolToObject(req, "parse_special", special);
            cJSON_AddBoolToObject(req, "with_pieces", 1);
            char *body = cJSON_PrintUnformatted(req), joined[512];
            cJSON_Delete(req);
            serve_error e;
            cJSON *r = reply_of(serve_tokenize(body, strlen(body), tok, &e));
            int32_t ids[256];
            int n = reply_ids(r, ids, 256, joined, sizeof joined);
            CHECK(r && n == (int)n_want && !memcmp(ids, want, sizeof *ids * n_want), "/tokenize %s (parse_special %d): the tokenizer's %zu ids, got %d",
                  text, special, n_want, n);
            CHECK(!strcmp(joined, text), "/tokenize %s: the pieces spell the text (got '%s')", text, joined);
            cJSON_Delete(r);
            free(body);
            /* /detokenize of those ids gives the text back */
            char *dbody = malloc(16 + 12 * n_want), *p = dbody;
            p += sprintf(p, "{\"tokens\":[");
            for (size_t k = 0; k < n_want; k++) p += sprintf(p, "%s%d", k ? "," : "", want[k]);
            sprintf(p, "]}");
            r = reply_of(serve_detokenize(dbody, strlen(dbody), tok, &e));
            const cJSON *content = cJSON_GetObjectItem(r, "content");
            CHECK(cJSON_IsString(content) && !strcmp(content->valuestring, text), "/detokenize gives '%s' back (got '%s')", text,
                  cJSON_IsString(content) ? content->valuestring : "-");
            cJSON_Delete(r);
            free(dbody);
            free(want);
        }
    }
    serve_error e;
    const char *with_bos = "{\"content\":\"Hello\",\"add_special\":true}", *without = "{\"content\":\"Hello\"}";
    cJSON *a = reply_of(serve_tokenize(with_bos, strlen(with_bos), tok, &e)), *b = reply_of(serve_tokenize(without, strlen(without), tok, &e));
    int32_t ia[16], ib[16];
    int na = reply_ids(a, ia, 16, NULL, 0), nb = reply_ids(b, ib, 16, NULL, 0);
    CHECK(bos >= 0 && na == nb + 1 && ia[0] == bos && !memcmp(ia + 1, ib, sizeof *ib * (size_t)nb), "add_special puts BOS (%d) first", bos);
    CHECK(nb > 0 && ib[0] != bos, "without add_special no BOS");
    cJSON_Delete(a), cJSON_Delete(b);
    /* a byte token's piece is its byte */
    int32_t byte = g4_tokenizer_piece_to_id(tok, "<0xE5>");
    char body[64];
    snprintf(body, sizeof body, "{\"tokens\":[%d]}", byte);
    const char *pieces = "{\"content\":\"\xe5\xaa\xbd\",\"with_pieces\":true}";
    a = reply_of(serve_tokenize(pieces, strlen(pieces), tok, &e));
    const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItem(a, "tokens"), 0), *piece = cJSON_GetObjectItem(first, "piece");
    CHECK(byte >= 0 && (int)cJSON_GetObjectItem(first, "id")->valuedouble == byte && cJSON_IsArray(piece) && cJSON_GetArraySize(piece) == 1 &&
              cJSON_GetArrayItem(piece, 0)->valuedouble == 0xE5,
          "a byte token's piece is [229]");
    cJSON_Delete(a);
    struct {
        const char *body, *param;
        int tokenize;
    } bad[] = {{"{}", "content", 1}, {"{\"content\":1}", "content", 1}, {"{\"content\":\"a\",\"add_special\":1}", "add_special", 1},
               {"[1]", "", 1}, {"{\"content\":\"\xc3\x28\"}", "", 1}, {"{}", "tokens", 0}, {"{\"tokens\":[-1]}", "tokens", 0},
               {"{\"tokens\":[0.5]}", "tokens", 0}, {"{\"tokens\":[1000000]}", "tokens", 0}, {"{\"tokens\":[757]}", "tokens", 0}, {"{\"tokens\":\"1\"}", "tokens", 0}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *out = bad[i].tokenize ? serve_tokenize(bad[i].body, strlen(bad[i].body), tok, &e) : serve_detokenize(bad[i].body, strlen(bad[i].body), tok, &e);
        CHECK(!out && e.status == 400 && !strcmp(e.param, bad[i].param) && e.message[0], "%s %s: 400 naming '%s' (got %d '%s': %s)",
              bad[i].tokenize ? "/tokenize" : "/detokenize", bad[i].body, bad[i].param, e.status, e.param, e.message);
        free(out);
    }
}

/* ---------------------------------------------------------------- /v1/embeddings */

static void check_embed_requests(void) {
    int32_t bos = g4_tokenizer_piece_to_id(tok, "<bos>"), *hello;
    size_t n_hello;
    CHECK(g4_tokenizer_encode(tok, "hello", 5, 1, &hello, &n_hello) == 0, "%s", g4_last_error());
    struct {
        const char *body;
        int n_inputs, base64;
    } ok[] = {{"{\"model\":\"m\",\"input\":\"hello\"}", 1, 0},
              {"{\"model\":\"m\",\"input\":[\"hello\",\"hello\"],\"encoding_format\":\"base64\"}", 2, 1},
              {"{\"model\":\"m\",\"input\":[5,6,7],\"encoding_format\":\"float\"}", 1, 0},
              {"{\"model\":\"m\",\"input\":[[5,6,7],[5]]}", 2, 0}};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        serve_embed_request r;
        serve_error e;
        int rc = serve_parse_embeddings(ok[i].body, strlen(ok[i].body), tok, 757, &LIM, &r, &e);
        CHECK(rc == 0 && r.n_inputs == ok[i].n_inputs && r.base64 == ok[i].base64, "%s: %d inputs (%s)", ok[i].body, ok[i].n_inputs, rc ? e.message : "");
        if (rc) continue;
        if (i < 2) {
            for (int k = 0; k < r.n_inputs; k++)
                CHECK(r.n_ids[k] == (int)n_hello + 1 && r.ids[k][0] == bos && !memcmp(r.ids[k] + 1, hello, sizeof *hello * n_hello),
                      "a text input is BOS and its tokens");
        } else {
            CHECK(r.n_ids[0] == 3 && r.ids[0][0] == 5 && r.ids[0][2] == 7 && (r.n_inputs == 1 || (r.n_ids[1] == 1 && r.ids[1][0] == 5)),
                  "token-id inputs as given");
        }
        serve_embed_request_free(&r);
    }
    free(hello);
    struct {
        const char *body, *param, *code;
        int status;
    } bad[] = {{"{\"model\":\"m\",\"input\":\"\"}", "input", NULL, 400},
               {"{\"model\":\"m\",\"input\":[]}", "input", NULL, 400},
               {"{\"model\":\"m\",\"input\":[\"a\",\"\"]}", "input[1]", NULL, 400},
               {"{\"model\":\"m\",\"input\":[[1],[]]}", "input[1]", NULL, 400},
               {"{\"model\":\"m\",\"input\":[1,757]}", "input", NULL, 400},
               {"{\"model\":\"m\",\"input\":[1,-1]}", "input", NULL, 400},
               {"{\"model\":\"m\",\"input\":[1,2.5]}", "input", NULL, 400},
               {"{\"model\":\"m\",\"input\":7}", "input", NULL, 400},
               {"{\"model\":\"m\",\"input\":[{\"a\":1}]}", "input", NULL, 400},
               {"{\"model\":\"m\"}", "input", NULL, 400},
               {"{\"input\":\"a\"}", "model", NULL, 400},
               {"{\"model\":\"x\",\"input\":\"a\"}", "model", "model_not_found", 404},
               {"{\"model\":\"m\",\"input\":\"a\",\"encoding_format\":\"int8\"}", "encoding_format", NULL, 400},
               {"{\"model\":\"m\",\"input\":[[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]]}", "input[0]", "context_length_exceeded", 400},
               {"{\"model\":\"m\",\"input\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", "input", "context_length_exceeded", 400}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        serve_embed_request r;
        serve_error e;
        int rc = serve_parse_embeddings(bad[i].body, strlen(bad[i].body), tok, 757, &LIM, &r, &e);
        CHECK(rc != 0 && e.status == bad[i].status && !strcmp(e.param, bad[i].param) && (bad[i].code ? e.code && !strcmp(e.code, bad[i].code) : !e.code),
              "%s: %d naming '%s' (got %d '%s' %s: %s)", bad[i].body, bad[i].status, bad[i].param, rc ? e.status : 0, rc ? e.param : "",
              rc && e.code ? e.code : "null", rc ? e.message : "");
        if (!rc) serve_embed_request_free(&r);
    }
    /* 16 tokens fit a context of 16: BOS and 15 */
    const char *fits = "{\"model\":\"m\",\"input\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}";
    serve_embed_request r;
    serve_error e;
    CHECK(serve_parse_embeddings(fits, strlen(fits), tok, 757, &LIM, &r, &e) == 0 && r.n_ids[0] == 16, "an input of exactly the context fits");
    serve_embed_request_free(&r);
    /* without --strict-model any name, or none, is taken (as for chat) */
    serve_limits open = LIM;
    open.strict_model = 0;
    const char *names[] = {"{\"input\":\"a\"}", "{\"model\":\"gpt-3.5-turbo\",\"input\":\"a\"}"};
    for (int i = 0; i < 2; i++) {
        int rc = serve_parse_embeddings(names[i], strlen(names[i]), tok, 757, &open, &r, &e);
        CHECK(rc == 0, "%s without --strict-model: %s", names[i], rc ? e.message : "");
        if (!rc) serve_embed_request_free(&r);
    }
}

/* Worked examples: rows (1, 2) and (3, 2): mean (2, 2) -> (1, 1)/sqrt(2); last (3, 2)/sqrt(13). */
static void check_pooling(void) {
    const float rows[2][2] = {{1, 2}, {3, 2}};
    for (int pooling = SERVE_POOL_MEAN; pooling <= SERVE_POOL_LAST; pooling++) {
        double acc[2] = {0, 0};
        float out[2];
        for (int i = 0; i < 2; i++) serve_pool_add(acc, rows[i], 2, (serve_pooling)pooling);
        serve_pool_finish(acc, 2, 2, (serve_pooling)pooling, out);
        double want0 = pooling == SERVE_POOL_MEAN ? 1 / sqrt(2) : 3 / sqrt(13), want1 = pooling == SERVE_POOL_MEAN ? 1 / sqrt(2) : 2 / sqrt(13);
        CHECK(fabs(out[0] - want0) < 1e-7 && fabs(out[1] - want1) < 1e-7, "%s pooling: (%.7f, %.7f), want (%.7f, %.7f)",
              pooling == SERVE_POOL_MEAN ? "mean" : "last", out[0], out[1], want0, want1);
    }
    /* a mean is not the last row's direction, nor the sum's of unequal rows' without the mean */
    double acc[3] = {0, 0, 0};
    const float a[3] = {1, 0, 0}, b[3] = {0, 3, 4};
    float out[3];
    serve_pool_add(acc, a, 3, SERVE_POOL_MEAN);
    serve_pool_add(acc, b, 3, SERVE_POOL_MEAN);
    serve_pool_finish(acc, 3, 2, SERVE_POOL_MEAN, out);
    CHECK(fabs(out[0] - 1 / sqrt(26)) < 1e-7 && fabs(out[1] - 3 / sqrt(26)) < 1e-7 && fabs(out[2] - 4 / sqrt(26)) < 1e-7, "mean of (1,0,0) and (0,3,4)");
}

static void check_embed_reply(void) {
    const char *body = "{\"model\":\"m\",\"input\":[[5,6,7],[8]],\"encoding_format\":\"base64\"}";
    serve_embed_request r;
    serve_error e;
    CHECK(serve_parse_embeddings(body, strlen(body), tok, 757, &LIM, &r, &e) == 0, "%s", e.message);
    const float vecs[4] = {1.0f, -2.0f, 0.5f, 0.25f};
    cJSON *j = reply_of(serve_embeddings_json(&r, vecs, 2, "m"));
    const cJSON *data = cJSON_GetObjectItem(j, "data"), *usage = cJSON_GetObjectItem(j, "usage");
    const cJSON *e0 = cJSON_GetArrayItem(data, 0), *e1 = cJSON_GetArrayItem(data, 1);
    /* 1.0f = 00 00 80 3F, -2.0f = 00 00 00 C0: bytes 00 00 80 3F 00 00 00 C0 */
    CHECK(cJSON_IsString(cJSON_GetObjectItem(e0, "embedding")) && !strcmp(cJSON_GetObjectItem(e0, "embedding")->valuestring, "AACAPwAAAMA="),
          "base64 of (1, -2): AACAPwAAAMA= (got %s)", cJSON_IsString(cJSON_GetObjectItem(e0, "embedding")) ? cJSON_GetObjectItem(e0, "embedding")->valuestring : "-");
    /* 0.5f = 00 00 00 3F, 0.25f = 00 00 80 3E */
    CHECK(e1 && !strcmp(cJSON_GetObjectItem(e1, "embedding")->valuestring, "AAAAPwAAgD4=") && cJSON_GetObjectItem(e1, "index")->valuedouble == 1,
          "base64 of (0.5, 0.25), index 1");
    CHECK(cJSON_GetObjectItem(usage, "prompt_tokens")->valuedouble == 4 && cJSON_GetObjectItem(usage, "total_tokens")->valuedouble == 4 &&
              !strcmp(cJSON_GetObjectItem(j, "object")->valuestring, "list") && !strcmp(cJSON_GetObjectItem(j, "model")->valuestring, "m") &&
              !strcmp(cJSON_GetObjectItem(e0, "object")->valuestring, "embedding"),
          "the list's shape and usage (4 tokens)");
    cJSON_Delete(j);
    r.base64 = 0;
    const float odd[2] = {0.1f, -3.4028235e38f};
    j = reply_of(serve_embeddings_json(&r, odd, 1, "m"));
    const cJSON *v = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0), "embedding"), 0);
    const cJSON *w = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 1), "embedding"), 0);
    CHECK(v && w && (float)v->valuedouble == 0.1f && (float)w->valuedouble == -3.4028235e38f, "float numbers read back as the same float32s");
    cJSON_Delete(j);
    serve_embed_request_free(&r);
}

int main(void) {
    g4_set_log(NULL, NULL);
    tok = g4_tokenizer_load_ex(TOKENIZER, G4_TOKENIZER_NO_CACHE);
    CHECK(tok != NULL, "%s", g4_last_error());
    if (!tok) return check_report("test_serve_tokens");
    check_tokenize();
    check_embed_requests();
    check_pooling();
    check_embed_reply();
    g4_tokenizer_free(tok);
    return check_report("test_serve_tokens");
}
