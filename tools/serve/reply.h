/* g4 serve's replies: the tokens one request generates, as OpenAI's JSON. The library's reply
 * reader (g4_reply) decides the text: thought, answer and tool-call spans, stop strings held back
 * until they can no longer match and matched on the answer only, tool calls completed with JSON
 * arguments, the finish reason; this shapes it as chat.completion.chunk / text_completion SSE
 * events, or keeps it for one response. */
#ifndef G4_SERVE_REPLY_H
#define G4_SERVE_REPLY_H

#include <stddef.h>
#include <stdint.h>

#include "g4.h"
#include "serve/request.h"
#include "g4dev.h" /* g4_textbuf */

typedef struct {
    serve_kind kind;
    int stream, include_usage;
    const char *id;       /* "chatcmpl-..." / "cmpl-...", also the calls' ids' stem */
    const char *model;
    long created;         /* Unix time */
    char *const *stop;    /* borrowed */
    int n_stop;
    int tools;            /* tools were declared: read tool-call spans as calls */
    int one_call;         /* parallel_tool_calls false: the reply ends at its first call */
    int opens_thought;    /* the prompt left a thought open */
    const char *prefill;  /* the call's opening the prompt ends with (tool_choice), or NULL */
    int index;            /* the choice's index (n > 1) */
    int logprobs;         /* write the tokens' log-probabilities (serve_reply_token_logprobs) */
} serve_reply_config;

typedef enum { SERVE_FINISH_STOP = 0, SERVE_FINISH_LENGTH = 1 } serve_finish;

typedef struct serve_reply serve_reply;

/* Streaming: appends the first chunk (the assistant role) to out. */
serve_reply *serve_reply_new(const g4_tokenizer *tok, const serve_reply_config *c, g4_textbuf *out);
void serve_reply_free(serve_reply *r);
/* One generated token; is_stop: it is a stop id (it adds no text). Appends what became final to
 * out when streaming. Returns 1 when a stop string matched (the generation ends there), 0, or -1
 * on failure (out of memory). */
int serve_reply_token(serve_reply *r, int32_t token, int is_stop, g4_textbuf *out);
/* As serve_reply_token, with the token's log-probabilities (NULL: none) for a reply that writes
 * them: chat's logprobs.content[] entries {token, logprob, bytes, top_logprobs[]}, completions'
 * logprobs {tokens, token_logprobs, top_logprobs, text_offset}; streamed with the chunk that
 * carries the token's text, or the next one. A stop id, which adds no text, adds no entry. */
int serve_reply_token_logprobs(serve_reply *r, int32_t token, int is_stop, const g4_logprobs *lp, g4_textbuf *out);
/* The end of the generation: releases what is held back and appends the last chunks, usage and
 * [DONE] (streaming) or the whole response body. finish_reason is "tool_calls" when the reply
 * made calls and stopped by itself, else why's. */
int serve_reply_finish(serve_reply *r, serve_finish why, int prompt_tokens, int cached_tokens, int completion_tokens, g4_textbuf *out);
/* The same for the n choices of one request (OpenAI's n), in index order: one response body with
 * every choice, or each choice's last chunks then the usage (the prompt counted once, the
 * completions summed) and [DONE]. */
int serve_reply_finish_all(serve_reply *const *r, int n, const serve_finish *why, int prompt_tokens, int cached_tokens, int completion_tokens,
                           g4_textbuf *out);
/* Streaming, a failure after the response began: an error event and [DONE]. */
int serve_reply_error(const serve_error *e, g4_textbuf *out);

#endif
