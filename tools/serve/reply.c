/* g4 serve's replies (reply.h): a request's tokens into OpenAI's JSON, streamed or whole. What
 * text each token releases (spans, stop strings, tool calls, the finish reason) is the library's
 * reply reader's (g4_reply); this file only shapes it as OpenAI's JSON and SSE. */
#define _POSIX_C_SOURCE 200809L
#include "serve/reply.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the reply */

typedef struct {
    char *name, *arguments; /* arguments as JSON text */
} call;

struct serve_reply {
    serve_reply_config c;
    g4_reply *reader;
    int stopped;                   /* a stop string, or the one call allowed, ended the reply */
    int finished;
    g4_finish finish;
    g4_textbuf content, reasoning; /* whole responses: everything; streaming: this token's */
    call *calls;
    int n_calls, cap_calls, streamed_calls;
    /* log-probabilities: the tokenizer (each token's text), the entries not yet sent (streaming)
     * or all of them; completions' form in four arrays, text_offset counting the tokens' text */
    const g4_tokenizer *tok;
    cJSON *lp_content;
    cJSON *lp_tokens, *lp_token_logprobs, *lp_top, *lp_offset;
    size_t text_offset; /* characters of the text decoded so far: where the next token's begins */
};

static cJSON *chunk_root(const serve_reply *r) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", r->c.id);
    cJSON_AddStringToObject(root, "object", r->c.kind == SERVE_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)r->c.created);
    cJSON_AddStringToObject(root, "model", r->c.model);
    cJSON_AddStringToObject(root, "system_fingerprint", "g4-" G4_VERSION);
    return root;
}

/* "data: JSON\n\n", the SSE event of one chunk; root is deleted. */
static int append_event(g4_textbuf *out, cJSON *root) {
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    int rc = !s || g4_textbuf_appends(out, "data: ") || g4_textbuf_appends(out, s) || g4_textbuf_appends(out, "\n\n");
    free(s);
    return rc ? -1 : 0;
}

/* ---------------------------------------------------------------- log-probabilities */

/* The arrays that hold the entries not yet written (all of them for a whole response). */
static int new_logprob_arrays(serve_reply *r) {
    if (r->c.kind == SERVE_CHAT) return (r->lp_content = cJSON_CreateArray()) ? 0 : -1;
    r->lp_tokens = cJSON_CreateArray(), r->lp_token_logprobs = cJSON_CreateArray();
    r->lp_top = cJSON_CreateArray(), r->lp_offset = cJSON_CreateArray();
    return r->lp_tokens && r->lp_token_logprobs && r->lp_top && r->lp_offset ? 0 : -1;
}

static void free_logprob_arrays(serve_reply *r) {
    cJSON_Delete(r->lp_content), cJSON_Delete(r->lp_tokens), cJSON_Delete(r->lp_token_logprobs), cJSON_Delete(r->lp_top), cJSON_Delete(r->lp_offset);
    r->lp_content = r->lp_tokens = r->lp_token_logprobs = r->lp_top = r->lp_offset = NULL;
}

static int has_pending_logprobs(const serve_reply *r) {
    return r->c.logprobs && cJSON_GetArraySize(r->c.kind == SERVE_CHAT ? r->lp_content : r->lp_tokens) > 0;
}

/* A choice's "logprobs": null when not asked, else the entries held (moved into it). */
static void add_logprobs(serve_reply *r, cJSON *ch) {
    if (!r->c.logprobs) {
        cJSON_AddNullToObject(ch, "logprobs");
        return;
    }
    cJSON *lp = cJSON_AddObjectToObject(ch, "logprobs");
    if (r->c.kind == SERVE_CHAT) {
        cJSON_AddItemToObject(lp, "content", r->lp_content);
    } else {
        cJSON_AddItemToObject(lp, "tokens", r->lp_tokens);
        cJSON_AddItemToObject(lp, "token_logprobs", r->lp_token_logprobs);
        cJSON_AddItemToObject(lp, "top_logprobs", r->lp_top);
        cJSON_AddItemToObject(lp, "text_offset", r->lp_offset);
    }
    r->lp_content = r->lp_tokens = r->lp_token_logprobs = r->lp_top = r->lp_offset = NULL;
    new_logprob_arrays(r);
}

/* A token's bytes: a byte token (<0xAB>) is its byte, any other piece its text with the
 * SentencePiece space (U+2581) as a space. */
static size_t token_bytes(const serve_reply *r, int32_t id, unsigned char *buf, size_t cap) {
    const char *piece = g4_tokenizer_id_to_piece(r->tok, id);
    unsigned byte;
    if (!piece) return 0;
    if (strlen(piece) == 6 && sscanf(piece, "<0x%2X>", &byte) == 1) {
        buf[0] = (unsigned char)byte;
        return 1;
    }
    size_t n = 0;
    for (const char *p = piece; *p && n < cap; p++) {
        if (!strncmp(p, "\xe2\x96\x81", 3)) buf[n++] = ' ', p += 2;
        else buf[n++] = (unsigned char)*p;
    }
    return n;
}

/* A token's text as the detokenizer writes it alone; a byte token that is no whole UTF-8
 * character alone is "bytes:\\xAB" (as vLLM writes it), not U+FFFD: every byte stays apart. */
static char *token_text(const serve_reply *r, int32_t id) {
    unsigned char b[8];
    char *text = NULL;
    size_t len;
    if (token_bytes(r, id, b, sizeof b) == 1 && b[0] >= 0x80) {
        if ((text = malloc(16))) snprintf(text, 16, "bytes:\\x%02x", b[0]);
        return text;
    }
    if (g4_tokenizer_decode(r->tok, &id, 1, &text, &len)) return NULL;
    return text;
}

/* The characters of UTF-8 text (text_offset counts characters, as OpenAI's and vLLM's do). */
static size_t utf8_chars(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

/* chat's {token, logprob, bytes} (top_logprobs added by the caller for the chosen one). */
static cJSON *chat_entry(const serve_reply *r, int32_t id, float logprob) {
    cJSON *e = cJSON_CreateObject(), *bytes = cJSON_CreateArray();
    char *text = token_text(r, id);
    unsigned char buf[256];
    size_t n = token_bytes(r, id, buf, sizeof buf);
    cJSON_AddStringToObject(e, "token", text ? text : "");
    cJSON_AddNumberToObject(e, "logprob", logprob);
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber(buf[i]));
    cJSON_AddItemToObject(e, "bytes", bytes);
    free(text);
    return e;
}

static int add_token_logprobs(serve_reply *r, int32_t token, const g4_logprobs *lp) {
    if (r->c.kind == SERVE_CHAT) {
        cJSON *e = chat_entry(r, token, lp->chosen.logprob), *top = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int i = 0; i < lp->n_top; i++) cJSON_AddItemToArray(top, chat_entry(r, lp->top[i].token, lp->top[i].logprob));
        cJSON_AddItemToArray(r->lp_content, e);
        return 0;
    }
    char *text = token_text(r, token);
    if (!text) return -1;
    cJSON *top = cJSON_CreateObject();
    for (int i = 0; i < lp->n_top; i++) {
        char *t = token_text(r, lp->top[i].token);
        if (t && !cJSON_GetObjectItemCaseSensitive(top, t)) cJSON_AddNumberToObject(top, t, lp->top[i].logprob);
        free(t);
    }
    cJSON_AddItemToArray(r->lp_tokens, cJSON_CreateString(text));
    cJSON_AddItemToArray(r->lp_token_logprobs, cJSON_CreateNumber(lp->chosen.logprob));
    cJSON_AddItemToArray(r->lp_top, top);
    cJSON_AddItemToArray(r->lp_offset, cJSON_CreateNumber((double)r->text_offset));

    free(text);
    return 0;
}

/* One choice of a chunk; finish NULL for none yet. */
static cJSON *add_choice(serve_reply *r, cJSON *root, const char *finish) {
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(root, "choices"), *ch = cJSON_CreateObject();
    if (!choices) choices = cJSON_AddArrayToObject(root, "choices");
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", r->c.index);
    if (r->c.kind == SERVE_COMPLETION) cJSON_AddStringToObject(ch, "text", r->content.p ? r->content.p : "");
    add_logprobs(r, ch);
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
    else cJSON_AddNullToObject(ch, "finish_reason");
    return ch;
}

static char *call_id(const serve_reply *r, int k) {
    static const char prefix[] = "call_";
    size_t n = strlen(r->c.id) + sizeof prefix + 16;
    char *id = malloc(n);
    if (id) snprintf(id, n, "%s%s_%d", prefix, strchr(r->c.id, '-') ? strchr(r->c.id, '-') + 1 : r->c.id, k);
    return id;
}

/* tool_calls[k] of a message or a delta. */
static cJSON *call_json(const serve_reply *r, int k, int with_index) {
    cJSON *j = cJSON_CreateObject(), *fn;
    char *id = call_id(r, k);
    if (with_index) cJSON_AddNumberToObject(j, "index", k);
    cJSON_AddStringToObject(j, "id", id ? id : "call");
    cJSON_AddStringToObject(j, "type", "function");
    fn = cJSON_AddObjectToObject(j, "function");
    cJSON_AddStringToObject(fn, "name", r->calls[k].name);
    cJSON_AddStringToObject(fn, "arguments", r->calls[k].arguments);
    free(id);
    return j;
}

/* This token's text, calls and thought as one chat chunk (nothing when there is none). */
static int stream_chat_delta(serve_reply *r, g4_textbuf *out) {
    if (!r->content.n && !r->reasoning.n && r->streamed_calls == r->n_calls && !has_pending_logprobs(r)) return 0;
    cJSON *root = chunk_root(r), *delta = cJSON_AddObjectToObject(add_choice(r, root, NULL), "delta");
    if (r->reasoning.n) cJSON_AddStringToObject(delta, "reasoning_content", r->reasoning.p);
    if (r->content.n) cJSON_AddStringToObject(delta, "content", r->content.p);
    if (r->streamed_calls < r->n_calls) {
        cJSON *calls = cJSON_AddArrayToObject(delta, "tool_calls");
        for (; r->streamed_calls < r->n_calls; r->streamed_calls++) cJSON_AddItemToArray(calls, call_json(r, r->streamed_calls, 1));
    }
    g4_textbuf_clear(&r->content);
    g4_textbuf_clear(&r->reasoning);
    return append_event(out, root);
}

static int stream_completion_delta(serve_reply *r, g4_textbuf *out) {
    if (!r->content.n && !has_pending_logprobs(r)) return 0;
    cJSON *root = chunk_root(r);
    add_choice(r, root, NULL);
    g4_textbuf_clear(&r->content);
    return append_event(out, root);
}

serve_reply *serve_reply_new(const g4_tokenizer *tok, const serve_reply_config *c, g4_textbuf *out) {
    serve_reply *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->c = *c;
    r->tok = tok;
    if (c->logprobs && new_logprob_arrays(r)) {
        serve_reply_free(r);
        return NULL;
    }
    /* a completion's text is all answer; a chat's tool calls are held whole when tools were
     * declared (the call the prompt opened is the start of the first), else they are text */
    int chat = c->kind == SERVE_CHAT;
    g4_reply_options ro = {.stop = (const char *const *)c->stop, .n_stop = c->n_stop, .starts_in_thought = chat && c->opens_thought,
                           .calls = chat && c->tools ? G4_CALLS_WHOLE : G4_CALLS_TEXT, .raw = !chat, .prefix = chat ? c->prefill : NULL,
                           .max_calls = chat && c->tools && c->one_call ? 1 : 0};
    r->reader = g4_reply_new(tok, &ro);
    int rc = !r->reader || g4_textbuf_append(&r->content, "", 0) || g4_textbuf_append(&r->reasoning, "", 0);
    if (!rc && c->stream && c->kind == SERVE_CHAT) {
        cJSON *root = chunk_root(r), *delta = cJSON_AddObjectToObject(add_choice(r, root, NULL), "delta");
        cJSON_AddStringToObject(delta, "role", "assistant");
        cJSON_AddStringToObject(delta, "content", "");
        rc = append_event(out, root);
    }
    if (rc) {
        serve_reply_free(r);
        return NULL;
    }
    return r;
}

void serve_reply_free(serve_reply *r) {
    if (!r) return;
    g4_reply_free(r->reader);
    free(r->content.p), free(r->reasoning.p);
    for (int i = 0; i < r->n_calls; i++) free(r->calls[i].name), free(r->calls[i].arguments);
    free(r->calls);
    free_logprob_arrays(r);
    free(r);
}

/* Text into a JSON string's buffer. A NUL the model writes (a <0x00> byte token) is dropped:
 * the JSON strings are C strings, and a NUL would cut the whole reply's content where the
 * stream's next delta goes on. */
static int append_nul_free(g4_textbuf *b, const char *s, size_t n) {
    for (const char *p = s, *end = s + n; p < end;) {
        const char *z = memchr(p, 0, (size_t)(end - p));
        size_t k = z ? (size_t)(z - p) : (size_t)(end - p);
        if (g4_textbuf_append(b, p, k)) return -1;
        p += k + (z != NULL);
    }
    return 0;
}

static int add_call(serve_reply *r, const g4_tool_call *tc) {
    if (r->n_calls == r->cap_calls) {
        int cap = r->cap_calls ? 2 * r->cap_calls : 4;
        call *c = realloc(r->calls, sizeof *c * (size_t)cap);
        if (!c) return -1;
        r->calls = c, r->cap_calls = cap;
    }
    call *c = &r->calls[r->n_calls];
    c->name = strdup(tc->name), c->arguments = strdup(tc->arguments);
    if (!c->name || !c->arguments) {
        free(c->name), free(c->arguments);
        return -1;
    }
    r->n_calls++;
    return 0;
}

/* What the reader released into the reply's parts: answer text to the content, thoughts to the
 * reasoning, completed calls to the calls (a call's text is in no part). */
static int take_delta(serve_reply *r, const g4_reply_delta *d) {
    for (int i = 0; i < d->n_spans; i++) {
        const g4_span_text *p = &d->spans[i];
        if (p->span != G4_SPAN_TOOL_CALL && append_nul_free(p->span == G4_SPAN_THOUGHT ? &r->reasoning : &r->content, p->text, p->len))
            return -1;
    }
    for (int k = 0; k < d->n_calls; k++)
        if (add_call(r, &d->calls[k])) return -1;
    r->stopped |= d->ended; /* the reader has no end ids here: a stop string or the last call allowed */
    return 0;
}

static int stream_delta(serve_reply *r, g4_textbuf *out) {
    if (!r->c.stream) return 0;
    return r->c.kind == SERVE_CHAT ? stream_chat_delta(r, out) : stream_completion_delta(r, out);
}

int serve_reply_token(serve_reply *r, int32_t token, int is_stop, g4_textbuf *out) { return serve_reply_token_logprobs(r, token, is_stop, NULL, out); }

int serve_reply_token_logprobs(serve_reply *r, int32_t token, int is_stop, const g4_logprobs *lp, g4_textbuf *out) {
    if (r->stopped) return 1;
    if (!is_stop && lp && r->c.logprobs && add_token_logprobs(r, token, lp)) return -1;
    if (!is_stop) { /* a stop id adds no text: it never reaches the reader */
        g4_reply_delta d;
        if (g4_reply_push_token(r->reader, token, &d) < 0 || take_delta(r, &d)) return -1;
        r->text_offset += utf8_chars(d.text, d.len);
    }
    if (stream_delta(r, out)) return -1;
    return r->stopped;
}

static const char *finish_reason(const serve_reply *r) {
    return r->finish == G4_FINISH_LENGTH ? "length" : r->finish == G4_FINISH_TOOL_CALLS ? "tool_calls" : "stop";
}

static cJSON *usage_json(int prompt, int cached, int completion) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", prompt + completion);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", cached);
    return u;
}

/* A whole response's choice: the reply's message (chat) or text, and its finish reason. */
static void whole_choice(serve_reply *r, cJSON *root, const char *finish) {
    cJSON *ch = add_choice(r, root, finish);
    if (r->c.kind != SERVE_CHAT) return;
    cJSON *msg = cJSON_CreateObject();
    cJSON_AddItemToObject(ch, "message", msg);
    cJSON_AddStringToObject(msg, "role", "assistant");
    /* OpenAI's shape: content null when the reply is only calls */
    if (r->content.n || !r->n_calls) cJSON_AddStringToObject(msg, "content", r->content.p);
    else cJSON_AddNullToObject(msg, "content");
    if (r->reasoning.n) cJSON_AddStringToObject(msg, "reasoning_content", r->reasoning.p);
    if (r->n_calls) {
        cJSON *calls = cJSON_AddArrayToObject(msg, "tool_calls");
        for (int k = 0; k < r->n_calls; k++) cJSON_AddItemToArray(calls, call_json(r, k, 0));
    }
}

/* What the reader still holds, into the reply; the finish reason. */
static int release_held(serve_reply *r, serve_finish why) {
    if (r->finished) return 0;
    r->finished = 1;
    g4_reply_delta d;
    if (g4_reply_finish(r->reader, why == SERVE_FINISH_LENGTH ? G4_STOP_BUDGET : G4_STOP_EOS, &d) || take_delta(r, &d)) return -1;
    r->finish = d.finish;
    return 0;
}

/* Every choice's end (its last chunks, or its part of the one response), then the usage. */
int serve_reply_finish_all(serve_reply *const *r, int n, const serve_finish *why, int prompt_tokens, int cached_tokens, int completion_tokens,
                           g4_textbuf *out) {
    for (int i = 0; i < n; i++)
        if (release_held(r[i], why[i])) return -1;
    const serve_reply *first = r[0];
    if (!first->c.stream) {
        cJSON *root = chunk_root(first);
        cJSON_ReplaceItemInObject(root, "object", cJSON_CreateString(first->c.kind == SERVE_CHAT ? "chat.completion" : "text_completion"));
        for (int i = 0; i < n; i++) whole_choice(r[i], root, finish_reason(r[i]));
        cJSON_AddItemToObject(root, "usage", usage_json(prompt_tokens, cached_tokens, completion_tokens));
        char *s = cJSON_PrintUnformatted(root);
        cJSON_Delete(root);
        int rc = !s || g4_textbuf_appends(out, s);
        free(s);
        return rc ? -1 : 0;
    }
    for (int i = 0; i < n; i++) {
        if (stream_delta(r[i], out)) return -1;
        cJSON *root = chunk_root(r[i]), *ch = add_choice(r[i], root, finish_reason(r[i]));
        if (r[i]->c.kind == SERVE_CHAT) cJSON_AddObjectToObject(ch, "delta");
        if (append_event(out, root)) return -1;
    }
    if (first->c.include_usage) {
        cJSON *root = chunk_root(first);
        cJSON_AddArrayToObject(root, "choices");
        cJSON_AddItemToObject(root, "usage", usage_json(prompt_tokens, cached_tokens, completion_tokens));
        if (append_event(out, root)) return -1;
    }
    return g4_textbuf_appends(out, "data: [DONE]\n\n");
}

int serve_reply_finish(serve_reply *r, serve_finish why, int prompt_tokens, int cached_tokens, int completion_tokens, g4_textbuf *out) {
    return serve_reply_finish_all(&r, 1, &why, prompt_tokens, cached_tokens, completion_tokens, out);
}

int serve_reply_error(const serve_error *e, g4_textbuf *out) {
    char *s = serve_error_json(e);
    int rc = !s || g4_textbuf_appends(out, "data: ") || g4_textbuf_appends(out, s) || g4_textbuf_appends(out, "\n\ndata: [DONE]\n\n");
    free(s);
    return rc ? -1 : 0;
}
