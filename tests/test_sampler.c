/* Sampling against worked examples: greedy and the repetition penalty, OpenAI's frequency and
 * presence penalties and logit bias, and the sampled frequencies of a known distribution under
 * temperature, top-k, top-p and min-p. */
#include <math.h>
#include "generate/sampler.h"
#include "testutil.h"
#include "util/select.h"

#define V 5

static g4_sampling params(float t, int k, float p, float minp) {
    g4_sampling s;
    g4_sampling_default(&s);
    s.temperature = t;
    s.top_k = k;
    s.top_p = p;
    s.min_p = minp;
    s.seed = 42;
    return s;
}

/* Frequencies of each token over n draws. */
static void frequencies(const g4_sampling *p, const float *logits, int n, double *freq) {
    g4_sampler *s = g4_sampler_new(p, V);
    for (int i = 0; i < V; i++) freq[i] = 0;
    for (int i = 0; i < n; i++) freq[g4_sampler_sample(s, logits, NULL, 0)] += 1.0 / n;
    g4_sampler_free(s);
}

static void expect_freq(const char *what, const double *freq, const double *want) {
    for (int i = 0; i < V; i++)
        CHECK(fabs(freq[i] - want[i]) < 0.012, "%s: token %d frequency %.4f, expected %.4f", what, i, freq[i], want[i]);
}

/* g4_argmax against the plain loop (first index of the largest value; NaNs never win unless at
 * index 0) on random arrays with ties, infinities, NaNs and every tail length. */
static void argmax_matches_plain_loop(void) {
    unsigned seed = 12345;
    int bad = 0;
    for (int c = 0; c < 4000; c++) {
        int n = 1 + c % 70;
        float v[70];
        for (int i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            unsigned r = seed >> 16;
            v[i] = r % 13 == 0 ? NAN : r % 17 == 0 ? INFINITY : r % 19 == 0 ? -INFINITY : (float)(int)(r % 7) - 3.0f;
            if (c % 5 == 0) v[i] = -INFINITY;
        }
        int want = 0;
        for (int i = 1; i < n; i++)
            if (v[i] > v[want]) want = i;
        bad += g4_argmax(v, n) != want;
    }
    CHECK(bad == 0, "g4_argmax differs from the plain loop on %d of 4000 arrays", bad);
}

/* g4_sampling_is_argmax: where it says yes, the sampler's pick is g4_argmax's whatever the
 * history; greedy with a repetition penalty, or any temperature, is not a plain argmax. */
static void is_argmax_agrees(void) {
    const float logits[V] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
    const int32_t history[3] = {1, 3, 1};
    g4_sampling p = params(0, 0, 1, 0);
    CHECK(g4_sampling_is_argmax(&p), "greedy without a penalty is an argmax");
    g4_sampler *s = g4_sampler_new(&p, V);
    CHECK_EQ_INT(g4_sampler_sample(s, logits, history, 3), g4_argmax(logits, V));
    g4_sampler_free(s);
    p.repeat_penalty = 1.5f;
    CHECK(!g4_sampling_is_argmax(&p), "a repetition penalty is not a plain argmax");
    s = g4_sampler_new(&p, V);
    CHECK_EQ_INT(g4_sampler_sample(s, logits, history, 3), 4); /* 2.0 / 1.5 twice: 1.9 wins */
    g4_sampler_free(s);
    p = params(0.7f, 0, 1, 0);
    CHECK(!g4_sampling_is_argmax(&p), "temperature 0.7 is not an argmax");
}

/* g4_select_first with a comparator that is no order (NaN keys compared as floats, as
 * codes_argmax's and, before issue 33, the sampler's did): every comparison stays inside the
 * array and the call returns. The comparator counts the elements it is handed outside it (its
 * first argument is an element, its second the pivot's copy). */
static const float *sel_lo, *sel_hi;
static long sel_outside;
static int nan_blind_desc(const void *a, const void *b) {
    const float *x = a, *y = b;
    sel_outside += x < sel_lo || x >= sel_hi;
    return *x > *y ? -1 : *x != *y;
}

static void select_stays_inside(void) {
    unsigned seed = 777;
    long cases = 0;
    sel_outside = 0;
    for (int c = 0; c < 3000; c++) {
        int n = 2 + c % 61, k = 1 + (c / 61) % n;
        float v[64 + 2 * 16], *a = v + 16; /* room either side, so a stray read does not crash first */
        for (int i = 0; i < (int)(sizeof v / sizeof *v); i++) v[i] = NAN;
        for (int i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            unsigned r = seed >> 16;
            a[i] = r % 3 == 0 ? NAN : r % 11 == 0 ? INFINITY : r % 13 == 0 ? -INFINITY : (float)(int)(r % 5);
        }
        sel_lo = a, sel_hi = a + n;
        g4_select_first(a, (size_t)n, sizeof *a, (size_t)k, nan_blind_desc);
        cases++;
    }
    CHECK(sel_outside == 0, "%ld comparisons outside the array over %ld selections", sel_outside, cases);
    /* on NaN-free input it is still the selection: the k-th largest at k - 1, the larger before */
    float w[9] = {3, -1, 7, 7, 0, INFINITY, -INFINITY, 2, 5};
    sel_lo = w, sel_hi = w + 9;
    g4_select_first(w, 9, sizeof *w, 4, nan_blind_desc);
    CHECK(w[3] == 5 && fminf(fminf(w[0], w[1]), w[2]) >= 5, "4th largest %g", (double)w[3]);
}

/* Logits with NaNs, infinities and ties through every sampling path: a token of the vocabulary
 * always, NaNs never picked while any other token is there, infinite logits sharing the draw. */
static void non_finite_logits(void) {
    const float nan_mix[V] = {1.0f, NAN, 3.0f, NAN, 2.0f};
    double f[V];
    g4_sampling p = params(1, 2, 1, 0);
    frequencies(&p, nan_mix, 20000, f);
    double e = exp(1.0); /* top-2 of {1, 3, 2}: e^3 : e^2 */
    expect_freq("NaN logits, top-k 2", f, (double[]){0, 0, e / (e + 1), 0, 1 / (e + 1)});
    p = params(1, 0, 1, 0);
    frequencies(&p, nan_mix, 20000, f);
    double z = exp(1.0) + exp(3.0) + exp(2.0);
    expect_freq("NaN logits, every token", f, (double[]){exp(1.0) / z, 0, exp(3.0) / z, 0, exp(2.0) / z});
    const float inf_mix[V] = {0.0f, INFINITY, 1.0f, INFINITY, -INFINITY};
    p = params(1, 0, 0.9f, 0.1f);
    frequencies(&p, inf_mix, 20000, f);
    expect_freq("+inf logits share the draw", f, (double[]){0, 0.5, 0, 0.5, 0});
    g4_sampling g = params(0, 0, 1, 0);
    frequencies(&g, nan_mix, 10, f);
    expect_freq("greedy skips NaN", f, (double[]){0, 0, 1, 0, 0});
    /* all NaN or all -inf, every path: some token of the vocabulary */
    const float all_nan[V] = {NAN, NAN, NAN, NAN, NAN}, all_ninf[V] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    const int32_t hist[2] = {1, 3};
    g4_sampling ps[] = {params(0, 0, 1, 0), params(1, 0, 1, 0), params(1, 3, 1, 0), params(0.5f, 0, 0.5f, 0), params(2, 0, 1, 0.5f)};
    int bad = 0;
    for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) {
        ps[i].repeat_penalty = i % 2 ? 1.2f : 1;
        g4_sampler *s = g4_sampler_new(&ps[i], V);
        for (int r = 0; r < 50; r++) {
            int32_t a = g4_sampler_sample(s, all_nan, hist, 2), b = g4_sampler_sample(s, all_ninf, hist, 2);
            bad += a < 0 || a >= V || b < 0 || b >= V;
        }
        g4_sampler_free(s);
    }
    CHECK(bad == 0, "%d picks outside the vocabulary", bad);
}

/* Defect 9: temperatures below G4_GREEDY_TEMPERATURE are greedy (1e-40 gave garbage: logit / T
 * overflowed), the greedy line is 1e-5 as documented, and non-finite values are refused with
 * the field named. */
static void temperature_rule(void) {
    const float close[V] = {30.0f, 29.999f, 29.9f, -30.0f, 0.0f};
    const float tiny[] = {1e-40f, 1e-30f, 9.9e-6f};
    for (size_t i = 0; i < sizeof tiny / sizeof *tiny; i++) {
        g4_sampling p = params(tiny[i], 0, 1, 0);
        CHECK(g4_sampling_greedy(&p) && g4_sampling_is_argmax(&p) && g4_sampling_top_needed(&p, V) == 1, "T=%g is not greedy",
              (double)tiny[i]);
        double f[V];
        frequencies(&p, close, 200, f);
        expect_freq("tiny temperature", f, (double[]){1, 0, 0, 0, 0});
    }
    g4_sampling p = params(1e-5f, 0, 1, 0);
    CHECK(!g4_sampling_greedy(&p), "T=1e-5 samples");
    struct {
        g4_sampling p;
        const char *msg;
    } bad[] = {
        {params(INFINITY, 0, 1, 0), "temperature inf: expected a finite number >= 0 (below 1e-05: greedy)"},
        {params(NAN, 0, 1, 0), "temperature nan"},
        {params(-1e-30f, 0, 1, 0), "temperature -1e-30"},
        {params(1, 0, NAN, 0), "top-p nan: expected a number in (0, 1]"},
        {params(1, 0, 1, NAN), "min-p nan: expected a number in [0, 1]"},
        {params(1, -1, 1, 0), "top-k -1"},
    };
    bad[5].p.top_k = -1;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(g4_sampling_check(&bad[i].p) != 0 && strstr(g4_last_error(), bad[i].msg) && g4_sampler_new(&bad[i].p, V) == NULL,
              "case %zu: %s", i, g4_last_error());
    g4_sampling rp = params(1, 0, 1, 0);
    rp.repeat_penalty = INFINITY;
    CHECK(g4_sampling_check(&rp) != 0 && strstr(g4_last_error(), "repeat-penalty inf"), "%s", g4_last_error());
    rp = params(0, 0, 1, 0);
    CHECK(g4_sampling_check(&rp) == 0, "greedy refused: %s", g4_last_error());
}

/* The distribution at temperature 1 against the softmax of the logits worked out by hand. */
static void expect_softmax(const char *what, g4_sampler *s, const float *logits, const int32_t *hist, int n, const double *want_logits) {
    double probs[V], z = 0;
    g4_sampler_distribution(s, logits, hist, n, probs);
    for (int i = 0; i < V; i++) z += exp(want_logits[i]);
    for (int i = 0; i < V; i++)
        CHECK(fabs(probs[i] - exp(want_logits[i]) / z) < 1e-6, "%s: token %d probability %.7f, expected %.7f", what, i, probs[i],
              exp(want_logits[i]) / z);
}

/* OpenAI's penalties (their API reference): logit - count x frequency_penalty - (count > 0) x
 * presence_penalty, counting the generated tokens only; logit_bias added to the logit. */
static void openai_penalties(void) {
    const float logits[V] = {2.0f, 1.5f, 1.0f, 0.0f, -1.0f};
    /* prompt [0], then tokens 1, 1, 2 generated: token 0 is the prompt's and keeps its logit;
     * token 1: 1.5 - 2 x 0.3 - 0.4 = 0.5; token 2: 1.0 - 0.3 - 0.4 = 0.3 */
    const int32_t hist[4] = {0, 1, 1, 2};
    g4_sampling p = params(1, 0, 1, 0);
    p.frequency_penalty = 0.3f;
    p.presence_penalty = 0.4f;
    CHECK(!g4_sampling_is_argmax(&p) && g4_sampling_top_needed(&p, V) == 0, "OpenAI's penalties need every logit");
    /* even with a top-k or greedy: a penalised or biased token may come from outside the raw top */
    g4_sampling k = p;
    k.top_k = 2;
    CHECK(g4_sampling_top_needed(&k, V) == 0, "top-k 2 with OpenAI's penalties needs every logit");
    k.temperature = 0;
    CHECK(g4_sampling_top_needed(&k, V) == 0, "greedy with OpenAI's penalties needs every logit");
    g4_sampler *s = g4_sampler_new(&p, V);
    g4_sampler_set_prompt(s, 1);
    expect_softmax("frequency 0.3, presence 0.4", s, logits, hist, 4, (double[]){2.0, 0.5, 0.3, 0.0, -1.0});
    /* twice in a row: the counts start from zero at each pick */
    expect_softmax("the same pick again", s, logits, hist, 4, (double[]){2.0, 0.5, 0.3, 0.0, -1.0});
    /* negative penalties favour what was said: token 1: 1.5 + 2 x 0.3 + 0.4 = 2.5 */
    g4_sampler_free(s);
    p.frequency_penalty = -0.3f;
    p.presence_penalty = -0.4f;
    s = g4_sampler_new(&p, V);
    g4_sampler_set_prompt(s, 1);
    expect_softmax("negative penalties", s, logits, hist, 4, (double[]){2.0, 2.5, 1.7, 0.0, -1.0});
    g4_sampler_free(s);
    /* greedy: the prompt's tokens are not penalised (token 0 wins over 1 only when it is) */
    const float l2[V] = {1.0f, 1.2f, 0.0f, -1.0f, -2.0f};
    const int32_t h2[1] = {1};
    g4_sampling g = params(0, 0, 1, 0);
    g.presence_penalty = 0.5f;
    s = g4_sampler_new(&g, V);
    g4_sampler_set_prompt(s, 1);
    CHECK_EQ_INT(g4_sampler_sample(s, l2, h2, 1), 1);
    g4_sampler_set_prompt(s, 0);
    CHECK_EQ_INT(g4_sampler_sample(s, l2, h2, 1), 0);
    g4_sampler_free(s);
    /* logit_bias: +100 forces a token, -100 forbids one; entries for one id add up */
    const int32_t ids[3] = {4, 1, 1};
    const float up[3] = {100, 0, 0}, down[3] = {0, -60, -40};
    g = params(0, 0, 1, 0);
    g.bias_ids = ids, g.bias_values = up, g.n_bias = 3;
    CHECK(!g4_sampling_is_argmax(&g), "a logit bias is not a plain argmax");
    s = g4_sampler_new(&g, V);
    CHECK_EQ_INT(g4_sampler_sample(s, l2, NULL, 0), 4);
    g4_sampler_free(s);
    g.bias_values = down;
    s = g4_sampler_new(&g, V);
    CHECK_EQ_INT(g4_sampler_sample(s, l2, NULL, 0), 0);
    g4_sampler_free(s);
    p = params(1, 0, 1, 0);
    p.bias_ids = ids, p.bias_values = down, p.n_bias = 3;
    s = g4_sampler_new(&p, V);
    expect_softmax("bias -60 - 40", s, l2, NULL, 0, (double[]){1.0, 1.2 - 100, 0.0, -1.0, -2.0});
    g4_sampler_free(s);
    /* the sampler copies the bias: the caller's arrays may change after */
    float changing[3] = {100, 0, 0};
    g.bias_values = changing;
    s = g4_sampler_new(&g, V);
    changing[0] = -100;
    CHECK_EQ_INT(g4_sampler_sample(s, l2, NULL, 0), 4);
    g4_sampler_free(s);
    /* refusals: a bias outside [-100, 100], an id outside the vocabulary, a non-finite penalty */
    const float too_big[1] = {100.5f};
    const int32_t outside[1] = {V};
    g.bias_ids = ids, g.bias_values = too_big, g.n_bias = 1;
    CHECK(g4_sampler_new(&g, V) == NULL && strstr(g4_last_error(), "[-100, 100]"), "a bias of 100.5 accepted");
    g.bias_ids = outside, g.bias_values = up;
    CHECK(g4_sampler_new(&g, V) == NULL && strstr(g4_last_error(), "outside the vocabulary"), "a bias on token %d accepted", V);
    g.n_bias = 0;
    g.frequency_penalty = INFINITY;
    CHECK(g4_sampler_new(&g, V) == NULL, "an infinite frequency penalty accepted");
}

int main(void) {
    argmax_matches_plain_loop();
    is_argmax_agrees();
    select_stays_inside();
    non_finite_logits();
    temperature_rule();
    openai_penalties();
    /* probabilities 0.5, 0.3, 0.2, 0, 0 (two tokens at -inf) */
    const float logits[V] = {logf(0.5f), logf(0.3f), logf(0.2f), -INFINITY, -INFINITY};
    double f[V];
    g4_sampling p = params(1, 0, 1, 0);
    frequencies(&p, logits, 40000, f);
    expect_freq("T=1", f, (double[]){0.5, 0.3, 0.2, 0, 0});
    p = params(1, 2, 1, 0);
    frequencies(&p, logits, 40000, f);
    expect_freq("top-k 2", f, (double[]){0.625, 0.375, 0, 0, 0});
    p = params(1, 0, 0.75f, 0);
    frequencies(&p, logits, 40000, f);
    expect_freq("top-p 0.75", f, (double[]){0.625, 0.375, 0, 0, 0});
    p = params(1, 0, 1, 0.5f);
    frequencies(&p, logits, 40000, f);
    expect_freq("min-p 0.5", f, (double[]){0.625, 0.375, 0, 0, 0});
    /* T = 2: p^(1/2) renormalised */
    double a = sqrt(0.5), b = sqrt(0.3), c = sqrt(0.2), z = a + b + c;
    p = params(2, 0, 1, 0);
    frequencies(&p, logits, 40000, f);
    expect_freq("T=2", f, (double[]){a / z, b / z, c / z, 0, 0});
    p = params(1, 1, 1, 0);
    frequencies(&p, logits, 2000, f);
    expect_freq("top-k 1", f, (double[]){1, 0, 0, 0, 0});

    /* same seed, same tokens; another seed, another sequence */
    g4_sampling s1 = params(1, 0, 1, 0), s2 = s1;
    s2.seed = 43;
    g4_sampler *x = g4_sampler_new(&s1, V), *y = g4_sampler_new(&s1, V), *w = g4_sampler_new(&s2, V);
    int differ_same = 0, differ_other = 0;
    for (int i = 0; i < 200; i++) {
        int32_t tx = g4_sampler_sample(x, logits, NULL, 0);
        differ_same += tx != g4_sampler_sample(y, logits, NULL, 0);
        differ_other += tx != g4_sampler_sample(w, logits, NULL, 0);
    }
    CHECK(differ_same == 0, "same seed gave different tokens %d times", differ_same);
    CHECK(differ_other > 0, "another seed gave the same 200 tokens");
    g4_sampler_free(x);
    g4_sampler_free(y);
    g4_sampler_free(w);

    /* greedy with the repetition penalty (HF rule): logits 2.0, 1.5, -1: token 0 seen -> 2.0/2 = 1.0 < 1.5 */
    const float l2[V] = {2.0f, 1.5f, -1.0f, -3.0f, -4.0f};
    g4_sampling g = params(0, 0, 1, 0);
    g4_sampler *gs = g4_sampler_new(&g, V);
    CHECK_EQ_INT(g4_sampler_sample(gs, l2, NULL, 0), 0);
    g4_sampler_free(gs);
    g.repeat_penalty = 2;
    gs = g4_sampler_new(&g, V);
    int32_t hist[3] = {0, 0, 2};
    CHECK_EQ_INT(g4_sampler_sample(gs, l2, hist, 3), 1);
    /* token 1 seen too: 1.5 / 2 = 0.75 < 1.0 = token 0 */
    int32_t hist2[2] = {0, 1};
    CHECK_EQ_INT(g4_sampler_sample(gs, l2, hist2, 2), 0);
    /* negative logits are multiplied (HF: score < 0 ? score * penalty : score / penalty): token 1
     * seen, -0.8 * 2 = -1.6 < -1.0 = token 0 (dividing would give -0.4 and pick token 1) */
    const float l3[V] = {-1.0f, -0.8f, -3.0f, -4.0f, -5.0f};
    int32_t hist4[1] = {1};
    CHECK_EQ_INT(g4_sampler_sample(gs, l3, NULL, 0), 1);
    CHECK_EQ_INT(g4_sampler_sample(gs, l3, hist4, 1), 0);
    g4_sampler_free(gs);
    /* repeat_last_n limits the window to the last N tokens: token 0 is outside the last 1 token,
     * and inside it when it is the last one (2.0 / 2 = 1.0 < 1.5 = token 1) */
    g.repeat_last_n = 1;
    gs = g4_sampler_new(&g, V);
    int32_t hist3[2] = {0, 3}, hist5[2] = {3, 0};
    CHECK_EQ_INT(g4_sampler_sample(gs, l2, hist3, 2), 0);
    CHECK_EQ_INT(g4_sampler_sample(gs, l2, hist5, 2), 1);
    g4_sampler_free(gs);

    /* invalid parameters */
    g4_sampling bad = params(-1, 0, 1, 0);
    CHECK(g4_sampler_new(&bad, V) == NULL && strstr(g4_last_error(), "temperature"), "negative temperature accepted");
    bad = params(1, 0, 0, 0);
    CHECK(g4_sampler_new(&bad, V) == NULL, "top-p 0 accepted");
    return check_report("sampler");
}
