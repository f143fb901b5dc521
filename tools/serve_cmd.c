/* `g4 serve`: an OpenAI-compatible HTTP server over the library. HTTP is libmicrohttpd's (one
 * thread per connection: a request waits for its reply, or streams it, in its own thread);
 * requests are read by tools/serve/request.c, run by the engine (tools/serve/engine.c: the
 * generation stepper, continuous batching, the prompt cache) and written by tools/serve/reply.c.
 * This file routes, authenticates, bounds the body, counts what it answered (/metrics) and drains
 * on SIGTERM. */
#define _GNU_SOURCE /* POLLRDHUP */
#include <cjson/cJSON.h>
#include <errno.h>
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
#include "serve/engine.h"
#include "serve/request.h"
#include "util/err.h"
#include "util/file.h"

/* ---------------------------------------------------------------- settings */

typedef struct {
    const char *dir, *host, *api_key, *alias, *test_replies;
    int port, parallel, queue, timeout_s, prompt_chunk, prompt_cache, verbose, step_ms, ignore_eos;
    g4_sampling sampling; /* --temp, --top-k, ...: the defaults of requests that do not set them */
    int sampling_given;
    double drain_s;
    size_t max_body, max_unread;
    serve_limits lim;
    g4_options o;
    draft_args draft;
} serve_args;

/* ---------------------------------------------------------------- what was answered (/metrics) */

enum { EP_CHAT, EP_COMPLETIONS, EP_MODELS, EP_HEALTH, EP_METRICS, EP_OTHER, EP_COUNT };
static const char *const endpoint_names[EP_COUNT] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "other"};
static const int statuses[] = {200, 400, 401, 404, 405, 413, 500, 503};
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
} server;

static void count_answer(server *sv, int ep, int status) {
    pthread_mutex_lock(&sv->count_mu);
    for (int k = 0; k < N_STATUSES; k++)
        if (statuses[k] == status) sv->answered[ep][k]++;
    pthread_mutex_unlock(&sv->count_mu);
}

/* ---------------------------------------------------------------- one connection's request */

typedef struct {
    server *sv;
    int ep, fd;
    char *body;
    size_t len, cap;
    int too_big;
    double t0;
    const char *method, *url;
} request_ctx;

/* The client closed its end (or the connection broke): nobody will read the reply. */
static int peer_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static enum MHD_Result send_text(request_ctx *rc, struct MHD_Connection *c, int status, const char *type, const char *body) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (status == 405) MHD_add_response_header(r, "Allow", rc->ep == EP_CHAT || rc->ep == EP_COMPLETIONS ? "POST" : "GET");
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

static enum MHD_Result get_models(request_ctx *rc, struct MHD_Connection *c, const char *url) {
    const char *id = url + strlen("/v1/models");
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
            if (sv->answered[ep][k]) addf(&t, "g4_requests_total{endpoint=\"%s\",status=\"%d\"} %ld\n", endpoint_names[ep], statuses[k], sv->answered[ep][k]);
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

/* Parses, renders and admits the request; streams its reply, or waits for it and sends it whole. */
static enum MHD_Result post_completion(request_ctx *rc, struct MHD_Connection *c) {
    server *sv = rc->sv;
    serve_request r;
    serve_error e;
    int32_t *ids;
    int n_ids, opens, max_tokens;
    char *prefill;
    if (serve_parse_request(rc->body ? rc->body : "", rc->len, rc->ep == EP_CHAT ? SERVE_CHAT : SERVE_COMPLETION, &sv->a.lim, &r, &e))
        return send_error(rc, c, &e);
    if (serve_prompt(&r, sv->tok, sv->form, sv->vocab, &sv->a.lim, &ids, &n_ids, &opens, &prefill, &max_tokens, &e)) {
        serve_request_free(&r);
        return send_error(rc, c, &e);
    }
    serve_job *j = serve_job_new(&r, ids, n_ids, opens, prefill, max_tokens, sv->a.lim.model_id);
    if (!j) {
        serve_request_free(&r);
        free(ids), free(prefill);
        return fail(rc, c, 500, "server_error", NULL, "out of memory");
    }
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
        enum MHD_Result ok = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        count_answer(sv, rc->ep, 200);
        return ok;
    }
    while (!serve_job_wait(sv->engine, j, 100))
        if (peer_gone(rc->fd)) {
            serve_job_release(sv->engine, j); /* stops it: nobody waits for the answer */
            return MHD_NO;
        }
    size_t len;
    const char *out = serve_job_output(j, &len);
    enum MHD_Result ok = send_json(rc, c, serve_job_status(j), out);
    serve_job_release(sv->engine, j);
    return ok;
}

/* ---------------------------------------------------------------- routing */

static int route(const char *url) {
    if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/chat/completions")) return EP_CHAT;
    if (!strcmp(url, "/v1/completions") || !strcmp(url, "/completions")) return EP_COMPLETIONS;
    if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11) || !strcmp(url, "/models")) return EP_MODELS;
    if (!strcmp(url, "/health")) return EP_HEALTH;
    if (!strcmp(url, "/metrics")) return EP_METRICS;
    return EP_OTHER;
}

/* Constant-time comparison, so the key cannot be guessed a byte at a time from timings. */
static int same_secret(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = na != nb;
    for (size_t i = 0; i < na; i++) d |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return d == 0;
}

static int authorized(const server *sv, struct MHD_Connection *c) {
    if (!sv->a.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    return h && !strncmp(h, "Bearer ", 7) && same_secret(h + 7, sv->a.api_key);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    server *sv = cls;
    request_ctx *rc = *con_cls;
    if (!rc) { /* the headers: route, authenticate, bound the body before reading it */
        if (!(rc = calloc(1, sizeof *rc))) return MHD_NO;
        *con_cls = rc;
        rc->sv = sv, rc->t0 = now_s(), rc->method = method, rc->url = url;
        rc->ep = route(url);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        rc->fd = ci ? ci->connect_fd : -1;
        if (rc->ep != EP_HEALTH && !authorized(sv, c))
            return fail(rc, c, 401, "invalid_request_error", "invalid_api_key", "Incorrect or missing API key: send 'Authorization: Bearer KEY'");
        int post = rc->ep == EP_CHAT || rc->ep == EP_COMPLETIONS;
        if (rc->ep == EP_OTHER) return fail(rc, c, 404, "invalid_request_error", "not_found", "no such endpoint: %.200s %.200s", method, url);
        if (strcmp(method, post ? "POST" : "GET") != 0)
            return fail(rc, c, 405, "invalid_request_error", "method_not_allowed", "%.200s takes %s, not %.20s", url, post ? "POST" : "GET", method);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (post && cl && strtoull(cl, NULL, 10) > sv->a.max_body)
            return fail(rc, c, 413, "invalid_request_error", "request_too_large", "the request body of %.30s bytes is over the limit of %zu (--max-body)",
                        cl, sv->a.max_body);
        if (post) return MHD_YES; /* the body follows */
    }
    if (*upload_size) { /* a piece of the body */
        if (!rc->too_big && rc->len + *upload_size > sv->a.max_body) rc->too_big = 1, free(rc->body), rc->body = NULL, rc->len = 0;
        if (!rc->too_big) {
            if (rc->len + *upload_size + 1 > rc->cap) {
                size_t cap = rc->cap ? rc->cap : 4096;
                while (cap < rc->len + *upload_size + 1) cap *= 2;
                char *p = realloc(rc->body, cap);
                if (!p) return MHD_NO;
                rc->body = p, rc->cap = cap;
            }
            memcpy(rc->body + rc->len, upload, *upload_size);
            rc->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    switch (rc->ep) {
    case EP_MODELS: return get_models(rc, c, url);
    case EP_HEALTH: return get_health(rc, c);
    case EP_METRICS: return get_metrics(rc, c);
    default: break;
    }
    if (rc->too_big)
        return fail(rc, c, 413, "invalid_request_error", "request_too_large", "the request body is over the limit of %zu bytes (--max-body)", sv->a.max_body);
    return post_completion(rc, c);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)cls, (void)c, (void)why;
    request_ctx *rc = *con_cls;
    if (!rc) return;
    free(rc->body);
    free(rc);
    *con_cls = NULL;
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

static int parse_serve_args(args_t *a, serve_args *s) {
    memset(s, 0, sizeof *s);
    g4_options_default(&s->o);
    s->host = "127.0.0.1";
    s->port = 8080;
    s->parallel = 4;
    s->queue = -1;
    s->timeout_s = 60;
    s->drain_s = 30;
    s->prompt_cache = 1;
    s->max_body = 4u << 20;
    s->max_unread = 1u << 20;
    s->lim = (serve_limits){.max_messages = 1024, .max_tools = 128, .max_stop = 4, .max_stop_len = 256};
    int bad = 0, cache = 1, n;
    static const char *const onoff[] = {"off", "on", NULL};
    for (a->i = 2; a->i < a->argc && !bad; a->i++) {
        const char *v;
        if (flag_is(a, "-m") || flag_is(a, "--model")) s->dir = flag_value(a, "-m", &bad);
        else if (flag_is(a, "--host")) s->host = flag_value(a, "--host", &bad);
        else if (flag_is(a, "--api-key")) s->api_key = flag_value(a, "--api-key", &bad);
        else if (flag_is(a, "--alias")) s->alias = flag_value(a, "--alias", &bad);
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
        else if (flag_is(a, "--max-tools")) bad = !(v = flag_value(a, "--max-tools", &bad)) || parse_int(a->cmd, "--max-tools", v, 0, 1 << 16, &s->lim.max_tools);
        else if (flag_is(a, "-n") || flag_is(a, "--max-tokens"))
            bad = !(v = flag_value(a, "--max-tokens", &bad)) || parse_int(a->cmd, "--max-tokens", v, 1, 1 << 24, &s->lim.max_tokens);
        else if (!engine_flag(a, &s->o, &bad) && !draft_flag(a, &s->draft, &bad) && !sampling_flag(a, &s->sampling, &s->sampling_given, &bad))
            return unknown_flag(a);
    }
    if (bad) return 1;
    if (s->sampling_given & G4_SAMPLE_SEED) return die("g4 serve: --seed: each request has its own seed (the 'seed' field)%s", "");
    if (s->sampling_given & G4_SAMPLE_BIAS) return die("g4 serve: --logit-bias: each request has its own ('logit_bias')%s", "");
    if (!s->dir) s->dir = default_model_dir();
    if (s->draft.tokens && !s->draft.dir) return die("g4 serve: --draft-tokens needs --draft DIR%s", "");
    if (s->queue < 0) s->queue = 4 * s->parallel;
    s->prompt_cache = cache;
    s->o.n_seq = s->parallel;
    s->lim.ctx = s->o.ctx;
    s->lim.max_n = s->parallel;
    s->lim.model_id = model_name(s);
    return 0;
}

static int open_model(server *sv) {
    char path[4096];
    sv->m = load_model(sv->a.dir, &sv->a.o);
    if (!sv->m || g4_path_join(path, sizeof path, sv->a.dir, "tokenizer.json") || !(sv->tok = g4_tokenizer_load(path))) return -1;
    if (g4_model_chat_form(sv->m, &sv->form) || !(sv->s = g4_session_new(sv->m, &sv->a.o))) return -1;
    draft_args *d = &sv->a.draft;
    if (draft_open(d, sv->m, sv->s) != 0) return -1;
    sv->vocab = g4_model_vocab_size(sv->m);
    sv->a.lim.vocab = sv->vocab;
    return 0;
}

static struct MHD_Daemon *start_http(server *sv) {
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)sv->a.port)};
    if (inet_pton(AF_INET, sv->a.host, &addr.sin_addr) != 1) {
        g4_fail("--host %s: expected an IPv4 address (127.0.0.1 for this machine only, 0.0.0.0 for every interface)", sv->a.host);
        return NULL;
    }
    /* enough connections that a full queue is answered with 503 rather than refused at accept */
    unsigned limit = (unsigned)(2 * (sv->a.parallel + sv->a.queue) + 64);
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG,
                                            0, NULL, NULL, on_request, sv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                                            MHD_OPTION_CONNECTION_LIMIT, limit, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)sv->a.timeout_s,
                                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u,
                                            MHD_OPTION_END);
    if (!d) g4_fail("cannot listen on %s:%d (%s)", sv->a.host, sv->a.port, errno ? strerror(errno) : "libmicrohttpd refused");
    return d;
}

/* SIGTERM or SIGINT: refuse new requests (503, /health too), let the running ones finish (cut
 * short with finish_reason "length" after --drain-timeout), wait until their replies are sent,
 * then stop. A second signal cuts them at once. */
static void drain_and_stop(server *sv, struct MHD_Daemon *d, const sigset_t *sigs) {
    fprintf(stderr, "g4 serve: draining (%d requests in flight)\n", serve_engine_live(sv->engine));
    serve_engine_drain(sv->engine, sv->a.drain_s);
    double give_up = now_s() + sv->a.drain_s + 10; /* readers that never take their last bytes */
    struct timespec tick = {0, 50 * 1000 * 1000};
    while (serve_engine_live(sv->engine) > 0 && now_s() < give_up)
        if (sigtimedwait(sigs, NULL, &tick) > 0) {
            fprintf(stderr, "g4 serve: second signal: stopping the requests in flight now\n");
            serve_engine_drain(sv->engine, 0);
        }
    MHD_stop_daemon(d);
}

int cmd_serve(args_t *a) {
    server sv = {0};
    if (parse_serve_args(a, &sv.a)) return 1;
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
    sv.started = (long)time(NULL);
    serve_engine_config ec = {.queue = sv.a.queue, .prompt_chunk = sv.a.prompt_chunk, .max_unread = sv.a.max_unread, .prompt_cache = sv.a.prompt_cache,
                             .step_ms = sv.a.step_ms, .ignore_eos = sv.a.ignore_eos, .sampling = sv.a.sampling,
                             .sampling_given = sv.a.sampling_given};
    struct MHD_Daemon *d = NULL;
    int rc = 1;
    if (open_model(&sv) || (sv.a.test_replies && load_script(sv.a.test_replies, sv.tok, &ec))) goto done;
    ec.draft = sv.a.draft.dr;
    ec.draft_tokens = sv.a.draft.tokens;
    if (!(sv.engine = serve_engine_new(sv.s, sv.tok, &ec))) {
        g4_fail("cannot start the engine (out of memory)");
        goto done;
    }
    if (!(d = start_http(&sv))) goto done;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "g4 serve: %s on http://%s:%d (model %s, %d slots, queue %d, context %d, %d threads)\n", sv.a.dir, sv.a.host,
            info ? info->port : sv.a.port, sv.a.lim.model_id, sv.a.parallel, sv.a.queue, sv.a.lim.ctx, g4_threads());
    if (sv.a.test_replies) fprintf(stderr, "g4 serve: test hook: the replies' text comes from %s\n", sv.a.test_replies);
    int sig;
    while (sigwait(&sigs, &sig) != 0) {
    }
    drain_and_stop(&sv, d, &sigs);
    d = NULL;
    fprintf(stderr, "g4 serve: stopped\n");
    rc = 0;
done:
    if (rc) die_lib();
    if (d) MHD_stop_daemon(d);
    serve_engine_free(sv.engine, 0);
    for (int i = 0; i < ec.n_script; i++) free(ec.script[i]);
    free(ec.script), free(ec.script_len);
    draft_close(&sv.a.draft);
    g4_session_free(sv.s);
    g4_tokenizer_free(sv.tok);
    g4_model_free(sv.m);
    return rc;
}
