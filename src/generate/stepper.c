/* The generation stepper (g4.h): generations in many sequences of a session, each with its own
 * settings and state, advanced together one token a step in one g4_decode call; new prompts fed
 * between, in chunks (continuous batching). The one place where a token is chosen (pick) and a
 * generation's stop checks are made (accept): g4_generate, g4 eval and g4 bench all run here. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "g4.h"
#include "generate/sampler.h"
#include "util/err.h"

/* Candidates a top-k row may take; more and the pick takes every logit. */
#define MAX_CANDIDATES 4096
/* Prompt tokens a step feeds by default: one chunk of the forward pass, one pass over the weights. */
#define PROMPT_CHUNK 64

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One sequence's generation. */
typedef struct {
    g4_seq_state state;
    g4_sampling sampling;
    g4_sampler *sampler;  /* its own parameters and generator, borrowing the stepper's buffers */
    g4_output output;     /* what its rows ask of the lm_head */
    int top_k;            /* G4_OUTPUT_TOP: the largest logits the pick needs, before the penalty's tokens */
    int max_tokens;
    int *stops, n_stops;
    int32_t *history;     /* the prompt, then the generated tokens (the repetition window's source) */
    int n_prompt, n_fed, n_hist, cap;
    int32_t *penalized;   /* [cap] the window's tokens, the candidates' extras */
    int32_t *cand;        /* [MAX_CANDIDATES] G4_OUTPUT_TOP */
    float *vals;
    g4_candidates top;
    g4_stop_reason stop;
    int32_t stop_id;
    long added;           /* when g4_stepper_add started it: prompts are fed first come, first served */
    double t_start, t_first, t_end;
} generation;

struct g4_stepper {
    g4_session *s;
    int n_seq, vocab, ctx, prompt_chunk;
    generation *seq;      /* [n_seq] */
    g4_sampler *buffers;  /* owns the working buffers every sequence's sampler borrows */
    float *logits;        /* [n_seq][vocab]: a call's G4_OUTPUT_LOGITS rows, allocated on first need */
    float *fallback;      /* [vocab]: a top row's logits when its candidates cannot decide */
    g4_batch_row *rows;   /* [max(n_seq, prompt_chunk)] */
    long added;
    g4_stepper_stats stats;
};

g4_stepper *g4_stepper_new(g4_session *s, int prompt_chunk) {
    g4_stepper *st = calloc(1, sizeof *st);
    if (!st) {
        g4_fail("out of memory for the stepper");
        return NULL;
    }
    st->s = s;
    st->n_seq = g4_session_n_seq(s);
    st->vocab = g4_model_vocab_size(g4_session_model(s));
    st->ctx = g4_session_ctx(s);
    st->prompt_chunk = prompt_chunk > 0 ? prompt_chunk : PROMPT_CHUNK;
    g4_sampling greedy;
    g4_sampling_default(&greedy);
    st->seq = calloc((size_t)st->n_seq, sizeof *st->seq);
    st->rows = malloc(sizeof *st->rows * (size_t)(st->n_seq > st->prompt_chunk ? st->n_seq : st->prompt_chunk));
    st->buffers = g4_sampler_new(&greedy, st->vocab);
    if (!st->seq || !st->rows || !st->buffers) {
        g4_stepper_free(st);
        g4_fail("out of memory for the stepper");
        return NULL;
    }
    return st;
}

void g4_stepper_free(g4_stepper *st) {
    if (!st) return;
    for (int q = 0; st->seq && q < st->n_seq; q++) {
        generation *g = &st->seq[q];
        g4_sampler_free(g->sampler);
        free(g->stops);
        free(g->history);
        free(g->penalized);
        free(g->cand);
        free(g->vals);
    }
    free(st->seq);
    g4_sampler_free(st->buffers);
    free(st->logits);
    free(st->fallback);
    free(st->rows);
    free(st);
}

/* ---- starting a generation ---- */

/* What a sequence's rows ask of the lm_head: the least that decides its sampler's pick, unless the
 * parameters force a form. */
static int choose_output(const g4_generate_params *p, int vocab, g4_output *out, int *top_k) {
    int needed = g4_sampling_top_needed(&p->sampling, vocab), argmax = g4_sampling_is_argmax(&p->sampling);
    *top_k = 0;
    switch (p->output) {
    case G4_OUTPUT_NONE: *out = argmax ? G4_OUTPUT_ARGMAX : needed > 0 ? G4_OUTPUT_TOP : G4_OUTPUT_LOGITS; break;
    case G4_OUTPUT_ARGMAX:
        if (!argmax) return g4_fail("the greedy token alone cannot serve sampling or a repetition penalty");
        *out = G4_OUTPUT_ARGMAX;
        break;
    case G4_OUTPUT_LOGITS: *out = G4_OUTPUT_LOGITS; break;
    case G4_OUTPUT_TOP: *out = G4_OUTPUT_TOP; break;
    default: return g4_fail("unknown output %d", (int)p->output);
    }
    if (*out == G4_OUTPUT_TOP) *top_k = p->output_k > needed ? p->output_k : needed > 0 ? needed : 1;
    return 0;
}

static int grow_i32(int32_t **p, size_t n) {
    int32_t *q = realloc(*p, sizeof *q * (n ? n : 1));
    if (q) *p = q;
    return q ? 0 : -1;
}

/* The buffers a generation of `cap` history tokens needs, and the stepper's for its output. */
static int alloc_generation(g4_stepper *st, generation *g, int cap) {
    size_t V = (size_t)st->vocab;
    if (grow_i32(&g->history, (size_t)cap) || grow_i32(&g->penalized, (size_t)cap)) return g4_fail("out of memory for generation");
    if (g->output == G4_OUTPUT_TOP) {
        if (!g->cand && !(g->cand = malloc(sizeof *g->cand * MAX_CANDIDATES))) return g4_fail("out of memory for generation");
        if (!g->vals && !(g->vals = malloc(sizeof *g->vals * MAX_CANDIDATES))) return g4_fail("out of memory for generation");
        if (!st->fallback && !(st->fallback = malloc(sizeof *st->fallback * V))) return g4_fail("out of memory for generation");
    }
    if (g->output == G4_OUTPUT_LOGITS && !st->logits && !(st->logits = malloc(sizeof *st->logits * V * (size_t)st->n_seq)))
        return g4_fail("out of memory for %d rows of logits", st->n_seq);
    g->cap = cap;
    return 0;
}

static int copy_stops(generation *g, const int *ids, int n) {
    int *copy = malloc(sizeof *copy * (size_t)(n > 0 ? n : 1));
    if (!copy) return g4_fail("out of memory for generation");
    if (n > 0) memcpy(copy, ids, sizeof *copy * (size_t)n);
    free(g->stops);
    g->stops = copy;
    g->n_stops = n;
    return 0;
}

int g4_stepper_add(g4_stepper *st, int seq, const int32_t *prompt, int n_prompt, const g4_generate_params *p) {
    if (seq < 0 || seq >= st->n_seq) return g4_fail("sequence %d does not exist (the session has %d)", seq, st->n_seq);
    generation *g = &st->seq[seq];
    if (g->state == G4_SEQ_PROMPT || g->state == G4_SEQ_GENERATING) return g4_fail("sequence %d is still generating", seq);
    if (n_prompt < 1) return g4_fail("empty prompt");
    int left = st->ctx - g4_session_seq_pos(st->s, seq);
    if (n_prompt > left) return g4_fail("prompt of %d tokens does not fit the context: %d of %d tokens left (--ctx)", n_prompt, left, st->ctx);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= st->vocab) return g4_fail("token id %d is outside the vocabulary (0..%d)", prompt[i], st->vocab - 1);
    g4_output out = G4_OUTPUT_NONE;
    int top_k;
    if (choose_output(p, st->vocab, &out, &top_k) != 0) return -1;
    g4_sampler *sampler = g4_sampler_new_sharing(&p->sampling, st->buffers);
    if (!sampler) return -1;
    g4_sampler_free(g->sampler);
    g->sampler = sampler;
    g->sampling = p->sampling;
    g->output = out;
    g->top_k = top_k;
    /* every generated token but the last takes a place in the context */
    int budget = p->max_tokens > 0 ? p->max_tokens : 0, room = left - n_prompt + 1;
    if (alloc_generation(st, g, n_prompt + (budget < room ? budget : room)) != 0) return -1;
    const int *stops = p->stop_ids;
    int n_stops = p->n_stop_ids;
    if (!stops) n_stops = g4_model_stop_ids(g4_session_model(st->s), &stops);
    if (copy_stops(g, stops, n_stops) != 0) return -1;
    memcpy(g->history, prompt, sizeof *prompt * (size_t)n_prompt);
    g->n_prompt = g->n_hist = n_prompt;
    g->n_fed = 0;
    g->max_tokens = budget;
    g->stop = G4_STOP_BUDGET;
    g->stop_id = 0;
    g->added = st->added++;
    g->t_start = g->t_first = g->t_end = 0;
    g->state = G4_SEQ_PROMPT;
    return 0;
}

/* ---- one step ---- */

/* Row `row` asks what sequence q's next pick needs; a G4_OUTPUT_LOGITS row gets the call's row
 * `slot` of the stepper's logits (consecutive slots for consecutive rows: one lm_head pass). */
static void ask(g4_stepper *st, int q, g4_batch_row *row, int slot) {
    generation *g = &st->seq[q];
    row->output = g->output;
    if (g->output == G4_OUTPUT_LOGITS) row->logits = st->logits + (size_t)slot * st->vocab;
    if (g->output != G4_OUTPUT_TOP) return;
    /* the penalty can demote up to n_pen tokens below the others: the top_k after it lie among the
     * top_k + n_pen before it, and the penalized tokens' own logits are needed exactly */
    int n_pen = g4_sampling_penalized(&g->sampling, g->history, g->n_hist, g->penalized);
    g->top = (g4_candidates){.k = g->top_k + n_pen, .extra = g->penalized, .n_extra = n_pen, .ids = g->cand, .logits = g->vals,
                             .cap = MAX_CANDIDATES};
    row->top = &g->top;
}

/* Sequence q's next token from what row `at` of the last call gave: the greedy token, the
 * sampler's pick from the candidates when they decide it (the pick it makes from every logit, bit
 * for bit), else its pick from every logit. */
static int pick(g4_stepper *st, int q, const g4_batch_row *row, int at, int32_t *token) {
    generation *g = &st->seq[q];
    if (row->output == G4_OUTPUT_ARGMAX) {
        *token = row->argmax;
        return 0;
    }
    const float *logits = row->logits;
    if (row->output == G4_OUTPUT_TOP) {
        const g4_candidates *c = row->top;
        int32_t t = c->n >= 0 ? g4_sampler_sample_top(g->sampler, c->ids, c->logits, c->n, c->bound, g->history, g->n_hist) : -1;
        if (t >= 0) {
            *token = t;
            return 0;
        }
        if (g4_decode_logits(st->s, at, st->fallback) != 0) return -1;
        logits = st->fallback;
    }
    *token = g4_sampler_sample(g->sampler, logits, g->history, g->n_hist);
    return 0;
}

static void finish(generation *g, g4_stop_reason why, double now) {
    g->state = G4_SEQ_FINISHED;
    g->stop = why;
    g->t_end = now;
}

static int is_stop(const generation *g, int32_t t) {
    for (int i = 0; i < g->n_stops; i++)
        if (g->stops[i] == t) return 1;
    return 0;
}

/* Takes token t for sequence q, then the stop checks in their order: a stop id, the budget, the
 * context (the token would need a place the cache does not have). */
static void accept(g4_stepper *st, int q, int32_t t, double now, g4_step_token *ev) {
    generation *g = &st->seq[q];
    g->history[g->n_hist++] = t;
    st->stats.generated++;
    if (g->state == G4_SEQ_PROMPT) g->t_first = now;
    g->state = G4_SEQ_GENERATING;
    if (is_stop(g, t)) {
        finish(g, G4_STOP_EOS, now);
        g->stop_id = t;
    } else if (g->n_hist - g->n_prompt >= g->max_tokens) {
        finish(g, G4_STOP_BUDGET, now);
    } else if (g4_session_seq_pos(st->s, q) >= st->ctx) {
        finish(g, G4_STOP_CONTEXT, now);
    }
    *ev = (g4_step_token){.seq = q, .token = t, .finished = g->state == G4_SEQ_FINISHED, .stop = g->stop};
}

/* Picks and accepts the token of every row of the last call that asked for one. */
static int take_tokens(g4_stepper *st, int n, g4_step_token *out) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        const g4_batch_row *row = &st->rows[i];
        if (row->output == G4_OUTPUT_NONE) continue;
        int32_t t;
        if (pick(st, row->seq, row, i, &t) != 0) return -1;
        accept(st, row->seq, t, now_s(), &out[k++]);
    }
    return k;
}

/* One token of every generating sequence, in one call. */
static int decode_step(g4_stepper *st, g4_step_token *out) {
    int n = 0;
    for (int q = 0; q < st->n_seq; q++) {
        const generation *g = &st->seq[q];
        if (g->state != G4_SEQ_GENERATING) continue;
        st->rows[n] = (g4_batch_row){.seq = q, .token = g->history[g->n_hist - 1]};
        ask(st, q, &st->rows[n], n);
        n++;
    }
    if (n == 0) return 0;
    double t0 = now_s();
    int k = g4_decode(st->s, st->rows, n) == 0 ? take_tokens(st, n, out) : -1;
    st->stats.decode_s += now_s() - t0;
    return k;
}

/* The sequences whose prompts wait, first added first, into order; returns their count. */
static int waiting(const g4_stepper *st, int *order) {
    int n = 0;
    for (int q = 0; q < st->n_seq; q++) {
        if (st->seq[q].state != G4_SEQ_PROMPT) continue;
        int at = n++;
        for (; at > 0 && st->seq[order[at - 1]].added > st->seq[q].added; at--) order[at] = order[at - 1];
        order[at] = q;
    }
    return n;
}

/* Up to prompt_chunk tokens of the waiting prompts in one call; a prompt's last token asks for
 * the sequence's first pick. A budget of 0 ends at the prompt, with no token. */
static int feed_prompts(g4_stepper *st, g4_step_token *out) {
    int order[64], n_wait = waiting(st, order), n = 0, n_logits = 0, k = 0;
    double t0 = now_s();
    for (int w = 0; w < n_wait && n < st->prompt_chunk; w++) {
        int q = order[w];
        generation *g = &st->seq[q];
        int take = g->n_prompt - g->n_fed < st->prompt_chunk - n ? g->n_prompt - g->n_fed : st->prompt_chunk - n;
        if (g->n_fed == 0) g->t_start = t0;
        for (int j = 0; j < take; j++) st->rows[n++] = (g4_batch_row){.seq = q, .token = g->history[g->n_fed++]};
        if (g->n_fed == g->n_prompt && g->max_tokens > 0) ask(st, q, &st->rows[n - 1], n_logits++);
    }
    if (n == 0) return 0;
    if (g4_decode(st->s, st->rows, n) != 0 || (k = take_tokens(st, n, out)) < 0) k = -1;
    for (int w = 0; k >= 0 && w < n_wait; w++) {
        generation *g = &st->seq[order[w]];
        if (g->state != G4_SEQ_PROMPT || g->n_fed < g->n_prompt) continue;
        finish(g, G4_STOP_BUDGET, now_s());
        out[k++] = (g4_step_token){.seq = order[w], .token = -1, .finished = 1, .stop = G4_STOP_BUDGET};
    }
    st->stats.prompt_tokens += n;
    st->stats.prefill_s += now_s() - t0;
    return k;
}

int g4_stepper_step(g4_stepper *st, g4_step_token *out) {
    int n = decode_step(st, out);
    int m = n < 0 ? -1 : feed_prompts(st, out + n);
    st->stats.steps++;
    return m < 0 ? -1 : n + m;
}

/* ---- the caller's view ---- */

int g4_stepper_cancel(g4_stepper *st, int seq) {
    if (seq < 0 || seq >= st->n_seq) return g4_fail("sequence %d does not exist (the session has %d)", seq, st->n_seq);
    generation *g = &st->seq[seq];
    if (g->state != G4_SEQ_PROMPT && g->state != G4_SEQ_GENERATING) return 0;
    finish(g, G4_STOP_USER, now_s());
    return 1;
}

g4_seq_state g4_stepper_state(const g4_stepper *st, int seq) {
    return seq >= 0 && seq < st->n_seq ? st->seq[seq].state : G4_SEQ_IDLE;
}

int g4_stepper_active(const g4_stepper *st) {
    int n = 0;
    for (int q = 0; q < st->n_seq; q++) n += st->seq[q].state == G4_SEQ_PROMPT || st->seq[q].state == G4_SEQ_GENERATING;
    return n;
}

int g4_stepper_result(const g4_stepper *st, int seq, g4_generate_result *r) {
    memset(r, 0, sizeof *r);
    if (seq < 0 || seq >= st->n_seq) return g4_fail("sequence %d does not exist (the session has %d)", seq, st->n_seq);
    const generation *g = &st->seq[seq];
    if (g->state == G4_SEQ_IDLE) return g4_fail("sequence %d has no generation", seq);
    double end = g->state == G4_SEQ_FINISHED ? g->t_end : now_s(), first = g->t_first > 0 ? g->t_first : end;
    *r = (g4_generate_result){.n_prompt = g->n_prompt, .n_generated = g->n_hist - g->n_prompt, .stop = g->stop, .stop_id = g->stop_id,
                              .prefill_s = g->t_start > 0 ? first - g->t_start : 0, .decode_s = end - first};
    return 0;
}

const int32_t *g4_stepper_tokens(const g4_stepper *st, int seq, int *n) {
    *n = 0;
    if (seq < 0 || seq >= st->n_seq || st->seq[seq].state == G4_SEQ_IDLE) return NULL;
    *n = st->seq[seq].n_hist - st->seq[seq].n_prompt;
    return st->seq[seq].history + st->seq[seq].n_prompt;
}

void g4_stepper_get_stats(const g4_stepper *st, g4_stepper_stats *stats) { *stats = st->stats; }
