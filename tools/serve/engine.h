/* g4 serve's engine: one thread that owns the session and its generation stepper, and runs every
 * admitted request in a sequence of its own (a slot), all of them advanced together one token a
 * step (continuous batching: a new request's prompt is fed in chunks between the others' steps).
 * Requests wait in a bounded queue for a slot; past it they are refused (503). A slot that
 * finished keeps its KV cache: a later request whose prompt starts with what a slot holds reuses
 * that prefix (the prompt cache). Each request's reply is written into its job's output as it is
 * generated; the HTTP side reads it from other threads. */
#ifndef G4_SERVE_ENGINE_H
#define G4_SERVE_ENGINE_H

#include "g4.h"
#include "serve/request.h"
#include "serve/tokens.h"

typedef struct serve_engine serve_engine;
typedef struct serve_job serve_job;

typedef struct {
    int queue;         /* requests that may wait for a slot */
    int prompt_chunk;  /* prompt tokens a step feeds (the stepper's) */
    size_t max_unread; /* a streaming reply's bytes its client has not read, past which it is stopped */
    int prompt_cache;  /* reuse idle slots' KV prefixes */
    /* Test hook (--test-replies): the model's text of each reply, in order, in place of what it
     * generates (the tokens still come from the stepper, one a step). NULL: none. */
    int32_t **script;
    int *script_len;
    int n_script;
    /* Test hook (--test-step-ms): a pause after every step, so that a test can act while a reply
     * is still being generated (cancel it, fill the queue, drain). 0: none. */
    int step_ms;
    /* Benchmark hook (--test-ignore-eos): no stop ids, every reply runs to its budget. */
    int ignore_eos;
    /* --draft: speculative decoding of every greedy request (g4_generate_params); NULL: none. */
    g4_drafter *draft;
    int draft_tokens;
    /* --temp, --top-k, ...: the server's sampling defaults, over the model's (G4_SAMPLE_* bits of
     * the fields set); a request's fields win over both. */
    g4_sampling sampling;
    int sampling_given;
} serve_engine_config;

/* Every counter since the start, and the state now (for /metrics and /health). */
typedef struct {
    int slots, active, queued, draining;
    long admitted, finished, rejected_busy, cancelled;
    long embedded_inputs, embedded_tokens; /* /v1/embeddings' inputs and their tokens */
    long prompt_tokens, cached_tokens, generated_tokens;
    double decode_s, prefill_s;  /* the stepper's decode and prompt calls */
    long draft_rounds, drafted, draft_accepted; /* --draft: the stepper's drafting totals */
    double ttft_sum;             /* time to first token, summed over finished requests */
    long ttft_count;
} serve_stats;

/* The engine over s (its n_seq slots) and tok; starts its thread. */
serve_engine *serve_engine_new(g4_session *s, const g4_tokenizer *tok, const serve_engine_config *c);
/* Drains (below) with drain_s, waits until every admitted request is finished, then stops the
 * thread and frees the engine. No reader may be left (serve_job_release them all first). */
void serve_engine_free(serve_engine *e, double drain_s);
/* New requests are refused from now on (503); running ones go on, until cut_after_s seconds from
 * now (< 0: no limit), when those still running end with finish_reason "length" and those still
 * queued with a 503. */
void serve_engine_drain(serve_engine *e, double cut_after_s);
/* Jobs admitted and not yet released by their readers. */
int serve_engine_live(serve_engine *e);
void serve_engine_stats(serve_engine *e, serve_stats *st);

/* A job from a parsed request and its prompt (serve_prompt's), all taken over. */
serve_job *serve_job_new(serve_request *r, int32_t *prompt, int n_prompt, int opens_thought, char *prefill, int max_tokens,
                         const char *model_id);
/* Media in the job's prompt: each span's rows (hidden floats each: image or audio soft tokens) are
 * fed at its prompt positions in place of the tokens there (the soft-token placeholders; copied).
 * The prompt cache keys those positions on the rows' bytes, not the placeholders: a request reuses
 * a slot's prefix only as far as its images and recordings are the same. Fails, with g4_last_error
 * set, on a span outside the prompt. Call it before serve_engine_submit. */
int serve_job_set_media(serve_job *j, const g4_embd_span *spans, int n_spans, int hidden);
/* Structured output for a job (before it is submitted): start, a state from g4_grammar_cache_start
 * of c, taken over (handed back when the job is freed); with thinking, the thought's ids (0: none). */
void serve_job_constrain(serve_job *j, g4_grammar_cache *c, g4_grammar_state *start, int32_t thought_open, int32_t thought_close);
/* An embedding job (/v1/embeddings): each input fed into the job's slot's sequence after the
 * others' steps, its rows' final hidden states pooled (serve_pool_add); the reply, once all are
 * in, is serve_embeddings_json's. r is taken over. */
serve_job *serve_embed_job_new(serve_embed_request *r, serve_pooling pooling, const char *model_id);
/* Admits the job (the engine holds it from now on) or refuses it with a 503 in e (queue full,
 * draining); the caller still holds its reference either way, and must release it. */
int serve_engine_submit(serve_engine *e, serve_job *j, serve_error *err);
/* Waits up to timeout_ms for output past what was read, copies up to cap bytes of it into buf and
 * returns how many; 0 with *done set when the reply is complete and read; 0 on a timeout. */
size_t serve_job_read(serve_engine *e, serve_job *j, char *buf, size_t cap, int timeout_ms, int *done);
/* Waits up to timeout_ms for the reply to be complete; 1 when it is. */
int serve_job_wait(serve_engine *e, serve_job *j, int timeout_ms);
/* The whole output (valid once complete and until the release). */
const char *serve_job_output(serve_job *j, size_t *len);
/* The client went away: the job stops where it stands (its slot is free at the next step). */
void serve_job_cancel(serve_engine *e, serve_job *j);
/* The reader is done with the job. */
void serve_job_release(serve_engine *e, serve_job *j);
int serve_job_stream(const serve_job *j);
/* 200, or the error's status of a job that failed before its reply began (not streaming). */
int serve_job_status(const serve_job *j);

#endif
