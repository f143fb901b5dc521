/* The shared attention schedule (kernels/attention.c) and the kernels a level gives it
 * (internal to src/kernels/). Each kernel works on heads [h0, h0 + nh) of query row t, all of
 * which read one KV head, and must compute exactly what g4_ref_attention_head does. */
#ifndef G4_KERNELS_ATTENTION_H
#define G4_KERNELS_ATTENTION_H

#include "kernels.h"

typedef struct {
    /* scores[h * count + j] for h < nh and positions j in [j0, j1) (relative to the row's lo;
     * count = hi - lo + 1): k_scale * dot(q, k_j) or dot(q, k_j) */
    void (*scores)(const g4_attn *a, int t, int h0, int nh, float *scores, int j0, int j1);
    /* out elements [d0, d1) of each head (both multiples of 8) summed over positions [j0, j1) in
     * order, from +0 when j0 == 0 and from out otherwise; times v_scale (int8 V) when j1 is the
     * row's last position. The schedule does the head dim's tail that is not a multiple of 8. */
    void (*values)(const g4_attn *a, int t, int h0, int nh, const float *scores, int d0, int d1, int j0, int j1);
    /* The softmax's vector steps (kernels.h, g4_attn) over sc[0, n8), n8 a multiple of 8 (the schedule does the
     * frame: the max of the lanes, the tail beyond n8, the lane sum): lanes[l] = the running max
     * of positions l mod 8 from lanes[l] (a NaN score never wins; which of +-0 wins cannot change
     * score - max); sc = g4_expf(sc - mx) in place with lanes[l] += each, in order; sc /= sum. */
    void (*softmax_max)(const float *sc, int n8, float lanes[8]);
    void (*softmax_exp)(float *sc, int n8, float mx, float lanes[8]);
    void (*softmax_div)(float *sc, int n8, float sum);
    /* Optional (NULL: values row by row): values of head h of rows t and t + 1, which see the same
     * positions of the same f32 V, over [j0, j1), elements [0, head_dim) (a multiple of 8), from
     * scores sc0 and sc1 (relative to lo): each element exactly as `values` gives it, the two
     * rows side by side so that each V row is loaded once for both. */
    void (*values_rows2)(const g4_attn *a, int t, int h, const float *sc0, const float *sc1, int j0, int j1);
} g4_attn_ops;

void g4_attention_run(const g4_attn *a, const g4_attn_ops *ops);

/* For a level: defines `static const g4_attn_ops OPS` from its register-tile kernels
 *   HEADS_SCORES(a, t, h0, scores, j0, j1, W) and HEADS_VALUES(a, t, h0, scores, d0, d1, j0, j1, W)
 * (scores pointing at head h0's row), instantiated for W = 8, 4, 2 and 1 heads, and its softmax
 * steps SOFTMAX_max, SOFTMAX_exp and SOFTMAX_div. */
#define G4_ATTN_WIDTH_LOOP(KERNEL, ...)                                                 \
    for (int h = h0; h < h0 + nh;) {                                                    \
        int w = h0 + nh - h >= 8 ? 8 : h0 + nh - h >= 4 ? 4 : h0 + nh - h >= 2 ? 2 : 1; \
        float *sc = (float *)scores + (size_t)(h - h0) * count;                         \
        if (w == 8) KERNEL(a, t, h, sc, __VA_ARGS__, 8);                                \
        else if (w == 4) KERNEL(a, t, h, sc, __VA_ARGS__, 4);                           \
        else if (w == 2) KERNEL(a, t, h, sc, __VA_ARGS__, 2);                           \
        else KERNEL(a, t, h, sc, __VA_ARGS__, 1);                                       \
        h += w;                                                                         \
    }
#define G4_ATTN_OPS(OPS, HEADS_SCORES, HEADS_VALUES, SOFTMAX, VALUES_ROWS2)                                       \
    static void OPS##_scores(const g4_attn *a, int t, int h0, int nh, float *scores, int j0, int j1) {       \
        const int count = a->rows[t].hi - a->rows[t].lo + 1;                                                 \
        G4_ATTN_WIDTH_LOOP(HEADS_SCORES, j0, j1)                                                             \
    }                                                                                                        \
    static void OPS##_values(const g4_attn *a, int t, int h0, int nh, const float *scores, int d0, int d1,    \
                             int j0, int j1) {                                                               \
        const int count = a->rows[t].hi - a->rows[t].lo + 1;                                                 \
        G4_ATTN_WIDTH_LOOP(HEADS_VALUES, d0, d1, j0, j1)                                                     \
    }                                                                                                        \
    static const g4_attn_ops OPS = {OPS##_scores, OPS##_values, SOFTMAX##_max, SOFTMAX##_exp, SOFTMAX##_div, VALUES_ROWS2};

#endif
