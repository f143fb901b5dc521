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
    /* one head's scores, in place, into softmax weights: max, expf, the sum in order, e / sum */
    void (*softmax)(float *scores, int count);
    /* out elements [d0, d1) of each head from the weights (d0 a multiple of 8, d1 a multiple of 8
     * or the head dim) */
    void (*values)(const g4_attn *a, int t, int h0, int nh, const float *scores, int d0, int d1);
} g4_attn_ops;

void g4_attention_run(const g4_attn *a, const g4_attn_ops *ops);

/* For a level's kernels: runs FN(first head, width) over heads [h0, h1) in groups of 8, 4, 2 and
 * 1, the widths a level instantiates its register tiles for. */
#define G4_ATTN_BY_WIDTH(FN, h0, h1)                                          \
    for (int h_ = (h0); h_ < (h1);) {                                         \
        int k_ = (h1) - h_, w_ = k_ >= 8 ? 8 : k_ >= 4 ? 4 : k_ >= 2 ? 2 : 1; \
        switch (w_) {                                                         \
        case 8: FN(h_, 8); break;                                             \
        case 4: FN(h_, 4); break;                                             \
        case 2: FN(h_, 2); break;                                             \
        default: FN(h_, 1); break;                                            \
        }                                                                     \
        h_ += w_;                                                             \
    }

#endif
