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
    g4_sampler *sampler = g4_sampler_new(&params->sampling, V);
    float *logits = malloc(sizeof *logits * (size_t)V);
    int32_t *history = malloc(sizeof *history * (size_t)(n_prompt + (params->max_tokens > 0 ? params->max_tokens : 0) + 1));
    if (!sampler || !logits || !history) {
        g4_sampler_free(sampler);
        free(logits);
        free(history);
        return sampler ? g4_fail("out of memory for generation") : -1;
    }
    memcpy(history, prompt, sizeof *prompt * (size_t)n_prompt);
    int n_hist = n_prompt, rc = 0;
    double t0 = now_s();
    /* plain greedy decoding needs only each step's argmax, which the session finds without most
     * of the logits */
    int greedy = g4_sampling_is_argmax(&params->sampling);
    int32_t next = 0;
    rc = greedy ? g4_session_eval_argmax(s, prompt, n_prompt, &next) : g4_session_eval(s, prompt, n_prompt, logits, 0);
    double t1 = now_s();
    result->prefill_s = t1 - t0;
    result->stop = G4_STOP_BUDGET;
    while (rc == 0 && result->n_generated < params->max_tokens) {
        if (!greedy) next = g4_sampler_sample(sampler, logits, history, n_hist);
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
        rc = greedy ? g4_session_eval_argmax(s, &fed, 1, &next) : g4_session_eval(s, &fed, 1, logits, 0);
    }
    result->decode_s = now_s() - t1;
    g4_sampler_free(sampler);
    free(logits);
    free(history);
    return rc;
}
