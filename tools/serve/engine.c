/* g4 serve's engine (engine.h): the slots, the queue, the prompt cache and the one thread that
 * steps the generation stepper. Lock order: the engine's mutex guards the queue, the slots'
 * assignment and every job's output and flags; the stepper and the session are the engine
 * thread's alone and run without the lock, so readers and new requests never wait for a step. */
#define _POSIX_C_SOURCE 200809L
#include "serve/engine.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "serve/reply.h"

/* One of a job's n choices (OpenAI's n): its reply, in a slot of its own while it runs. */
typedef struct {
    serve_reply *reply;
    int slot;             /* -1 before it starts and once it has finished */
    int n_generated, script_at, finished;
    serve_finish why;
} job_choice;

struct serve_job {
    serve_request req;
    int32_t *prompt;
    int n_prompt, opens_thought, max_tokens;
    char *prefill, *model_id;
    char id[40];
    long created;
    uint64_t seed;       /* the request's, or a fresh one */
    /* under the engine's mutex */
    g4_textbuf out;      /* the reply so far: SSE events, or the whole body once done */
    size_t read_at;      /* what the reader has taken of it */
    int status;          /* 200, or the error's when the job failed before its response began */
    int done, cancel, refs, admitted;
    pthread_cond_t cond; /* output, or done */
    serve_job *next;     /* in the queue */
    /* the engine thread's */
    job_choice *ch;        /* [n_choices] */
    int n_choices, n_running, n_cached;
    int script;            /* test hook: the reply text's index, or -1 */
    double t_submit, t_first;
    /* an embedding job (embed set): its inputs, the one being fed and how far, the pooled vectors */
    int embed, at_input, at_token;
    serve_pooling pooling;
    serve_embed_request er;
    double *acc;  /* the input's sum (or last row) so far, dim doubles */
    float *vecs;  /* n_inputs x dim */
    /* media (serve_job_set_media): the prompt's embedding spans, their rows in embd (owned), and
     * the prompt cache's key of each prompt position (cache_key) */
    g4_embd_span *spans;
    int n_spans;
    float *embd;
    int32_t *key;
    /* structured output: the start state from the grammar cache (handed back, warmed by the
     * choices' walks, when the job is freed) and the thought's token ids (0: none) */
    g4_grammar_cache *grammars;
    g4_grammar_state *constraint;
    int32_t thought_open, thought_close;
};

typedef struct {
    serve_job *job;  /* the request it runs, or NULL when idle */
    int choice;      /* which of the job's choices */
    int32_t *held;   /* what its KV cache holds, for the prompt cache */
    int n_held;
    int held_key;    /* and whose it is: the API key and cache_salt of the request that left it */
    char *held_salt;
    long used;       /* when it last finished: the least recently used idle slot goes first */
} slot;

struct serve_engine {
    g4_session *s;
    const g4_tokenizer *tok;
    serve_engine_config c;
    g4_stepper *st;
    int n_slots, ctx;
    slot *slots;
    g4_step_token *events;
    g4_batch_row *rows; /* the embedding rows of one g4_decode call */
    serve_job **row_job; /* each row's job */
    float *hidden;      /* a row's final hidden state */
    int dim;
    g4_sampling defaults;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t work;   /* a new or cancelled job, or stopping */
    serve_job *head, *tail;
    int queued, active, live;
    int draining, stopping;
    double cut_at;         /* while draining: when the requests still running are cut short (0: never) */
    long clock, script_next;
    serve_stats stats;
};

static double now_mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* pthread_cond_timedwait on CLOCK_MONOTONIC (the conditions are made with that clock). */
static void wait_until(pthread_cond_t *c, pthread_mutex_t *mu, double deadline) {
    struct timespec ts;
    ts.tv_sec = (time_t)deadline;
    ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(c, mu, &ts);
}

static int cond_init(pthread_cond_t *c) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
    return rc;
}

/* Ids and seeds: a counter through splitmix64 from a start that differs per process (set by
 * serve_engine_new, before any other thread asks). */
static _Atomic uint64_t id_counter;
static uint64_t id_salt;
static uint64_t random64(void) {
    uint64_t z = id_salt + atomic_fetch_add(&id_counter, 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---------------------------------------------------------------- jobs */

serve_job *serve_job_new(serve_request *r, int32_t *prompt, int n_prompt, int opens_thought, char *prefill, int max_tokens,
                         const char *model_id) {
    serve_job *j = calloc(1, sizeof *j);
    int n = r->n > 0 ? r->n : 1;
    if (!j || !(j->ch = calloc((size_t)n, sizeof *j->ch)) || cond_init(&j->cond) || !(j->model_id = strdup(model_id))) {
        if (j) free(j->model_id), free(j->ch);
        free(j);
        return NULL;
    }
    j->n_choices = n;
    for (int i = 0; i < n; i++) j->ch[i].slot = -1;
    j->req = *r;
    memset(r, 0, sizeof *r);
    j->prompt = prompt, j->n_prompt = n_prompt, j->opens_thought = opens_thought, j->prefill = prefill, j->max_tokens = max_tokens;
    snprintf(j->id, sizeof j->id, "%s-%016llx", j->req.kind == SERVE_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)random64());
    j->created = (long)time(NULL);
    j->seed = j->req.seed_given ? j->req.sampling.seed : random64();
    j->status = 200;
    j->refs = 1;
    j->script = -1;
    return j;
}

serve_job *serve_embed_job_new(serve_embed_request *r, serve_pooling pooling, const char *model_id) {
    serve_job *j = calloc(1, sizeof *j);
    if (!j || !(j->ch = calloc(1, sizeof *j->ch)) || cond_init(&j->cond) || !(j->model_id = strdup(model_id))) {
        if (j) free(j->model_id), free(j->ch);
        free(j);
        return NULL;
    }
    j->n_choices = 1; /* one slot, no reply of the stepper's */
    j->ch[0].slot = -1;
    j->er = *r;
    memset(r, 0, sizeof *r);
    j->embed = 1, j->pooling = pooling;
    snprintf(j->id, sizeof j->id, "embd-%016llx", (unsigned long long)random64());
    j->created = (long)time(NULL);
    j->status = 200;
    j->refs = 1;
    j->script = -1;
    return j;
}

/* The prompt cache's key of an embedding row: a hash of its bytes (64-bit FNV-1a folded), as a
 * negative number, which no token id is. A slot's cache is reused as far as the keys agree, so a
 * second image's rows never reuse the first one's K/V (its placeholder ids are the same); equal
 * rows give equal K/V, so equal keys may share it. Two different rows share a key with odds of
 * 2^-31. */
static int32_t embedding_key(const float *row, int hidden) {
    const unsigned char *b = (const unsigned char *)row;
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < sizeof *row * (size_t)hidden; i++) h = (h ^ b[i]) * 0x100000001b3u;
    return -1 - (int32_t)((h ^ h >> 32) & 0x7fffffff);
}

int serve_job_set_media(serve_job *j, const g4_embd_span *spans, int n_spans, int hidden) {
    size_t rows = 0;
    for (int k = 0; k < n_spans; k++) {
        if (!spans[k].embd || spans[k].n < 1 || spans[k].at < 0 || spans[k].at > j->n_prompt - spans[k].n)
            return g4_fail("media span %d (%d rows at %d) is empty or outside the prompt of %d tokens", k, spans[k].n, spans[k].at, j->n_prompt);
        rows += (size_t)spans[k].n;
    }
    free(j->spans), free(j->embd), free(j->key);
    j->spans = malloc(sizeof *j->spans * (size_t)(n_spans ? n_spans : 1));
    j->embd = malloc(sizeof *j->embd * (rows * (size_t)hidden + 1));
    j->key = malloc(sizeof *j->key * (size_t)(j->n_prompt ? j->n_prompt : 1));
    if (!j->spans || !j->embd || !j->key) return g4_fail("out of memory for %zu media rows", rows);
    memcpy(j->key, j->prompt, sizeof *j->key * (size_t)j->n_prompt);
    float *at = j->embd;
    for (int k = 0; k < n_spans; k++) {
        size_t len = (size_t)spans[k].n * (size_t)hidden;
        memcpy(at, spans[k].embd, sizeof *at * len);
        j->spans[k] = (g4_embd_span){.at = spans[k].at, .n = spans[k].n, .embd = at};
        for (int r = 0; r < spans[k].n; r++) j->key[spans[k].at + r] = embedding_key(at + (size_t)r * hidden, hidden);
        at += len;
    }
    j->n_spans = n_spans;
    return 0;
}

/* What the prompt cache compares: the prompt's ids, with media rows' keys in their place. */
static const int32_t *cache_key(const serve_job *j) { return j->key ? j->key : j->prompt; }

void serve_job_constrain(serve_job *j, g4_grammar_cache *c, g4_grammar_state *start, int32_t thought_open, int32_t thought_close) {
    j->grammars = c, j->constraint = start, j->thought_open = thought_open, j->thought_close = thought_close;
}

static void job_free(serve_job *j) {
    if (j->constraint) g4_grammar_cache_done(j->grammars, j->constraint, j->constraint);
    serve_embed_request_free(&j->er);
    free(j->acc), free(j->vecs);
    serve_request_free(&j->req);
    for (int i = 0; i < j->n_choices; i++) serve_reply_free(j->ch[i].reply);
    free(j->ch);
    free(j->prompt), free(j->prefill), free(j->model_id), free(j->out.p);
    free(j->spans), free(j->embd), free(j->key);
    pthread_cond_destroy(&j->cond);
    free(j);
}

/* Drops a reference (under the mutex); the last one frees the job. */
static void job_unref(serve_engine *e, serve_job *j) {
    if (--j->refs > 0) return;
    if (j->admitted) e->live--;
    job_free(j);
}

void serve_job_release(serve_engine *e, serve_job *j) {
    pthread_mutex_lock(&e->mu);
    if (!j->done) { /* the reader leaves first: the engine stops it at its next look */
        j->cancel = 1;
        pthread_cond_signal(&e->work);
    }
    job_unref(e, j);
    pthread_mutex_unlock(&e->mu);
}

void serve_job_cancel(serve_engine *e, serve_job *j) {
    pthread_mutex_lock(&e->mu);
    if (!j->done) {
        j->cancel = 1;
        pthread_cond_signal(&e->work);
    }
    pthread_mutex_unlock(&e->mu);
}

int serve_job_stream(const serve_job *j) { return j->req.stream; }

size_t serve_job_read(serve_engine *e, serve_job *j, char *buf, size_t cap, int timeout_ms, int *done) {
    double deadline = now_mono() + timeout_ms / 1000.0;
    pthread_mutex_lock(&e->mu);
    while (j->read_at == j->out.n && !j->done && now_mono() < deadline) wait_until(&j->cond, &e->mu, deadline);
    size_t n = j->out.n - j->read_at < cap ? j->out.n - j->read_at : cap;
    if (n) memcpy(buf, j->out.p + j->read_at, n);
    j->read_at += n;
    if (j->read_at == j->out.n && !j->done) j->read_at = j->out.n = 0; /* all read: the buffer starts over */
    *done = j->done && j->read_at == j->out.n;
    pthread_mutex_unlock(&e->mu);
    return n;
}

int serve_job_wait(serve_engine *e, serve_job *j, int timeout_ms) {
    double deadline = now_mono() + timeout_ms / 1000.0;
    pthread_mutex_lock(&e->mu);
    while (!j->done && now_mono() < deadline) wait_until(&j->cond, &e->mu, deadline);
    int done = j->done;
    pthread_mutex_unlock(&e->mu);
    return done;
}

const char *serve_job_output(serve_job *j, size_t *len) {
    *len = j->out.n;
    return j->out.p ? j->out.p : "";
}

int serve_job_status(const serve_job *j) { return j->status; }

/* ---------------------------------------------------------------- finishing */

/* What the slot's cache holds now: the prompt, then the generated tokens the stepper fed. */
static void remember_held(serve_engine *e, int q, const serve_job *j) {
    slot *sl = &e->slots[q];
    int n_pos = g4_session_seq_pos(e->s, q), n_gen;
    const int32_t *gen = g4_stepper_tokens(e->st, q, &n_gen);
    int from_prompt = n_pos < j->n_prompt ? n_pos : j->n_prompt, from_gen = n_pos - from_prompt;
    if (from_gen > n_gen) from_gen = n_gen;
    memcpy(sl->held, cache_key(j), sizeof *sl->held * (size_t)from_prompt);
    if (from_gen > 0) memcpy(sl->held + from_prompt, gen, sizeof *sl->held * (size_t)from_gen);
    sl->n_held = from_prompt + from_gen;
}

/* Choice i's slot is free (under the mutex), its cache remembered for the prompt cache. */
static void free_choice_slot(serve_engine *e, serve_job *j, int i) {
    int q = j->ch[i].slot;
    if (q < 0) return;
    if (j->embed) e->slots[q].n_held = 0; /* its cache holds the last input: no prompt's prefix */
    else remember_held(e, q, j);
    e->slots[q].job = NULL;
    e->slots[q].used = ++e->clock;
    e->active--;
    j->ch[i].slot = -1;
}

/* The job's end (under the mutex): every choice's slot free, the replies' last chunks (when
 * write), its reader woken. */
static void end_job(serve_engine *e, serve_job *j, int write) {
    serve_reply *replies[64];
    serve_finish why[64];
    int n = 0, generated = 0;
    for (int i = 0; i < j->n_choices; i++) {
        free_choice_slot(e, j, i);
        generated += j->ch[i].n_generated;
        if (j->ch[i].reply && n < 64) replies[n] = j->ch[i].reply, why[n++] = j->ch[i].why;
    }
    if (write && n == j->n_choices && serve_reply_finish_all(replies, n, why, j->n_prompt, j->n_cached, generated, &j->out) != 0) {
        serve_error err;
        serve_fail(&err, 500, "server_error", NULL, NULL, "out of memory while writing the reply");
        g4_textbuf_clear(&j->out);
        if (j->req.stream) serve_reply_error(&err, &j->out);
        else {
            char *s = serve_error_json(&err);
            if (s) g4_textbuf_appends(&j->out, s);
            free(s);
            j->status = 500;
        }
    }
    e->stats.finished++;
    e->stats.generated_tokens += generated;
    if (j->t_first > 0) e->stats.ttft_sum += j->t_first - j->t_submit, e->stats.ttft_count++;
    j->done = 1;
    pthread_cond_broadcast(&j->cond);
    job_unref(e, j);
}

/* Every choice still running stops in the stepper and ends for `why`; then the job ends. */
static void finish_job(serve_engine *e, serve_job *j, serve_finish why) {
    for (int i = 0; i < j->n_choices; i++) {
        job_choice *c = &j->ch[i];
        if (c->finished) continue;
        if (c->slot >= 0) g4_stepper_cancel(e->st, c->slot);
        c->finished = 1, c->why = why;
    }
    end_job(e, j, 1);
}

/* Choice i ended for `why` (its generation stopped); the job ends with its last choice. */
static void finish_choice(serve_engine *e, serve_job *j, int i, serve_finish why) {
    job_choice *c = &j->ch[i];
    if (c->finished) return;
    c->finished = 1, c->why = why;
    /* the masks its generation walked, for the schema's next request (g4_grammar_cache_done) */
    if (j->constraint && c->slot >= 0 && g4_stepper_constraint(e->st, c->slot))
        g4_grammar_state_keep_cache(j->constraint, g4_stepper_constraint(e->st, c->slot));
    free_choice_slot(e, j, i);
    if (--j->n_running == 0) end_job(e, j, 1);
    else pthread_cond_broadcast(&j->cond);
}

/* A job that cannot run: its error as the response (or, streaming, as an event after the role). */
static void fail_job(serve_engine *e, serve_job *j, int status, const char *msg) {
    serve_error err;
    serve_fail(&err, status, status == 500 ? "server_error" : "invalid_request_error", NULL, NULL, "%s", msg);
    for (int i = 0; i < j->n_choices; i++) {
        job_choice *c = &j->ch[i];
        if (c->slot >= 0 && !c->finished) g4_stepper_cancel(e->st, c->slot);
        c->finished = 1;
        serve_reply_free(c->reply);
        c->reply = NULL;
    }
    if (j->req.stream) serve_reply_error(&err, &j->out); /* its 200 and event stream began at admission */
    else {
        char *s = serve_error_json(&err);
        g4_textbuf_clear(&j->out);
        if (s) g4_textbuf_appends(&j->out, s);
        free(s);
        j->status = status;
    }
    end_job(e, j, 0);
}

/* ---------------------------------------------------------------- starting */

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = 0;
    while (n < na && n < nb && a[n] == b[n]) n++;
    return n;
}

/* Whether the job may reuse what the slot holds: only a prefix left by a request with the same
 * API key and cache_salt, since the cached token count it would report (usage's cached_tokens)
 * lets a client guess another's prompt a token at a time. */
static int same_cache_scope(const slot *sl, const serve_job *j) {
    const char *a = sl->held_salt, *b = j->req.cache_salt;
    return sl->held_key == j->req.api_key && (a && b ? !strcmp(a, b) : a == b);
}

/* The slot now holds the job's prompt: its scope is the job's. 0, or -1 when out of memory. */
static int take_cache_scope(slot *sl, const serve_job *j) {
    free(sl->held_salt);
    sl->held_salt = NULL;
    sl->held_key = j->req.api_key;
    if (!j->req.cache_salt || (sl->held_salt = strdup(j->req.cache_salt))) return 0;
    sl->held_key = -1; /* no request's scope */
    return -1;
}

/* The idle slot for a prompt: the one sharing the longest prefix with it, else the least
 * recently used (whose cache is the least likely to be asked for again). */
static int choose_slot(const serve_engine *e, const serve_job *j, int use_cache, int *shared) {
    int best = -1, best_shared = 0;
    *shared = 0;
    for (int q = 0; q < e->n_slots; q++) {
        const slot *sl = &e->slots[q];
        if (sl->job) continue;
        int n = use_cache && same_cache_scope(sl, j) ? common_prefix(sl->held, sl->n_held, cache_key(j), j->n_prompt) : 0;
        if (best < 0 || n > best_shared || (n == best_shared && sl->used < e->slots[best].used)) best = q, best_shared = n;
    }
    *shared = best_shared;
    return best;
}

/* Choice i's settings: the server's defaults (the model's, then its flags), each sampling field
 * the request gave in its place; the seed the request's (or a fresh one) plus i. */
static g4_generate_params job_params(const serve_engine *e, const serve_job *j, int i, const int *no_stops) {
    g4_generate_params p = {.max_tokens = j->max_tokens, .sampling = e->defaults, .logprobs = j->req.logprobs,
                            .top_logprobs = j->req.top_logprobs};
    g4_sampling_override(&p.sampling, &j->req.sampling, j->req.sampling_given);
    p.sampling.seed = j->seed + (uint64_t)i;
    p.draft = e->c.draft; /* greedy and sampled requests, constrained or not; not with logprobs or a repetition penalty */
    p.draft_tokens = e->c.draft_tokens;
    /* the scripted reply decides where it ends; a benchmark's replies all run to their budget */
    if (j->script >= 0 || e->c.ignore_eos) p.stop_ids = no_stops, p.n_stop_ids = 1;
    if (j->constraint) {
        p.constraint = j->constraint, p.constraint_vocab = g4_grammar_cache_vocab(j->grammars);
        p.thought_open = j->thought_open, p.thought_close = j->thought_close;
    }
    return p;
}

/* Choice i's reply (its first chunk written when streaming). */
static int new_choice_reply(serve_engine *e, serve_job *j, int i) {
    serve_reply_config rc = {.kind = j->req.kind, .stream = j->req.stream, .include_usage = j->req.include_usage, .id = j->id,
                             .model = j->model_id, .created = j->created, .stop = j->req.stop, .n_stop = j->req.n_stop,
                             .tools = j->req.n_tools > 0 && j->req.tool_choice != SERVE_TOOLS_NONE, .one_call = j->req.one_call, .opens_thought = j->opens_thought,
                             .prefill = j->prefill, .index = i, .logprobs = j->req.logprobs};
    return (j->ch[i].reply = serve_reply_new(e->tok, &rc, &j->out)) ? 0 : -1;
}

/* Choice i (> 0) in an idle slot, a fork of choice 0's prompt: it copies that prompt's cache. */
static int start_fork(serve_engine *e, serve_job *j, int i, const int *no_stops) {
    int shared, q = choose_slot(e, j, 0, &shared);
    g4_generate_params p = job_params(e, j, i, no_stops);
    if (q < 0 || take_cache_scope(&e->slots[q], j) || g4_stepper_add_fork(e->st, q, j->ch[0].slot, &p) != 0) return -1;
    e->slots[q].job = j, e->slots[q].choice = i, e->slots[q].n_held = 0;
    j->ch[i].slot = q;
    j->n_running++;
    e->active++;
    return 0;
}

/* Puts the job in slots: the first choice's with the prompt cache's prefix kept and the rest of
 * the prompt to the stepper, the others forks of it. */
/* An embedding job into a free slot (the least recently used: it keeps no prefix), its vectors'
 * room made; the engine thread feeds it (feed_embeddings). */
static void start_embed(serve_engine *e, serve_job *j) {
    int shared, q = choose_slot(e, j, 0, &shared);
    j->acc = calloc((size_t)e->dim, sizeof *j->acc);
    j->vecs = malloc(sizeof *j->vecs * (size_t)e->dim * (size_t)j->er.n_inputs);
    if (!j->acc || !j->vecs) return fail_job(e, j, 500, "out of memory for the embeddings");
    g4_session_reset_seq(e->s, q);
    e->slots[q].n_held = 0;
    e->slots[q].job = j;
    e->slots[q].choice = 0;
    j->ch[0].slot = q;
    j->n_running = 1;
    e->active++;
}

/* The job's prompt from position keep on (what the slot's cache lacks) into the stepper, with its
 * media spans' rows from there on. */
static int add_prompt(serve_engine *e, int q, const serve_job *j, int keep, const g4_generate_params *p) {
    if (j->n_spans == 0) return g4_stepper_add(e->st, q, j->prompt + keep, j->n_prompt - keep, p);
    g4_embd_span *rest = malloc(sizeof *rest * (size_t)j->n_spans);
    if (!rest) return g4_fail("out of memory for the media spans");
    int n = 0, hidden = g4_model_hidden_size(g4_session_model(e->s));
    for (int k = 0; k < j->n_spans; k++) {
        const g4_embd_span *sp = &j->spans[k];
        int skip = keep > sp->at ? keep - sp->at : 0; /* rows the cache holds */
        if (skip < sp->n) rest[n++] = (g4_embd_span){.at = sp->at + skip - keep, .n = sp->n - skip, .embd = sp->embd + (size_t)skip * hidden};
    }
    int rc = g4_stepper_add_embd(e->st, q, j->prompt + keep, j->n_prompt - keep, rest, n, p);
    free(rest);
    return rc;
}

static void start_job(serve_engine *e, serve_job *j) {
    static const int no_stops[1] = {-1};
    if (j->embed) return start_embed(e, j);
    if (e->c.n_script > 0) j->script = (int)(e->script_next++ % e->c.n_script);
    g4_generate_params p = job_params(e, j, 0, no_stops);
    /* the repetition penalty's window is the prompt the stepper is given: a cached prefix would
     * change it, so such requests start from an empty cache */
    int use_cache = e->c.prompt_cache && p.sampling.repeat_penalty == 1.0f, shared;
    int q = choose_slot(e, j, use_cache, &shared);
    int keep = shared < j->n_prompt ? shared : j->n_prompt - 1; /* the stepper needs a token to feed */
    for (int i = 0; i < j->n_choices; i++)
        if (new_choice_reply(e, j, i)) return fail_job(e, j, 500, "out of memory for the reply");
    if (take_cache_scope(&e->slots[q], j)) keep = 0; /* no salt to mark it with: nothing is reused, nor left to reuse */
    if (keep > 0) g4_session_truncate_seq(e->s, q, keep);
    else g4_session_reset_seq(e->s, q);
    e->slots[q].n_held = keep;
    if (add_prompt(e, q, j, keep, &p) != 0) {
        e->slots[q].n_held = 0;
        g4_session_reset_seq(e->s, q);
        return fail_job(e, j, 400, g4_last_error());
    }
    e->slots[q].job = j;
    e->slots[q].choice = 0;
    j->ch[0].slot = q;
    j->n_running = 1;
    j->n_cached = keep;
    e->active++;
    e->stats.cached_tokens += keep;
    e->stats.prompt_tokens += j->n_prompt;
    for (int i = 1; i < j->n_choices; i++)
        if (start_fork(e, j, i, no_stops) != 0) return fail_job(e, j, 500, g4_last_error());
}

/* Queued jobs into the free slots, first come first served. */
static void admit_jobs(serve_engine *e) {
    while (e->head && e->active + e->head->n_choices <= e->n_slots) {
        serve_job *j = e->head;
        e->head = j->next;
        if (!e->head) e->tail = NULL;
        e->queued--;
        start_job(e, j);
    }
}

/* Jobs whose readers left: stopped where they stand. */
static void drop_cancelled(serve_engine *e) {
    for (int q = 0; q < e->n_slots; q++) {
        serve_job *j = e->slots[q].job;
        if (j && j->cancel) {
            e->stats.cancelled++;
            finish_job(e, j, SERVE_FINISH_STOP);
        }
    }
    for (serve_job **p = &e->head; *p;) {
        serve_job *j = *p;
        if (!j->cancel) {
            p = &j->next;
            continue;
        }
        *p = j->next;
        if (e->tail == j) e->tail = NULL;
        for (serve_job *t = e->head; t; t = t->next) e->tail = t;
        e->queued--;
        e->stats.cancelled++;
        finish_job(e, j, SERVE_FINISH_STOP);
    }
}

/* Draining past its time: every request still running or waiting ends now, its reply complete
 * with finish_reason "length". */
static void cut_all(serve_engine *e) {
    for (int q = 0; q < e->n_slots; q++)
        if (e->slots[q].job && e->slots[q].job->embed) fail_job(e, e->slots[q].job, 503, "the server shut down before the embeddings were computed");
        else if (e->slots[q].job) finish_job(e, e->slots[q].job, SERVE_FINISH_LENGTH);
    while (e->head) {
        serve_job *j = e->head;
        e->head = j->next;
        e->queued--;
        fail_job(e, j, 503, "the server shut down before the request could start");
    }
    e->tail = NULL;
}

/* ---------------------------------------------------------------- a step's tokens */

/* One token of a step for its job: through the reply (the scripted text's token in its place
 * under the test hook); a stop string, the end of a script or a client that stopped reading ends
 * the job there. */
static void deliver(serve_engine *e, const g4_step_token *ev) {
    serve_job *j = e->slots[ev->seq].job;
    if (!j) return;
    int i = e->slots[ev->seq].choice, ended = 0;
    job_choice *c = &j->ch[i];
    if (ev->token >= 0) {
        int32_t t = ev->token;
        int is_stop = ev->finished && ev->stop == G4_STOP_EOS;
        g4_logprobs lp;
        int has_lp = j->req.logprobs && g4_stepper_logprobs(e->st, ev->seq, &lp) == 0;
        if (j->script >= 0) t = e->c.script[j->script][c->script_at++], is_stop = 0, has_lp = 0;
        if (j->t_first == 0) j->t_first = now_mono();
        c->n_generated++;
        int rc = serve_reply_token_logprobs(c->reply, t, is_stop, has_lp ? &lp : NULL, &j->out);
        if (rc < 0) return fail_job(e, j, 500, "out of memory while writing the reply");
        ended = rc == 1 || (j->script >= 0 && c->script_at == e->c.script_len[j->script]);
    }
    if (ev->finished && ev->stop == G4_STOP_ERROR && !ended) { /* the model's output turned NaN: this request only */
        const char *why = g4_stepper_error(e->st, ev->seq);
        return fail_job(e, j, 500, why ? why : "the model's output turned non-finite");
    }
    if (ev->finished && !ended) {
        finish_choice(e, j, i, ev->stop == G4_STOP_EOS || ev->stop == G4_STOP_USER ? SERVE_FINISH_STOP : SERVE_FINISH_LENGTH);
    } else if (ended) {
        g4_stepper_cancel(e->st, ev->seq);
        finish_choice(e, j, i, SERVE_FINISH_STOP);
    } else if (j->req.stream && j->out.n - j->read_at > e->c.max_unread) {
        e->stats.cancelled++; /* its client stopped reading */
        finish_job(e, j, SERVE_FINISH_LENGTH);
    } else {
        pthread_cond_broadcast(&j->cond);
    }
}

/* ---------------------------------------------------------------- embeddings */

/* The rows of the next embedding batch (under the mutex, which guards the slots): up to
 * EMBED_ROWS tokens of the inputs being fed, slot after slot; a row asks for an output (its
 * final hidden state) when its pooling reads it. Returns the number of rows. */
#define EMBED_ROWS 64
static int plan_embeddings(serve_engine *e) {
    int n = 0;
    for (int q = 0; q < e->n_slots && n < EMBED_ROWS; q++) {
        serve_job *j = e->slots[q].job;
        if (!j || !j->embed || j->cancel) continue;
        const int32_t *ids = j->er.ids[j->at_input];
        int len = j->er.n_ids[j->at_input];
        for (int t = j->at_token; t < len && n < EMBED_ROWS; t++, n++) {
            int read = j->pooling == SERVE_POOL_MEAN || t == len - 1;
            e->rows[n] = (g4_batch_row){.seq = q, .token = ids[t], .output = read ? G4_OUTPUT_ARGMAX : G4_OUTPUT_NONE};
            e->row_job[n] = j;
        }
    }
    return n;
}

/* Feeds the planned rows (the engine thread's, without the mutex) and pools what they give; an
 * input whose last row is in gets its vector, and its sequence starts over for the next input. */
static int run_embeddings(serve_engine *e, int n) {
    if (g4_decode(e->s, e->rows, n) != 0) return -1;
    for (int r = 0; r < n; r++) {
        serve_job *j = e->row_job[r];
        if (e->rows[r].output != G4_OUTPUT_NONE) {
            if (g4_decode_hidden(e->s, r, e->hidden) != 0) return -1;
            serve_pool_add(j->acc, e->hidden, e->dim, j->pooling);
        }
        int len = j->er.n_ids[j->at_input];
        if (++j->at_token < len) continue;
        serve_pool_finish(j->acc, e->dim, len, j->pooling, j->vecs + (size_t)j->at_input * (size_t)e->dim);
        memset(j->acc, 0, sizeof *j->acc * (size_t)e->dim);
        j->at_input++, j->at_token = 0;
        g4_session_reset_seq(e->s, e->rows[r].seq);
    }
    return 0;
}

/* After a batch (under the mutex): the jobs whose inputs are all in get their reply; a failed
 * batch fails its jobs. */
static void finish_embeddings(serve_engine *e, int n, const char *err) {
    for (int r = 0; r < n; r++) {
        serve_job *j = e->row_job[r];
        if (j->done || (r + 1 < n && e->row_job[r + 1] == j)) continue; /* a job's rows are consecutive: act at its last */
        if (err) {
            fail_job(e, j, 500, err);
        } else if (j->at_input == j->er.n_inputs) {
            size_t n_vals = (size_t)j->er.n_inputs * (size_t)e->dim, k = 0;
            while (k < n_vals && isfinite(j->vecs[k])) k++;
            if (k < n_vals) {
                fail_job(e, j, 500, "the model's hidden states are not finite numbers (a broken checkpoint?)");
                continue;
            }
            char *json = serve_embeddings_json(&j->er, j->vecs, e->dim, j->model_id);
            if (!json) {
                fail_job(e, j, 500, "out of memory while writing the reply");
                continue;
            }
            g4_textbuf_appends(&j->out, json);
            free(json);
            e->stats.embedded_inputs += j->er.n_inputs;
            for (int i = 0; i < j->er.n_inputs; i++) e->stats.embedded_tokens += j->er.n_ids[i];
            finish_job(e, j, SERVE_FINISH_STOP);
        }
    }
}

static void *engine_main(void *arg) {
    serve_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        drop_cancelled(e);
        if (e->draining && e->cut_at > 0 && now_mono() >= e->cut_at) cut_all(e);
        admit_jobs(e);
        if (e->active == 0) {
            if (e->stopping && !e->head) break;
            if (e->draining && e->cut_at > 0) wait_until(&e->work, &e->mu, e->cut_at);
            else pthread_cond_wait(&e->work, &e->mu);
            continue;
        }
        int n_embed = plan_embeddings(e);
        pthread_mutex_unlock(&e->mu);
        /* the generations' step, then a batch of the embedding inputs */
        int n = g4_stepper_active(e->st) > 0 ? g4_stepper_step(e->st, e->events) : 0;
        char err[256], embed_err[256];
        if (n < 0) snprintf(err, sizeof err, "generation failed: %s", g4_last_error());
        if (n_embed > 0 && run_embeddings(e, n_embed) != 0) snprintf(embed_err, sizeof embed_err, "embedding failed: %s", g4_last_error());
        else embed_err[0] = 0;
        if (e->c.step_ms > 0) nanosleep(&(struct timespec){e->c.step_ms / 1000, (long)(e->c.step_ms % 1000) * 1000000L}, NULL);
        pthread_mutex_lock(&e->mu);
        g4_stepper_stats ss;
        g4_stepper_get_stats(e->st, &ss);
        e->stats.decode_s = ss.decode_s, e->stats.prefill_s = ss.prefill_s;
        g4_stepper_draft_stats(e->st, &e->stats.draft_rounds, &e->stats.drafted, &e->stats.draft_accepted);
        for (int i = 0; i < n; i++) deliver(e, &e->events[i]);
        finish_embeddings(e, n_embed, embed_err[0] ? embed_err : NULL);
        if (n < 0)
            for (int q = 0; q < e->n_slots; q++)
                if (e->slots[q].job) fail_job(e, e->slots[q].job, 500, err);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---------------------------------------------------------------- the engine */

serve_engine *serve_engine_new(g4_session *s, const g4_tokenizer *tok, const serve_engine_config *c) {
    serve_engine *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    if (!id_salt) id_salt = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 32 ^ (uint64_t)(now_mono() * 1e9);
    e->s = s, e->tok = tok, e->c = *c;
    e->n_slots = g4_session_n_seq(s);
    e->ctx = g4_session_ctx(s);
    g4_model_sampling_defaults(g4_session_model(s), &e->defaults);
    g4_sampling_override(&e->defaults, &c->sampling, c->sampling_given);
    e->slots = calloc((size_t)e->n_slots, sizeof *e->slots);
    e->st = g4_stepper_new(s, c->prompt_chunk);
    e->events = e->st ? calloc((size_t)g4_stepper_max_tokens(e->st), sizeof *e->events) : NULL;
    e->dim = g4_model_hidden_size(g4_session_model(s));
    e->rows = calloc(EMBED_ROWS, sizeof *e->rows);
    e->row_job = calloc(EMBED_ROWS, sizeof *e->row_job);
    e->hidden = malloc(sizeof *e->hidden * (size_t)e->dim);
    int ok = e->slots && e->events && e->rows && e->row_job && e->hidden && e->st && !pthread_mutex_init(&e->mu, NULL) && !cond_init(&e->work);
    for (int q = 0; ok && q < e->n_slots; q++) ok = (e->slots[q].held = malloc(sizeof *e->slots[q].held * (size_t)(e->ctx + 1))) != NULL;
    e->stats.slots = e->n_slots;
    if (ok && pthread_create(&e->thread, NULL, engine_main, e) == 0) {
        e->thread_started = 1;
        return e;
    }
    serve_engine_free(e, 0);
    return NULL;
}

void serve_engine_drain(serve_engine *e, double cut_after_s) {
    pthread_mutex_lock(&e->mu);
    e->draining = 1;
    /* a later call may bring the cut forward (a second SIGTERM: now), never put it off */
    double at = now_mono() + (cut_after_s > 0 ? cut_after_s : 1e-9);
    if (cut_after_s >= 0 && (e->cut_at == 0 || at < e->cut_at)) e->cut_at = at;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
}

void serve_engine_free(serve_engine *e, double drain_s) {
    if (!e) return;
    if (e->thread_started) {
        serve_engine_drain(e, drain_s);
        pthread_mutex_lock(&e->mu);
        e->stopping = 1;
        pthread_cond_signal(&e->work);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    for (int q = 0; e->slots && q < e->n_slots; q++) free(e->slots[q].held), free(e->slots[q].held_salt);
    free(e->slots);
    free(e->events);
    free(e->rows), free(e->row_job), free(e->hidden);
    g4_stepper_free(e->st);
    free(e);
}

int serve_engine_submit(serve_engine *e, serve_job *j, serve_error *err) {
    pthread_mutex_lock(&e->mu);
    int rc = 0;
    if (e->draining) {
        rc = serve_fail(err, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
    } else if (e->queued + e->active >= e->n_slots + e->c.queue) {
        e->stats.rejected_busy++;
        rc = serve_fail(err, 503, "server_error", "server_busy", NULL,
                        "the server is busy: all %d slots and the %d places of the queue are taken; retry later", e->n_slots, e->c.queue);
    } else {
        j->refs++;
        j->admitted = 1;
        j->t_submit = now_mono();
        e->live++;
        e->queued++;
        e->stats.admitted++;
        if (e->tail) e->tail->next = j;
        else e->head = j;
        e->tail = j;
        pthread_cond_signal(&e->work);
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int serve_engine_live(serve_engine *e) {
    pthread_mutex_lock(&e->mu);
    int n = e->live;
    pthread_mutex_unlock(&e->mu);
    return n;
}

void serve_engine_stats(serve_engine *e, serve_stats *st) {
    pthread_mutex_lock(&e->mu);
    *st = e->stats;
    st->active = e->active;
    st->queued = e->queued;
    st->draining = e->draining;
    pthread_mutex_unlock(&e->mu);
}
