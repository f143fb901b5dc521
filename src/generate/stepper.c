/* The generation stepper (g4.h): generations in many sequences of a session, each with its own
 * settings and state, advanced together one token a step in one g4_decode call; new prompts fed
 * between, in chunks (continuous batching). The one place where a token is chosen (pick) and a
 * generation's stop checks are made (accept): g4_generate, g4 eval and g4 bench all run here. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
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
    /* g4_stepper_add_embd: prompt position i is fed as embedding row embd_at[i] of embd (hidden
     * floats each), or as its token where that is -1; embd_at NULL: every position a token */
    int32_t *embd_at;
    float *embd;
    int32_t *penalized;   /* [cap] the window's tokens, the candidates' extras */
    int32_t *cand;        /* [MAX_CANDIDATES] G4_OUTPUT_TOP */
    float *vals;
    g4_candidates top;
    g4_stop_reason stop;
    int32_t stop_id;
    long added;           /* when g4_stepper_add started it: prompts are fed first come, first served */
    double t_start, t_first, t_end;
    /* Speculative decoding: the tokens a round drafts at most (0: none), the target's final-normed
     * hidden state of the row that gave the last token (what the next round drafts from), and this
     * round's drafts. */
    int draft_k, has_hidden;
    int sampled;          /* its rounds sample (speculative sampling): q holds each draft's distribution */
    double *q;            /* [draft_k][vocab] */
    float *hidden;
    int32_t draft[G4_MAX_DRAFT_TOKENS];
    int n_draft, row0, pos0; /* drafts this round; the sequence's first row in the call and its position before it */
    char error[160];      /* why it stopped with G4_STOP_ERROR */
    int base;             /* the sequence's position where its prompt goes */
    /* g4_stepper_add_fork: the sequence whose prompt's cache it copies (-1: none, or copied) and
     * that generation's `added` (it must still be the same one) */
    int fork_from;
    long fork_added;
    /* log-probabilities: wanted, the top entries wanted, the last token's */
    int logprobs, top_logprobs, has_lp;
    g4_logprobs lp;
    /* structured output: the grammar's state (the generation's own copy), the tokenizer's trie,
     * the stop ids as the mask takes them, a step's allowed tokens (a bit each) */
    g4_grammar_state *gstate;
    const g4_grammar_vocab *gvocab;
    int32_t *gstops;
    uint32_t *gmask;
    int32_t thought_open, thought_close;
    int in_thought;       /* the reply opened a thought: the constraint waits for its end */
    g4_grammar_state *dstate; /* drafting under the constraint: the grammar after the round's drafts so far */
} generation;

struct g4_stepper {
    g4_session *s;
    int n_seq, vocab, ctx, prompt_chunk;
    generation *seq;      /* [n_seq] */
    g4_sampler *buffers;  /* owns the working buffers every sequence's sampler borrows */
    float *logits;        /* [cap_logits][vocab]: a call's G4_OUTPUT_LOGITS rows, allocated on first need */
    int cap_logits;
    float *fallback;      /* [vocab]: a top row's logits when its candidates cannot decide */
    g4_batch_row *rows;   /* [max(n_seq x (G4_MAX_DRAFT_TOKENS + 1), prompt_chunk)] */
    long added;
    g4_stepper_stats stats;
    g4_drafter *dr;       /* the drafter of the generations that draft (one per stepper) */
    int hidden_size;
    float *draft_hidden;  /* [n_seq][hidden_size]: a round's drafting state */
    float *check;         /* [hidden_size]: a row's hidden state, looked at for NaN and infinities */
    float *draft_logits;  /* [64][vocab]: a sampling or constrained group's drafter logits, allocated on first need */
    double *p;            /* [vocab]: a verified row's distribution (speculative sampling) */
    long rounds, drafted, accepted;
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
    int max_rows = st->n_seq * (G4_MAX_DRAFT_TOKENS + 1);
    st->rows = malloc(sizeof *st->rows * (size_t)(max_rows > st->prompt_chunk ? max_rows : st->prompt_chunk));
    st->hidden_size = g4_model_hidden_size(g4_session_model(s));
    st->buffers = g4_sampler_new(&greedy, st->vocab);
    st->check = malloc(sizeof *st->check * (size_t)st->hidden_size);
    if (!st->seq || !st->rows || !st->buffers || !st->check) {
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
        free(g->embd_at);
        free(g->embd);
        free(g->penalized);
        free(g->cand);
        free(g->vals);
        free(g->hidden);
        free(g->q);
        g4_grammar_state_free(g->gstate);
        g4_grammar_state_free(g->dstate);
        free(g->gstops);
        free(g->gmask);
    }
    free(st->seq);
    free(st->draft_hidden);
    free(st->check);
    free(st->draft_logits);
    free(st->p);
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
    if (p->logprobs) *out = G4_OUTPUT_LOGITS; /* they are read from every logit of the row */
    if (p->constraint) *out = G4_OUTPUT_LOGITS; /* the mask may allow any of them */
    if (*out == G4_OUTPUT_TOP) *top_k = p->output_k > needed ? p->output_k : needed > 0 ? needed : 1;
    return 0;
}

/* Room for `rows` rows of logits. */
static int ensure_logits(g4_stepper *st, int rows) {
    if (rows <= st->cap_logits) return 0;
    float *l = realloc(st->logits, sizeof *l * (size_t)st->vocab * (size_t)rows);
    if (!l) return g4_fail("out of memory for %d rows of logits", rows);
    st->logits = l;
    st->cap_logits = rows;
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
    if (g->output == G4_OUTPUT_LOGITS && ensure_logits(st, st->n_seq) != 0) return -1;
    g->cap = cap;
    return 0;
}

/* Whether sequence q's rounds draft: greedy picks (the argmax, or every logit with temperature 0
 * and no penalty) from a form whose rows do not share buffers (each G4_OUTPUT_TOP row would need
 * its own candidates); or sampling without a repetition penalty (speculative sampling: its rounds'
 * rows ask for every logit). A penalty would make each drafted token change the next one's
 * distribution, drafter's and target's alike: such generations decode a token a step. */
static int can_draft(const generation *g) {
    if (g->logprobs) return 0; /* one token, one row of logits, a step */
    if (g4_sampling_is_argmax(&g->sampling)) return g->output == G4_OUTPUT_ARGMAX || g->output == G4_OUTPUT_LOGITS;
    return g4_sampling_history_free(&g->sampling);
}

/* The drafting settings of a new generation: its drafter becomes the stepper's. */
static int set_draft(g4_stepper *st, generation *g, const g4_generate_params *p) {
    g->draft_k = g->n_draft = 0;
    g->has_hidden = 0;
    if (!p->draft) return 0;
    if (p->draft_tokens < 0 || p->draft_tokens > G4_MAX_DRAFT_TOKENS)
        return g4_fail("draft_tokens %d: expected 0 (the default, %d) to %d", p->draft_tokens, G4_DRAFT_TOKENS_DEFAULT, G4_MAX_DRAFT_TOKENS);
    if (st->dr && st->dr != p->draft) return g4_fail("one stepper takes one drafter: another is in use");
    if (g4_drafter_session(p->draft) != st->s) return g4_fail("the drafter drafts over another session than the stepper's");
    if (!g->hidden && !(g->hidden = malloc(sizeof *g->hidden * (size_t)st->hidden_size))) return g4_fail("out of memory for generation");
    if (!st->draft_hidden && !(st->draft_hidden = malloc(sizeof *st->draft_hidden * (size_t)st->n_seq * (size_t)st->hidden_size)))
        return g4_fail("out of memory for generation");
    st->dr = p->draft;
    g->draft_k = can_draft(g) ? (p->draft_tokens ? p->draft_tokens : G4_DRAFT_TOKENS_DEFAULT) : 0;
    g->sampled = g->draft_k && !g4_sampling_is_argmax(&g->sampling);
    if (g->sampled) {
        double *q = realloc(g->q, sizeof *q * (size_t)g->draft_k * (size_t)st->vocab);
        if (!q || (!st->p && !(st->p = malloc(sizeof *st->p * (size_t)st->vocab)))) return g4_fail("out of memory for speculative sampling");
        g->q = q;
    }
    /* speculative sampling weighs the drafter's distributions; a constraint masks them */
    if ((g->sampled || (g->draft_k && g->gstate)) && !st->draft_logits &&
        !(st->draft_logits = malloc(sizeof *st->draft_logits * (size_t)(st->n_seq < 64 ? st->n_seq : 64) * (size_t)st->vocab)))
        return g4_fail("out of memory for speculative decoding");
    return 0;
}

/* A constrained generation's own grammar state, its stop ids as the mask takes them, its mask. */
static int set_constraint(g4_stepper *st, generation *g, const g4_generate_params *p) {
    g4_grammar_state_free(g->gstate);
    g->gstate = NULL;
    g->gvocab = NULL;
    if (!p->constraint) return 0;
    if (!p->constraint_vocab) return g4_fail("a constraint needs the tokenizer's vocabulary (constraint_vocab)");
    if (g4_grammar_vocab_size(p->constraint_vocab) > (size_t)st->vocab)
        return g4_fail("the constraint's vocabulary has %zu tokens, the model %d: another tokenizer's", g4_grammar_vocab_size(p->constraint_vocab),
                       st->vocab);
    size_t words = ((size_t)st->vocab + 31) / 32;
    int32_t *stops = realloc(g->gstops, sizeof *stops * (size_t)(g->n_stops > 0 ? g->n_stops : 1));
    if (stops) g->gstops = stops;
    uint32_t *mask = stops ? realloc(g->gmask, sizeof *mask * words) : NULL;
    if (mask) g->gmask = mask;
    if (!st->fallback && mask) st->fallback = malloc(sizeof *st->fallback * (size_t)st->vocab);
    if (!stops || !mask || !st->fallback) return g4_fail("out of memory for the constraint");
    for (int i = 0; i < g->n_stops; i++) g->gstops[i] = g->stops[i];
    if (!(g->gstate = g4_grammar_state_copy(p->constraint))) return -1;
    g->gvocab = p->constraint_vocab;
    g->thought_open = p->thought_open, g->thought_close = p->thought_close, g->in_thought = 0;
    if (g->thought_open < 0 || g->thought_open >= st->vocab || g->thought_close < 0 || g->thought_close >= st->vocab)
        return g4_fail("thought_open %d, thought_close %d: expected token ids (0: none)", g->thought_open, g->thought_close);
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

/* The prompt's embedding rows (embd_at, embd: see generation; NULL: none), copied into g. */
static int copy_embeddings(const g4_stepper *st, generation *g, const int32_t *embd_at, const float *embd, int n_prompt) {
    free(g->embd_at), free(g->embd);
    g->embd_at = NULL, g->embd = NULL;
    if (!embd_at) return 0;
    int rows = 0;
    for (int i = 0; i < n_prompt; i++) rows += embd_at[i] >= 0;
    size_t bytes = sizeof *embd * (size_t)rows * (size_t)st->hidden_size;
    g->embd_at = malloc(sizeof *embd_at * (size_t)n_prompt);
    g->embd = malloc(bytes ? bytes : 1);
    if (!g->embd_at || !g->embd) return g4_fail("out of memory for %d embedding rows", rows);
    memcpy(g->embd_at, embd_at, sizeof *embd_at * (size_t)n_prompt);
    memcpy(g->embd, embd, bytes);
    return 0;
}

/* Starts a generation in seq whose prompt goes in at position base (embd_at, embd: its embedding
 * rows, see generation). */
static int start(g4_stepper *st, int seq, const int32_t *prompt, int n_prompt, const int32_t *embd_at, const float *embd, int base,
                 const g4_generate_params *p) {
    generation *g = &st->seq[seq];
    if (g->state == G4_SEQ_PROMPT || g->state == G4_SEQ_GENERATING) return g4_fail("sequence %d is still generating", seq);
    if (n_prompt < 1) return g4_fail("empty prompt");
    int left = st->ctx - base;
    if (n_prompt > left) return g4_fail("prompt of %d tokens does not fit the context: %d of %d tokens left (--ctx)", n_prompt, left, st->ctx);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= st->vocab) return g4_fail("token id %d is outside the vocabulary (0..%d)", prompt[i], st->vocab - 1);
    if (p->logprobs && (p->top_logprobs < 0 || p->top_logprobs > G4_MAX_TOP_LOGPROBS))
        return g4_fail("top_logprobs %d: expected 0 to %d", p->top_logprobs, G4_MAX_TOP_LOGPROBS);
    g4_output out = G4_OUTPUT_NONE;
    int top_k;
    if (choose_output(p, st->vocab, &out, &top_k) != 0) return -1;
    g4_sampler *sampler = g4_sampler_new_sharing(&p->sampling, st->buffers);
    if (!sampler) return -1;
    g4_sampler_set_prompt(sampler, n_prompt);
    g4_sampler_free(g->sampler);
    g->sampler = sampler;
    g->sampling = p->sampling;
    g->sampling.bias_ids = NULL, g->sampling.bias_values = NULL; /* borrowed: the sampler holds the copy */
    g->output = out;
    g->top_k = top_k;
    g->logprobs = p->logprobs != 0;
    g->top_logprobs = g->logprobs ? p->top_logprobs : 0;
    g->has_lp = 0;
    g->fork_from = -1;
    /* every generated token but the last takes a place in the context */
    int budget = p->max_tokens > 0 ? p->max_tokens : 0, room = left - n_prompt + 1;
    if (alloc_generation(st, g, n_prompt + (budget < room ? budget : room)) != 0) return -1;
    const int *stops = p->stop_ids;
    int n_stops = p->n_stop_ids;
    if (!stops) n_stops = g4_model_stop_ids(g4_session_model(st->s), &stops);
    if (copy_stops(g, stops, n_stops) != 0 || set_constraint(st, g, p) != 0 || set_draft(st, g, p) != 0 ||
        copy_embeddings(st, g, embd_at, embd, n_prompt) != 0)
        return -1;
    memmove(g->history, prompt, sizeof *prompt * (size_t)n_prompt);
    g->n_prompt = g->n_hist = n_prompt;
    g->n_fed = 0;
    g->base = base;
    g->max_tokens = budget;
    g->stop = G4_STOP_BUDGET;
    g->stop_id = 0;
    g->added = st->added++;
    g->t_start = g->t_first = g->t_end = 0;
    g->error[0] = 0;
    g->state = G4_SEQ_PROMPT;
    return 0;
}

int g4_stepper_add(g4_stepper *st, int seq, const int32_t *prompt, int n_prompt, const g4_generate_params *p) {
    if (seq < 0 || seq >= st->n_seq) return g4_fail("sequence %d does not exist (the session has %d)", seq, st->n_seq);
    return start(st, seq, prompt, n_prompt, NULL, NULL, g4_session_seq_pos(st->s, seq), p);
}

/* The spans as a row index per prompt position (malloc'd into *at) and their rows gathered in
 * order (*embd); fails, naming the span, on one that is empty, outside the prompt, overlapping
 * another or holding a NaN or an infinity. */
static int gather_spans(const g4_stepper *st, int n_prompt, const g4_embd_span *spans, int n_spans, int32_t **at, float **embd) {
    size_t H = (size_t)st->hidden_size;
    int rows = 0;
    *at = malloc(sizeof **at * (size_t)(n_prompt > 0 ? n_prompt : 1));
    if (!*at) return g4_fail("out of memory for embedding spans");
    for (int i = 0; i < n_prompt; i++) (*at)[i] = -1;
    for (int k = 0; k < n_spans; k++) {
        const g4_embd_span *sp = &spans[k];
        if (!sp->embd || sp->n < 1 || sp->at < 0 || sp->at > n_prompt - sp->n)
            return g4_fail("embedding span %d (%d rows at %d) is empty or outside the prompt of %d tokens", k, sp->n, sp->at, n_prompt);
        for (int i = sp->at; i < sp->at + sp->n; i++) {
            if ((*at)[i] != -1) return g4_fail("embedding span %d overlaps an earlier span at prompt position %d", k, i);
            (*at)[i] = -2; /* a span's, its row numbered below */
        }
        for (size_t c = 0; c < (size_t)sp->n * H; c++)
            if (!isfinite(sp->embd[c])) return g4_fail("embedding span %d: row %zu, value %zu is not finite", k, c / H, c % H);
        rows += sp->n;
    }
    *embd = malloc(sizeof **embd * (size_t)rows * H + 1);
    if (!*embd) return g4_fail("out of memory for %d embedding rows", rows);
    int r = 0;
    for (int i = 0; i < n_prompt; i++) /* rows in prompt order, whatever the spans' order */
        for (int k = 0; (*at)[i] == -2 && k < n_spans; k++)
            if (i >= spans[k].at && i < spans[k].at + spans[k].n) {
                memcpy(*embd + (size_t)r * H, spans[k].embd + (size_t)(i - spans[k].at) * H, sizeof **embd * H);
                (*at)[i] = r++;
            }
    return 0;
}

int g4_stepper_add_embd(g4_stepper *st, int seq, const int32_t *prompt, int n_prompt, const g4_embd_span *spans, int n_spans,
                        const g4_generate_params *p) {
    if (seq < 0 || seq >= st->n_seq) return g4_fail("sequence %d does not exist (the session has %d)", seq, st->n_seq);
    if (n_spans < 0 || (n_spans > 0 && !spans)) return g4_fail("%d embedding spans and no array of them", n_spans);
    int32_t *at = NULL;
    float *embd = NULL;
    int rc = gather_spans(st, n_prompt, spans, n_spans, &at, &embd);
    if (rc == 0) rc = start(st, seq, prompt, n_prompt, at, embd, g4_session_seq_pos(st->s, seq), p);
    free(at), free(embd);
    return rc;
}

int g4_stepper_add_fork(g4_stepper *st, int seq, int from, const g4_generate_params *p) {
    if (seq < 0 || seq >= st->n_seq || from < 0 || from >= st->n_seq || seq == from)
        return g4_fail("cannot fork sequence %d into %d (the session has %d)", from, seq, st->n_seq);
    const generation *f = &st->seq[from];
    if (f->state != G4_SEQ_PROMPT || f->fork_from >= 0) return g4_fail("sequence %d is not feeding a prompt of its own: nothing to fork", from);
    if (start(st, seq, f->history, f->n_prompt, f->embd_at, f->embd, f->base, p) != 0) return -1;
    generation *g = &st->seq[seq];
    g->fork_from = from;
    g->fork_added = f->added;
    return 0;
}

/* ---- one step ---- */

/* Row `row` asks what sequence q's next pick needs; a G4_OUTPUT_LOGITS row gets the call's row
 * `slot` of the stepper's logits (consecutive slots for consecutive rows: one lm_head pass). */
static void ask(g4_stepper *st, int q, g4_batch_row *row, int slot) {
    generation *g = &st->seq[q];
    /* a speculative-sampling round weighs whole distributions: its rows ask for every logit */
    row->output = g->sampled && g->n_draft ? G4_OUTPUT_LOGITS : g->output;
    if (row->output == G4_OUTPUT_LOGITS) row->logits = st->logits + (size_t)slot * st->vocab;
    if (row->output != G4_OUTPUT_TOP) return;
    /* the penalty can demote up to n_pen tokens below the others: the top_k after it lie among the
     * top_k + n_pen before it, and the penalized tokens' own logits are needed exactly */
    int n_pen = g4_sampling_penalized(&g->sampling, g->history, g->n_hist, g->penalized);
    g->top = (g4_candidates){.k = g->top_k + n_pen, .extra = g->penalized, .n_extra = n_pen, .ids = g->cand, .logits = g->vals,
                             .cap = MAX_CANDIDATES};
    row->top = &g->top;
}

static int all_finite(const float *v, int n) {
    for (int i = 0; i < n; i++)
        if (!isfinite(v[i])) return 0;
    return 1;
}

/* 1 (with sequence q's error set) when what row `at` gave cannot be sampled: a hidden state or
 * logits (those the pick reads) with a NaN or an infinity, which would give garbage tokens
 * (greedy decoding's argmax of NaNs is token 0 forever), or a greedy token outside the vocabulary. */
static int non_finite(g4_stepper *st, int q, const g4_batch_row *row, int at, const float *logits) {
    generation *g = &st->seq[q];
    const char *what = NULL;
    if (g4_decode_hidden(st->s, at, st->check) == 0 && !all_finite(st->check, st->hidden_size)) what = "hidden state";
    else if (logits && !all_finite(logits, st->vocab)) what = "logits";
    else if (!logits && row->output == G4_OUTPUT_TOP && row->top->n >= 0 && !all_finite(row->top->logits, row->top->n)) what = "logits";
    else if (!logits && row->output == G4_OUTPUT_ARGMAX && (row->argmax < 0 || row->argmax >= st->vocab)) what = "greedy token";
    if (!what) return 0;
    snprintf(g->error, sizeof g->error, "the model's %s turned non-finite (NaN or infinite) at generated token %d: its weights or "
             "config.json overflow float", what, g->n_hist - g->n_prompt + 1);
    return 1;
}

/* Whether token a (logit la) ranks before token b (lb): higher logit, then lower id. */
static int ranks_before(float la, int32_t a, float lb, int32_t b) { return la > lb || (la == lb && a < b); }

/* The chosen token's log-probability and the top ones, from every logit of its row: the
 * log-softmax of the model's distribution as it is (the sampler's processors left out). The
 * exponentials are expf's (within an ulp; exp in double costs three times as much over E2B's
 * 262,144 logits), summed in double. */
static void record_logprobs(const g4_stepper *st, generation *g, const float *logits, int32_t token) {
    int V = st->vocab, n = 0, want = g->top_logprobs;
    float max = logits[g4_argmax(logits, V)]; /* the library's vectorised scan */
    double sum = 0;
    for (int v = 0; v < V; v++) sum += expf(logits[v] - max);
    double lse = max + log(sum);
    g4_token_logprob *top = g->lp.top;
    for (int v = 0; v < V && want > 0; v++) {
        if (n == want && !ranks_before(logits[v], v, logits[top[n - 1].token], top[n - 1].token)) continue;
        int at = n < want ? n++ : n - 1; /* insertion: the last one drops out when full */
        for (; at > 0 && ranks_before(logits[v], v, logits[top[at - 1].token], top[at - 1].token); at--) top[at] = top[at - 1];
        top[at].token = v;
    }
    for (int i = 0; i < n; i++) top[i].logprob = (float)((double)logits[top[i].token] - lse);
    g->lp.n_top = n;
    g->lp.chosen = (g4_token_logprob){token, (float)((double)logits[token] - lse)};
    g->has_lp = 1;
}

/* Sequence q's next token from what row `at` of the last call gave: the greedy token, the
 * sampler's pick from the candidates when they decide it (the pick it makes from every logit, bit
 * for bit), else its pick from every logit. 1 when the row's output is not finite (non_finite). */
static int pick_constrained(g4_stepper *st, int q, const float *logits, int32_t *token);
static int is_stop(const generation *g, int32_t t);

static int pick(g4_stepper *st, int q, const g4_batch_row *row, int at, int32_t *token) {
    generation *g = &st->seq[q];
    if (non_finite(st, q, row, at, row->output == G4_OUTPUT_LOGITS ? row->logits : NULL)) return 1;
    if (g->gstate) return pick_constrained(st, q, row->logits, token);
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
        if (non_finite(st, q, row, at, st->fallback)) return 1;
        logits = st->fallback;
    }
    *token = g4_sampler_sample(g->sampler, logits, g->history, g->n_hist);
    if (g->logprobs) record_logprobs(st, g, logits, *token);
    return 0;
}

static int mask_has(const uint32_t *mask, int32_t t) { return (mask[t >> 5] >> (t & 31)) & 1; }

/* to = from with every token g->gmask leaves out at -infinity (to may be from). */
static void apply_mask(const g4_stepper *st, const generation *g, const float *from, float *to) {
    size_t nv = g4_grammar_vocab_size(g->gvocab);
    for (int v = 0; v < st->vocab; v++) to[v] = (size_t)v < nv && mask_has(g->gmask, v) ? from[v] : -INFINITY;
}

/* The logits a constrained pick draws from, into st->fallback: in a thought, the row's but the
 * stop ids (a thought is free text, the answer after it the constraint's); else the row's with
 * every token the grammar's mask leaves out at -infinity (the thought's opening allowed as the
 * reply's first token). 0; 1 with the error set when the mask fails or the grammar needs bytes no
 * token gives; 2 when the grammar is complete, cannot go on and there is no stop id to pick. */
static int constrained_logits(g4_stepper *st, int q, const float *logits) {
    generation *g = &st->seq[q];
    float *masked = st->fallback;
    if (g->in_thought) {
        memcpy(masked, logits, sizeof *logits * (size_t)st->vocab);
        for (int i = 0; i < g->n_stops; i++)
            if (g->stops[i] >= 0 && g->stops[i] < st->vocab) masked[g->stops[i]] = -INFINITY;
        return 0;
    }
    int first = g->n_hist == g->n_prompt;
    long allowed = g4_grammar_mask(g->gvocab, g->gstate, g->gstops, (size_t)g->n_stops, g->gmask);
    if (allowed >= 0 && first && g->thought_open > 0 && !mask_has(g->gmask, g->thought_open)) {
        g->gmask[g->thought_open >> 5] |= 1u << (g->thought_open & 31);
        allowed++;
    }
    if (allowed == 0 && g4_grammar_is_complete(g->gstate)) return 2;
    if (allowed <= 0) {
        snprintf(g->error, sizeof g->error, "constraint at generated token %d: %s", g->n_hist - g->n_prompt + 1,
                 allowed < 0 ? g4_last_error() : "the grammar needs bytes that no token of the vocabulary gives");
        return 1;
    }
    apply_mask(st, g, logits, masked);
    return 0;
}

/* Takes token t (one constrained_logits allowed) into the constraint: a thought opens or closes,
 * or the grammar advances by it (a stop id ends the reply). 1 with the error set when it cannot. */
static int constraint_take(g4_stepper *st, int q, int32_t t) {
    generation *g = &st->seq[q];
    if (g->in_thought) {
        g->in_thought = t != g->thought_close;
        return 0;
    }
    if (g->n_hist == g->n_prompt && g->thought_open > 0 && t == g->thought_open) {
        g->in_thought = 1;
        return 0;
    }
    if (is_stop(g, t) || g4_grammar_accept_token(g->gvocab, g->gstate, t) == 0) return 0;
    snprintf(g->error, sizeof g->error, "constraint at generated token %d: %s", g->n_hist - g->n_prompt + 1, g4_last_error());
    return 1;
}

/* A constrained pick (the rows ask for every logit): the sampler's pick from constrained_logits,
 * taken into the constraint. 1 or 2 as constrained_logits or constraint_take give them. */
static int pick_constrained(g4_stepper *st, int q, const float *logits, int32_t *token) {
    generation *g = &st->seq[q];
    int rc = constrained_logits(st, q, logits);
    if (rc != 0) return rc;
    int32_t t = g4_sampler_sample(g->sampler, st->fallback, g->history, g->n_hist);
    /* a draw that rounding left on a token the constraint leaves out (weight 0) takes the best allowed one */
    if (t < 0 || t >= st->vocab || st->fallback[t] == -INFINITY) t = g4_argmax(st->fallback, st->vocab);
    if (constraint_take(st, q, t) != 0) return 1;
    if (g->logprobs) record_logprobs(st, g, logits, t);
    *token = t;
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

/* Ends sequence q at a row that gives no token: pick's 1 (output not finite, a constraint's
 * error: G4_STOP_ERROR) or 2 (a complete grammar with no stop id to pick: G4_STOP_EOS, stop_id -1). */
static void refuse(g4_stepper *st, int q, int rc, double now, g4_step_token *ev) {
    generation *g = &st->seq[q];
    g4_stop_reason why = rc == 2 ? G4_STOP_EOS : G4_STOP_ERROR;
    if (g->state == G4_SEQ_PROMPT) g->t_first = now;
    finish(g, why, now);
    if (rc == 2) g->stop_id = -1;
    *ev = (g4_step_token){.seq = q, .token = -1, .finished = 1, .stop = why};
}

/* Takes token t for sequence q, then the stop checks in their order: a stop id, the budget, the
 * context (the token would need a place the cache does not have: `held` tokens are in it). */
static void accept(g4_stepper *st, int q, int32_t t, int held, double now, g4_step_token *ev) {
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
    } else if (held >= st->ctx) {
        finish(g, G4_STOP_CONTEXT, now);
    }
    *ev = (g4_step_token){.seq = q, .token = t, .finished = g->state == G4_SEQ_FINISHED, .stop = g->stop};
}

/* Keeps the target's hidden state of row i of the last call for sequence q's next round. */
static int keep_hidden(g4_stepper *st, int q, int i) {
    generation *g = &st->seq[q];
    if (!g->draft_k) return 0;
    g->has_hidden = 1;
    return g4_decode_hidden(st->s, i, g->hidden);
}

/* Picks and accepts the token of every row of the last call that asked for one, except the rows
 * of a drafting round (settle_round). */
static int take_tokens(g4_stepper *st, int n, g4_step_token *out) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        const g4_batch_row *row = &st->rows[i];
        if (row->output == G4_OUTPUT_NONE) continue;
        int q = row->seq;
        int32_t t;
        int rc = pick(st, q, row, i, &t);
        if (rc == 1 || rc == 2) {
            refuse(st, q, rc, now_s(), &out[k++]);
            continue;
        }
        if (rc != 0 || keep_hidden(st, q, i) != 0) return -1;
        accept(st, q, t, g4_session_seq_pos(st->s, q), now_s(), &out[k++]);
    }
    return k;
}

/* ---- speculative decoding ---- */

/* A constrained round drafts what the grammar allows after the drafts before: the drafter's logits
 * lg with every other token at -infinity (greedy drafts its best allowed token, sampling draws from
 * the masked distribution). The target's verification alone keeps the output in the grammar; this
 * only keeps the drafter from spending a round on tokens the target cannot take (a JSON schema's
 * fixed keys and punctuation are then drafted exactly). 0 when nothing is allowed. */
static int mask_draft(g4_stepper *st, generation *g, float *lg) {
    if (g4_grammar_mask(g->gvocab, g->dstate, g->gstops, (size_t)g->n_stops, g->gmask) <= 0) return 0;
    apply_mask(st, g, lg, lg);
    return 1;
}

/* Up to 64 rounds' drafts, all their steps batched (one drafter pass per step); at: the
 * sequences, whose hidden states are rows of st->draft_hidden. */
static int draft_group(g4_stepper *st, int *at, int n) {
    int seqs[64], longest = 0;
    int32_t tokens[64], next[64];
    for (int i = 0; i < n; i++) {
        const generation *g = &st->seq[at[i]];
        memcpy(st->draft_hidden + (size_t)i * st->hidden_size, g->hidden, sizeof *g->hidden * (size_t)st->hidden_size);
        seqs[i] = at[i];
        tokens[i] = g->history[g->n_hist - 1];
        if (g->n_draft > longest) longest = g->n_draft;
    }
    for (int j = 0; j < longest; j++) {
        /* the rounds still drafting at step j, packed to the front */
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (st->seq[at[i]].n_draft <= j) continue;
            if (m != i) {
                seqs[m] = seqs[i], tokens[m] = tokens[i], at[m] = at[i];
                memmove(st->draft_hidden + (size_t)m * st->hidden_size, st->draft_hidden + (size_t)i * st->hidden_size,
                        sizeof *st->draft_hidden * (size_t)st->hidden_size);
            }
            m++;
        }
        n = m;
        if (n == 0) break; /* the grammar ended every round early */
        int sampled = st->seq[at[0]].sampled, logits = sampled; /* a group is all greedy or all sampling */
        for (int i = 0; i < n; i++) logits |= st->seq[at[i]].dstate != NULL;
        if (g4_drafter_step(st->dr, n, seqs, tokens, st->draft_hidden, next, logits ? st->draft_logits : NULL) != 0) return -1;
        for (int i = 0; i < n; i++) {
            generation *g = &st->seq[at[i]];
            float *lg = st->draft_logits + (size_t)i * st->vocab;
            if (g->dstate && !mask_draft(st, g, lg)) {
                g->n_draft = j; /* the grammar allows nothing more: the round verifies the drafts it has */
                continue;
            }
            if (sampled) {
                /* the draft is sampled from the drafter's distribution, as the target's sampler
                 * would shape it; settle_round weighs it against the target's */
                double *q = g->q + (size_t)j * st->vocab;
                g4_sampler_distribution(g->sampler, lg, g->history, g->n_hist, q);
                next[i] = g4_sampler_draw_from(g->sampler, q);
            } else if (g->dstate) {
                next[i] = g4_argmax(lg, st->vocab);
            }
            g->draft[j] = tokens[i] = next[i];
            st->drafted++;
            if (g->dstate && (is_stop(g, next[i]) || g4_grammar_accept_token(g->gvocab, g->dstate, next[i]) != 0))
                g->n_draft = j + 1; /* nothing follows a stop id */
        }
    }
    return 0;
}

static int draft_kind(g4_stepper *st, int sampled);

/* The drafts of this step's rounds: up to draft_k tokens for every generating sequence that
 * drafts, as many as its budget and the context leave room to verify. */
static int draft_rounds(g4_stepper *st) {
    for (int sampled = 0; sampled < 2; sampled++)
        if (draft_kind(st, sampled) != 0) return -1;
    return 0;
}

/* The rounds of the greedy generations (sampled 0) or of the sampling ones, in groups of 64. */
static int draft_kind(g4_stepper *st, int sampled) {
    int at[64], n = 0;
    for (int q = 0; q < st->n_seq; q++) {
        generation *g = &st->seq[q];
        if (g->sampled != sampled) continue;
        g->n_draft = 0;
        if (g->state != G4_SEQ_GENERATING || !g->draft_k || !g->has_hidden) continue;
        int pos = g4_session_seq_pos(st->s, q), left = g->max_tokens - (g->n_hist - g->n_prompt), k = g->draft_k;
        if (k > left - 1) k = left - 1;                   /* the round yields up to k + 1 tokens */
        if (k > st->ctx - pos - 1) k = st->ctx - pos - 1; /* its k + 1 rows must fit the cache */
        if (k <= 0) continue;
        g->n_draft = k;
        /* a constrained round drafts from a copy of the grammar's state (none in a thought: free text) */
        g4_grammar_state_free(g->dstate);
        g->dstate = g->gstate && !g->in_thought ? g4_grammar_state_copy(g->gstate) : NULL;
        if (g->gstate && !g->in_thought && !g->dstate) return -1;
        at[n++] = q;
        if (n == 64) {
            if (draft_group(st, at, n) != 0) return -1;
            n = 0;
        }
    }
    return n > 0 ? draft_group(st, at, n) : 0;
}

/* Sequence q's round after the call: row r0 + i holds token i of [last, draft_0, ...]; its pick
 * t_i is taken while the target agrees with the drafts (t_i == draft_i) and the generation goes
 * on; the cache keeps the rows whose tokens were taken, the rest are rolled back. */
/* Speculative sampling's token for row i of sequence q's round (Leviathan et al. 2023, Chen et al.
 * 2023): draft i is taken with probability min(1, p(d) / q(d)), p the target's distribution at
 * the row and q the drafter's it was drawn from; else a token is drawn from max(0, p - q),
 * normalised. After the last draft, the target's own pick. Each position's token is then
 * distributed as the target's sampler would draw it, whatever the drafter. */
static int spec_pick(g4_stepper *st, int q, int i, int32_t *t) {
    generation *g = &st->seq[q];
    const g4_batch_row *row = &st->rows[g->row0 + i];
    if (i == g->n_draft || non_finite(st, q, row, g->row0 + i, row->logits)) return pick(st, q, row, g->row0 + i, t);
    const float *logits = row->logits;
    if (g->gstate) { /* p is the constrained distribution: a draft the grammar leaves out has p(d) = 0, never taken */
        int rc = constrained_logits(st, q, logits);
        if (rc != 0) return rc;
        logits = st->fallback;
    }
    g4_sampler_distribution(g->sampler, logits, g->history, g->n_hist, st->p);
    int32_t d = g->draft[i];
    const double *qd = g->q + (size_t)i * st->vocab;
    if (g4_sampler_uniform(g->sampler) * qd[d] < st->p[d]) {
        *t = d;
    } else {
        for (int v = 0; v < st->vocab; v++) st->p[v] = st->p[v] > qd[v] ? st->p[v] - qd[v] : 0;
        *t = g4_sampler_draw_from(g->sampler, st->p);
        if (*t < 0 || *t == d) return pick(st, q, row, g->row0 + i, t); /* p == q to the last bit: p itself */
    }
    return g->gstate && constraint_take(st, q, *t) != 0 ? 1 : 0;
}

static int settle_round(g4_stepper *st, int q, g4_step_token *out) {
    generation *g = &st->seq[q];
    int r0 = g->row0, pos0 = g->pos0;
    int k = 0, i = 0;
    for (;; i++) {
        int32_t t;
        int rc = g->sampled && g->n_draft ? spec_pick(st, q, i, &t) : pick(st, q, &st->rows[r0 + i], r0 + i, &t);
        if (rc == 1 || rc == 2) { /* the cache keeps the tokens taken before the row */
            refuse(st, q, rc, now_s(), &out[k++]);
            return g4_session_truncate_seq(st->s, q, pos0 + i) == 0 ? k : -1;
        }
        if (rc != 0 || keep_hidden(st, q, r0 + i) != 0) return -1;
        accept(st, q, t, pos0 + i + 1, now_s(), &out[k++]);
        if (g->state == G4_SEQ_FINISHED || i == g->n_draft || t != g->draft[i]) break;
        st->accepted++;
    }
    if (g->n_draft == 0) return k;
    st->rounds++;
    return g4_session_truncate_seq(st->s, q, pos0 + i + 1) == 0 ? k : -1;
}

/* One token of every generating sequence, or a drafting round's 1 to k + 1, in one call. */
static int decode_step(g4_stepper *st, g4_step_token *out) {
    double t0 = now_s();
    if (st->dr && draft_rounds(st) != 0) return -1;
    int n = 0;
    for (int q = 0; q < st->n_seq; q++)
        if (st->seq[q].state == G4_SEQ_GENERATING) n += 1 + st->seq[q].n_draft;
    if (n == 0) return 0;
    if (ensure_logits(st, n) != 0) return -1; /* before ask() points rows into it */
    n = 0;
    for (int q = 0; q < st->n_seq; q++) {
        generation *g = &st->seq[q];
        if (g->state != G4_SEQ_GENERATING) continue;
        g->row0 = n;
        g->pos0 = g4_session_seq_pos(st->s, q);
        for (int i = 0; i <= g->n_draft; i++, n++) {
            st->rows[n] = (g4_batch_row){.seq = q, .token = i == 0 ? g->history[g->n_hist - 1] : g->draft[i - 1]};
            ask(st, q, &st->rows[n], n);
        }
    }
    int k = g4_decode(st->s, st->rows, n) == 0 ? 0 : -1;
    for (int q = 0; q < st->n_seq && k >= 0; q++) {
        if (st->seq[q].state != G4_SEQ_GENERATING) continue;
        int got = settle_round(st, q, out + k);
        k = got < 0 ? -1 : k + got;
    }
    st->stats.decode_s += now_s() - t0;
    return k;
}

/* The sequences whose prompts wait, first added first, into order; returns their count. */
static int waiting(const g4_stepper *st, int *order) {
    int n = 0;
    for (int q = 0; q < st->n_seq; q++) {
        if (st->seq[q].state != G4_SEQ_PROMPT || st->seq[q].fork_from >= 0) continue;
        int at = n++;
        for (; at > 0 && st->seq[order[at - 1]].added > st->seq[q].added; at--) order[at] = order[at - 1];
        order[at] = q;
    }
    return n;
}

/* The forks whose source has fed all but its prompt's last token take a copy of its cache up to
 * there (before and after each prompt call), and feed that token themselves; a fork whose source stopped short (cancelled) stops too,
 * as a sequence that was cancelled: its event token -1. */
static int copy_forks(g4_stepper *st, g4_step_token *out) {
    int k = 0;
    for (int q = 0; q < st->n_seq; q++) {
        generation *g = &st->seq[q];
        if (g->state != G4_SEQ_PROMPT || g->fork_from < 0) continue;
        const generation *f = &st->seq[g->fork_from];
        int need = g->base + g->n_prompt - 1;
        if (f->added == g->fork_added && f->state == G4_SEQ_PROMPT && f->n_fed < g->n_prompt - 1) continue; /* not there yet */
        if (f->added != g->fork_added || g4_session_seq_pos(st->s, g->fork_from) < need) {
            finish(g, G4_STOP_USER, now_s());
            out[k++] = (g4_step_token){.seq = q, .token = -1, .finished = 1, .stop = G4_STOP_USER};
            continue;
        }
        if (g4_session_copy_seq(st->s, g->fork_from, q, need) != 0) return -1;
        g->fork_from = -1;
        g->n_fed = g->n_prompt - 1;
        g->t_start = now_s();
    }
    return k;
}

/* Up to prompt_chunk tokens of the waiting prompts in one call; a prompt's last token asks for
 * the sequence's first pick. A budget of 0 ends at the prompt, with no token. */
static int feed_prompts(g4_stepper *st, g4_step_token *out) {
    int forked = copy_forks(st, out);
    if (forked < 0) return -1;
    out += forked;
    int order[64], n_wait = waiting(st, order), n = 0, n_logits = 0, k = 0;
    double t0 = now_s();
    for (int w = 0; w < n_wait && n < st->prompt_chunk; w++) {
        int q = order[w];
        generation *g = &st->seq[q];
        int take = g->n_prompt - g->n_fed < st->prompt_chunk - n ? g->n_prompt - g->n_fed : st->prompt_chunk - n;
        if (g->n_fed == 0) g->t_start = t0;
        for (int j = 0; j < take; j++, g->n_fed++) {
            st->rows[n] = (g4_batch_row){.seq = q, .token = g->history[g->n_fed]};
            if (g->embd_at && g->embd_at[g->n_fed] >= 0) st->rows[n].embd = g->embd + (size_t)g->embd_at[g->n_fed] * (size_t)st->hidden_size;
            n++;
        }
        if (g->n_fed == g->n_prompt && g->max_tokens > 0) ask(st, q, &st->rows[n - 1], n_logits++);
    }
    if (n == 0) return forked;
    if (g4_decode(st->s, st->rows, n) != 0 || (k = take_tokens(st, n, out)) < 0) k = -1;
    for (int w = 0; k >= 0 && w < n_wait; w++) {
        generation *g = &st->seq[order[w]];
        if (g->state != G4_SEQ_PROMPT || g->n_fed < g->n_prompt) continue;
        finish(g, G4_STOP_BUDGET, now_s());
        out[k++] = (g4_step_token){.seq = order[w], .token = -1, .finished = 1, .stop = G4_STOP_BUDGET};
    }
    st->stats.prompt_tokens += n;
    st->stats.prefill_s += now_s() - t0;
    /* forks whose source fed its prompt in this call copy it now, in the step that fed it: the
     * source may finish at its first token, and its caller then reuse its sequence */
    int late = k < 0 ? -1 : copy_forks(st, out + k);
    return late < 0 ? -1 : forked + k + late;
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

int g4_stepper_cancel_at(g4_stepper *st, int seq, int n_keep) {
    if (seq < 0 || seq >= st->n_seq) return g4_fail("sequence %d does not exist (the session has %d)", seq, st->n_seq);
    generation *g = &st->seq[seq];
    int n_gen = g->n_hist - g->n_prompt;
    if (g->state == G4_SEQ_IDLE) return g4_fail("sequence %d has no generation", seq);
    if (n_keep < 1 || n_keep > n_gen) return g4_fail("sequence %d generated %d tokens: it cannot keep %d", seq, n_gen, n_keep);
    /* the cache holds every history token but the last: drop the ones after the kept */
    int pos = g4_session_seq_pos(st->s, seq) - (n_gen - n_keep);
    if (pos < 0 || g4_session_truncate_seq(st->s, seq, pos) != 0) return -1;
    g->n_hist = g->n_prompt + n_keep;
    int was_running = g->state == G4_SEQ_PROMPT || g->state == G4_SEQ_GENERATING;
    if (was_running || n_keep < n_gen) {
        double end = g->t_end;
        finish(g, G4_STOP_USER, now_s());
        if (!was_running) g->t_end = end;
    }
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

const char *g4_stepper_error(const g4_stepper *st, int seq) {
    if (seq < 0 || seq >= st->n_seq || st->seq[seq].state != G4_SEQ_FINISHED || st->seq[seq].stop != G4_STOP_ERROR) return NULL;
    return st->seq[seq].error;
}

void g4_stepper_get_stats(const g4_stepper *st, g4_stepper_stats *stats) { *stats = st->stats; }

int g4_stepper_max_tokens(const g4_stepper *st) { return st->n_seq * (G4_MAX_DRAFT_TOKENS + 1); }

void g4_stepper_draft_stats(const g4_stepper *st, long *rounds, long *drafted, long *accepted) {
    *rounds = st->rounds;
    *drafted = st->drafted;
    *accepted = st->accepted;
}

int g4_stepper_logprobs(const g4_stepper *st, int seq, g4_logprobs *out) {
    if (seq < 0 || seq >= st->n_seq || !st->seq[seq].logprobs || !st->seq[seq].has_lp) return -1;
    *out = st->seq[seq].lp;
    return 0;
}

const struct g4_grammar_state *g4_stepper_constraint(const g4_stepper *st, int seq) {
    return seq >= 0 && seq < st->n_seq && st->seq[seq].state != G4_SEQ_IDLE ? st->seq[seq].gstate : NULL;
}
