#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "g4.h"
#include "generate/sampler.h"
#include "model/model.h"
#include "util/err.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void g4_model_sampling_defaults(const g4_model *m, g4_sampling *p) {
    g4_sampling_default(p);
    if (!m->cfg.has_sampling) return;
    p->temperature = (float)m->cfg.temperature;
    p->top_k = m->cfg.top_k;
    p->top_p = (float)m->cfg.top_p;
}

const char *g4_stop_reason_name(g4_stop_reason r) {
    switch (r) {
    case G4_STOP_EOS: return "eos";
    case G4_STOP_BUDGET: return "budget";
    case G4_STOP_CONTEXT: return "context";
    case G4_STOP_USER: return "user";
    }
    return "?";
}

static int is_stop(const int *ids, int n, int32_t t) {
    for (int i = 0; i < n; i++)
        if (ids[i] == t) return 1;
    return 0;
}

/* Candidates the sampling shortcut may finish; more than this and the step takes the full logits. */
#define MAX_CANDIDATES 4096

/* What one step needs besides the session: the sampler and the buffers of its two paths. */
typedef struct {
    g4_sampler *sampler;
    const g4_sampling *p;
    int greedy, top_k; /* top_k: g4_sampling_top_needed, 0 when the step takes every logit */
    float *logits;     /* [vocab] */
    int32_t *cand, *penalized;
    float *vals;
} stepper;

/* Feeds ids and picks the next token: greedy through the session's argmax; sampling from the
 * few candidates the session finishes when the sampler can decide from them (the same token as
 * from every logit, bit for bit), else from every logit. */
static int eval_and_pick(g4_session *s, const stepper *st, const int32_t *ids, int n, const int32_t *history, int n_hist, int32_t *next) {
    if (st->greedy) return g4_session_eval_argmax(s, ids, n, next);
    if (st->top_k > 0) {
        int n_pen = g4_sampling_penalized(st->p, history, n_hist, st->penalized), m = -1;
        float bound;
        int rc = g4_session_eval_top(s, ids, n, st->top_k + n_pen, st->penalized, n_pen, st->cand, st->vals, MAX_CANDIDATES, &bound, &m);
        if (rc != 0) return rc;
        int32_t pick = m >= 0 ? g4_sampler_sample_top(st->sampler, st->cand, st->vals, m, bound, history, n_hist) : -1;
        if (pick >= 0) {
            *next = pick;
            return 0;
        }
        if (g4_session_last_logits(s, st->logits) != 0) return -1;
    } else if (g4_session_eval(s, ids, n, st->logits, 0) != 0) {
        return -1;
    }
    *next = g4_sampler_sample(st->sampler, st->logits, history, n_hist);
    return 0;
}

int g4_generate(g4_session *s, const int32_t *prompt, int n_prompt, const g4_generate_params *params, g4_token_fn on_token,
                void *user, g4_generate_result *result) {
    const g4_model *m = g4_session_model(s);
    int V = g4_model_vocab_size(m), ctx = g4_session_ctx(s), start = g4_session_pos(s);
    memset(result, 0, sizeof *result);
    result->n_prompt = n_prompt;
    if (n_prompt < 1) return g4_fail("empty prompt");
    if (n_prompt > ctx - start)
        return g4_fail("prompt of %d tokens does not fit the context: %d of %d tokens left (--ctx)", n_prompt, ctx - start, ctx);
    const int *stops = params->stop_ids;
    int n_stops = params->n_stop_ids;
    if (!stops) n_stops = g4_model_stop_ids(m, &stops);
    size_t n_history = (size_t)n_prompt + (size_t)(params->max_tokens > 0 ? params->max_tokens : 0) + 1;
    g4_sampler *sampler = g4_sampler_new(&params->sampling, V);
    float *logits = malloc(sizeof *logits * (size_t)V), *vals = malloc(sizeof *vals * MAX_CANDIDATES);
    int32_t *history = malloc(sizeof *history * n_history), *cand = malloc(sizeof *cand * MAX_CANDIDATES);
    int32_t *penalized = malloc(sizeof *penalized * n_history);
    if (!sampler || !logits || !history || !vals || !cand || !penalized) {
        g4_sampler_free(sampler);
        free(logits);
        free(history);
        free(vals);
        free(cand);
        free(penalized);
        return sampler ? g4_fail("out of memory for generation") : -1;
    }
    memcpy(history, prompt, sizeof *prompt * (size_t)n_prompt);
    int n_hist = n_prompt, rc = 0;
    double t0 = now_s();
    /* plain greedy decoding needs only each step's argmax, which the session finds without most
     * of the logits */
    stepper st = {sampler, &params->sampling, g4_sampling_is_argmax(&params->sampling), g4_sampling_top_needed(&params->sampling, V),
                  logits, cand, penalized, vals};
    int32_t next = 0;
    rc = eval_and_pick(s, &st, prompt, n_prompt, history, n_hist, &next);
    double t1 = now_s();
    result->prefill_s = t1 - t0;
    result->stop = G4_STOP_BUDGET;
    while (rc == 0 && result->n_generated < params->max_tokens) {
        history[n_hist++] = next;
        result->n_generated++;
        int stop_now = is_stop(stops, n_stops, next);
        if (on_token && on_token(user, next)) {
            result->stop = G4_STOP_USER;
            break;
        }
        if (stop_now) {
            result->stop = G4_STOP_EOS;
            result->stop_id = next;
            break;
        }
        if (result->n_generated == params->max_tokens) break;
        if (g4_session_pos(s) >= ctx) {
            result->stop = G4_STOP_CONTEXT;
            break;
        }
        int32_t fed = next;
        rc = eval_and_pick(s, &st, &fed, 1, history, n_hist, &next);
    }
    result->decode_s = now_s() - t1;
    g4_sampler_free(sampler);
    free(logits);
    free(history);
    free(vals);
    free(cand);
    free(penalized);
    return rc;
}
