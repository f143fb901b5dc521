/* g4 serve's requests: an OpenAI chat-completions or completions body checked and read into what
 * the engine runs (messages in g4's roles, tool declarations in Gemma's syntax, sampling, stop
 * strings, budget), and the prompt's tokens; every refusal an OpenAI-style error naming the
 * parameter. Nothing here touches HTTP or the model's weights, so the fuzzer runs it as it is. */
#ifndef G4_SERVE_REQUEST_H
#define G4_SERVE_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "g4.h"

/* An answer that is not a completion: {"error":{"message","type","param","code"}} with its status. */
typedef struct {
    int status;       /* 400, 401, 404, 405, 413, 500, 503 */
    const char *type; /* "invalid_request_error", "authentication_error", "server_error" */
    const char *code; /* NULL, or "context_length_exceeded", "model_not_found", ... */
    char param[96];   /* "" for none, else "messages[2].role" */
    char message[512];
} serve_error;

/* Fills e (always returns -1, for `return serve_fail(...)`). param may be NULL. */
int serve_fail(serve_error *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* The error's JSON body (malloc'd). */
char *serve_error_json(const serve_error *e);

/* A body's text before its JSON is read: whole UTF-8, no escaped NUL (cJSON takes both silently). */
int serve_check_body(const char *body, size_t len, serve_error *e);

/* What requests may hold (g4 serve's flags). */
typedef struct {
    const char *model_id; /* the name /v1/models lists, and replies give */
    int strict_model;     /* a request must name model_id (else any name, or none, is taken) */
    int ctx;              /* tokens per conversation: prompt + max_tokens may not exceed it */
    int max_messages, max_tools, max_stop, max_stop_len;
    int max_json_values;  /* values in the body (serve_json_values), bounding cJSON's memory; 0: no bound */
    int max_n;            /* choices a request may ask for (n): the slots, --parallel */
    int vocab;            /* token ids logit_bias may name: [0, vocab) (0: not checked here) */
    int max_media;        /* image and audio parts a request may hold (0: none); their decoded bytes are bounded by the body's */
    int max_tokens;       /* the budget of a reply that sets no max_tokens (-n/--max-tokens; 0: chat 4096, completions 16),
                             cut to what the context leaves */
} serve_limits;

#define SERVE_DEFAULT_CHAT_TOKENS 4096
#define SERVE_DEFAULT_COMPLETION_TOKENS 16
#define SERVE_MAX_LOGIT_BIAS 1024

typedef enum { SERVE_CHAT = 0, SERVE_COMPLETION = 1 } serve_kind;
typedef enum { SERVE_TOOLS_AUTO = 0, SERVE_TOOLS_NONE, SERVE_TOOLS_REQUIRED, SERVE_TOOLS_NAMED } serve_tool_choice;

/* An image or audio part of a user message: its file's bytes (decoded from a data: URL or
 * input_audio's base64), then its soft tokens (set by the server, serve_media_set). */
typedef struct {
    size_t msg;           /* the message it belongs to (r->msgs) */
    g4_media_kind kind;
    unsigned char *bytes; /* the file */
    size_t len;
    int budget;           /* an image's soft-token budget: 70 for detail "low", else 0 (the server's) */
    char param[192];      /* where it stands: "messages[0].content[1].image_url.url" */
    float *embd;          /* n soft tokens x hidden floats (malloc'd), or NULL */
    int n;
} serve_media;

typedef struct {
    serve_kind kind;
    int stream, include_usage;
    int max_tokens;      /* -1: not given (the rest of the context for chat, 16 for completions) */
    g4_sampling sampling;
    int sampling_given;  /* G4_SAMPLE_* bits (g4.h) of the fields the request set */
    int seed_given;
    int n;               /* choices (OpenAI's n): sequences forked from the one prompt, seeds seed, seed + 1, ... */
    int logprobs;        /* log-probabilities asked: chat's logprobs true, completions' logprobs N */
    int top_logprobs;    /* 0..G4_MAX_TOP_LOGPROBS: chat's top_logprobs, completions' N */
    int32_t *bias_ids;   /* logit_bias (sampling's bias_ids and bias_values point here; G4_SAMPLE_BIAS) */
    float *bias_values;
    char **stop;         /* stop strings, matched on the text and not sent */
    int n_stop;
    /* chat */
    int thinking;
    g4_chat_message *msgs; /* contents malloc'd */
    size_t n_msgs;
    char **tools;        /* declarations in Gemma's syntax (g4_tool_declaration) */
    size_t n_tools;
    serve_tool_choice tool_choice;
    char *tool_name;     /* SERVE_TOOLS_NAMED */
    char *tools_json;    /* the tools array as JSON (malloc'd), for the call's grammar (serve_tool_constraint) */
    int strict_tools;    /* some function says "strict": true */
    int one_call;        /* parallel_tool_calls false: a reply ends at its first tool call */
    /* completions */
    char *prompt;        /* a text prompt, or NULL for one of token ids */
    int32_t *prompt_ids;
    int n_prompt_ids;
    /* the prompt cache's scope: a prefix is reused only between requests with the same cache_salt
     * (vLLM's field; NULL: none) and let in by the same API key (set by the server, not parsed) */
    char *cache_salt;
    int api_key;
    /* structured output: constraint_kind a g4_constraint_kind (-1: none) over constraint_text
     * (malloc'd: a schema's JSON, a GBNF grammar, a regex), from the field constraint_param names
     * (response_format, grammar, json_schema, guided_json, guided_regex, guided_choice,
     * guided_grammar, structured_outputs); compiled by the server (g4_grammar_cache) */
    int constraint_kind;
    char *constraint_text;
    char constraint_param[64];
    serve_media *media;  /* the user messages' image and audio parts, in prompt order */
    int n_media;
} serve_request;

/* An upper bound on the JSON values in a body (each value but the first follows a '[', ',' or
 * ':' outside strings): what cJSON would allocate a node for, counted before it does. */
size_t serve_json_values(const char *body, size_t len);

/* Checks and reads a request body (len bytes, not NUL-terminated). Fails with e filled: invalid
 * UTF-8 or JSON, a field of the wrong type or out of range, an unknown role, an unknown
 * model (--strict-model), more values than max_json_values (413), more messages, tools or stop
 * strings than the limits, a malformed or doubled constraint field, a feature g4 does not have (images, best_of,
 * echo, suffix). Unknown fields are
 * ignored, as OpenAI-compatible servers do. r is zeroed first and freed on failure. */
int serve_parse_request(const char *body, size_t len, serve_kind kind, const serve_limits *lim, serve_request *r, serve_error *e);
void serve_request_free(serve_request *r);
/* The `model` rule every endpoint applies (NULL: none given): any name unless lim->strict_model. */
int serve_check_model(const char *model, const serve_limits *lim, serve_error *e);

/* The prompt's tokens (malloc'd), what the engine feeds: the chat template's rendering (form as the
 * checkpoint asks, BOS and generation prompt on), followed, for tool_choice required or a named
 * tool, by the opening of a call ("<|tool_call>call:" [NAME]), whose text goes to *prefill
 * (malloc'd, or NULL) for the reply to start from; or the completion's prompt as it is (text
 * encoded with its control tokens, no BOS added, like `g4 run --raw`). *opens_thought: the prompt
 * ends inside a thought. Sets r->max_tokens to the budget. Fails when the prompt, with max_tokens,
 * does not fit the context (400 context_length_exceeded) or has a token the model lacks. */
int serve_prompt(const serve_request *r, const g4_tokenizer *tok, g4_chat_form form, int vocab, const serve_limits *lim,
                 int32_t **ids, int *n_ids, int *opens_thought, char **prefill, int *max_tokens, serve_error *e);

/* The calls' constraint. in_call (serve_prompt's *prefill: tool_choice required or a named
 * function opened a call): r's constraint becomes the grammar of the rest of the call, a declared
 * function's name (unless named) and arguments keeping to its parameters schema
 * (g4_tool_call_gbnf), from the field "tool_choice". Else, tool_choice auto with a function marked
 * "strict": the whole reply's (g4_tool_reply_gbnf: text, then calls of declared functions, the
 * strict ones' arguments by their schemas), from "tools". Otherwise nothing. A schema the compiler
 * refuses is a 400 naming "tools[i].function.parameters". */
int serve_tool_constraint(serve_request *r, const g4_tokenizer *tok, int in_call, serve_error *e);

/* The embedding spans of a chat prompt's media parts (serve_prompt's ids, every part's embd set):
 * each part's placeholders, found after its begin marker in order. *spans malloc'd (n_media). */
int serve_media_spans(const serve_request *r, const g4_tokenizer *tok, const int32_t *ids, int n_ids, g4_embd_span **spans, serve_error *e);

#endif
