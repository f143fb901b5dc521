/* Fuzz target: g4 serve's request parser and reply writer (tools/serve/request.c, reply.c) and the
 * tool-call parser (src/text/tools.c), with the Gemma 4 tokenizer.
 *
 * Input: one flag byte, then the data. Flag bits 0-1 choose what the data is:
 *   0, 1: a request body (chat / completions) for serve_parse_request, then serve_prompt. Refused:
 *         a 4xx/500 status, a one-line message, an error body that is JSON with the four fields.
 *         Accepted: UTF-8 message contents, the limits kept, and a prompt whose tokens are in the
 *         vocabulary and that fits the context with its budget, or a 400;
 *   2:    a call's arguments for g4_tool_arguments_json: accepted, the JSON is an object; when its
 *         keys are plain words (no duplicates) and its strings hold no <|"|>, writing it back with
 *         g4_tool_call_text and parsing that gives the same JSON (the round trip the server makes
 *         with a model's call fed back in the history). The data as a tool object goes through
 *         g4_tool_declaration too;
 *   3:    model text, tokenized and pushed token by token through serve_reply, streamed and whole,
 *         with stop strings cut from the data (flag bits 2-7) and, for data of odd length, each
 *         token's log-probabilities written (chat's logprobs.content): every event is "data: JSON", the
 *         stream ends with [DONE], the whole body is JSON, and both carry the same content,
 *         reasoning and calls. */
#include <cjson/cJSON.h>
#include <strings.h>

#include "serve/reply.h"
#include "serve/request.h"
#include "text/chat.h"
#include "g4.h"
#include "util/err.h"

#include "fuzz_common.h"

static g4_tokenizer *tok;
static int vocab;
static const serve_limits LIM = {.model_id = "m", .strict_model = 1, .ctx = 512, .max_messages = 16, .max_tools = 4, .max_stop = 4, .max_stop_len = 32,
                                 .max_json_values = 4096, .max_n = 4, .vocab = 512, .max_media = 4};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g4_set_log(NULL, NULL);
    tok = fz_load_gemma_tokenizer();
    vocab = (int)g4_tokenizer_vocab_size(tok);
    return 0;
}

static void check_error(const serve_error *e) {
    FZ_CHECK(e->status == 400 || e->status == 404 || e->status == 500, "status %d", e->status);
    FZ_CHECK(e->message[0] && !strchr(e->message, '\n') && e->type, "message '%s'", e->message);
    char *json = serve_error_json(e);
    cJSON *j = json ? cJSON_Parse(json) : NULL, *err = cJSON_GetObjectItem(j, "error");
    FZ_CHECK(cJSON_GetArraySize(err) == 4 && cJSON_IsString(cJSON_GetObjectItem(err, "message")), "error body %s", json ? json : "-");
    cJSON_Delete(j);
    free(json);
}

static void fuzz_request(const char *data, size_t n, serve_kind kind) {
    serve_request r;
    serve_error e;
    if (serve_parse_request(data, n, kind, &LIM, &r, &e)) {
        check_error(&e);
        return;
    }
    FZ_CHECK(r.n_stop <= LIM.max_stop && r.n_msgs <= (size_t)LIM.max_messages && r.n_tools <= (size_t)LIM.max_tools, "limits");
    for (int i = 0; i < r.n_stop; i++) FZ_CHECK(r.stop[i][0] && strlen(r.stop[i]) <= (size_t)LIM.max_stop_len, "stop string %d", i);
    for (size_t i = 0; i < r.n_msgs; i++) {
        size_t len = strlen(r.msgs[i].content);
        FZ_CHECK(g4_text_utf8_prefix(r.msgs[i].content, len) == len, "message %zu is not UTF-8", i);
    }
    /* media parts: in user messages, within the limit, each with its bytes and field; given stand-in
     * soft tokens (1 to 3 rows), the prompt holds each part's placeholders where its span says */
    static const float row[1] = {0};
    FZ_CHECK(r.n_media <= LIM.max_media, "%d media parts", r.n_media);
    for (int k = 0; k < r.n_media; k++) {
        const serve_media *m = &r.media[k];
        FZ_CHECK(m->msg < r.n_msgs && r.msgs[m->msg].role == G4_CHAT_USER && m->bytes && m->len > 0 && !strncmp(m->param, "messages[", 9),
                 "media part %d", k);
        r.media[k].n = 1 + k % 3;
        r.media[k].embd = malloc(sizeof row);
    }
    int32_t *ids;
    int n_ids, opens, budget;
    char *prefill;
    if (serve_prompt(&r, tok, G4_CHAT_FORM_E2B, vocab, &LIM, &ids, &n_ids, &opens, &prefill, &budget, &e) == 0) {
        FZ_CHECK(n_ids >= 1 && n_ids <= LIM.ctx && budget >= 1 && n_ids + budget - 1 <= LIM.ctx, "prompt %d budget %d", n_ids, budget);
        for (int i = 0; i < n_ids; i++) FZ_CHECK(ids[i] >= 0 && ids[i] < vocab, "token %d", ids[i]);
        g4_embd_span *spans = NULL;
        if (r.n_media) {
            FZ_CHECK(serve_media_spans(&r, tok, ids, n_ids, &spans, &e) == 0, "media spans: %s", e.message);
            for (int k = 0; spans && k < r.n_media; k++) {
                int32_t mk[3];
                FZ_CHECK(g4_media_marker_ids(tok, r.media[k].kind, mk) == 0 && spans[k].n == r.media[k].n && spans[k].at >= 1 &&
                             spans[k].at + spans[k].n < n_ids && ids[spans[k].at - 1] == mk[0] && ids[spans[k].at + spans[k].n] == mk[2],
                         "media span %d", k);
            }
        }
        free(spans);
        free(ids);
        free(prefill);
    } else {
        FZ_CHECK(e.status == 400 || e.status == 500, "prompt status %d", e.status);
        check_error(&e);
    }
    serve_request_free(&r);
}

/* Keys plain words without duplicates (ignoring case), strings without the delimiter: what the
 * tool syntax can write and read back. */
static int writable(const cJSON *v, int depth) {
    if (depth > 60) return 0;
    if (cJSON_IsString(v)) return !strstr(v->valuestring, "<|\"|>");
    for (const cJSON *c = v->child; c; c = c->next) {
        if (cJSON_IsObject(v)) {
            if (!c->string[0]) return 0;
            for (const char *k = c->string; *k; k++)
                if (!((*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') || (*k >= '0' && *k <= '9') || *k == '_')) return 0;
            for (const cJSON *d = v->child; d != c; d = d->next)
                if (!strcasecmp(d->string, c->string)) return 0;
        }
        if (!writable(c, depth + 1)) return 0;
    }
    return 1;
}

static void fuzz_tool_arguments(const char *data, size_t n) {
    char *json = NULL, *decl = NULL;
    if (g4_tool_declaration(data, n, &decl) == 0) FZ_CHECK(decl && !strncmp(decl, "declaration:", 12), "declaration '%s'", decl);
    free(decl);
    if (g4_tool_arguments_json(data, n, &json)) {
        FZ_CHECK(!json && !strchr(g4_last_error(), '\n'), "a refusal with output");
        return;
    }
    cJSON *a = cJSON_Parse(json);
    FZ_CHECK(cJSON_IsObject(a), "arguments %s are no JSON object", json);
    if (writable(a, 0)) {
        char *call = NULL, *back = NULL;
        FZ_CHECK(g4_tool_call_text("f", json, strlen(json), &call) == 0, "writing %s: %s", json, g4_last_error());
        char *name = NULL;
        FZ_CHECK(g4_tool_call_parse(call, strlen(call), &name, &back) == 0 && !strcmp(name, "f"), "reading back %s: %s", call,
                 g4_last_error());
        free(name);
        cJSON *b = cJSON_Parse(back);
        FZ_CHECK(cJSON_Compare(a, b, 1), "round trip: %s -> %s -> %s", json, call, back);
        cJSON_Delete(b);
        free(call), free(back);
    }
    cJSON_Delete(a);
    free(json);
}

/* What a reply's output carries, joined. */
typedef struct {
    g4_textbuf content, reasoning, calls;
    char finish[16];
} carried;

static void add_string(g4_textbuf *b, const cJSON *s) {
    if (cJSON_IsString(s)) g4_textbuf_appends(b, s->valuestring);
}

static void add_calls(carried *c, const cJSON *calls) {
    for (const cJSON *k = cJSON_IsArray(calls) ? calls->child : NULL; k; k = k->next) {
        const cJSON *fn = cJSON_GetObjectItem(k, "function");
        add_string(&c->calls, cJSON_GetObjectItem(fn, "name"));
        add_string(&c->calls, cJSON_GetObjectItem(fn, "arguments"));
    }
}

static void read_stream(const char *out, carried *c) {
    const char *p = out;
    for (;;) {
        const char *end = strstr(p, "\n\n");
        FZ_CHECK(!strncmp(p, "data: ", 6) && end, "not an SSE event: %.80s", p);
        if (!strncmp(p, "data: [DONE]\n\n", 14)) {
            FZ_CHECK(p[14] == 0, "events after [DONE]");
            return;
        }
        cJSON *j = cJSON_ParseWithLength(p + 6, (size_t)(end - p - 6));
        FZ_CHECK(j != NULL, "an event that is not JSON: %.80s", p);
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), *d = cJSON_GetObjectItem(ch, "delta");
        add_string(&c->content, cJSON_GetObjectItem(d, "content"));
        add_string(&c->reasoning, cJSON_GetObjectItem(d, "reasoning_content"));
        add_calls(c, cJSON_GetObjectItem(d, "tool_calls"));
        const cJSON *f = cJSON_GetObjectItem(ch, "finish_reason");
        if (cJSON_IsString(f)) snprintf(c->finish, sizeof c->finish, "%s", f->valuestring);
        cJSON_Delete(j);
        p = end + 2;
    }
}

static void read_whole(const char *out, carried *c) {
    cJSON *j = cJSON_Parse(out);
    FZ_CHECK(j != NULL, "the whole reply is not JSON");
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), *m = cJSON_GetObjectItem(ch, "message");
    add_string(&c->content, cJSON_GetObjectItem(m, "content"));
    add_string(&c->reasoning, cJSON_GetObjectItem(m, "reasoning_content"));
    add_calls(c, cJSON_GetObjectItem(m, "tool_calls"));
    snprintf(c->finish, sizeof c->finish, "%s", cJSON_GetObjectItem(ch, "finish_reason")->valuestring);
    cJSON_Delete(j);
}

static void fuzz_reply(const char *data, size_t n, unsigned flags) {
    int32_t *ids;
    size_t n_ids;
    if (g4_tokenizer_encode(tok, data, n, 1, &ids, &n_ids)) return;
    /* up to two stop strings: slices of the data, NUL-free, cut to whole UTF-8 characters (the
     * request parser refuses a body that is not UTF-8, so the reply never sees another stop) */
    char s1[8] = {0}, s2[8] = {0}, *stops[2] = {s1, s2};
    size_t l1 = flags & 3, l2 = (flags >> 2) & 3;
    for (size_t i = 0; i < l1 && i < n && data[i]; i++) s1[i] = data[i];
    for (size_t i = 0; i < l2 && n > 4 + i && data[4 + i]; i++) s2[i] = data[4 + i];
    s1[g4_text_utf8_prefix(s1, strlen(s1))] = 0;
    s2[g4_text_utf8_prefix(s2, strlen(s2))] = 0;
    int n_stop = (s1[0] != 0) + (s1[0] && s2[0]);
    carried got[2];
    memset(got, 0, sizeof got);
    for (int stream = 0; stream < 2; stream++) {
        serve_reply_config c = {.kind = SERVE_CHAT, .stream = stream, .include_usage = stream, .id = "chatcmpl-x", .model = "m", .created = 1,
                                .stop = stops, .n_stop = n_stop, .tools = (flags >> 4) & 1, .opens_thought = (flags >> 5) & 1,
                                .logprobs = (int)(n & 1)}; /* the flags are all taken: odd-length data writes logprobs */
        g4_textbuf out = {0};
        serve_reply *r = serve_reply_new(tok, &c, &out);
        FZ_CHECK(r != NULL, "serve_reply_new");
        int stopped = 0;
        for (size_t k = 0; k < n_ids && !stopped; k++) {
            /* log-probabilities of the data's own tokens (any ids of the vocabulary) */
            g4_logprobs lp = {.chosen = {ids[k], -(float)k}, .n_top = (int)(n_ids - k < G4_MAX_TOP_LOGPROBS ? n_ids - k : G4_MAX_TOP_LOGPROBS)};
            for (int t = 0; t < lp.n_top; t++) lp.top[t] = (g4_token_logprob){ids[k + (size_t)t], -(float)t};
            int rc = serve_reply_token_logprobs(r, ids[k], 0, &lp, &out);
            FZ_CHECK(rc == 0 || rc == 1, "serve_reply_token %d", rc);
            stopped = rc;
        }
        FZ_CHECK(serve_reply_finish(r, SERVE_FINISH_STOP, 1, 0, (int)n_ids, &out) == 0, "serve_reply_finish");
        if (stream) read_stream(out.p, &got[1]);
        else read_whole(out.p, &got[0]);
        serve_reply_free(r);
        free(out.p);
    }
    for (int k = 0; k < 3; k++) {
        const g4_textbuf *a = k == 0 ? &got[0].content : k == 1 ? &got[0].reasoning : &got[0].calls;
        const g4_textbuf *b = k == 0 ? &got[1].content : k == 1 ? &got[1].reasoning : &got[1].calls;
        FZ_CHECK(a->n == b->n && (a->n == 0 || !memcmp(a->p, b->p, a->n)), "part %d differs between the whole reply and the stream", k);
    }
    FZ_CHECK(!strcmp(got[0].finish, got[1].finish), "finish %s vs %s", got[0].finish, got[1].finish);
    for (int s = 0; s < 2; s++) free(got[s].content.p), free(got[s].reasoning.p), free(got[s].calls.p);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    unsigned flags = data[0];
    const char *d = (const char *)data + 1;
    size_t n = size - 1;
    switch (flags & 3) {
    case 0: fuzz_request(d, n, SERVE_CHAT); break;
    case 1: fuzz_request(d, n, SERVE_COMPLETION); break;
    case 2: fuzz_tool_arguments(d, n); break;
    default: fuzz_reply(d, n, flags >> 2); break;
    }
    return 0;
}
