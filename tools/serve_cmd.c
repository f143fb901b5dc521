/* `g4 serve`: an OpenAI-compatible HTTP server over the library. HTTP is libmicrohttpd's (one
 * thread per connection: a request waits for its reply, or streams it, in its own thread);
 * requests are read by tools/serve/request.c, run by the engine (tools/serve/engine.c: the
 * generation stepper, continuous batching, the prompt cache) and written by tools/serve/reply.c.
 * This file routes, authenticates, bounds the body, counts what it answered (/metrics) and drains
 * on SIGTERM. */
#define _GNU_SOURCE /* POLLRDHUP */
#include <cjson/cJSON.h>
#include <errno.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "g4dev.h"
#include "serve/engine.h"
#include "serve/request.h"
#include "serve/tokens.h"

/* ---------------------------------------------------------------- settings */

#define MAX_HOSTS 8

typedef struct {
    const char *dir, *alias, *test_replies, *api_key_file;
    const char *hosts[MAX_HOSTS];
    int n_hosts;
    char **keys; /* --api-key and --api-key-file's keys, each non-empty (malloc'd) */
    int n_keys;
    int port, parallel, queue, timeout_s, prompt_chunk, prompt_cache, verbose, step_ms, ignore_eos;
    int header_timeout_s, body_timeout_s, max_conn_per_ip;
    g4_sampling sampling; /* --temp, --top-k, ...: the defaults of requests that do not set them */
    int sampling_given;
    double drain_s;
    size_t max_body, max_body_total, max_unread;
    int image_tokens;     /* --image-tokens: an image part's soft-token budget (0: the model's) */
    const char *cors[16]; /* --cors-origin: origins (or "*") whose browsers may read the replies */
    int n_cors;
    int pooling;          /* --pooling: SERVE_POOL_MEAN or SERVE_POOL_LAST (/v1/embeddings) */
    serve_limits lim;
    g4_options o;
    draft_args draft;
} serve_args;

/* ---------------------------------------------------------------- what was answered (/metrics) */

/* Answers are counted per route (the index of its row in the route table below; EP_OTHER for a
 * path no row takes) and status. N_ROUTES is the table's size: a row past it does not compile. */
enum { N_ROUTES = 10, EP_OTHER = N_ROUTES, EP_COUNT };
static const int statuses[] = {200, 204, 400, 401, 404, 405, 413, 500, 503};
#define N_STATUSES (int)(sizeof statuses / sizeof *statuses)

typedef struct {
    serve_args a;
    serve_engine *engine;
    g4_model *m;
    g4_session *s;
    g4_tokenizer *tok;
    g4_chat_form form;
    int vocab;
    long started;
    pthread_mutex_t count_mu;
    long answered[EP_COUNT][N_STATUSES];
    /* the connections' deadlines (conn_watch) and the bytes of request bodies held (under watch_mu) */
    pthread_mutex_t watch_mu;
    pthread_cond_t watch_stop;
    struct conn_watch *watched;
    int stopping;
    long timed_out;
    size_t body_bytes;
    /* structured output: the tokenizer's trie and the compiled grammars, made on first need */
    pthread_mutex_t grammars_mu;
    g4_grammar_cache *grammars;
} server;

static void count_answer(server *sv, int ep, int status) {
    pthread_mutex_lock(&sv->count_mu);
    for (int k = 0; k < N_STATUSES; k++)
        if (statuses[k] == status) sv->answered[ep][k]++;
    pthread_mutex_unlock(&sv->count_mu);
}

/* ---------------------------------------------------------------- one connection's request */

typedef struct request_ctx request_ctx;
typedef enum MHD_Result (*route_handler)(request_ctx *rc, struct MHD_Connection *c);

/* One row of the route table: a new endpoint is a row and its handler. */
typedef struct {
    const char *path;
    const char *alias;    /* another path it answers (OpenAI clients' base URLs with or without /v1), or NULL */
    int sub;              /* path/NAME is taken too (/v1/models/ID) */
    const char *method;   /* "GET" or "POST" (a body, read before the handler runs) */
    route_handler handler;
    int open;             /* answered without the API key: health checks, the chat page */
} route_def;

static const route_def routes[N_ROUTES];

struct request_ctx {
    server *sv;
    int ep, fd, api_key;
    const route_def *route; /* NULL: no route takes the path */
    const char *origin;     /* the Origin header's value when --cors-origin allows it, else NULL */
    char *body;
    size_t len, cap, reserved; /* reserved: what it counts in sv->body_bytes */
    int too_big, too_busy;
    double t0;
    const char *method, *url, *version;
};

/* The value of Access-Control-Allow-Origin for a request from origin (NULL: no CORS headers):
 * "*" when --cors-origin * was given, the origin itself when it was listed. */
static const char *cors_allowed(const serve_args *a, const char *origin) {
    if (!origin) return NULL;
    for (int i = 0; i < a->n_cors; i++)
        if (!strcmp(a->cors[i], "*")) return "*";
        else if (!strcmp(a->cors[i], origin)) return origin;
    return NULL;
}

/* The headers every answer carries: CORS's, when the request's origin is allowed. */
static void add_common_headers(const request_ctx *rc, struct MHD_Response *r) {
    if (!rc->origin) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", rc->origin);
    MHD_add_response_header(r, "Vary", "Origin");
}

/* The client closed its end (or the connection broke): nobody will read the reply. */
static int peer_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* While a whole reply is computed: has its client left? A client that closed its socket and one
 * that only shut down its sending side once the request was sent (a half-close, which HTTP
 * allows) look the same (POLLRDHUP) until something is written to them; so the first time, an
 * interim "100 Continue" is written, which HTTP/1.1 clients must skip: a closed socket answers it
 * with a reset (POLLHUP/POLLERR at the next look), a half-closed one takes it. HTTP/1.0 clients
 * may not be sent one: for them a half-close counts as leaving. */
static int waiting_client_gone(request_ctx *rc, int *probed) {
    if (rc->fd < 0) return 0;
    struct pollfd p = {.fd = rc->fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return 1;
    if (!(p.revents & POLLRDHUP) || *probed) return 0;
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    *probed = 1;
    if (!rc->version || strcmp(rc->version, MHD_HTTP_VERSION_1_1) != 0) return 1;
    return send(rc->fd, cont, sizeof cont - 1, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)(sizeof cont - 1);
}

static enum MHD_Result send_text(request_ctx *rc, struct MHD_Connection *c, int status, const char *type, const char *body) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (status == 503) MHD_add_response_header(r, "Retry-After", "1"); /* busy or draining: a slot, or another replica, soon */
    if (status == 405 && rc->route) MHD_add_response_header(r, "Allow", !strcmp(rc->route->method, "POST") ? "POST, OPTIONS" : "GET, OPTIONS");
    add_common_headers(rc, r);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    count_answer(rc->sv, rc->ep, status);
    if (rc->sv->a.verbose) fprintf(stderr, "g4 serve: %s %s %d %.3fs\n", rc->method, rc->url, status, now_s() - rc->t0);
    return ok;
}

static enum MHD_Result send_json(request_ctx *rc, struct MHD_Connection *c, int status, const char *json) {
    return send_text(rc, c, status, "application/json", json);
}

static enum MHD_Result send_error(request_ctx *rc, struct MHD_Connection *c, const serve_error *e) {
    char *json = serve_error_json(e);
    enum MHD_Result ok = send_json(rc, c, e->status, json ? json : "{\"error\":{\"message\":\"out of memory\"}}");
    free(json);
    return ok;
}

static enum MHD_Result fail(request_ctx *rc, struct MHD_Connection *c, int status, const char *type, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static enum MHD_Result fail(request_ctx *rc, struct MHD_Connection *c, int status, const char *type, const char *code, const char *fmt, ...) {
    serve_error e = {.status = status, .type = type, .code = code};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    return send_error(rc, c, &e);
}

/* ---------------------------------------------------------------- GET endpoints */

static cJSON *model_object(const server *sv) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", sv->a.lim.model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)sv->started);
    cJSON_AddStringToObject(m, "owned_by", "g4");
    cJSON_AddNumberToObject(m, "context_length", sv->a.lim.ctx);
    return m;
}

static enum MHD_Result send_cjson(request_ctx *rc, struct MHD_Connection *c, int status, cJSON *root) {
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    enum MHD_Result ok = s ? send_json(rc, c, status, s) : MHD_NO;
    free(s);
    return ok;
}

static enum MHD_Result get_models(request_ctx *rc, struct MHD_Connection *c) {
    const char *id = rc->url + strlen(rc->url[1] == 'v' ? "/v1/models" : "/models");
    if (*id == '/' && id[1]) {
        if (strcmp(id + 1, rc->sv->a.lim.model_id) != 0)
            return fail(rc, c, 404, "invalid_request_error", "model_not_found", "The model '%.200s' does not exist", id + 1);
        return send_cjson(rc, c, 200, model_object(rc->sv));
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), model_object(rc->sv));
    return send_cjson(rc, c, 200, root);
}

/* 200 while serving, 503 while draining: what a load balancer's health check reads. */
static enum MHD_Result get_health(request_ctx *rc, struct MHD_Connection *c) {
    serve_stats st;
    serve_engine_stats(rc->sv->engine, &st);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", st.draining ? "draining" : "ok");
    cJSON_AddNumberToObject(root, "slots", st.slots);
    cJSON_AddNumberToObject(root, "slots_active", st.active);
    cJSON_AddNumberToObject(root, "queued", st.queued);
    return send_cjson(rc, c, st.draining ? 503 : 200, root);
}

typedef struct {
    char *p;
    size_t n, cap;
} text;

static void addf(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void addf(text *t, const char *fmt, ...) {
    va_list ap;
    for (int tries = 0; tries < 2; tries++) {
        va_start(ap, fmt);
        int k = vsnprintf(t->p ? t->p + t->n : NULL, t->p ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (t->p && t->n + (size_t)k < t->cap) {
            t->n += (size_t)k;
            return;
        }
        size_t cap = t->cap ? t->cap : 4096;
        while (cap <= t->n + (size_t)k) cap *= 2;
        char *p = realloc(t->p, cap);
        if (!p) return;
        t->p = p, t->cap = cap;
    }
}

static void metric(text *t, const char *name, const char *type, const char *help) { addf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type); }

/* Prometheus' text format (version 0.0.4). */
static enum MHD_Result get_metrics(request_ctx *rc, struct MHD_Connection *c) {
    server *sv = rc->sv;
    serve_stats st;
    serve_engine_stats(sv->engine, &st);
    text t = {0};
    metric(&t, "g4_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
    pthread_mutex_lock(&sv->count_mu);
    for (int ep = 0; ep < EP_COUNT; ep++)
        for (int k = 0; k < N_STATUSES; k++)
            if (sv->answered[ep][k])
                addf(&t, "g4_requests_total{endpoint=\"%s\",status=\"%d\"} %ld\n", ep < N_ROUTES ? routes[ep].path : "other", statuses[k],
                     sv->answered[ep][k]);
    pthread_mutex_unlock(&sv->count_mu);
    metric(&t, "g4_prompt_tokens_total", "counter", "Prompt tokens of the requests started, the cached ones included.");
    addf(&t, "g4_prompt_tokens_total %ld\n", st.prompt_tokens);
    metric(&t, "g4_prompt_tokens_cached_total", "counter", "Prompt tokens taken from an idle slot's cache instead of prefilled.");
    addf(&t, "g4_prompt_tokens_cached_total %ld\n", st.cached_tokens);
    metric(&t, "g4_generated_tokens_total", "counter", "Tokens generated.");
    addf(&t, "g4_generated_tokens_total %ld\n", st.generated_tokens);
    metric(&t, "g4_requests_finished_total", "counter", "Completions finished (cancelled ones included).");
    addf(&t, "g4_requests_finished_total %ld\n", st.finished);
    metric(&t, "g4_requests_cancelled_total", "counter", "Completions stopped because their client left or stopped reading.");
    addf(&t, "g4_requests_cancelled_total %ld\n", st.cancelled);
    metric(&t, "g4_requests_rejected_busy_total", "counter", "Requests refused with 503 because every slot and queue place was taken.");
    addf(&t, "g4_requests_rejected_busy_total %ld\n", st.rejected_busy);
    metric(&t, "g4_connections_timed_out_total", "counter", "Connections closed for sending their headers or body too slowly (--header-timeout, --body-timeout).");
    pthread_mutex_lock(&sv->watch_mu);
    addf(&t, "g4_connections_timed_out_total %ld\n", sv->timed_out);
    pthread_mutex_unlock(&sv->watch_mu);
    metric(&t, "g4_embedding_inputs_total", "counter", "Inputs embedded (/v1/embeddings).");
    addf(&t, "g4_embedding_inputs_total %ld\n", st.embedded_inputs);
    metric(&t, "g4_embedding_tokens_total", "counter", "Tokens of the inputs embedded.");
    addf(&t, "g4_embedding_tokens_total %ld\n", st.embedded_tokens);
    metric(&t, "g4_queue_depth", "gauge", "Requests waiting for a slot.");
    addf(&t, "g4_queue_depth %d\n", st.queued);
    metric(&t, "g4_slots_active", "gauge", "Slots running a request.");
    addf(&t, "g4_slots_active %d\n", st.active);
    metric(&t, "g4_slots_total", "gauge", "Slots (--parallel).");
    addf(&t, "g4_slots_total %d\n", st.slots);
    metric(&t, "g4_decode_seconds_total", "counter", "Seconds in the batched decode steps.");
    addf(&t, "g4_decode_seconds_total %.6f\n", st.decode_s);
    metric(&t, "g4_prefill_seconds_total", "counter", "Seconds feeding prompts.");
    addf(&t, "g4_prefill_seconds_total %.6f\n", st.prefill_s);
    metric(&t, "g4_decode_tokens_per_second", "gauge", "Generated tokens per second of decode steps, since the start.");
    addf(&t, "g4_decode_tokens_per_second %.3f\n", st.decode_s > 0 ? (double)st.generated_tokens / st.decode_s : 0.0);
    metric(&t, "g4_draft_rounds_total", "counter", "Speculative decoding rounds (--draft).");
    addf(&t, "g4_draft_rounds_total %ld\n", st.draft_rounds);
    metric(&t, "g4_draft_tokens_total", "counter", "Tokens the drafter drafted.");
    addf(&t, "g4_draft_tokens_total %ld\n", st.drafted);
    metric(&t, "g4_draft_accepted_tokens_total", "counter", "Drafted tokens the model accepted.");
    addf(&t, "g4_draft_accepted_tokens_total %ld\n", st.draft_accepted);
    metric(&t, "g4_time_to_first_token_seconds", "summary", "From admission to the first generated token.");
    addf(&t, "g4_time_to_first_token_seconds_sum %.6f\ng4_time_to_first_token_seconds_count %ld\n", st.ttft_sum, st.ttft_count);
    enum MHD_Result ok = t.p ? send_text(rc, c, 200, "text/plain; version=0.0.4; charset=utf-8", t.p) : MHD_NO;
    free(t.p);
    return ok;
}

/* ---------------------------------------------------------------- completions */

/* A streaming reply's reader, apart from the request's context: libmicrohttpd frees that one
 * (on_completed) before it lets go of the response. */
typedef struct {
    serve_engine *engine;
    serve_job *job;
    int fd;
} stream_ctx;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_ctx *sc = cls;
    for (;;) {
        int done;
        size_t n = serve_job_read(sc->engine, sc->job, buf, max, 100, &done);
        if (n) return (ssize_t)n;
        if (done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (peer_gone(sc->fd)) {
            serve_job_cancel(sc->engine, sc->job);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) {
    stream_ctx *sc = cls;
    serve_job_release(sc->engine, sc->job);
    free(sc);
}

#define SERVE_GRAMMAR_CACHE 64 /* schemas and grammars kept compiled, with their warm mask caches */

/* The request's constraint as a start state from the server's grammar cache; a grammar or schema
 * the compiler refuses is a 400 naming the field. */
static int constrain(server *sv, const serve_request *r, g4_grammar_state **start, serve_error *e) {
    pthread_mutex_lock(&sv->grammars_mu);
    if (!sv->grammars) sv->grammars = g4_grammar_cache_new(sv->tok, SERVE_GRAMMAR_CACHE);
    g4_grammar_cache *c = sv->grammars;
    pthread_mutex_unlock(&sv->grammars_mu);
    if (!c) return serve_fail(e, 500, "server_error", NULL, NULL, "structured output: %s", g4_last_error());
    *start = g4_grammar_cache_start(c, (g4_constraint_kind)r->constraint_kind, r->constraint_text, strlen(r->constraint_text));
    if (!*start) return serve_fail(e, 400, "invalid_request_error", NULL, r->constraint_param, "'%s': %s", r->constraint_param, g4_last_error());
    return 0;
}

/* The tower's work is the whole machine's: one request's media at a time. */
static pthread_mutex_t media_mu = PTHREAD_MUTEX_INITIALIZER;

/* The request's image and audio parts through the model's towers (their bytes dropped after); a
 * part the tower refuses (a bad file, a model without that tower) is a 400 naming it. */
static int media_soft_tokens(server *sv, serve_request *r, serve_error *e) {
    for (int k = 0; k < r->n_media; k++) {
        serve_media *m = &r->media[k];
        int rc;
        pthread_mutex_lock(&media_mu);
        if (m->kind == G4_MEDIA_IMAGE)
            rc = g4_image_soft_tokens(sv->m, &sv->a.o, m->bytes, m->len, m->budget ? m->budget : sv->a.image_tokens, &m->embd, &m->n);
        else
            rc = g4_audio_soft_tokens(sv->m, &sv->a.o, m->bytes, m->len, &m->embd, &m->n);
        pthread_mutex_unlock(&media_mu);
        free(m->bytes), m->bytes = NULL;
        if (rc) return serve_fail(e, 400, "invalid_request_error", NULL, m->param, "'%s': %s", m->param, g4_last_error());
    }
    return 0;
}

/* Parses, renders and admits the request; streams its reply, or waits for it and sends it whole. */
static enum MHD_Result post_completion(request_ctx *rc, struct MHD_Connection *c, serve_kind kind) {
    server *sv = rc->sv;
    serve_request r;
    serve_error e;
    int32_t *ids;
    int n_ids, opens, max_tokens;
    char *prefill;
    if (serve_parse_request(rc->body ? rc->body : "", rc->len, kind, &sv->a.lim, &r, &e))
        return send_error(rc, c, &e);
    r.api_key = rc->api_key; /* the prompt cache's scope: this key's and r.cache_salt's */
    if (media_soft_tokens(sv, &r, &e) ||
        serve_prompt(&r, sv->tok, sv->form, sv->vocab, &sv->a.lim, &ids, &n_ids, &opens, &prefill, &max_tokens, &e)) {
        serve_request_free(&r);
        return send_error(rc, c, &e);
    }
    g4_grammar_state *start = NULL;
    /* a call the prompt opened (tool_choice required or named) keeps to the tools' schemas, and so
     * does any call of a strict function under tool_choice auto (not after tool responses with
     * thinking on: the prompt ends inside a thought); under --test-replies the text is the
     * script's, not the model's, so nothing is constrained */
    int in_call = prefill != NULL;
    if ((!opens && !sv->a.test_replies && serve_tool_constraint(&r, sv->tok, in_call, &e)) || (r.constraint_text && constrain(sv, &r, &start, &e))) {
        serve_request_free(&r);
        free(ids), free(prefill);
        return send_error(rc, c, &e);
    }
    /* thinking: the constraint takes the answer after the thought; a prompt that ends inside a
     * thought (after tool responses) would need the constraint to start mid-thought: refused */
    if (start && opens) {
        g4_grammar_cache_done(sv->grammars, start, NULL);
        serve_fail(&e, 400, "invalid_request_error", NULL, r.constraint_param,
                   "'%s': a constrained answer right after tool responses with thinking on is not supported", r.constraint_param);
        serve_request_free(&r);
        free(ids), free(prefill);
        return send_error(rc, c, &e);
    }
    int32_t open = 0, close = 0;
    if (start && r.kind == SERVE_CHAT && r.thinking && !in_call) {
        open = g4_tokenizer_piece_to_id(sv->tok, "<|channel>"), close = g4_tokenizer_piece_to_id(sv->tok, "<channel|>");
        if (open <= 0 || close <= 0) open = close = 0;
    }
    g4_embd_span *spans = NULL;
    int n_spans = r.n_media;
    if (n_spans && serve_media_spans(&r, sv->tok, ids, n_ids, &spans, &e)) {
        if (start) g4_grammar_cache_done(sv->grammars, start, NULL);
        serve_request_free(&r);
        free(ids), free(prefill);
        return send_error(rc, c, &e);
    }
    serve_request media = {.media = r.media, .n_media = r.n_media}; /* the soft tokens, copied by the job, freed after */
    r.media = NULL, r.n_media = 0;
    serve_job *j = serve_job_new(&r, ids, n_ids, opens, prefill, max_tokens, sv->a.lim.model_id);
    int media_rc = j && n_spans ? serve_job_set_media(j, spans, n_spans, g4_model_hidden_size(sv->m)) : 0;
    free(spans);
    serve_request_free(&media);
    if (!j || media_rc) {
        if (start) g4_grammar_cache_done(sv->grammars, start, NULL);
        if (j) serve_job_release(sv->engine, j);
        else serve_request_free(&r), free(ids), free(prefill);
        return fail(rc, c, 500, "server_error", NULL, "%s", j ? g4_last_error() : "out of memory");
    }
    if (start) serve_job_constrain(j, sv->grammars, start, open, close);
    if (serve_engine_submit(sv->engine, j, &e)) {
        serve_job_release(sv->engine, j);
        return send_error(rc, c, &e);
    }
    if (serve_job_stream(j)) {
        stream_ctx *sc = malloc(sizeof *sc);
        struct MHD_Response *resp = NULL;
        if (sc) *sc = (stream_ctx){sv->engine, j, rc->fd};
        if (!sc || !(resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, sc, stream_free))) {
            free(sc);
            serve_job_release(sv->engine, j);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no"); /* nginx: pass events on at once */
        add_common_headers(rc, resp);
        enum MHD_Result ok = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        count_answer(sv, rc->ep, 200);
        return ok;
    }
    int probed = 0;
    while (!serve_job_wait(sv->engine, j, 100))
        if (waiting_client_gone(rc, &probed)) {
            serve_job_release(sv->engine, j); /* stops it: nobody waits for the answer */
            return MHD_NO;
        }
    size_t len;
    const char *out = serve_job_output(j, &len);
    enum MHD_Result ok = send_json(rc, c, serve_job_status(j), out);
    serve_job_release(sv->engine, j);
    return ok;
}

static enum MHD_Result post_chat(request_ctx *rc, struct MHD_Connection *c) { return post_completion(rc, c, SERVE_CHAT); }
static enum MHD_Result post_completions(request_ctx *rc, struct MHD_Connection *c) { return post_completion(rc, c, SERVE_COMPLETION); }

/* ---------------------------------------------------------------- tokens, embeddings, settings */

/* A reply computed from the body alone (tokens.h): its JSON, or its error. */
static enum MHD_Result send_computed(request_ctx *rc, struct MHD_Connection *c, char *json, const serve_error *e) {
    enum MHD_Result ok = json ? send_json(rc, c, 200, json) : send_error(rc, c, e);
    free(json);
    return ok;
}

static enum MHD_Result post_tokenize(request_ctx *rc, struct MHD_Connection *c) {
    serve_error e;
    return send_computed(rc, c, serve_tokenize(rc->body ? rc->body : "", rc->len, rc->sv->tok, &e), &e);
}

static enum MHD_Result post_detokenize(request_ctx *rc, struct MHD_Connection *c) {
    serve_error e;
    return send_computed(rc, c, serve_detokenize(rc->body ? rc->body : "", rc->len, rc->sv->tok, &e), &e);
}

/* The inputs go to the engine as one job (a slot of their own, fed between the generations'
 * steps); the reply waits for all of them. */
static enum MHD_Result post_embeddings(request_ctx *rc, struct MHD_Connection *c) {
    server *sv = rc->sv;
    serve_embed_request r;
    serve_error e;
    if (serve_parse_embeddings(rc->body ? rc->body : "", rc->len, sv->tok, sv->vocab, &sv->a.lim, &r, &e)) return send_error(rc, c, &e);
    serve_job *j = serve_embed_job_new(&r, (serve_pooling)sv->a.pooling, sv->a.lim.model_id);
    if (!j) {
        serve_embed_request_free(&r);
        return fail(rc, c, 500, "server_error", NULL, "out of memory");
    }
    if (serve_engine_submit(sv->engine, j, &e)) {
        serve_job_release(sv->engine, j);
        return send_error(rc, c, &e);
    }
    while (!serve_job_wait(sv->engine, j, 100))
        if (peer_gone(rc->fd)) {
            serve_job_release(sv->engine, j);
            return MHD_NO;
        }
    size_t len;
    enum MHD_Result ok = send_json(rc, c, serve_job_status(j), serve_job_output(j, &len));
    serve_job_release(sv->engine, j);
    return ok;
}

/* A read-only view of the settings (llama-server's /props, its field names where it has them);
 * never the API key, only whether one is needed. */
static enum MHD_Result get_props(request_ctx *rc, struct MHD_Connection *c) {
    const serve_args *a = &rc->sv->a;
    g4_sampling d;
    g4_model_sampling_defaults(rc->sv->m, &d);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model_alias", a->lim.model_id);
    cJSON_AddStringToObject(root, "model_path", a->dir);
    cJSON_AddNumberToObject(root, "total_slots", a->parallel);
    cJSON_AddNumberToObject(root, "n_ctx", a->lim.ctx);
    cJSON_AddStringToObject(root, "build_info", g4_version());
    cJSON *gen = cJSON_AddObjectToObject(root, "default_generation_settings");
    cJSON_AddNumberToObject(gen, "n_ctx", a->lim.ctx);
    cJSON *params = cJSON_AddObjectToObject(gen, "params");
    cJSON_AddNumberToObject(params, "temperature", d.temperature);
    cJSON_AddNumberToObject(params, "top_k", d.top_k);
    cJSON_AddNumberToObject(params, "top_p", d.top_p);
    cJSON_AddNumberToObject(params, "min_p", d.min_p);
    cJSON_AddNumberToObject(params, "repeat_penalty", d.repeat_penalty);
    cJSON_AddNumberToObject(params, "repeat_last_n", d.repeat_last_n);
    cJSON *srv = cJSON_AddObjectToObject(root, "server");
    cJSON_AddNumberToObject(srv, "queue", a->queue);
    cJSON_AddNumberToObject(srv, "timeout", a->timeout_s);
    cJSON_AddNumberToObject(srv, "drain_timeout", a->drain_s);
    cJSON_AddNumberToObject(srv, "max_body", (double)a->max_body);
    cJSON_AddNumberToObject(srv, "max_unread", (double)a->max_unread);
    cJSON_AddNumberToObject(srv, "max_messages", a->lim.max_messages);
    cJSON_AddNumberToObject(srv, "max_tools", a->lim.max_tools);
    cJSON_AddBoolToObject(srv, "prompt_cache", a->prompt_cache);
    cJSON_AddStringToObject(srv, "pooling", a->pooling == SERVE_POOL_LAST ? "last" : "mean");
    cJSON_AddBoolToObject(srv, "api_key_required", a->n_keys > 0);
    cJSON_AddBoolToObject(srv, "strict_model", a->lim.strict_model);
    cJSON_AddNumberToObject(srv, "max_body_total", (double)a->max_body_total);
    cJSON_AddNumberToObject(srv, "max_json_values", a->lim.max_json_values);
    cJSON_AddNumberToObject(srv, "header_timeout", a->header_timeout_s);
    cJSON_AddNumberToObject(srv, "body_timeout", a->body_timeout_s);
    cJSON_AddNumberToObject(srv, "max_conn_per_ip", a->max_conn_per_ip);
    cJSON *cors = cJSON_AddArrayToObject(srv, "cors_origins");
    for (int i = 0; i < a->n_cors; i++) cJSON_AddItemToArray(cors, cJSON_CreateString(a->cors[i]));
    return send_cjson(rc, c, 200, root);
}

/* ---------------------------------------------------------------- the chat page */

/* tools/serve/chat.html, made into a C array at build time, and its policy
 * (tools/serve/embed_page.pl) */
extern const unsigned char g4_chat_html[];
extern const unsigned int g4_chat_html_len;
extern const char g4_chat_csp[];

/* GET /: the chat page. Its script and style are inline and it loads nothing else: the policy
 * runs that script and style only (by their hashes), lets the page talk to this server only and
 * keeps it out of other sites' frames. */
static enum MHD_Result get_page(request_ctx *rc, struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(g4_chat_html_len, (void *)g4_chat_html, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(r, "Content-Security-Policy", g4_chat_csp);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    add_common_headers(rc, r);
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    count_answer(rc->sv, rc->ep, 200);
    return ok;
}

/* ---------------------------------------------------------------- routing */

static const route_def routes[N_ROUTES] = {
    {"/v1/chat/completions", "/chat/completions", 0, "POST", post_chat, 0},
    {"/v1/completions", "/completions", 0, "POST", post_completions, 0},
    {"/v1/models", "/models", 1, "GET", get_models, 0},
    {"/v1/embeddings", "/embeddings", 0, "POST", post_embeddings, 0},
    {"/tokenize", NULL, 0, "POST", post_tokenize, 0},
    {"/detokenize", NULL, 0, "POST", post_detokenize, 0},
    {"/props", NULL, 0, "GET", get_props, 0},
    {"/health", NULL, 0, "GET", get_health, 1},
    {"/metrics", NULL, 0, "GET", get_metrics, 0},
    {"/", NULL, 0, "GET", get_page, 1},
};

static int path_is(const char *url, const char *path, int sub) {
    size_t n = strlen(path);
    return !strncmp(url, path, n) && (url[n] == 0 || (sub && url[n] == '/'));
}

/* The row whose path or alias the URL names; EP_OTHER for none. */
static int find_route(const char *url) {
    for (int i = 0; i < N_ROUTES; i++)
        if ((routes[i].path && path_is(url, routes[i].path, routes[i].sub)) || (routes[i].alias && path_is(url, routes[i].alias, routes[i].sub))) return i;
    return EP_OTHER;
}

/* A browser's CORS preflight (OPTIONS): 204 with what the route takes, unauthenticated (browsers
 * send no credentials with it); the Access-Control-Allow-* headers only for an allowed origin. */
static enum MHD_Result answer_preflight(request_ctx *rc, struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    const char *methods = !strcmp(rc->route->method, "POST") ? "POST, OPTIONS" : "GET, OPTIONS";
    MHD_add_response_header(r, "Allow", methods);
    add_common_headers(rc, r);
    if (rc->origin) {
        MHD_add_response_header(r, "Access-Control-Allow-Methods", methods);
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    }
    enum MHD_Result ok = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    count_answer(rc->sv, rc->ep, 204);
    return ok;
}

/* Constant-time comparison, so the key cannot be guessed a byte at a time from timings. */
static int same_secret(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = na != nb;
    for (size_t i = 0; i < na; i++) d |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return d == 0;
}

/* Which key let the request in: 1 + its index among --api-key's and --api-key-file's, 0 when the
 * server takes none, -1 for a missing or wrong one. Every key is compared, whichever matches. */
static int api_key_of(const server *sv, struct MHD_Connection *c) {
    if (sv->a.n_keys == 0) return 0;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7) != 0) return -1;
    int which = -1;
    for (int k = 0; k < sv->a.n_keys; k++)
        if (same_secret(h + 7, sv->a.keys[k])) which = k + 1;
    return which;
}

/* ---------------------------------------------------------------- slow clients and big bodies */

/* A connection's deadline: libmicrohttpd's --timeout is an idle timeout, which a client sending a
 * byte now and then never reaches (slowloris), so the headers must arrive within
 * --header-timeout of the connection's start (or of its previous reply) and the body within
 * --body-timeout of the headers. A watchdog thread shuts down the sockets past their deadline;
 * libmicrohttpd then closes them as it does any broken connection. */
typedef struct conn_watch {
    int fd;
    double deadline; /* now_s() time; 0 while a reply is computed or sent (no deadline) */
    struct conn_watch *prev, *next;
} conn_watch;

static void set_deadline(server *sv, struct MHD_Connection *c, double after_s) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    conn_watch *w = ci ? ci->socket_context : NULL;
    if (!w) return;
    pthread_mutex_lock(&sv->watch_mu);
    w->deadline = after_s > 0 ? now_s() + after_s : 0;
    pthread_mutex_unlock(&sv->watch_mu);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    server *sv = cls;
    conn_watch *w = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci || !(w = calloc(1, sizeof *w))) return; /* unwatched: the idle timeout still holds */
        w->fd = ci->connect_fd;
        pthread_mutex_lock(&sv->watch_mu);
        w->deadline = now_s() + sv->a.header_timeout_s;
        w->next = sv->watched;
        if (sv->watched) sv->watched->prev = w;
        sv->watched = w;
        pthread_mutex_unlock(&sv->watch_mu);
        *socket_context = w;
    } else if (w) { /* closed: libmicrohttpd closes the socket after this call */
        pthread_mutex_lock(&sv->watch_mu);
        if (w->prev) w->prev->next = w->next;
        else sv->watched = w->next;
        if (w->next) w->next->prev = w->prev;
        pthread_mutex_unlock(&sv->watch_mu);
        free(w);
        *socket_context = NULL;
    }
}

static void *watchdog_main(void *arg) {
    server *sv = arg;
    pthread_mutex_lock(&sv->watch_mu);
    while (!sv->stopping) {
        double now = now_s();
        for (conn_watch *w = sv->watched; w; w = w->next)
            if (w->deadline > 0 && now > w->deadline) {
                shutdown(w->fd, SHUT_RDWR);
                w->deadline = 0;
                sv->timed_out++;
            }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&sv->watch_stop, &sv->watch_mu, &ts);
    }
    pthread_mutex_unlock(&sv->watch_mu);
    return NULL;
}

/* The parse memory of a body of len bytes: the bytes, and cJSON's node (about 64 bytes and the
 * allocator's own) for each value it may hold, up to --max-json-values (past it the parse refuses
 * the body before allocating). */
static size_t parse_cost(const server *sv, const char *body, size_t len) {
    size_t values = serve_json_values(body, len), max = (size_t)sv->a.lim.max_json_values;
    return len + 96 * (values < max ? values : max);
}

/* Counts n more bytes against --max-body-total (the bodies held and parsed at once, across
 * connections); 0 when that would pass it. */
static int reserve_body(request_ctx *rc, size_t n) {
    server *sv = rc->sv;
    pthread_mutex_lock(&sv->watch_mu);
    int ok = sv->body_bytes + n <= sv->a.max_body_total;
    if (ok) sv->body_bytes += n, rc->reserved += n;
    pthread_mutex_unlock(&sv->watch_mu);
    return ok;
}

static void release_body(request_ctx *rc) {
    pthread_mutex_lock(&rc->sv->watch_mu);
    rc->sv->body_bytes -= rc->reserved;
    pthread_mutex_unlock(&rc->sv->watch_mu);
    rc->reserved = 0;
}

/* A piece of the body, kept while the body is within --max-body and the total within
 * --max-body-total; past either the rest is read and dropped, and the answer is a 413 or 503. */
static int take_body(request_ctx *rc, const char *upload, size_t n) {
    size_t max = rc->sv->a.max_body;
    if (!rc->too_big && !rc->too_busy && rc->len + n > max) rc->too_big = 1;
    if (!rc->too_big && !rc->too_busy && rc->len + n + 1 > rc->cap) {
        size_t cap = rc->cap ? rc->cap : 4096;
        while (cap < rc->len + n + 1) cap *= 2;
        if (cap > max + 1) cap = max + 1;
        char *p = reserve_body(rc, cap - rc->cap) ? realloc(rc->body, cap) : NULL;
        if (!p) rc->too_busy = 1;
        else rc->body = p, rc->cap = cap;
    }
    if (rc->too_big || rc->too_busy) {
        free(rc->body), rc->body = NULL, rc->len = rc->cap = 0;
        release_body(rc);
        return 0;
    }
    memcpy(rc->body + rc->len, upload, n);
    rc->len += n;
    return 0;
}

static enum MHD_Result busy_reading(request_ctx *rc, struct MHD_Connection *c) {
    return fail(rc, c, 503, "server_error", "server_busy",
                "the server is reading too many request bodies at once (over --max-body-total, %zu bytes); retry later", rc->sv->a.max_body_total);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls) {
    server *sv = cls;
    request_ctx *rc = *con_cls;
    if (!rc) { /* the headers: route, authenticate, bound the body before reading it */
        if (!(rc = calloc(1, sizeof *rc))) return MHD_NO;
        *con_cls = rc;
        rc->sv = sv, rc->t0 = now_s(), rc->method = method, rc->url = url, rc->version = version;
        rc->ep = find_route(url);
        rc->route = rc->ep < N_ROUTES ? &routes[rc->ep] : NULL;
        rc->origin = cors_allowed(&sv->a, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"));
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        rc->fd = ci ? ci->connect_fd : -1;
        int post = rc->route && !strcmp(rc->route->method, "POST");
        set_deadline(sv, c, post ? sv->a.body_timeout_s : 0);
        if (!rc->route) return fail(rc, c, 404, "invalid_request_error", "not_found", "no such endpoint: %.200s %.200s", method, url);
        if (!strcmp(method, "OPTIONS")) return answer_preflight(rc, c);
        if (!rc->route->open && (rc->api_key = api_key_of(sv, c)) < 0)
            return fail(rc, c, 401, "invalid_request_error", "invalid_api_key", "Incorrect or missing API key: send 'Authorization: Bearer KEY'");
        if (strcmp(method, rc->route->method) != 0)
            return fail(rc, c, 405, "invalid_request_error", "method_not_allowed", "%.200s takes %s, not %.20s", url, rc->route->method, method);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        unsigned long long n = cl ? strtoull(cl, NULL, 10) : 0;
        if (post && n > sv->a.max_body)
            return fail(rc, c, 413, "invalid_request_error", "request_too_large", "the request body of %.30s bytes is over the limit of %zu (--max-body)",
                        cl, sv->a.max_body);
        /* the whole body's room at once; without it the body is read and dropped, and the answer
         * is a 503 (answered now, the client could see a reset in place of it while still sending) */
        if (post && n > 0) {
            if (reserve_body(rc, (size_t)n + 1) && (rc->body = malloc((size_t)n + 1))) rc->cap = (size_t)n + 1;
            else release_body(rc), rc->too_busy = 1;
        }
        if (post) return MHD_YES; /* the body follows */
    }
    if (*upload_size) { /* a piece of the body */
        if (take_body(rc, upload, *upload_size)) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    set_deadline(sv, c, 0); /* the request is in: its reply takes what it takes */
    if (rc->too_big)
        return fail(rc, c, 413, "invalid_request_error", "request_too_large", "the request body is over the limit of %zu bytes (--max-body)", sv->a.max_body);
    if (!strcmp(rc->route->method, "POST")) {
        if (rc->too_busy) return busy_reading(rc, c);
        /* cJSON's nodes for the parse, counted with the body (released in on_completed) */
        if (!reserve_body(rc, parse_cost(sv, rc->body ? rc->body : "", rc->len) - rc->len)) return busy_reading(rc, c);
    }
    return rc->route->handler(rc, c);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)why;
    server *sv = cls;
    request_ctx *rc = *con_cls;
    if (!rc) return;
    set_deadline(sv, c, sv->a.header_timeout_s); /* the next request on the connection */
    int big = rc->reserved >= (1u << 20);
    release_body(rc);
    free(rc->body);
    free(rc);
    *con_cls = NULL;
    /* a big body's pages (and its parse's, in this thread's arena) go back to the system */
    if (big) malloc_trim(0);
}

/* ---------------------------------------------------------------- start-up */

/* The test hook's replies: a JSON array of strings, each the model's text of one reply. */
static int load_script(const char *path, const g4_tokenizer *tok, serve_engine_config *ec) {
    char *text;
    size_t len;
    if (g4_read_file(path, &text, &len)) return -1;
    cJSON *arr = cJSON_ParseWithLength(text, len);
    free(text);
    int n = cJSON_GetArraySize(arr), rc = 0;
    if (!cJSON_IsArray(arr) || n == 0) rc = g4_fail("%s: expected a JSON array of reply texts", path);
    ec->script = calloc((size_t)(n ? n : 1), sizeof *ec->script);
    ec->script_len = calloc((size_t)(n ? n : 1), sizeof *ec->script_len);
    int i = 0;
    for (const cJSON *s = arr ? arr->child : NULL; !rc && s; s = s->next, i++) {
        size_t k;
        if (!cJSON_IsString(s) || !s->valuestring[0]) rc = g4_fail("%s: reply %d is not a non-empty string", path, i);
        else rc = g4_tokenizer_encode(tok, s->valuestring, strlen(s->valuestring), 1, &ec->script[i], &k);
        if (!rc) ec->script_len[i] = (int)k;
    }
    ec->n_script = n;
    cJSON_Delete(arr);
    return rc;
}

/* The name /v1/models lists: --alias, else the model folder's name. */
static const char *model_name(const serve_args *a) {
    static char name[256];
    if (a->alias) return a->alias;
    snprintf(name, sizeof name, "%s", a->dir);
    size_t n = strlen(name);
    while (n > 1 && name[n - 1] == '/') name[--n] = 0;
    const char *slash = strrchr(name, '/');
    return slash ? slash + 1 : name;
}

static int parse_size(const char *cmd, const char *flag, const char *v, size_t lo, size_t hi, size_t *out) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end == 'k' || *end == 'K') x <<= 10, end++;
    else if (*end == 'M') x <<= 20, end++;
    if (errno || end == v || *end || x < lo || x > hi || v[0] == '-') {
        fprintf(stderr, "g4 %s: error: %s %s: expected a size in [%zu, %zu] bytes (k and M suffixes taken)\n", cmd, flag, v, lo, hi);
        return -1;
    }
    *out = (size_t)x;
    return 0;
}

/* One API key (copied). An empty one would let in "Authorization: Bearer " with nothing after it;
 * a key is sent in a header, so it must be printable ASCII without spaces. */
static int add_key(serve_args *s, const char *key, const char *where, int line) {
    char at[64] = "";
    if (line) snprintf(at, sizeof at, " line %d", line);
    if (!key[0]) {
        fprintf(stderr, "g4 serve: error: %s%s: an empty API key would let in any 'Authorization: Bearer ' header\n", where, at);
        return -1;
    }
    for (const char *p = key; *p; p++)
        if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e) {
            fprintf(stderr, "g4 serve: error: %s%s: an API key must be printable ASCII without spaces\n", where, at);
            return -1;
        }
    char **keys = realloc(s->keys, sizeof *keys * (size_t)(s->n_keys + 1));
    if (!keys || !(keys[s->n_keys] = strdup(key))) {
        if (keys) s->keys = keys;
        fprintf(stderr, "g4 serve: error: out of memory\n");
        return -1;
    }
    s->keys = keys;
    s->n_keys++;
    return 0;
}

/* --api-key-file: a key a line; blank lines and lines starting with '#' are skipped. */
static int read_key_file(serve_args *s, const char *path) {
    char *text;
    size_t len;
    if (g4_read_file(path, &text, &len)) {
        fprintf(stderr, "g4 serve: error: --api-key-file %s: %s\n", path, g4_last_error());
        return -1;
    }
    int rc = 0, line = 0, before = s->n_keys;
    for (char *p = text, *eol; !rc && p < text + len; p = eol + 1) {
        line++;
        eol = memchr(p, '\n', (size_t)(text + len - p));
        if (!eol) eol = text + len;
        char *end = eol;
        while (end > p && (end[-1] == '\r' || end[-1] == ' ' || end[-1] == '\t')) end--;
        *end = 0;
        if (p[0] && p[0] != '#') rc = add_key(s, p, path, line);
    }
    free(text);
    if (!rc && s->n_keys == before) {
        fprintf(stderr, "g4 serve: error: --api-key-file %s: no key in it\n", path);
        rc = -1;
    }
    return rc;
}
const command_usage usage_serve = {
    "serve [-m DIR] [--host 127.0.0.1] [--port 8080] [--parallel 4] [flags]",
    "OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models, /tokenize,\n"
    "/detokenize, /props, /health, /metrics, a chat page at /;\n"
    "N conversations decoded together. Loopback only unless --host says otherwise.",
    (const usage_line[]){
        {"-m, --model DIR", "the checkpoint folder (default: the built-in model); its name is the model id"},
        {"--alias NAME", "the model id to report instead"},
        {"--host ADDR", "an IPv4 or IPv6 address to listen on, repeatable (default 127.0.0.1; 0.0.0.0 / ::: every interface)"},
        {"--port N", "the port (default 8080; 0: any free port, printed on stderr)"},
        {"--parallel N", "conversations decoded together, each with --ctx tokens of KV cache (default 4)"},
        {"--queue N", "requests that may wait for a slot; more get 503 (default 4 x --parallel)"},
        {"--api-key KEY", "every endpoint but /health wants Authorization: Bearer KEY (repeatable; a prompt cache per key)"},
        {"--api-key-file FILE", "API keys, one a line ('#' comments)"},
        {"--strict-model", "refuse a model other than the server's (404); without it any name is taken"},
        {"--max-body BYTES", "request bodies past it get 413 (k, M suffixes; default 4M)"},
        {"--max-body-total BYTES", "bodies held and parsed at once over every connection; past it 503 (default 64M)"},
        {"--max-json-values N", "JSON values a body may hold; more get 413 (default 65536 + 2 x --ctx)"},
        {"--header-timeout S", "a request's headers must arrive within S seconds (default 10)"},
        {"--body-timeout S", "its body within S seconds of the headers (default 60)"},
        {"--max-conn-per-ip N", "connections from one client address (default 64; 0: no cap)"},
        {"--cors-origin ORIGIN", "browsers from ORIGIN (or *) may read the replies; repeatable (default: none)"},
        {"--pooling mean|last", "/v1/embeddings: the mean of the hidden states or the last one (default mean)"},
        {"--max-messages N", "messages a request may have (default 1024)"},
        {"--max-tools N", "tools a request may have (default 128)"},
        {"--max-media N", "image and audio parts a request may have (default 16; their bytes count in --max-body)"},
        {"--image-tokens N", "an image part's soft-token budget: 70, 140, 280, 560 or 1120 (default: the model's; detail \"low\": 70)"},
        {"--timeout S", "an idle or stalled connection is closed after S seconds (default 60)"},
        {"--drain-timeout S", "after SIGTERM, requests still running after S seconds end (default 30)"},
        {"--prompt-cache on|off", "reuse idle slots' KV prefixes (default on)"},
        {"--prompt-chunk N", "prompt tokens fed per step (default 64)"},
        {"--max-unread BYTES", "a streaming reply's unread bytes past which its client has stopped reading (default 1M)"},
        {"-n, --max-tokens N", "the budget of a reply that sets no max_tokens (default: chat 4096, completions 16; cut to the context)"},
        {"--verbose", "one line per request on stderr"},
        {"--test-replies FILE", "tests: replies' text from a JSON array of strings instead of the model's"},
        {"--test-step-ms N", "tests: a pause after each step"},
        {"--test-ignore-eos", "tests, benchmarks: no stop ids"},
        {NULL, NULL},
    },
    USAGE_ENGINE | USAGE_DRAFT | USAGE_SAMPLING, /* the sampling flags: defaults of requests that do not set them (--seed, --logit-bias refused) */
};

/* An origin as browsers send it: "*", or scheme://host[:port] with nothing after. */
static int cors_origin_ok(const char *v) {
    if (!strcmp(v, "*")) return 1;
    const char *host = strstr(v, "://");
    if (!host || host == v || !host[3]) return 0;
    for (const char *p = host + 3; *p; p++)
        if (*p == '/' || *p == ' ' || *p == ',' || (unsigned char)*p < 0x21) return 0;
    return 1;
}

static int parse_serve_args(args_t *a, serve_args *s) {
    memset(s, 0, sizeof *s);
    g4_options_default(&s->o);
    s->header_timeout_s = 10;
    s->body_timeout_s = 60;
    s->max_conn_per_ip = 64;
    s->max_body_total = 64u << 20;
    s->port = 8080;
    s->parallel = 4;
    s->queue = -1;
    s->timeout_s = 60;
    s->drain_s = 30;
    s->prompt_cache = 1;
    s->max_body = 4u << 20;
    s->max_unread = 1u << 20;
    s->lim = (serve_limits){.max_messages = 1024, .max_tools = 128, .max_stop = 4, .max_stop_len = 256, .max_media = 16};
    int bad = 0, cache = 1, n, values_given = 0;
    static const char *const onoff[] = {"off", "on", NULL};
    static const char *const pooling_names[] = {"mean", "last", NULL}; /* serve_pooling's order */
    for (a->i = 2; a->i < a->argc && !bad; a->i++) {
        const char *v;
        if (flag_is(a, "-m") || flag_is(a, "--model")) s->dir = flag_value(a, "-m", &bad);
        else if (flag_is(a, "--host")) {
            if (s->n_hosts == MAX_HOSTS) return die("g4 serve: --host: at most %s addresses", "8");
            bad = !(s->hosts[s->n_hosts++] = flag_value(a, "--host", &bad));
        } else if (flag_is(a, "--api-key")) bad = !(v = flag_value(a, "--api-key", &bad)) || add_key(s, v, "--api-key", 0);
        else if (flag_is(a, "--api-key-file")) bad = !(v = flag_value(a, "--api-key-file", &bad)) || read_key_file(s, v);
        else if (flag_is(a, "--strict-model")) s->lim.strict_model = 1;
        else if (flag_is(a, "--header-timeout"))
            bad = !(v = flag_value(a, "--header-timeout", &bad)) || parse_int(a->cmd, "--header-timeout", v, 1, 3600, &s->header_timeout_s);
        else if (flag_is(a, "--body-timeout"))
            bad = !(v = flag_value(a, "--body-timeout", &bad)) || parse_int(a->cmd, "--body-timeout", v, 1, 86400, &s->body_timeout_s);
        else if (flag_is(a, "--max-conn-per-ip"))
            bad = !(v = flag_value(a, "--max-conn-per-ip", &bad)) || parse_int(a->cmd, "--max-conn-per-ip", v, 0, 100000, &s->max_conn_per_ip);
        else if (flag_is(a, "--max-body-total"))
            bad = !(v = flag_value(a, "--max-body-total", &bad)) || parse_size(a->cmd, "--max-body-total", v, 1024, (size_t)1 << 40, &s->max_body_total);
        else if (flag_is(a, "--max-json-values")) {
            bad = !(v = flag_value(a, "--max-json-values", &bad)) || parse_int(a->cmd, "--max-json-values", v, 1024, 1 << 26, &s->lim.max_json_values);
            values_given = 1;
        }
        else if (flag_is(a, "--alias")) s->alias = flag_value(a, "--alias", &bad);
        else if (flag_is(a, "--cors-origin")) {
            if (s->n_cors == (int)(sizeof s->cors / sizeof *s->cors)) return die("g4 serve: --cors-origin: at most 16 origins%s", "");
            if ((v = flag_value(a, "--cors-origin", &bad)) && !cors_origin_ok(v))
                return die("g4 serve: --cors-origin %s: expected * or an origin such as http://localhost:3000 (scheme://host[:port], no path)", v);
            if (v) s->cors[s->n_cors++] = v;
        } else if (flag_is(a, "--pooling")) bad = !(v = flag_value(a, "--pooling", &bad)) || parse_choice(a->cmd, "--pooling", v, pooling_names, &s->pooling);
        else if (flag_is(a, "--test-replies")) s->test_replies = flag_value(a, "--test-replies", &bad);
        else if (flag_is(a, "--verbose")) s->verbose = 1;
        else if (flag_is(a, "--test-ignore-eos")) s->ignore_eos = 1;
        else if (flag_is(a, "--test-step-ms")) bad = !(v = flag_value(a, "--test-step-ms", &bad)) || parse_int(a->cmd, "--test-step-ms", v, 0, 10000, &s->step_ms);
        else if (flag_is(a, "--port")) bad = (v = flag_value(a, "--port", &bad)) == NULL || parse_int(a->cmd, "--port", v, 0, 65535, &s->port);
        else if (flag_is(a, "--parallel")) bad = !(v = flag_value(a, "--parallel", &bad)) || parse_int(a->cmd, "--parallel", v, 1, 64, &s->parallel);
        else if (flag_is(a, "--queue")) bad = !(v = flag_value(a, "--queue", &bad)) || parse_int(a->cmd, "--queue", v, 0, 4096, &s->queue);
        else if (flag_is(a, "--timeout")) bad = !(v = flag_value(a, "--timeout", &bad)) || parse_int(a->cmd, "--timeout", v, 1, 86400, &s->timeout_s);
        else if (flag_is(a, "--drain-timeout")) {
            bad = !(v = flag_value(a, "--drain-timeout", &bad)) || parse_int(a->cmd, "--drain-timeout", v, 0, 86400, &n);
            s->drain_s = n;
        } else if (flag_is(a, "--prompt-chunk")) bad = !(v = flag_value(a, "--prompt-chunk", &bad)) || parse_int(a->cmd, "--prompt-chunk", v, 1, 64, &s->prompt_chunk);
        else if (flag_is(a, "--prompt-cache")) bad = !(v = flag_value(a, "--prompt-cache", &bad)) || parse_choice(a->cmd, "--prompt-cache", v, onoff, &cache);
        else if (flag_is(a, "--max-body")) bad = !(v = flag_value(a, "--max-body", &bad)) || parse_size(a->cmd, "--max-body", v, 1024, 1u << 30, &s->max_body);
        else if (flag_is(a, "--max-unread")) bad = !(v = flag_value(a, "--max-unread", &bad)) || parse_size(a->cmd, "--max-unread", v, 1024, 1u << 30, &s->max_unread);
        else if (flag_is(a, "--max-messages")) bad = !(v = flag_value(a, "--max-messages", &bad)) || parse_int(a->cmd, "--max-messages", v, 1, 1 << 20, &s->lim.max_messages);
        else if (flag_is(a, "--max-media")) bad = !(v = flag_value(a, "--max-media", &bad)) || parse_int(a->cmd, "--max-media", v, 0, 1024, &s->lim.max_media);
        else if (flag_is(a, "--image-tokens")) {
            static const char *const budgets[] = {"70", "140", "280", "560", "1120", NULL};
            int k;
            bad = !(v = flag_value(a, "--image-tokens", &bad)) || parse_choice(a->cmd, "--image-tokens", v, budgets, &k);
            if (!bad) s->image_tokens = atoi(budgets[k]);
        } else if (flag_is(a, "--max-tools")) bad = !(v = flag_value(a, "--max-tools", &bad)) || parse_int(a->cmd, "--max-tools", v, 0, 1 << 16, &s->lim.max_tools);
        else if (flag_is(a, "-n") || flag_is(a, "--max-tokens"))
            bad = !(v = flag_value(a, "--max-tokens", &bad)) || parse_int(a->cmd, "--max-tokens", v, 1, 1 << 24, &s->lim.max_tokens);
        else if (!engine_flag(a, &s->o, &bad) && !draft_flag(a, &s->draft, &bad) && !sampling_flag(a, &s->sampling, &s->sampling_given, &bad))
            return unknown_flag(a);
    }
    if (bad) return 1;
    if (s->n_hosts == 0) s->hosts[s->n_hosts++] = "127.0.0.1";
    if (s->max_body_total < s->max_body) {
        fprintf(stderr, "g4 serve: error: --max-body-total %zu is below --max-body %zu: no body of the largest size could be read\n", s->max_body_total,
                s->max_body);
        return 1;
    }
    if (s->sampling_given & G4_SAMPLE_SEED) return die("g4 serve: --seed: each request has its own seed (the 'seed' field)%s", "");
    if (s->sampling_given & G4_SAMPLE_BIAS) return die("g4 serve: --logit-bias: each request has its own ('logit_bias')%s", "");
    if (!s->dir) s->dir = default_model_dir();
    if (s->draft.tokens && !s->draft.dir) return die("g4 serve: --draft-tokens needs --draft DIR%s", "");
    if (s->queue < 0) s->queue = 4 * s->parallel;
    s->prompt_cache = cache;
    s->o.n_seq = s->parallel;
    s->lim.ctx = s->o.ctx;
    /* a completions prompt of token ids takes one value a token */
    if (!values_given) s->lim.max_json_values = 65536 + 2 * s->o.ctx;
    s->lim.max_n = s->parallel;
    s->lim.model_id = model_name(s);
    return 0;
}

static int open_model(server *sv) {
    g4_checkpoint ck;
    draft_args *d = &sv->a.draft;
    if (g4_checkpoint_open(&ck, sv->a.dir, &sv->a.o, d->dir) != 0) return -1;
    sv->m = ck.model, sv->tok = ck.tok, d->d = ck.draft; /* the server's close frees them */
    if (g4_model_chat_form(sv->m, &sv->form) || !(sv->s = g4_session_new(sv->m, &sv->a.o))) return -1;
    if (draft_open(d, sv->m, sv->s) != 0) return -1;
    sv->vocab = g4_model_vocab_size(sv->m);
    sv->a.lim.vocab = sv->vocab;
    return 0;
}

/* "127.0.0.1:8080" or "[::1]:8080". */
static void format_address(const struct sockaddr *sa, char *out, size_t cap) {
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &a6->sin6_addr, host, sizeof host);
        port = ntohs(a6->sin6_port);
        snprintf(out, cap, "[%s]:%d", host, port);
    } else {
        const struct sockaddr_in *a4 = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &a4->sin_addr, host, sizeof host);
        port = ntohs(a4->sin_port);
        snprintf(out, cap, "%s:%d", host, port);
    }
}

/* A listening socket on host:port, bound here rather than by libmicrohttpd so that a refusal is
 * one line naming the address. SO_REUSEADDR (a restart need not wait out TIME_WAIT) but never
 * SO_REUSEPORT, which would let a second server, or anyone's process, bind the same port and
 * take half the connections: the port in use must be an error. An IPv6 socket takes IPv6 only
 * (--host :: and --host 0.0.0.0 together serve both). Returns the socket, -1 with the message. */
static int listen_on(const char *host, int port, char *where, size_t where_cap) {
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_PASSIVE, .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    if (getaddrinfo(host, service, &hints, &ai) != 0 || !ai)
        return g4_fail("--host %s: expected an IPv4 or IPv6 address (127.0.0.1 or ::1 for this machine only, 0.0.0.0 or :: for every interface)",
                       host);
    format_address(ai->ai_addr, where, where_cap);
    int one = 1, fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int ok = fd >= 0 && !setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) &&
             (ai->ai_family != AF_INET6 || !setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one)) &&
             !bind(fd, ai->ai_addr, ai->ai_addrlen) && !listen(fd, 128);
    int err = errno;
    freeaddrinfo(ai);
    if (!ok) {
        if (fd >= 0) close(fd);
        return g4_fail("cannot listen on %s: %s%s", where, strerror(err), err == EADDRINUSE ? " (another process is serving on that port)" : "");
    }
    struct sockaddr_storage bound;
    socklen_t n = sizeof bound;
    if (!getsockname(fd, (struct sockaddr *)&bound, &n)) format_address((struct sockaddr *)&bound, where, where_cap);
    return fd;
}

/* The port a listening socket got (--port 0: the kernel's choice). */
static int bound_port(int fd) {
    struct sockaddr_storage a;
    socklen_t n = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &n)) return -1;
    return ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port : ((struct sockaddr_in *)&a)->sin_port);
}

/* One daemon per --host address, on the same port (the first's, when --port is 0); their
 * addresses, joined, in where. Returns how many started, -1 with the message (none left running). */
static int start_http(server *sv, struct MHD_Daemon **d, char *where, size_t where_cap) {
    /* enough connections that a full queue is answered with 503 rather than refused at accept,
     * and that one client address (--max-conn-per-ip) cannot take them all */
    unsigned limit = (unsigned)(2 * (sv->a.parallel + sv->a.queue) + 64 + sv->a.max_conn_per_ip);
    int port = sv->a.port, k;
    size_t used = 0;
    for (k = 0; k < sv->a.n_hosts; k++) {
        char one[INET6_ADDRSTRLEN + 16];
        int fd = listen_on(sv->a.hosts[k], port, one, sizeof one);
        if (fd < 0) break;
        if (port == 0) port = bound_port(fd);
        d[k] = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG, 0, NULL, NULL,
                                on_request, sv, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT, limit,
                                MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)sv->a.max_conn_per_ip, MHD_OPTION_CONNECTION_TIMEOUT,
                                (unsigned)sv->a.timeout_s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, sv, MHD_OPTION_NOTIFY_CONNECTION,
                                on_connection, sv, MHD_OPTION_END);
        if (!d[k]) {
            close(fd);
            g4_fail("cannot serve on %s (libmicrohttpd refused)", one);
            break;
        }
        used += (size_t)snprintf(where + used, used < where_cap ? where_cap - used : 0, "%shttp://%s", k ? " and " : "", one);
        if (used >= where_cap) used = where_cap - 1;
    }
    if (k == sv->a.n_hosts) return k;
    while (k > 0) MHD_stop_daemon(d[--k]);
    return -1;
}

/* SIGTERM or SIGINT: refuse new requests (503, /health too), let the running ones finish (cut
 * short with finish_reason "length" after --drain-timeout), wait until their replies are sent,
 * then stop. A second signal cuts them at once. */
static void drain_and_stop(server *sv, struct MHD_Daemon **d, int n_d, const sigset_t *sigs) {
    fprintf(stderr, "g4 serve: draining (%d requests in flight)\n", serve_engine_live(sv->engine));
    serve_engine_drain(sv->engine, sv->a.drain_s);
    double give_up = now_s() + sv->a.drain_s + 10; /* readers that never take their last bytes */
    struct timespec tick = {0, 50 * 1000 * 1000};
    while (serve_engine_live(sv->engine) > 0 && now_s() < give_up)
        if (sigtimedwait(sigs, NULL, &tick) > 0) {
            fprintf(stderr, "g4 serve: second signal: stopping the requests in flight now\n");
            serve_engine_drain(sv->engine, 0);
            if (give_up > now_s() + 2) give_up = now_s() + 2; /* the replies' last bytes, for readers still reading */
        }
    for (int k = 0; k < n_d; k++) MHD_stop_daemon(d[k]);
}

int cmd_serve(args_t *a) {
    server sv = {0};
    if (parse_serve_args(a, &sv.a)) {
        for (int k = 0; k < sv.a.n_keys; k++) free(sv.a.keys[k]);
        free(sv.a.keys);
        return 1;
    }
    /* the signals are taken by sigwait in this thread only; the HTTP and engine threads inherit
     * the mask (SIGPIPE: a client gone mid-write is an error return, not a death) */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigset_t blocked = sigs;
    sigaddset(&blocked, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &blocked, NULL);
    pthread_mutex_init(&sv.count_mu, NULL);
    pthread_mutex_init(&sv.watch_mu, NULL);
    pthread_mutex_init(&sv.grammars_mu, NULL);
    pthread_cond_init(&sv.watch_stop, NULL);
    sv.started = (long)time(NULL);
    serve_engine_config ec = {.queue = sv.a.queue, .prompt_chunk = sv.a.prompt_chunk, .max_unread = sv.a.max_unread, .prompt_cache = sv.a.prompt_cache,
                             .step_ms = sv.a.step_ms, .ignore_eos = sv.a.ignore_eos, .sampling = sv.a.sampling,
                             .sampling_given = sv.a.sampling_given};
    struct MHD_Daemon *d[MAX_HOSTS] = {0};
    int rc = 1, n_d = 0;
    char where[MAX_HOSTS * (INET6_ADDRSTRLEN + 32)];
    pthread_t watchdog;
    int watching = 0;
    if (open_model(&sv) || (sv.a.test_replies && load_script(sv.a.test_replies, sv.tok, &ec))) goto done;
    ec.draft = sv.a.draft.dr;
    ec.draft_tokens = sv.a.draft.tokens;
    if (!(sv.engine = serve_engine_new(sv.s, sv.tok, &ec))) {
        g4_fail("cannot start the engine (out of memory)");
        goto done;
    }
    if (pthread_create(&watchdog, NULL, watchdog_main, &sv) != 0) {
        g4_fail("cannot start the connection watchdog");
        goto done;
    }
    watching = 1;
    if ((n_d = start_http(&sv, d, where, sizeof where)) < 0) {
        n_d = 0;
        goto done;
    }
    fprintf(stderr, "g4 serve: %s on %s (model %s, %d slots, queue %d, context %d, %d threads)\n", sv.a.dir, where, sv.a.lim.model_id, sv.a.parallel, sv.a.queue, sv.a.lim.ctx, g4_threads());
    if (sv.a.test_replies) fprintf(stderr, "g4 serve: test hook: the replies' text comes from %s\n", sv.a.test_replies);
    int sig;
    while (sigwait(&sigs, &sig) != 0) {
    }
    drain_and_stop(&sv, d, n_d, &sigs);
    n_d = 0;
    fprintf(stderr, "g4 serve: stopped\n");
    rc = 0;
done:
    if (rc) die_lib();
    for (int k = 0; k < n_d; k++) MHD_stop_daemon(d[k]);
    if (watching) {
        pthread_mutex_lock(&sv.watch_mu);
        sv.stopping = 1;
        pthread_cond_signal(&sv.watch_stop);
        pthread_mutex_unlock(&sv.watch_mu);
        pthread_join(watchdog, NULL);
    }
    for (int k = 0; k < sv.a.n_keys; k++) free(sv.a.keys[k]);
    free(sv.a.keys);
    serve_engine_free(sv.engine, 0);
    g4_grammar_cache_free(sv.grammars);
    for (int i = 0; i < ec.n_script; i++) free(ec.script[i]);
    free(ec.script), free(ec.script_len);
    draft_close(&sv.a.draft);
    g4_session_free(sv.s);
    g4_tokenizer_free(sv.tok);
    g4_model_free(sv.m);
    return rc;
}
