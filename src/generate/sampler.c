#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "util/select.h"

typedef struct {
    int32_t id;
    float logit;
} candidate;

struct g4_sampler {
    g4_sampling p;
    int vocab;
    uint64_t rng;
    /* Working buffers of one pick, which samplers made with g4_sampler_new_sharing borrow. */
    candidate *cand; /* [vocab] */
    float *work;     /* [vocab] logits after the penalty */
    double *prob;    /* [vocab] unnormalised probabilities of the sorted candidates */
    int *count;      /* [vocab] zero between picks: a token's count among the generated ones */
    int owns_buffers;
    int n_prompt;    /* history[0, n_prompt) is the prompt, which OpenAI's penalties do not count */
    int32_t *bias_ids; /* the logit bias, copied (p's pointers point here) */
    float *bias_values;
};

void g4_sampling_default(g4_sampling *p) {
    *p = (g4_sampling){.temperature = 0, .top_k = 0, .top_p = 1, .min_p = 0, .repeat_penalty = 1, .repeat_last_n = 64, .seed = 0};
}

/* OpenAI's processors (frequency and presence penalties, logit bias) are on: they reach tokens
 * outside any top-k of the raw logits, so the pick needs every logit. */
static int openai_processors(const g4_sampling *p) {
    return p->frequency_penalty != 0 || p->presence_penalty != 0 || p->n_bias > 0;
}

/* splitmix64: a small, well-mixed generator; the sequence depends only on the seed. */
static uint64_t next_u64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static double next_unit(uint64_t *state) { return (double)(next_u64(state) >> 11) * (1.0 / 9007199254740992.0); }

/* Every front end's rule (g4.h): finite values in these ranges. */
int g4_sampling_check(const g4_sampling *p) {
    if (!(p->temperature >= 0 && isfinite(p->temperature)))
        return g4_fail("temperature %g: expected a finite number >= 0 (below %g: greedy)", (double)p->temperature, (double)G4_GREEDY_TEMPERATURE);
    if (p->top_k < 0) return g4_fail("top-k %d: expected 0 (off) or more", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1)) return g4_fail("top-p %g: expected a number in (0, 1]", (double)p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1)) return g4_fail("min-p %g: expected a number in [0, 1]", (double)p->min_p);
    if (!(p->repeat_penalty > 0 && isfinite(p->repeat_penalty)))
        return g4_fail("repeat-penalty %g: expected a finite number > 0", (double)p->repeat_penalty);
    if (p->repeat_last_n < 0) return g4_fail("repeat-last-n %d: expected 0 (all) or more", p->repeat_last_n);
    if (!isfinite(p->frequency_penalty) || !isfinite(p->presence_penalty))
        return g4_fail("frequency-penalty %g, presence-penalty %g: expected finite numbers", (double)p->frequency_penalty, (double)p->presence_penalty);
    if (p->n_bias < 0 || (p->n_bias > 0 && (!p->bias_ids || !p->bias_values))) return g4_fail("invalid logit bias (%d entries)", p->n_bias);
    for (int i = 0; i < p->n_bias; i++)
        if (!(p->bias_values[i] >= -G4_MAX_LOGIT_BIAS && p->bias_values[i] <= G4_MAX_LOGIT_BIAS))
            return g4_fail("logit bias of token %d is %g: expected a number in [-100, 100]", p->bias_ids[i], (double)p->bias_values[i]);
    return 0;
}

int g4_sampling_greedy(const g4_sampling *p) { return p->temperature < G4_GREEDY_TEMPERATURE; }

void g4_sampling_override(g4_sampling *to, const g4_sampling *from, int given) {
    if (given & G4_SAMPLE_TEMP) to->temperature = from->temperature;
    if (given & G4_SAMPLE_TOP_K) to->top_k = from->top_k;
    if (given & G4_SAMPLE_TOP_P) to->top_p = from->top_p;
    if (given & G4_SAMPLE_MIN_P) to->min_p = from->min_p;
    if (given & G4_SAMPLE_PENALTY) to->repeat_penalty = from->repeat_penalty;
    if (given & G4_SAMPLE_LAST_N) to->repeat_last_n = from->repeat_last_n;
    if (given & G4_SAMPLE_SEED) to->seed = from->seed;
    if (given & G4_SAMPLE_FREQUENCY) to->frequency_penalty = from->frequency_penalty;
    if (given & G4_SAMPLE_PRESENCE) to->presence_penalty = from->presence_penalty;
    if (given & G4_SAMPLE_BIAS) to->bias_ids = from->bias_ids, to->bias_values = from->bias_values, to->n_bias = from->n_bias;
}

static int valid_params(const g4_sampling *p) { return g4_sampling_check(p) == 0; }

/* The logit bias's entries, each a token of the vocabulary, copied into s (its p points there). */
static int copy_bias(g4_sampler *s, int vocab) {
    const int32_t *ids = s->p.bias_ids;
    const float *values = s->p.bias_values;
    int n = s->p.n_bias;
    s->p.bias_ids = NULL, s->p.bias_values = NULL;
    if (n == 0) return 0;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) return g4_fail("logit bias: token id %d is outside the vocabulary (0..%d)", ids[i], vocab - 1);
    s->bias_ids = malloc(sizeof *s->bias_ids * (size_t)n);
    s->bias_values = malloc(sizeof *s->bias_values * (size_t)n);
    if (!s->bias_ids || !s->bias_values) return g4_fail("out of memory for the logit bias");
    memcpy(s->bias_ids, ids, sizeof *s->bias_ids * (size_t)n);
    memcpy(s->bias_values, values, sizeof *s->bias_values * (size_t)n);
    s->p.bias_ids = s->bias_ids, s->p.bias_values = s->bias_values;
    return 0;
}

/* A sampler with its own buffers (shared NULL) or with those of `shared`. */
static g4_sampler *sampler_new(const g4_sampling *p, int vocab, const g4_sampler *shared) {
    if (!valid_params(p)) return NULL;
    g4_sampler *s = calloc(1, sizeof *s);
    if (s && shared) {
        s->cand = shared->cand, s->work = shared->work, s->prob = shared->prob, s->count = shared->count;
    } else if (s) {
        s->owns_buffers = 1;
        s->cand = malloc(sizeof *s->cand * (size_t)vocab);
        s->work = malloc(sizeof *s->work * (size_t)vocab);
        s->prob = malloc(sizeof *s->prob * (size_t)vocab);
        s->count = calloc((size_t)vocab, sizeof *s->count);
    }
    if (!s || !s->cand || !s->work || !s->prob || !s->count) {
        g4_sampler_free(s);
        g4_fail("out of memory for the sampler");
        return NULL;
    }
    s->p = *p;
    s->vocab = vocab;
    if (copy_bias(s, vocab) != 0) {
        g4_sampler_free(s);
        return NULL;
    }
    s->rng = p->seed;
    return s;
}

g4_sampler *g4_sampler_new(const g4_sampling *params, int vocab) { return sampler_new(params, vocab, NULL); }

g4_sampler *g4_sampler_new_sharing(const g4_sampling *params, const g4_sampler *shared) {
    return sampler_new(params, shared->vocab, shared);
}

void g4_sampler_free(g4_sampler *s) {
    if (!s) return;
    if (s->owns_buffers) {
        free(s->cand);
        free(s->work);
        free(s->prob);
        free(s->count);
    }
    free(s->bias_ids);
    free(s->bias_values);
    free(s);
}

/* Higher logit first; the lower id first on equal logits, and NaN after everything, so the order
 * is total and stable whatever the logits. */
static int by_logit_desc(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    int x_nan = isnan(x->logit), y_nan = isnan(y->logit);
    if (x_nan != y_nan) return x_nan - y_nan;
    if (!x_nan && x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The repetition penalty's window: history[window_start(p, n), n). Each distinct token in it is
 * penalised once, as in HF (it gathers, then scatters): at its first occurrence in the window. */
static int window_start(const g4_sampling *p, int n) { return p->repeat_last_n && n > p->repeat_last_n ? n - p->repeat_last_n : 0; }

static int first_in_window(const int32_t *history, int from, int i) {
    for (int j = from; j < i; j++)
        if (history[j] == history[i]) return 0;
    return 1;
}

static float penalize(const g4_sampler *s, float l) { return l > 0 ? l / s->p.repeat_penalty : l * s->p.repeat_penalty; }

static void apply_repeat_penalty(const g4_sampler *s, float *logits, const int32_t *history, int n) {
    if (s->p.repeat_penalty == 1) return;
    int from = window_start(&s->p, n);
    for (int i = from; i < n; i++) {
        int32_t t = history[i];
        if (t >= 0 && t < s->vocab && first_in_window(history, from, i)) logits[t] = penalize(s, logits[t]);
    }
}

/* OpenAI's penalties over the generated tokens history[n_prompt, n) (counted in s->count, which
 * is left zero again), then the logit bias. */
static void apply_openai(const g4_sampler *s, float *logits, const int32_t *history, int n) {
    const g4_sampling *p = &s->p;
    if (p->frequency_penalty != 0 || p->presence_penalty != 0) {
        int from = s->n_prompt < n ? s->n_prompt : n;
        for (int i = from; i < n; i++)
            if (history[i] >= 0 && history[i] < s->vocab) s->count[history[i]]++;
        for (int i = from; i < n; i++) {
            int32_t t = history[i];
            if (t < 0 || t >= s->vocab || s->count[t] == 0) continue; /* out of range, or done */
            logits[t] -= (float)s->count[t] * p->frequency_penalty + p->presence_penalty;
            s->count[t] = 0;
        }
    }
    for (int i = 0; i < p->n_bias; i++) logits[p->bias_ids[i]] += p->bias_values[i];
}

/* Every processor before the temperature, in order, on a copy of the logits in s->work. */
static void processed(g4_sampler *s, const float *logits, const int32_t *history, int n_history) {
    memcpy(s->work, logits, sizeof *logits * (size_t)s->vocab);
    apply_repeat_penalty(s, s->work, history, n_history);
    apply_openai(s, s->work, history, n_history);
}

void g4_sampler_set_prompt(g4_sampler *s, int n_prompt) { s->n_prompt = n_prompt > 0 ? n_prompt : 0; }

/* Moves the k best candidates to the front, sorted. */
static void select_top(candidate *c, int n, int k) {
    g4_select_first(c, (size_t)n, sizeof *c, (size_t)k, by_logit_desc);
    qsort(c, (size_t)k, sizeof *c, by_logit_desc);
}

int g4_sampling_is_argmax(const g4_sampling *p) { return g4_sampling_greedy(p) && p->repeat_penalty == 1 && !openai_processors(p); }

int g4_sampling_history_free(const g4_sampling *p) { return p->repeat_penalty == 1 && p->frequency_penalty == 0 && p->presence_penalty == 0; }

/* The candidates a draw keeps of the n best, sorted in s->cand (softmax, top-p, min-p): their
 * unnormalised probabilities into s->prob, their number returned, their total into *sum. */
/* exp(l - max): a candidate's unnormalised probability, max the first (largest) candidate's logit.
 * Defined for any floats (the stepper ends a generation on non-finite logits, but the sampler
 * stays safe without it): an infinite max shares the mass among the tokens at it, NaN gets none. */
static double weight(float l, double max) {
    if (isnan(l) || isnan(max)) return 0;
    if (isinf(max)) return l == max ? 1 : 0;
    return exp((double)l - max);
}

static int kept(g4_sampler *s, int n, double *sum) {
    /* probabilities over the survivors, in double */
    double max = s->cand[0].logit, total = 0, *prob = s->prob;
    for (int i = 0; i < n; i++) total += prob[i] = weight(s->cand[i].logit, max);
    if (!(total > 0)) { /* every candidate NaN: the first takes the draw, the distribution still sums to 1 */
        for (int i = 0; i < n; i++) prob[i] = i == 0;
        total = 1;
    }
    /* top-p: the smallest prefix whose mass reaches p (always at least one token) */
    if (s->p.top_p < 1) {
        double acc = 0;
        int keep = 0;
        while (keep < n && acc < s->p.top_p * total) acc += prob[keep++];
        n = keep > 0 ? keep : 1;
    }
    /* min-p: drop tokens below min_p x the top probability */
    if (s->p.min_p > 0) {
        int keep = 1;
        while (keep < n && prob[keep] >= s->p.min_p * prob[0]) keep++;
        n = keep;
    }
    total = 0;
    for (int i = 0; i < n; i++) total += prob[i];
    *sum = total;
    return n;
}

/* Draws from the n best candidates, sorted in s->cand. */
static int32_t draw(g4_sampler *s, int n) {
    double total, *prob = s->prob;
    n = kept(s, n, &total);
    double r = next_unit(&s->rng) * total, acc = 0;
    int32_t pick = s->cand[n - 1].id;
    for (int i = 0; i < n; i++) {
        acc += prob[i];
        if (r < acc) {
            pick = s->cand[i].id;
            break;
        }
    }
    return pick;
}

int32_t g4_sampler_sample(g4_sampler *s, const float *logits, const int32_t *history, int n_history) {
    processed(s, logits, history, n_history);
    if (g4_sampling_greedy(&s->p)) return g4_argmax(s->work, s->vocab);
    int n = s->vocab;
    for (int i = 0; i < n; i++) s->cand[i] = (candidate){i, s->work[i] / s->p.temperature};
    int k = s->p.top_k > 0 && s->p.top_k < n ? s->p.top_k : n;
    select_top(s->cand, n, k);
    return draw(s, k);
}

/* s->cand sorted by the processors, the top-k's first; their count. */
static int ranked(g4_sampler *s, const float *logits, const int32_t *history, int n_history) {
    processed(s, logits, history, n_history);
    int n = s->vocab;
    for (int i = 0; i < n; i++) s->cand[i] = (candidate){i, s->work[i] / s->p.temperature};
    int k = s->p.top_k > 0 && s->p.top_k < n ? s->p.top_k : n;
    select_top(s->cand, n, k);
    return k;
}

void g4_sampler_distribution(g4_sampler *s, const float *logits, const int32_t *history, int n_history, double *probs) {
    for (int i = 0; i < s->vocab; i++) probs[i] = 0;
    if (g4_sampling_greedy(&s->p)) {
        probs[g4_sampler_sample(s, logits, history, n_history)] = 1;
        return;
    }
    double total;
    int n = kept(s, ranked(s, logits, history, n_history), &total);
    for (int i = 0; i < n; i++) probs[s->cand[i].id] = s->prob[i] / total;
}

double g4_sampler_uniform(g4_sampler *s) { return next_unit(&s->rng); }

int32_t g4_sampler_draw_from(g4_sampler *s, const double *w) {
    double total = 0, acc = 0;
    int32_t last = -1;
    for (int i = 0; i < s->vocab; i++)
        if (w[i] > 0) total += w[i], last = i;
    if (last < 0) return -1;
    double r = next_unit(&s->rng) * total;
    for (int i = 0; i < s->vocab; i++) {
        if (!(w[i] > 0)) continue;
        acc += w[i];
        if (r < acc) return i;
    }
    return last;
}

int g4_sampling_top_needed(const g4_sampling *p, int vocab) {
    if (openai_processors(p)) return 0;
    if (g4_sampling_greedy(p)) return 1;
    return p->top_k > 0 && p->top_k < vocab ? p->top_k : 0;
}

int g4_sampling_penalized(const g4_sampling *p, const int32_t *history, int n_history, int32_t *ids) {
    if (p->repeat_penalty == 1) return 0;
    int from = window_start(p, n_history), n = 0;
    for (int i = from; i < n_history; i++)
        if (first_in_window(history, from, i)) ids[n++] = history[i];
    return n;
}

int32_t g4_sampler_sample_top(g4_sampler *s, const int32_t *ids, const float *logits, int m, float bound, const int32_t *history,
                              int n_history) {
    int k = g4_sampling_top_needed(&s->p, s->vocab);
    if (k == 0 || openai_processors(&s->p) || m < k || m > s->vocab || isnan(bound)) return -1;
    for (int i = 0; i < m; i++) {
        if (isnan(logits[i]) || ids[i] < 0 || ids[i] >= s->vocab) return -1;
        s->work[i] = logits[i];
    }
    /* the penalty, on the candidates, as apply_repeat_penalty applies it to every logit */
    if (s->p.repeat_penalty != 1) {
        int from = window_start(&s->p, n_history);
        for (int h = from; h < n_history; h++) {
            int32_t t = history[h], at = -1;
            if (t < 0 || t >= s->vocab || !first_in_window(history, from, h)) continue;
            for (int i = 0; i < m && at < 0; i++)
                if (ids[i] == t) at = i;
            if (at < 0) return -1; /* a penalized token that is not a candidate */
            s->work[at] = penalize(s, s->work[at]);
        }
    }
    if (g4_sampling_greedy(&s->p)) {
        /* g4_argmax: the first index of the largest; every other token is at most `bound`, so the
         * best candidate stands only when strictly above it */
        int best = -1;
        for (int i = 0; i < m; i++)
            if (best < 0 || s->work[i] > s->work[best] || (s->work[i] == s->work[best] && ids[i] < ids[best])) best = i;
        return s->work[best] > bound ? ids[best] : -1;
    }
    for (int i = 0; i < m; i++) s->cand[i] = (candidate){ids[i], s->work[i] / s->p.temperature};
    select_top(s->cand, m, k);
    /* every other token is at most bound / T after the division (it is monotone), so the k best
     * candidates are the k best tokens when the k-th lies strictly above that */
    if (!(s->cand[k - 1].logit > bound / s->p.temperature)) return -1;
    return draw(s, k);
}
