/* The attention schedule every vector level shares: which rows and heads run on which thread,
 * the score buffers, and the order of the phases. A level supplies two kernels over a run of
 * heads that read one KV head (g4_attn_ops); everything they compute is defined by the reference
 * (kernels/ref.c), so the schedule never changes a bit. The head dim's tail beyond a multiple of
 * 8 is scalar here, as in the reference.
 *
 * Many query rows (prefill): one work item per (row, KV head) runs scores, softmax and values for
 * all the heads of the group, so each K and V row is loaded once for the group.
 * Few query rows (decode): the group's heads are split into one run per thread, and each item
 * does its run start to end. A K/V row is then converted once per run instead of once per group
 * (about a fifth more arithmetic for 8 heads on 2 threads), but the layer takes one pass over
 * the pool instead of three (scores, softmax, values), which measured 0.55-0.65 ms per token
 * faster on E2B at 512 positions. */
#include <math.h>
#include <stdlib.h>

#include "attention.h"
#include "levels.h"
#include "pool.h"

static int count_of(const g4_attn *a, int t) { return a->rows[t].hi - a->rows[t].lo + 1; }

/* The softmax of one head's scores (kernels.h, g4_attn): the level's vector steps on the multiples of 8, the
 * rest here, every element landing in the lane the reference gives it. */
static void softmax(const g4_attn_ops *ops, float *sc, int count) {
    const int n8 = count & ~7;
    float lanes[8], mx = -INFINITY;
    for (int l = 0; l < 8; l++) lanes[l] = -INFINITY;
    ops->softmax_max(sc, n8, lanes);
    for (int l = 0; l < 8; l++)
        if (lanes[l] > mx) mx = lanes[l];
    for (int i = n8; i < count; i++)
        if (sc[i] > mx) mx = sc[i];
    for (int l = 0; l < 8; l++) lanes[l] = 0;
    ops->softmax_exp(sc, n8, mx, lanes);
    for (int i = n8; i < count; i++) lanes[i & 7] += sc[i] = g4_expf(sc[i] - mx);
    const float sum = g4_reduce8(lanes);
    ops->softmax_div(sc, n8, sum);
    for (int i = n8; i < count; i++) sc[i] = sc[i] / sum;
}

/* Bytes of V rows one values pass reads, so that they stay in L1 across the elements it does. */
#define VALUES_BLOCK 16384

/* out elements [d0, d1) of heads [h0, h0 + nh) of row t from the weights at scores: the level's
 * kernel on the multiples of 8, a block of positions at a time, and the reference's loop on the
 * rest of the head dim. */
static void run_values(const g4_attn *a, const g4_attn_ops *ops, int t, int h0, int nh, const float *scores, int d0, int d1) {
    const g4_attn_row *c = &a->rows[t];
    const int hd = a->head_dim, hd8 = hd & ~7, count = count_of(a, t), dv = d1 < hd8 ? d1 : hd8;
    const size_t off = (size_t)(h0 / a->group) * hd, stride = (size_t)a->kv_width;
    int jblock = (int)(VALUES_BLOCK / ((size_t)(d1 - d0) * (c->vq ? 1 : 4)));
    if (jblock < 1) jblock = 1;
    for (int j0 = 0; j0 < count; j0 += jblock) {
        int j1 = count - j0 > jblock ? j0 + jblock : count;
        if (d0 < dv) ops->values(a, t, h0, nh, scores, d0, dv, j0, j1);
        for (int h = 0; h < nh; h++) {
            float *out = a->out + ((size_t)t * a->n_heads + (size_t)(h0 + h)) * hd;
            for (int d = hd8 > d0 ? hd8 : d0; d < d1; d++) {
                float acc = j0 ? out[d] : 0.0f;
                for (int i = j0; i < j1; i++) {
                    size_t row = (size_t)(c->lo + i) * stride + off + (size_t)d;
                    acc = fmaf(scores[(size_t)h * count + i], c->vq ? (float)c->vq[row] : c->vf[row], acc);
                }
                out[d] = j1 == count && c->vq ? acc * c->v_scale : acc;
            }
        }
    }
}

typedef struct {
    const g4_attn *a;
    const g4_attn_ops *ops;
    int parts; /* items per (row, KV head): its group of heads split into this many runs */
} row_job;

static void row_items(void *ctx, int b, int e) {
    const row_job *j = ctx;
    const g4_attn *a = j->a;
    int n_kv = a->n_heads / a->group, most = 1, per = (a->group + j->parts - 1) / j->parts;
    for (int i = b; i < e; i++)
        if (count_of(a, i / (n_kv * j->parts)) > most) most = count_of(a, i / (n_kv * j->parts));
    float *scores = malloc(sizeof *scores * (size_t)most * (size_t)per);
    for (int i = b; i < e; i++) {
        int t = i / (n_kv * j->parts), kv = i / j->parts % n_kv, part = i % j->parts, count = count_of(a, t);
        int h0 = kv * a->group + part * per, nh = a->group - part * per < per ? a->group - part * per : per;
        if (nh <= 0) continue;
        if (!scores) { /* out of memory: the reference recomputes what it cannot keep */
            for (int h = h0; h < h0 + nh; h++) g4_ref_attention_head(a, t, h, NULL);
            continue;
        }
        j->ops->scores(a, t, h0, nh, scores, 0, count);
        for (int h = 0; h < nh; h++) softmax(j->ops, scores + (size_t)h * count, count);
        run_values(a, j->ops, t, h0, nh, scores, 0, a->head_dim);
    }
    free(scores);
}

/* Many query rows over one shared key range (the vision tower's bidirectional attention: 2,304
 * patches each seeing all 2,304 keys): a work item is a tile of TILE_ROWS query rows x one KV
 * head, and its scores and values passes go over the keys TILE_KEYS at a time, every row of the
 * tile taking its turn on a K (then V) block while the block is in L1, instead of each row
 * streaming the whole K and V of its head from memory. The level's kernels compute every score
 * alone and sum every output element over the positions in order whatever the blocks (their
 * contract, attention.h), so the bits are the row schedule's. */
#define TILE_ROWS 16
#define TILE_KEYS 64 /* 64 keys x a head dim of 64 x 4 B: 16 KB of K or V */

/* 1 when every row attends to the same positions of the same cache, so a key block serves them all. */
static int shares_keys(const g4_attn *a) {
    const g4_attn_row *r0 = &a->rows[0];
    for (int t = 1; t < a->n; t++) {
        const g4_attn_row *r = &a->rows[t];
        if (r->lo != r0->lo || r->hi != r0->hi || r->kq != r0->kq || r->vq != r0->vq || r->kf != r0->kf || r->vf != r0->vf ||
            r->k_scale != r0->k_scale || r->v_scale != r0->v_scale)
            return 0;
    }
    return 1;
}

static void tile_items(void *ctx, int b, int e) {
    const row_job *j = ctx;
    const g4_attn *a = j->a;
    const int n_kv = a->n_heads / a->group, nh = a->group, count = count_of(a, 0), hd = a->head_dim;
    const size_t per_row = (size_t)nh * count;
    float *scores = malloc(sizeof *scores * per_row * TILE_ROWS);
    for (int i = b; i < e; i++) {
        int t0 = i / n_kv * TILE_ROWS, h0 = i % n_kv * nh, t1 = t0 + TILE_ROWS < a->n ? t0 + TILE_ROWS : a->n;
        if (!scores) { /* out of memory: the reference recomputes what it cannot keep */
            for (int t = t0; t < t1; t++)
                for (int h = h0; h < h0 + nh; h++) g4_ref_attention_head(a, t, h, NULL);
            continue;
        }
        for (int k0 = 0; k0 < count; k0 += TILE_KEYS) {
            int k1 = count - k0 > TILE_KEYS ? k0 + TILE_KEYS : count;
            for (int t = t0; t < t1; t++) j->ops->scores(a, t, h0, nh, scores + (size_t)(t - t0) * per_row, k0, k1);
        }
        for (int t = t0; t < t1; t++)
            for (int h = 0; h < nh; h++) softmax(j->ops, scores + (size_t)(t - t0) * per_row + (size_t)h * count, count);
        /* two rows at a time where the level can (one head each, f32 V): each V block is read once for both */
        int pairs = j->ops->values_rows2 && nh == 1 && !a->rows[t0].vq;
        for (int k0 = 0; k0 < count; k0 += TILE_KEYS) {
            int k1 = count - k0 > TILE_KEYS ? k0 + TILE_KEYS : count;
            for (int t = t0; t < t1;) {
                const float *sc = scores + (size_t)(t - t0) * per_row;
                if (pairs && t + 1 < t1) {
                    j->ops->values_rows2(a, t, h0, sc, sc + per_row, k0, k1);
                    t += 2;
                } else {
                    j->ops->values(a, t, h0, nh, sc, 0, hd, k0, k1);
                    t++;
                }
            }
        }
    }
    free(scores);
}

void g4_attention_run(const g4_attn *a, const g4_attn_ops *ops) {
    if (a->n <= 0 || a->n_heads <= 0) return;
    if (a->group <= 0 || a->n_heads % a->group) { /* not a grouped layout the schedule knows */
        g4_portable_attention(a);
        return;
    }
    int n_kv = a->n_heads / a->group;
    /* the head dim's tail beyond a multiple of 8 is run_values' (the row schedule) */
    if (a->n >= 2 * TILE_ROWS && a->head_dim % 8 == 0 && shares_keys(a)) {
        row_job j = {a, ops, 1};
        g4_pool_for((a->n + TILE_ROWS - 1) / TILE_ROWS * n_kv, 1, g4_attention_work(a), tile_items, &j);
        return;
    }
    /* few rows (decode): each group of heads split so that every thread gets a run of heads */
    int parts = 1;
    if (a->n * n_kv < 4) {
        parts = g4_kernels_threads();
        if (parts > a->group) parts = a->group;
        if (parts < 1) parts = 1;
    }
    row_job j = {a, ops, parts};
    g4_pool_for(a->n * n_kv * parts, 1, g4_attention_work(a), row_items, &j);
}
