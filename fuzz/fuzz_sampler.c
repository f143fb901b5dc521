/* Fuzz target: the token sampler (src/generate/sampler.h) on raw logits.
 *
 * Input: 8 setting bytes, then the logits as raw little-endian floats (every bit pattern: NaN,
 * +-inf, denormals, ties), the vocabulary being as many as there are (1 to 512), then the
 * repetition history as 16-bit ids (some outside the vocabulary).
 *   byte 0: temperature (a table: 0, below and at the greedy line, ordinary, huge)
 *   byte 1: top-k (0 off, else 1 + byte % (vocab + 2), past the vocabulary too)
 *   byte 2: top-p (byte / 255, 0 made 1); byte 3: min-p (byte / 255 when below 128, else 0)
 *   byte 4: repetition penalty (a table, 1 = off); byte 5: repeat_last_n (byte % 8)
 *   byte 6: the seed; byte 7: how many logits (n x 4 bytes) follow before the history, 0: all
 * Every path runs: g4_sampler_sample, g4_sampler_distribution, g4_sampler_sample_top on the
 * top candidates with their bound, g4_sampler_draw_from on the distribution. Checked:
 *   - every token returned is in [0, vocab) (sample_top and draw_from: or -1);
 *   - the distribution is in [0, 1] and sums to 1 (to 1e-9), whatever the logits; a token drawn
 *     from it has a non-zero probability;
 *   - greedy without a penalty on NaN-free logits picks g4_argmax's token. */
#include <math.h>

#include "generate/sampler.h"
#include "util/err.h"

#include "fuzz_common.h"

#define MAX_VOCAB 512

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g4_set_log(NULL, NULL);
    return 0;
}

static const float temperatures[8] = {0.0f, 1e-40f, 9.9e-6f, 1e-5f, 0.7f, 1.0f, 2.0f, 1e30f};
static const float penalties[4] = {1.0f, 1.3f, 0.5f, 1e30f};

static int all_finite(const float *v, int n) {
    for (int i = 0; i < n; i++)
        if (!isfinite(v[i])) return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 8 + 4) return 0;
    g4_sampling p;
    g4_sampling_default(&p);
    p.temperature = temperatures[data[0] % 8];
    p.top_p = data[2] ? data[2] / 255.0f : 1.0f;
    p.min_p = data[3] < 128 ? data[3] / 255.0f : 0.0f;
    p.repeat_penalty = penalties[data[4] % 4];
    p.repeat_last_n = data[5] % 8;
    p.seed = data[6];
    size_t body = size - 8, n_logits = data[7] ? (size_t)data[7] : body / 4;
    if (n_logits > body / 4) n_logits = body / 4;
    if (n_logits > MAX_VOCAB) n_logits = MAX_VOCAB;
    if (n_logits < 1) return 0;
    int V = (int)n_logits;
    p.top_k = data[1] ? 1 + data[1] % (V + 2) : 0;
    float logits[MAX_VOCAB];
    memcpy(logits, data + 8, n_logits * 4);
    const uint8_t *h = data + 8 + n_logits * 4;
    int32_t history[256];
    int n_hist = (int)((size - 8 - n_logits * 4) / 2);
    if (n_hist > 256) n_hist = 256;
    for (int i = 0; i < n_hist; i++) history[i] = (int32_t)(h[2 * i] | h[2 * i + 1] << 8) % (V + 3) - 1; /* -1 and past V too */

    g4_sampler *s = g4_sampler_new(&p, V);
    FZ_CHECK(s != NULL, "sampler refused valid parameters: %s", g4_last_error());
    int32_t t = g4_sampler_sample(s, logits, history, n_hist);
    FZ_CHECK(t >= 0 && t < V, "sample gave %d of %d", t, V);
    int nan_free = 1;
    for (int i = 0; i < V; i++) nan_free &= !isnan(logits[i]);
    if (g4_sampling_is_argmax(&p) && nan_free) FZ_CHECK(t == g4_argmax(logits, V), "greedy %d, argmax %d", t, g4_argmax(logits, V));

    double probs[MAX_VOCAB], sum = 0;
    g4_sampler_distribution(s, logits, history, n_hist, probs);
    for (int i = 0; i < V; i++) {
        FZ_CHECK(probs[i] >= 0 && probs[i] <= 1, "probability %g of token %d", probs[i], i);
        sum += probs[i];
    }
    FZ_CHECK(fabs(sum - 1) < 1e-9, "the distribution sums to %.17g", sum);
    int32_t d = g4_sampler_draw_from(s, probs);
    FZ_CHECK(d >= 0 && d < V && probs[d] > 0, "draw_from gave %d", d);
    FZ_CHECK(g4_sampler_uniform(s) >= 0, "uniform");

    /* the candidates path: the k best ids by a NaN-last order, their logits, the bound below */
    int k = g4_sampling_top_needed(&p, V);
    if (k > 0 && all_finite(logits, V)) {
        int32_t ids[MAX_VOCAB], pen[256];
        float vals[MAX_VOCAB];
        int m = 0, n_pen = g4_sampling_penalized(&p, history, n_hist, pen);
        char taken[MAX_VOCAB] = {0};
        for (int r = 0; r < k; r++) { /* selection sort: small k */
            int best = -1;
            for (int i = 0; i < V; i++)
                if (!taken[i] && (best < 0 || logits[i] > logits[best])) best = i;
            taken[best] = 1, ids[m] = best, vals[m++] = logits[best];
        }
        for (int i = 0; i < n_pen; i++)
            if (pen[i] >= 0 && pen[i] < V && !taken[pen[i]]) taken[pen[i]] = 1, ids[m] = pen[i], vals[m++] = logits[pen[i]];
        float bound = -INFINITY;
        for (int i = 0; i < V; i++)
            if (!taken[i] && logits[i] > bound) bound = logits[i];
        int32_t c = g4_sampler_sample_top(s, ids, vals, m, bound, history, n_hist);
        FZ_CHECK(c >= -1 && c < V, "sample_top gave %d", c);
    }
    g4_sampler_free(s);
    return 0;
}
