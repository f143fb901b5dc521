/* The audio tower's loader and forward pass (modeling_gemma4.py: Gemma4AudioModel,
 * Gemma4AudioSubSampleConvProjection, Gemma4AudioLayer with its Gemma4AudioFeedForward halves,
 * Gemma4AudioAttention and Gemma4AudioLightConv1d; Gemma4MultimodalEmbedder embed_audio), bound
 * lazily on the first clip as the vision tower is. Every linear goes through the text model's
 * linear step (g4_forward_linear in a session of its own), so float / fake / int modes and the
 * kernel levels apply as for the text decoder; the float cores (subsampling convolutions, local
 * attention, light conv) are plain C in audio/, the same on every level. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audio/audio.h"
#include "audio/tower.h"
#include "model/session.h"
#include "model/tower.h"
#include "util/err.h"
#include "util/file.h"

#define AT "model.audio_tower."
#define TOWER "audio tower"

typedef struct {
    g4_clip_linear ff1[2], ff2[2]; /* feed_forward1/2: ffw_layer_1, ffw_layer_2 */
    float *ff1_pre, *ff1_post, *ff2_pre, *ff2_post;
    g4_clip_linear q, k, v, post;
    g4_linear rel_k;          /* relative_k_proj, float */
    float *per_dim_scale, *norm_pre_attn, *norm_post_attn;
    g4_clip_linear lc_start, lc_end;
    float *lc_pre, *lc_conv_norm, *lc_conv_w; /* conv weight [hidden][kernel] */
    float *norm_out;
} at_layer;

struct g4_audio_tower {
    int hidden, n_layers, heads, head_dim, ch0, ch1, kernel, chunk, ctx_left, ctx_right, out_dims, text_hidden;
    float eps, logit_cap, residual_weight, grad_clip;
    int clipped;
    float *conv0_w, *conv0_norm, *conv1_w, *conv1_norm;
    g4_linear input_proj, output_proj, embed;
    float *output_bias;
    at_layer *layers;
    g4_tower_mem mem;
};

static void at_free(void *ptr) {
    g4_audio_tower *at = ptr;
    if (!at) return;
    g4_tower_mem_free(&at->mem);
    free(at->layers);
    free(at);
}

/* ---- audio_config ---- */

static int cfg_int(const cJSON *ac, const char *path, const char *key, int lo, int hi, int *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(ac, key);
    if (!j || cJSON_IsNull(j)) return g4_fail("%s: audio_config.%s missing", path, key);
    if (!cJSON_IsNumber(j) || j->valuedouble != (double)(int)j->valuedouble || j->valuedouble < lo || j->valuedouble > hi)
        return g4_fail("%s: audio_config.%s must be an integer in [%d, %d]", path, key, lo, hi);
    *out = (int)j->valuedouble;
    return 0;
}

static float cfg_float(const cJSON *ac, const char *key, float def) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(ac, key);
    return cJSON_IsNumber(j) ? (float)j->valuedouble : def;
}

static int read_audio_config(const g4_model *m, g4_audio_tower *at) {
    char path[4096];
    if (g4_path_join(path, sizeof path, m->dir, "config.json")) return -1;
    char *text;
    if (g4_read_file(path, &text, NULL)) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return g4_fail("%s: not JSON", path);
    const cJSON *ac = cJSON_GetObjectItemCaseSensitive(root, "audio_config");
    int rc = -1;
    if (!cJSON_IsObject(ac)) {
        g4_fail("%s: no audio_config: this model takes no audio", path);
        goto done;
    }
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(ac, "subsampling_conv_channels");
    if (!cJSON_IsArray(ch) || cJSON_GetArraySize(ch) != 2 || !cJSON_IsNumber(cJSON_GetArrayItem(ch, 0)) ||
        !cJSON_IsNumber(cJSON_GetArrayItem(ch, 1))) {
        g4_fail("%s: audio_config.subsampling_conv_channels must be two integers", path);
        goto done;
    }
    at->ch0 = (int)cJSON_GetArrayItem(ch, 0)->valuedouble;
    at->ch1 = (int)cJSON_GetArrayItem(ch, 1)->valuedouble;
    if (at->ch0 < 1 || at->ch0 > 4096 || at->ch1 < 1 || at->ch1 > 4096) {
        g4_fail("%s: audio_config.subsampling_conv_channels [%d, %d] out of range", path, at->ch0, at->ch1);
        goto done;
    }
    /* transformers sizes input_proj_linear (channels[0] / 4) x channels[1]; the flattened features
     * after two stride-2 convolutions over 128 mel bins are 32 x channels[1] */
    if (at->ch0 / 4 != G4_AUDIO_MEL_BINS / 4) {
        g4_fail("%s: audio_config.subsampling_conv_channels[0] is %d: the tower's input projection then takes %d values per "
                "frame, not the %d that %d mel bins give (only 128 works)",
                path, at->ch0, at->ch0 / 4 * at->ch1, G4_AUDIO_MEL_BINS / 4 * at->ch1, G4_AUDIO_MEL_BINS);
        goto done;
    }
    if (cfg_int(ac, path, "hidden_size", 2, 1 << 16, &at->hidden) || cfg_int(ac, path, "num_hidden_layers", 1, 1024, &at->n_layers) ||
        cfg_int(ac, path, "num_attention_heads", 1, 1024, &at->heads) || cfg_int(ac, path, "conv_kernel_size", 1, 64, &at->kernel) ||
        cfg_int(ac, path, "attention_chunk_size", 1, 4096, &at->chunk) ||
        cfg_int(ac, path, "attention_context_left", 1, 4096, &at->ctx_left) ||
        cfg_int(ac, path, "attention_context_right", 0, 4096, &at->ctx_right) ||
        cfg_int(ac, path, "output_proj_dims", 1, 1 << 16, &at->out_dims))
        goto done;
    if (at->hidden % at->heads || at->hidden % 2) {
        g4_fail("%s: audio_config.hidden_size %d is not a multiple of num_attention_heads %d (and of 2)", path, at->hidden, at->heads);
        goto done;
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(ac, "hidden_act");
    if (cJSON_IsString(act) && strcmp(act->valuestring, "silu") != 0) {
        g4_fail("%s: audio_config.hidden_act \"%s\": only \"silu\" is supported", path, act->valuestring);
        goto done;
    }
    at->head_dim = at->hidden / at->heads;
    at->eps = cfg_float(ac, "rms_norm_eps", 1e-6f);
    at->logit_cap = cfg_float(ac, "attention_logit_cap", 50.0f);
    at->residual_weight = cfg_float(ac, "residual_weight", 0.5f);
    at->grad_clip = cfg_float(ac, "gradient_clipping", 1e10f);
    at->clipped = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ac, "use_clipped_linears"));
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(tc ? tc : root, "hidden_size");
    at->text_hidden = cJSON_IsNumber(th) ? (int)th->valuedouble : m->cfg.hidden;
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

/* ---- loading ---- */

static int clip_bind(g4_model *m, g4_audio_tower *at, g4_clip_linear *L, const char *module, int in, int out) {
    return g4_tower_bind_clippable(m, &at->mem, TOWER, L, module, in, out, at->clipped);
}

static int bind_ffw(g4_model *m, g4_audio_tower *at, const char *p, g4_clip_linear ff[2], float **pre, float **post) {
    char n[256];
    int H = at->hidden;
    snprintf(n, sizeof n, "%sffw_layer_1", p);
    if (clip_bind(m, at, &ff[0], n, H, 4 * H)) return -1;
    snprintf(n, sizeof n, "%sffw_layer_2", p);
    if (clip_bind(m, at, &ff[1], n, 4 * H, H)) return -1;
    snprintf(n, sizeof n, "%spre_layer_norm.weight", p);
    if (!(*pre = g4_tower_vec(m, &at->mem, TOWER, n, H))) return -1;
    snprintf(n, sizeof n, "%spost_layer_norm.weight", p);
    if (!(*post = g4_tower_vec(m, &at->mem, TOWER, n, H))) return -1;
    return 0;
}

static int bind_layer(g4_model *m, g4_audio_tower *at, int l) {
    at_layer *L = &at->layers[l];
    char p[160], n[224], f[200];
    int H = at->hidden;
    snprintf(p, sizeof p, AT "layers.%d.", l);
#define MOD(s) (snprintf(n, sizeof n, "%s%s", p, s), n)
    snprintf(f, sizeof f, "%sfeed_forward1.", p);
    if (bind_ffw(m, at, f, L->ff1, &L->ff1_pre, &L->ff1_post)) return -1;
    snprintf(f, sizeof f, "%sfeed_forward2.", p);
    if (bind_ffw(m, at, f, L->ff2, &L->ff2_pre, &L->ff2_post)) return -1;
    if (clip_bind(m, at, &L->q, MOD("self_attn.q_proj"), H, H) || clip_bind(m, at, &L->k, MOD("self_attn.k_proj"), H, H) ||
        clip_bind(m, at, &L->v, MOD("self_attn.v_proj"), H, H) || clip_bind(m, at, &L->post, MOD("self_attn.post"), H, H) ||
        g4_tower_bind_float(m, &L->rel_k, MOD("self_attn.relative_k_proj"), H, H) ||
        clip_bind(m, at, &L->lc_start, MOD("lconv1d.linear_start"), H, 2 * H) ||
        clip_bind(m, at, &L->lc_end, MOD("lconv1d.linear_end"), H, H))
        return -1;
    int64_t cshape[3] = {H, 1, at->kernel};
    if (!(L->per_dim_scale = g4_tower_vec(m, &at->mem, TOWER, MOD("self_attn.per_dim_scale"), at->head_dim)) ||
        !(L->norm_pre_attn = g4_tower_vec(m, &at->mem, TOWER, MOD("norm_pre_attn.weight"), H)) ||
        !(L->norm_post_attn = g4_tower_vec(m, &at->mem, TOWER, MOD("norm_post_attn.weight"), H)) ||
        !(L->lc_pre = g4_tower_vec(m, &at->mem, TOWER, MOD("lconv1d.pre_layer_norm.weight"), H)) ||
        !(L->lc_conv_norm = g4_tower_vec(m, &at->mem, TOWER, MOD("lconv1d.conv_norm.weight"), H)) ||
        !(L->lc_conv_w = g4_tower_floats(m, &at->mem, TOWER, MOD("lconv1d.depthwise_conv1d.weight"), 3, cshape)) ||
        !(L->norm_out = g4_tower_vec(m, &at->mem, TOWER, MOD("norm_out.weight"), H)))
        return -1;
#undef MOD
    return 0;
}

static g4_audio_tower *at_load(g4_model *m) {
    g4_audio_tower *at = calloc(1, sizeof *at);
    if (!at) return g4_fail("out of memory for the audio tower"), NULL;
    if (read_audio_config(m, at)) goto fail;
    at->layers = calloc((size_t)at->n_layers, sizeof *at->layers);
    if (!at->layers) {
        g4_fail("out of memory for the audio tower");
        goto fail;
    }
    int64_t c0[4] = {at->ch0, 1, 3, 3}, c1[4] = {at->ch1, at->ch0, 3, 3};
    if (!(at->conv0_w = g4_tower_floats(m, &at->mem, TOWER, AT "subsample_conv_projection.layer0.conv.weight", 4, c0)) ||
        !(at->conv0_norm = g4_tower_vec(m, &at->mem, TOWER, AT "subsample_conv_projection.layer0.norm.weight", at->ch0)) ||
        !(at->conv1_w = g4_tower_floats(m, &at->mem, TOWER, AT "subsample_conv_projection.layer1.conv.weight", 4, c1)) ||
        !(at->conv1_norm = g4_tower_vec(m, &at->mem, TOWER, AT "subsample_conv_projection.layer1.norm.weight", at->ch1)))
        goto fail;
    if (g4_tower_bind_float(m, &at->input_proj, AT "subsample_conv_projection.input_proj_linear", G4_AUDIO_MEL_BINS / 4 * at->ch1, at->hidden))
        goto fail;
    for (int l = 0; l < at->n_layers; l++)
        if (bind_layer(m, at, l)) goto fail;
    if (g4_tower_bind_float(m, &at->output_proj, AT "output_proj", at->hidden, at->out_dims) ||
        !(at->output_bias = g4_tower_vec(m, &at->mem, TOWER, AT "output_proj.bias", at->out_dims)) ||
        g4_tower_bind_float(m, &at->embed, "model.embed_audio.embedding_projection", at->out_dims, at->text_hidden))
        goto fail;
    return at;
fail:
    at_free(at);
    return NULL;
}

/* The loader in the form g4_tower_get takes. */
static void *at_load_any(g4_model *m) { return at_load(m); }

const g4_audio_tower *g4_audio_tower_get(const g4_model *cm) {
    g4_model *m = (g4_model *)cm; /* the tower is a cache of the model's, bound once */
    return g4_tower_get(m, &m->audio, &m->audio_free, at_load_any, at_free);
}

/* ---- the forward pass ---- */

/* torch's silu in f32: x * sigmoid(x) */
static void silu(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
}

typedef struct {
    float *x, *xn, *a, *b, *c, *big, *relk, *pos;
    double attention_seconds; /* the local attention cores' wall time, for g4 bench */
} at_bufs;

/* Gemma4AudioFeedForward: x += residual_weight x post_norm(clip(ffw2(silu(ffw1(pre_norm(clip(x))))))) */
static void ffw_run(g4_session *s, const g4_audio_tower *at, const g4_clip_linear ff[2], const float *pre, const float *post, at_bufs *b, int n) {
    int H = at->hidden;
    size_t nh = (size_t)n * H;
    memcpy(b->xn, b->x, sizeof(float) * nh);
    g4_tower_clamp(b->xn, nh, -at->grad_clip, at->grad_clip);
    g4_forward_rmsnorm_rows(b->xn, b->xn, pre, n, H, at->eps);
    g4_tower_clip_linear(s, &ff[0], b->xn, n, b->big);
    silu(b->big, (size_t)n * 4 * H);
    g4_tower_clip_linear(s, &ff[1], b->big, n, b->a);
    g4_tower_clamp(b->a, nh, -at->grad_clip, at->grad_clip);
    g4_forward_rmsnorm_rows(b->a, b->a, post, n, H, at->eps);
    for (size_t i = 0; i < nh; i++) b->x[i] += b->a[i] * at->residual_weight;
}

static int layer_run(g4_session *s, const g4_audio_tower *at, const at_layer *L, at_bufs *b, int n, const uint8_t *valid, int n_pos) {
    int H = at->hidden;
    size_t nh = (size_t)n * H;
    ffw_run(s, at, L->ff1, L->ff1_pre, L->ff1_post, b, n);
    /* attention block: x += norm_post_attn(clip(post(attention(norm_pre_attn(clip(x)))))) */
    memcpy(b->xn, b->x, sizeof(float) * nh);
    g4_tower_clamp(b->xn, nh, -at->grad_clip, at->grad_clip);
    g4_forward_rmsnorm_rows(b->xn, b->xn, L->norm_pre_attn, n, H, at->eps);
    g4_tower_clip_linear(s, &L->q, b->xn, n, b->a);
    g4_tower_clip_linear(s, &L->k, b->xn, n, b->b);
    g4_tower_clip_linear(s, &L->v, b->xn, n, b->c);
    g4_tower_linear_rows(s, &L->rel_k, b->pos, n_pos, b->relk);
    double t0 = g4_prof_clock();
    if (g4_audio_local_attention(b->a, b->b, b->c, n, at->heads, at->head_dim, b->relk, n_pos, L->per_dim_scale, valid, at->chunk,
                                 at->ctx_left, at->ctx_right, at->logit_cap, b->xn))
        return -1;
    b->attention_seconds += g4_prof_clock() - t0;
    g4_tower_clip_linear(s, &L->post, b->xn, n, b->a);
    g4_tower_clamp(b->a, nh, -at->grad_clip, at->grad_clip);
    g4_forward_rmsnorm_rows(b->a, b->a, L->norm_post_attn, n, H, at->eps);
    for (size_t i = 0; i < nh; i++) b->x[i] += b->a[i];
    /* light conv block: x += linear_end(silu(conv_norm(clip(conv(glu(linear_start(pre_norm(x)))))))) */
    g4_forward_rmsnorm_rows(b->xn, b->x, L->lc_pre, n, H, at->eps);
    g4_tower_clip_linear(s, &L->lc_start, b->xn, n, b->big);
    if (g4_audio_glu_depthwise_conv(b->big, n, H, L->lc_conv_w, at->kernel, b->a)) return -1;
    g4_tower_clamp(b->a, nh, -at->grad_clip, at->grad_clip);
    g4_forward_rmsnorm_rows(b->a, b->a, L->lc_conv_norm, n, H, at->eps);
    silu(b->a, nh);
    g4_tower_clip_linear(s, &L->lc_end, b->a, n, b->c);
    for (size_t i = 0; i < nh; i++) b->x[i] += b->c[i];
    ffw_run(s, at, L->ff2, L->ff2_pre, L->ff2_post, b, n);
    g4_tower_clamp(b->x, nh, -at->grad_clip, at->grad_clip);
    g4_forward_rmsnorm_rows(b->x, b->x, L->norm_out, n, H, at->eps);
    return 0;
}

/* Every quantized linear of the tower, for the session's requant tables. */
static int add_requant_tables(g4_session *s, const g4_audio_tower *at) {
    for (int l = 0; l < at->n_layers; l++) {
        const at_layer *L = &at->layers[l];
        const g4_clip_linear *Ls[10] = {&L->ff1[0], &L->ff1[1], &L->ff2[0], &L->ff2[1], &L->q, &L->k, &L->v, &L->post, &L->lc_start, &L->lc_end};
        for (int i = 0; i < 10; i++)
            if (g4_requant_table_add(s, &Ls[i]->lin)) return -1;
    }
    return 0;
}

int g4_audio_encode(const g4_model *m, const g4_audio_tower *at, const g4_options *o, const float *mel, const uint8_t *mask, int T,
                    float **embd, int *n_tokens, g4_audio_stats *stats) {
    double t_start = g4_prof_clock();
    *embd = NULL;
    *n_tokens = 0;
    int T1 = g4_audio_subsampled_len(T), n = g4_audio_subsampled_len(T1);
    int F1 = g4_audio_subsampled_len(G4_AUDIO_MEL_BINS), F2 = g4_audio_subsampled_len(F1);
    int H = at->hidden, D = at->text_hidden, n_pos = (at->chunk + at->ctx_left - 1 + at->ctx_right) / 2 + 1;
    g4_options so = *o;
    so.ctx = 1;
    so.n_seq = 1;
    g4_session *s = g4_session_new(m, &so);
    if (!s) return g4_fail_prefix("audio: ");
    size_t widest = (size_t)(4 * H);
    if ((size_t)F2 * at->ch1 > widest) widest = (size_t)F2 * at->ch1;
    if ((size_t)at->out_dims > widest) widest = (size_t)at->out_dims;
    if ((size_t)D > widest) widest = (size_t)D;
    if (widest > s->acc_len) {
        g4_session_free(s);
        return g4_fail("audio: the tower's linears (%zu wide) are wider than a whole session buffer (%zu)", widest, s->acc_len);
    }
    if (add_requant_tables(s, at)) {
        g4_session_free(s);
        return -1;
    }
    size_t nw = (size_t)n * (widest > (size_t)H ? widest : (size_t)H);
    float *h0 = malloc(sizeof(float) * (size_t)T1 * F1 * at->ch0), *h1 = malloc(sizeof(float) * (size_t)n * F2 * at->ch1);
    uint8_t *m1 = malloc((size_t)T1), *valid = malloc((size_t)n);
    at_bufs b = {0};
    b.x = malloc(sizeof(float) * (size_t)n * H);
    b.xn = malloc(sizeof(float) * nw);
    b.a = malloc(sizeof(float) * nw);
    b.b = malloc(sizeof(float) * (size_t)n * H);
    b.c = malloc(sizeof(float) * (size_t)n * H);
    b.big = malloc(sizeof(float) * (size_t)n * 4 * H);
    b.relk = malloc(sizeof(float) * (size_t)n_pos * H);
    b.pos = malloc(sizeof(float) * (size_t)n_pos * H);
    float *out = NULL;
    int rc = -1;
    if (!h0 || !h1 || !m1 || !valid || !b.x || !b.xn || !b.a || !b.b || !b.c || !b.big || !b.relk || !b.pos) {
        g4_fail("audio: out of memory for %d frames", T);
        goto done;
    }
    if (stats) g4_session_set_profiling(s, 1);
    double t_sub = g4_prof_clock();
    if (g4_audio_subsample_layer(mel, mask, T, G4_AUDIO_MEL_BINS, 1, at->conv0_w, at->conv0_norm, at->ch0, at->eps, h0, m1) ||
        g4_audio_subsample_layer(h0, m1, T1, F1, at->ch0, at->conv1_w, at->conv1_norm, at->ch1, at->eps, h1, valid))
        goto done;
    t_sub = g4_prof_clock() - t_sub;
    g4_tower_linear_rows(s, &at->input_proj, h1, n, b.x);
    g4_audio_rel_pos_sinusoids(H, n_pos, b.pos);
    for (int l = 0; l < at->n_layers; l++)
        if (layer_run(s, at, &at->layers[l], &b, n, valid, n_pos)) goto done;
    /* output_proj (float, with bias), then embed_audio: weightless RMSNorm and the float projection;
     * the padding frames (mask 0) are dropped, as Gemma4Model.forward does */
    g4_tower_linear_rows(s, &at->output_proj, b.x, n, b.a);
    int n_valid = 0;
    for (int t = 0; t < n; t++) {
        if (!valid[t]) continue;
        float *r = b.xn + (size_t)n_valid * at->out_dims;
        for (int d = 0; d < at->out_dims; d++) r[d] = b.a[(size_t)t * at->out_dims + d] + at->output_bias[d];
        n_valid++;
    }
    g4_forward_rmsnorm_rows(b.xn, b.xn, NULL, n_valid, at->out_dims, at->eps);
    out = malloc(sizeof(float) * (size_t)(n_valid > 0 ? n_valid : 1) * D);
    if (!out) {
        g4_fail("audio: out of memory for %d soft tokens", n_valid);
        goto done;
    }
    g4_tower_linear_rows(s, &at->embed, b.xn, n_valid, out);
    *embd = out;
    *n_tokens = n_valid;
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->subsample_seconds = t_sub;
        stats->attention_seconds = b.attention_seconds;
        stats->linear_seconds = s->prof[G4_PROF_LINEAR];
        const g4_linear *F[4] = {&at->input_proj, &at->output_proj, &at->embed, NULL};
        for (int i = 0; i < 3; i++) g4_tower_count_macs(s, F[i], &stats->int_macs, &stats->float_macs);
        for (int l = 0; l < at->n_layers; l++) {
            const at_layer *L = &at->layers[l];
            const g4_clip_linear *Ls[10] = {&L->ff1[0], &L->ff1[1], &L->ff2[0], &L->ff2[1], &L->q, &L->k, &L->v, &L->post, &L->lc_start, &L->lc_end};
            for (int i = 0; i < 10; i++) g4_tower_count_macs(s, &Ls[i]->lin, &stats->int_macs, &stats->float_macs);
            g4_tower_count_macs(s, &L->rel_k, &stats->int_macs, &stats->float_macs);
        }
        stats->seconds = g4_prof_clock() - t_start;
    }
    rc = 0;
done:
    free(h0), free(h1), free(m1), free(valid);
    free(b.x), free(b.xn), free(b.a), free(b.b), free(b.c), free(b.big), free(b.relk), free(b.pos);
    g4_session_free(s);
    return rc;
}

int g4_audio_soft_tokens(const g4_model *m, const g4_options *o, const void *bytes, size_t len, float **embd, int *n_tokens) {
    if (!embd || !n_tokens) return g4_fail("g4_audio_soft_tokens: embd and n_tokens are required");
    *embd = NULL;
    *n_tokens = 0;
    if (!m || !o) return g4_fail("g4_audio_soft_tokens: a model and options are required");
    const g4_audio_tower *at = g4_audio_tower_get(m);
    if (!at) return -1;
    float *pcm = NULL, *mel = NULL;
    uint8_t *mask = NULL;
    size_t n = 0;
    int T = 0;
    if (g4_audio_pcm16k(bytes, len, "audio", &pcm, &n)) return -1;
    int rc = g4_audio_log_mel(pcm, n, &mel, &mask, &T);
    free(pcm);
    if (rc == 0) rc = g4_audio_encode(m, at, o, mel, mask, T, embd, n_tokens, NULL);
    free(mel);
    free(mask);
    return rc;
}
