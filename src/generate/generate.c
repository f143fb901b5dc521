/* g4_generate: one generation in one sequence through a stepper (stepper.c), streaming each token
 * to a callback; the model's sampling defaults and the stop reasons' names. */
#include <string.h>

#include "g4.h"
#include "generate/generate.h"
#include "model/model.h"
#include "util/err.h"

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
    case G4_STOP_ERROR: return "error";
    }
    return "?";
}

int g4_generate_seq(g4_session *s, int seq, const int32_t *prompt, int n_prompt, const g4_generate_params *params,
                    g4_token_fn on_token, void *user, g4_generate_result *result) {
    return g4_generate_seq_embd(s, seq, prompt, n_prompt, NULL, 0, params, on_token, user, result);
}

int g4_generate_seq_embd(g4_session *s, int seq, const int32_t *prompt, int n_prompt, const g4_embd_span *spans, int n_spans,
                         const g4_generate_params *params, g4_token_fn on_token, void *user, g4_generate_result *result) {
    memset(result, 0, sizeof *result);
    result->n_prompt = n_prompt;
    g4_stepper *st = g4_stepper_new(s, 0);
    if (!st) return -1;
    int rc = n_spans ? g4_stepper_add_embd(st, seq, prompt, n_prompt, spans, n_spans, params) : g4_stepper_add(st, seq, prompt, n_prompt, params);
    int stopped = 0, seen = 0;
    while (rc == 0 && !stopped && g4_stepper_active(st) > 0) {
        if (params->cancel && params->cancel(params->cancel_user)) { /* between prompt chunks too */
            g4_stepper_cancel(st, seq);
            stopped = 1;
            break;
        }
        g4_step_token t[G4_MAX_DRAFT_TOKENS + 1]; /* only this sequence runs: one token a step, or a drafting round's */
        int n = g4_stepper_step(st, t);
        if (n < 0) rc = -1;
        /* the callback sees a stop id too, and stopping there makes it the caller's stop; a
         * drafting round's later tokens are dropped, the cache rolled back over them */
        for (int i = 0; i < n && !stopped; i++) {
            seen += t[i].token >= 0;
            if (t[i].token >= 0 && on_token && on_token(user, t[i].token)) {
                if (g4_stepper_cancel_at(st, seq, seen) < 0) rc = -1;
                stopped = 1;
            }
        }
    }
    if (g4_stepper_state(st, seq) != G4_SEQ_IDLE) g4_stepper_result(st, seq, result);
    if (rc == 0 && !stopped && result->stop == G4_STOP_ERROR) rc = g4_fail("%s", g4_stepper_error(st, seq));
    if (stopped) {
        result->stop = G4_STOP_USER;
        result->stop_id = 0;
    }
    g4_stepper_free(st);
    return rc;
}

int g4_generate(g4_session *s, const int32_t *prompt, int n_prompt, const g4_generate_params *params, g4_token_fn on_token,
                void *user, g4_generate_result *result) {
    return g4_generate_seq(s, 0, prompt, n_prompt, params, on_token, user, result);
}
