/* The vision tower's loader and forward pass (modeling_gemma4.py: Gemma4VisionModel,
 * Gemma4VisionEncoderLayer, Gemma4VisionAttention, Gemma4VisionPooler; Gemma4MultimodalEmbedder).
 * Every tower linear runs through the text model's linear step (g4_forward_linear in a session of
 * its own), so float / fake / int modes, the ablation switches and the kernel levels apply as
 * for the text decoder. The elementwise steps here are plain C, the same on every level. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/session.h"
#include "model/tower.h"
#include "util/err.h"
#include "util/file.h"
#include "vision/tower.h"

#define VT "model.vision_tower."
#define TOWER "vision tower"

typedef struct {
    g4_clip_linear q, k, v, o, gate, up, down;
    float *ln_in, *ln_post_attn, *ln_pre_ffw, *ln_post_ffw, *q_norm, *k_norm;
} vt_layer;

struct g4_vision_tower {
    int hidden, n_layers, heads, head_dim, mlp, patch, pool, pos_size, text_hidden, default_tokens;
    float eps, root_hidden;
    int clipped, standardize;
    g4_linear patch_proj;  /* patch_embedder.input_proj, float (BF16) */
    float *pos_table;      /* [2, pos_size, hidden] */
    vt_layer *layers;
    float *std_bias, *std_scale; /* standardize only */
    float *embed_w;        /* embed_vision.embedding_projection [text_hidden, hidden], f32 */
    float *inv_freq;       /* [head_dim / 4] */
    g4_tower_mem mem;
};

static void vt_free(void *ptr) {
    g4_vision_tower *vt = ptr;
    if (!vt) return;
    g4_tower_mem_free(&vt->mem);
    free(vt->layers);
    free(vt);
}

static float *load_floats(g4_model *m, g4_vision_tower *vt, const char *name, int ndim, const int64_t *shape) {
    return g4_tower_floats(m, &vt->mem, TOWER, name, ndim, shape);
}

static float *load_vec(g4_model *m, g4_vision_tower *vt, const char *name, int n) { return g4_tower_vec(m, &vt->mem, TOWER, name, n); }

static int bind_clippable(g4_model *m, g4_vision_tower *vt, g4_clip_linear *L, const char *module, int in, int out) {
    return g4_tower_bind_clippable(m, &vt->mem, TOWER, L, module, in, out, vt->clipped);
}

/* ---- vision_config ---- */

static int cfg_int(const cJSON *vc, const char *path, const char *key, int def, int lo, int hi, int *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(vc, key);
    if (!j || cJSON_IsNull(j)) {
        if (def < lo) return g4_fail("%s: vision_config.%s missing", path, key);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(j) || j->valuedouble != (double)(int)j->valuedouble || j->valuedouble < lo || j->valuedouble > hi)
        return g4_fail("%s: vision_config.%s must be an integer in [%d, %d]", path, key, lo, hi);
    *out = (int)j->valuedouble;
    return 0;
}

static int read_vision_config(const g4_model *m, g4_vision_tower *vt, double *theta) {
    char path[4096];
    if (g4_path_join(path, sizeof path, m->dir, "config.json")) return -1;
    char *text;
    if (g4_read_file(path, &text, NULL)) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return g4_fail("%s: not JSON", path);
    const cJSON *vc = cJSON_GetObjectItemCaseSensitive(root, "vision_config");
    int rc = -1, kv = 0;
    if (!cJSON_IsObject(vc)) {
        g4_fail("%s: no vision_config: this model takes no images", path);
        goto done;
    }
    if (cfg_int(vc, path, "hidden_size", -1, 1, 1 << 16, &vt->hidden) || cfg_int(vc, path, "num_hidden_layers", -1, 1, 1024, &vt->n_layers) ||
        cfg_int(vc, path, "num_attention_heads", -1, 1, 1024, &vt->heads) ||
        cfg_int(vc, path, "num_key_value_heads", -1, 1, 1024, &kv) || cfg_int(vc, path, "intermediate_size", -1, 1, 1 << 20, &vt->mlp) ||
        cfg_int(vc, path, "patch_size", -1, 1, 256, &vt->patch) || cfg_int(vc, path, "pooling_kernel_size", -1, 1, 16, &vt->pool) ||
        cfg_int(vc, path, "position_embedding_size", -1, 1, 1 << 20, &vt->pos_size) ||
        cfg_int(vc, path, "head_dim", vt->hidden / vt->heads, 1, 4096, &vt->head_dim))
        goto done;
    if (kv != vt->heads) {
        g4_fail("%s: vision_config.num_key_value_heads %d differs from num_attention_heads %d (grouped vision attention is not supported)", path, kv, vt->heads);
        goto done;
    }
    if (vt->head_dim % 4 || vt->head_dim > 256) {
        g4_fail("%s: vision_config.head_dim %d: g4 takes a multiple of 4 (2-D RoPE halves) up to 256", path, vt->head_dim);
        goto done;
    }
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(vc, "rms_norm_eps");
    vt->eps = cJSON_IsNumber(eps) ? (float)eps->valuedouble : 1e-6f;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(vc, "rope_parameters");
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(rp, "rope_theta");
    const cJSON *rt = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
    if (cJSON_IsString(rt) && strcmp(rt->valuestring, "axial") != 0) {
        g4_fail("%s: vision_config.rope_parameters.rope_type \"%s\": only \"axial\" is supported", path, rt->valuestring);
        goto done;
    }
    *theta = cJSON_IsNumber(th) ? th->valuedouble : 100.0;
    vt->clipped = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(vc, "use_clipped_linears"));
    vt->standardize = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(vc, "standardize"));
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    const cJSON *th2 = cJSON_GetObjectItemCaseSensitive(tc ? tc : root, "hidden_size");
    vt->text_hidden = cJSON_IsNumber(th2) ? (int)th2->valuedouble : m->cfg.hidden;
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

/* processor_config.json's image_processor.max_soft_tokens, else the processor's default 280. */
static int read_default_tokens(const g4_model *m) {
    char path[4096];
    if (g4_path_join(path, sizeof path, m->dir, "processor_config.json") || !g4_file_exists(path)) return 280;
    char *text;
    if (g4_read_file(path, &text, NULL)) return 280;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *ip = cJSON_GetObjectItemCaseSensitive(root, "image_processor");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(ip ? ip : root, "max_soft_tokens");
    int v = cJSON_IsNumber(t) ? (int)t->valuedouble : 280;
    cJSON_Delete(root);
    return v;
}

/* ---- loading ---- */

static int bind_layer(g4_model *m, g4_vision_tower *vt, int l) {
    vt_layer *L = &vt->layers[l];
    char p[160], n[224];
    int H = vt->hidden, QD = vt->heads * vt->head_dim;
    snprintf(p, sizeof p, VT "encoder.layers.%d.", l);
#define MOD(s) (snprintf(n, sizeof n, "%s%s", p, s), n)
    if (bind_clippable(m, vt, &L->q, MOD("self_attn.q_proj"), H, QD) || bind_clippable(m, vt, &L->k, MOD("self_attn.k_proj"), H, QD) ||
        bind_clippable(m, vt, &L->v, MOD("self_attn.v_proj"), H, QD) || bind_clippable(m, vt, &L->o, MOD("self_attn.o_proj"), QD, H) ||
        bind_clippable(m, vt, &L->gate, MOD("mlp.gate_proj"), H, vt->mlp) || bind_clippable(m, vt, &L->up, MOD("mlp.up_proj"), H, vt->mlp) ||
        bind_clippable(m, vt, &L->down, MOD("mlp.down_proj"), vt->mlp, H))
        return -1;
    if (!(L->ln_in = load_vec(m, vt, MOD("input_layernorm.weight"), H)) ||
        !(L->ln_post_attn = load_vec(m, vt, MOD("post_attention_layernorm.weight"), H)) ||
        !(L->ln_pre_ffw = load_vec(m, vt, MOD("pre_feedforward_layernorm.weight"), H)) ||
        !(L->ln_post_ffw = load_vec(m, vt, MOD("post_feedforward_layernorm.weight"), H)) ||
        !(L->q_norm = load_vec(m, vt, MOD("self_attn.q_norm.weight"), vt->head_dim)) ||
        !(L->k_norm = load_vec(m, vt, MOD("self_attn.k_norm.weight"), vt->head_dim)))
        return -1;
#undef MOD
    return 0;
}

static g4_vision_tower *vt_load(g4_model *m) {
    g4_vision_tower *vt = calloc(1, sizeof *vt);
    if (!vt) return g4_fail("out of memory for the vision tower"), NULL;
    double theta = 100;
    if (read_vision_config(m, vt, &theta)) goto fail;
    vt->default_tokens = read_default_tokens(m);
    vt->root_hidden = (float)sqrt((double)vt->hidden);
    vt->layers = calloc((size_t)vt->n_layers, sizeof *vt->layers);
    vt->inv_freq = g4_tower_alloc(&vt->mem, sizeof(float) * (size_t)(vt->head_dim / 4));
    if (!vt->layers || !vt->inv_freq) {
        g4_fail("out of memory for the vision tower");
        goto fail;
    }
    /* torch: 1.0 / (base ** (arange(0, d/2, 2).float() / (d/2))), in f32 */
    int spatial = vt->head_dim / 2;
    for (int j = 0; j < vt->head_dim / 4; j++) vt->inv_freq[j] = 1.0f / powf((float)theta, (float)(2 * j) / (float)spatial);
    if (g4_tower_bind_float(m, &vt->patch_proj, VT "patch_embedder.input_proj", 3 * vt->patch * vt->patch, vt->hidden)) goto fail;
    int64_t pshape[3] = {2, vt->pos_size, vt->hidden};
    if (!(vt->pos_table = load_floats(m, vt, VT "patch_embedder.position_embedding_table", 3, pshape))) goto fail;
    for (int l = 0; l < vt->n_layers; l++)
        if (bind_layer(m, vt, l)) goto fail;
    if (vt->standardize && (!(vt->std_bias = load_vec(m, vt, VT "std_bias", vt->hidden)) ||
                            !(vt->std_scale = load_vec(m, vt, VT "std_scale", vt->hidden))))
        goto fail;
    int64_t eshape[2] = {vt->text_hidden, vt->hidden};
    if (!(vt->embed_w = load_floats(m, vt, "model.embed_vision.embedding_projection.weight", 2, eshape))) goto fail;
    return vt;
fail:
    vt_free(vt);
    return NULL;
}

/* The loader in the form g4_tower_get takes. */
static void *vt_load_any(g4_model *m) { return vt_load(m); }

const g4_vision_tower *g4_vision_tower_get(const g4_model *cm) {
    g4_model *m = (g4_model *)cm; /* the tower is a cache of the model's, bound once */
    return g4_tower_get(m, &m->vision, &m->vision_free, vt_load_any, vt_free);
}

int g4_vision_patch_size(const g4_vision_tower *vt) { return vt->patch; }
int g4_vision_pooling(const g4_vision_tower *vt) { return vt->pool; }
int g4_vision_default_soft_tokens(const g4_vision_tower *vt) { return vt->default_tokens; }

/* ---- the forward pass ---- */

/* 8 running sums in a fixed order: the same bits on every build level, and vectorizable. */
static float dot(const float *a, const float *b, int n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += a[i + l] * b[i + l];
    for (; i < n; i++) s[i & 7] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* 2-D RoPE on each head of n rows: dims [0, d/2) rotate with x, [d/2, d) with y, each half
 * rotate-half with the d/4 frequencies. */
static void rope_2d(const g4_vision_tower *vt, float *x, int n, const int32_t *pos) {
    int hd = vt->head_dim, f = hd / 4;
    float cs[2][64], sn[2][64];
    for (int t = 0; t < n; t++) {
        for (int a = 0; a < 2; a++)
            for (int j = 0; j < f && j < 64; j++) {
                float ang = (float)pos[2 * t + a] * vt->inv_freq[j];
                cs[a][j] = cosf(ang);
                sn[a][j] = sinf(ang);
            }
        for (int h = 0; h < vt->heads; h++) {
            float *v = x + ((size_t)t * vt->heads + h) * hd;
            g4_forward_rope(v, cs[0], sn[0], hd / 2);
            g4_forward_rope(v + hd / 2, cs[1], sn[1], hd / 2);
        }
    }
}

typedef struct {
    float *x, *xn, *q, *k, *v, *att, *proj, *gate, *up;
    g4_attn_row *rows;
    double attention_seconds; /* the attention cores' wall time, for g4 bench */
} vt_bufs;

static void vt_layer_run(g4_session *s, const g4_vision_tower *vt, const vt_layer *L, vt_bufs *b, int n, const int32_t *pos) {
    int H = vt->hidden, hd = vt->head_dim, W = vt->heads * hd;
    float eps = vt->eps;
    g4_forward_rmsnorm_rows(b->xn, b->x, L->ln_in, n, H, eps);
    g4_tower_clip_linear(s, &L->q, b->xn, n, b->q);
    g4_tower_clip_linear(s, &L->k, b->xn, n, b->k);
    g4_tower_clip_linear(s, &L->v, b->xn, n, b->v);
    g4_forward_rmsnorm_rows(b->q, b->q, L->q_norm, n * vt->heads, hd, eps);
    g4_forward_rmsnorm_rows(b->k, b->k, L->k_norm, n * vt->heads, hd, eps);
    g4_forward_rmsnorm_rows(b->v, b->v, NULL, n * vt->heads, hd, eps);
    rope_2d(vt, b->q, n, pos);
    rope_2d(vt, b->k, n, pos);
    /* the text model's attention kernel (scale 1, as here), every query row seeing every key:
     * bidirectional; the padding patches are not in the batch */
    for (int t = 0; t < n; t++) b->rows[t] = (g4_attn_row){.kf = b->k, .vf = b->v, .lo = 0, .hi = n - 1};
    g4_attn a = {.n = n, .n_heads = vt->heads, .head_dim = hd, .kv_width = W, .group = 1, .q = b->q, .out = b->att, .rows = b->rows};
    double t0 = g4_prof_clock();
    s->k->attention(&a);
    b->attention_seconds += g4_prof_clock() - t0;
    g4_tower_clip_linear(s, &L->o, b->att, n, b->proj);
    g4_forward_add_normed(b->x, b->proj, L->ln_post_attn, n, H, eps);
    g4_forward_rmsnorm_rows(b->xn, b->x, L->ln_pre_ffw, n, H, eps);
    g4_tower_clip_linear(s, &L->gate, b->xn, n, b->gate);
    g4_tower_clip_linear(s, &L->up, b->xn, n, b->up);
    s->k->gelu_mul(b->gate, b->up, (size_t)n * vt->mlp, 0);
    g4_tower_clip_linear(s, &L->down, b->gate, n, b->proj);
    g4_forward_add_normed(b->x, b->proj, L->ln_post_ffw, n, H, eps);
}

/* The pooler: each k x k block of the patch grid averaged (weight f32(1/k^2), summed in patch
 * order as the one-hot matmul), times f32(sqrt(hidden)). Blocks are row-major over the grid. */
static void pool_blocks(const g4_vision_tower *vt, const float *x, const g4_image_patches *p, float *out, int n_out) {
    int H = vt->hidden, k = vt->pool, bw = p->grid_w / k;
    float w = 1.0f / (float)(k * k);
    memset(out, 0, sizeof *out * (size_t)n_out * H);
    for (int t = 0; t < p->n_real; t++) {
        int bi = p->pos[2 * t] / k + bw * (p->pos[2 * t + 1] / k);
        float *o = out + (size_t)bi * H;
        for (int d = 0; d < H; d++) o[d] += w * x[(size_t)t * H + d];
    }
    for (size_t i = 0; i < (size_t)n_out * H; i++) out[i] *= vt->root_hidden;
}

int g4_vision_encode(const g4_model *m, const g4_vision_tower *vt, const g4_options *o, const g4_image_patches *p, float **embd,
                     int *n_tokens, g4_vision_stats *stats) {
    double t0 = g4_prof_clock();
    *embd = NULL;
    *n_tokens = 0;
    int H = vt->hidden, W = vt->heads * vt->head_dim, n = p->n_real, pd = p->patch_dim;
    if (pd != 3 * vt->patch * vt->patch) return g4_fail("vision: patches of %d values, the tower takes %d", pd, 3 * vt->patch * vt->patch);
    if (p->grid_w % vt->pool || p->grid_h % vt->pool)
        return g4_fail("vision: a %d x %d patch grid is not a multiple of the pooling %d", p->grid_w, p->grid_h, vt->pool);
    if (p->grid_w > vt->pos_size || p->grid_h > vt->pos_size)
        return g4_fail("vision: a %d x %d patch grid exceeds the position table (%d)", p->grid_w, p->grid_h, vt->pos_size);
    int n_out = n / (vt->pool * vt->pool);
    g4_options so = *o;
    so.ctx = 1;
    so.n_seq = 1;
    g4_session *s = g4_session_new(m, &so);
    if (!s) return g4_fail_prefix("vision: ");
    size_t widest = (size_t)(H > W ? H : W);
    if ((size_t)vt->mlp > widest) widest = vt->mlp;
    if ((size_t)pd > widest) widest = (size_t)pd;
    if (widest > s->acc_len) {
        g4_session_free(s);
        return g4_fail("vision: the tower's linears (%zu wide) are wider than a whole session buffer (%zu)", widest, s->acc_len);
    }
    for (int l = 0; l < vt->n_layers; l++) {
        const g4_clip_linear *Ls[7] = {&vt->layers[l].q, &vt->layers[l].k, &vt->layers[l].v, &vt->layers[l].o,
                                  &vt->layers[l].gate, &vt->layers[l].up, &vt->layers[l].down};
        for (int i = 0; i < 7; i++)
            if (g4_requant_table_add(s, &Ls[i]->lin)) {
                g4_session_free(s);
                return -1;
            }
    }
    if (stats) g4_session_set_profiling(s, 1);
    vt_bufs b = {0};
    size_t big = (size_t)n * (vt->mlp > W ? vt->mlp : W);
    b.x = malloc(sizeof(float) * (size_t)n * H);
    b.xn = malloc(sizeof(float) * (size_t)n * (pd > H ? pd : H));
    b.q = malloc(sizeof(float) * (size_t)n * W);
    b.k = malloc(sizeof(float) * (size_t)n * W);
    b.v = malloc(sizeof(float) * (size_t)n * W);
    b.att = malloc(sizeof(float) * (size_t)n * W);
    b.proj = malloc(sizeof(float) * (size_t)n * H);
    b.gate = malloc(sizeof(float) * big);
    b.up = malloc(sizeof(float) * big);
    b.rows = malloc(sizeof *b.rows * (size_t)n);
    float *pooled = malloc(sizeof(float) * (size_t)(n_out > 0 ? n_out : 1) * H);
    float *out = malloc(sizeof(float) * (size_t)(n_out > 0 ? n_out : 1) * vt->text_hidden);
    int rc = -1;
    if (!b.x || !b.xn || !b.q || !b.k || !b.v || !b.att || !b.proj || !b.gate || !b.up || !b.rows || !pooled || !out) {
        g4_fail("vision: out of memory for %d patches", n);
        goto done;
    }
    /* patch embedding: input_proj(2 (pixels - 0.5)) + (pos_x + pos_y) */
    for (size_t i = 0; i < (size_t)n * pd; i++) b.xn[i] = 2.0f * (p->pixels[i] - 0.5f);
    g4_tower_linear_rows(s, &vt->patch_proj, b.xn, n, b.x);
    for (int t = 0; t < n; t++) {
        const float *px = vt->pos_table + (size_t)p->pos[2 * t] * H;
        const float *py = vt->pos_table + ((size_t)vt->pos_size + p->pos[2 * t + 1]) * H;
        for (int d = 0; d < H; d++) b.x[(size_t)t * H + d] += px[d] + py[d];
    }
    for (int l = 0; l < vt->n_layers; l++) vt_layer_run(s, vt, &vt->layers[l], &b, n, p->pos);
    pool_blocks(vt, b.x, p, pooled, n_out);
    if (vt->standardize)
        for (int t = 0; t < n_out; t++)
            for (int d = 0; d < H; d++) pooled[(size_t)t * H + d] = (pooled[(size_t)t * H + d] - vt->std_bias[d]) * vt->std_scale[d];
    /* embed_vision: weightless RMSNorm, then the float projection to the text width */
    g4_forward_rmsnorm_rows(pooled, pooled, NULL, n_out, H, vt->eps);
    for (int t = 0; t < n_out; t++)
        for (int o2 = 0; o2 < vt->text_hidden; o2++) out[(size_t)t * vt->text_hidden + o2] = dot(vt->embed_w + (size_t)o2 * H, pooled + (size_t)t * H, H);
    *embd = out;
    out = NULL;
    *n_tokens = n_out;
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->attention_seconds = b.attention_seconds;
        stats->linear_seconds = s->prof[G4_PROF_LINEAR];
        g4_tower_count_macs(s, &vt->patch_proj, &stats->int_macs, &stats->float_macs);
        for (int l = 0; l < vt->n_layers; l++) {
            const g4_clip_linear *Ls[7] = {&vt->layers[l].q, &vt->layers[l].k, &vt->layers[l].v, &vt->layers[l].o,
                                      &vt->layers[l].gate, &vt->layers[l].up, &vt->layers[l].down};
            for (int i = 0; i < 7; i++) g4_tower_count_macs(s, &Ls[i]->lin, &stats->int_macs, &stats->float_macs);
        }
        stats->seconds = g4_prof_clock() - t0;
    }
    rc = 0;
done:
    free(b.x), free(b.xn), free(b.q), free(b.k), free(b.v), free(b.att), free(b.proj), free(b.gate), free(b.up), free(b.rows);
    free(pooled);
    free(out);
    g4_session_free(s);
    return rc;
}
