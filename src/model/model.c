/* Weight binding: derives every tensor the text decoder needs from config.json, checks its
 * dtype, shape and bit width against the file, and binds it (checkpoint.md §5-§10). */
#define _DEFAULT_SOURCE /* madvise, MAP_ANONYMOUS */
#include "model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/pool.h"
#include "modules.h"
#include "quant/pack.h"
#include "util/err.h"

/* Room for one more owned pointer: 0, or -1 when memory is short. */
static int owned_room(g4_model *m) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 256;
        void **p = realloc(m->owned, sizeof *p * (size_t)cap);
        if (!p) return -1;
        m->owned = p;
        m->cap_owned = cap;
    }
    return 0;
}

static void *own(g4_model *m, size_t bytes) {
    if (owned_room(m) != 0) return NULL;
    void *p = calloc(1, bytes ? bytes : 1);
    if (p) m->owned[m->n_owned++] = p;
    return p;
}

static const g4_tensor *find(const g4_model *m, const char *name) {
    const g4_tensor *t = g4_st_find(&m->st, name);
    if (!t) g4_fail("%s: tensor %s missing from the checkpoint", m->dir, name);
    return t;
}

static int shape_is(const g4_tensor *t, int ndim, int64_t d0, int64_t d1) {
    if (t->ndim != ndim) return 0;
    return (ndim < 1 || t->shape[0] == d0) && (ndim < 2 || t->shape[1] == d1);
}

static int wrong(const g4_model *m, const g4_tensor *t, const char *expected) {
    char sh[96];
    return g4_fail("%s: tensor %s: expected %s, found %s %s", g4_st_path(&m->st, t), t->name, expected,
                   g4_dtype_name(t->dtype), g4_shape_str(t, sh, sizeof sh));
}

static int is_float_dtype(g4_dtype dt) { return dt == G4_DT_F32 || dt == G4_DT_BF16 || dt == G4_DT_F16; }

/* A float vector (norm weight) of n elements, copied to f32. */
static float *load_vector(g4_model *m, const char *name, int n) {
    const g4_tensor *t = find(m, name);
    if (!t) return NULL;
    if (!is_float_dtype(t->dtype) || !shape_is(t, 1, n, 0)) {
        char want[64];
        snprintf(want, sizeof want, "BF16 [%d]", n);
        wrong(m, t, want);
        return NULL;
    }
    float *v = own(m, sizeof *v * (size_t)n);
    if (!v) {
        g4_fail("%s: out of memory", name);
        return NULL;
    }
    for (int i = 0; i < n; i++) v[i] = g4_tensor_float(t, i);
    return v;
}

/* A scalar stored as shape [] or [1]. */
static int load_scalar(g4_model *m, const char *name, float *out) {
    const g4_tensor *t = find(m, name);
    if (!t) return -1;
    if (!is_float_dtype(t->dtype) || t->numel != 1 || t->ndim > 1) return wrong(m, t, "a float scalar (shape [] or [1])");
    *out = g4_tensor_float(t, 0);
    if (!isfinite(*out)) return g4_fail("%s: tensor %s: value is not finite", g4_st_path(&m->st, t), name);
    return 0;
}

/* Whether the checkpoint is in the mobile format (quant_method gemma, one scale per output row),
 * whose every linear and producer layer carries its static activation and KV-cache scales. */
static int mobile_format(const g4_model *m) { return m->cfg.quant.method == G4_QUANT_GEMMA && m->cfg.quant.block_size == 0; }

static int load_activation_scale(g4_model *m, const char *name, float *out) {
    if (load_scalar(m, name, out) != 0) return -1;
    /* 0 means "not quantized"; anything else must have a finite f32 reciprocal (x * (1/s)) */
    if (*out < 0 || (*out != 0 && !isfinite(1.0f / *out)))
        return g4_fail("%s: tensor %s: activation scale %g must be 0 or a positive normal number", m->dir, name, *out);
    return 0;
}

/* A KV-cache scale: required in the mobile format, which has them on every layer; a checkpoint
 * without activation quantization may leave them out (0: the cache stays f32). */
static int load_cache_scale(g4_model *m, const char *name, float *out) {
    *out = 0;
    if (!mobile_format(m) && !g4_st_find(&m->st, name)) return 0;
    return load_activation_scale(m, name, out);
}

static int check_bits(const g4_model *m, const char *module, int bits) {
    if (bits != 2 && bits != 4 && bits != 8)
        return g4_fail("%s/config.json: quantization_config gives %s %d bits (g4 supports 2, 4 and 8)", m->dir, module, bits);
    return 0;
}

/* Packed codes [rows, ceil(cols * bits / 8)]: U8 for 2/4 bits, I8 for 8 bits. */
static int check_packed(const g4_model *m, const g4_tensor *t, int bits, int64_t rows, int64_t cols) {
    int64_t packed = (int64_t)g4_packed_row_bytes(bits, (size_t)cols);
    g4_dtype want_dt = bits == 8 ? G4_DT_I8 : G4_DT_U8;
    if (t->dtype != want_dt || !shape_is(t, 2, rows, packed)) {
        char want[128];
        snprintf(want, sizeof want, "%s [%lld, %lld] (%lld inputs at %d bits)", g4_dtype_name(want_dt), (long long)rows,
                 (long long)packed, (long long)cols, bits);
        return wrong(m, t, want);
    }
    return 0;
}

/* Element i of a scale tensor (F32, or F16 as the block-scaled format may store it). */
static float scale_at(const g4_tensor *t, int64_t i) {
    return t->dtype == G4_DT_F16 ? g4_f16_to_f32((uint16_t)(t->data[2 * i] | t->data[2 * i + 1] << 8)) : g4_load_f32(t->data + 4 * i);
}

/* Scales [rows, nblocks], copied out as f32 (or only checked when copy is NULL). The mobile
 * format's are F32, positive and finite (the lm_head's argmax search relies on the sign); the
 * block-scaled format (block != 0) may store F16 and signed values, as llama.cpp's Q4_0 does
 * (d = max / -8 takes the sign that maps the block's largest element to code -8), and 0 for a
 * block of zeros. */
static int read_scales(const g4_model *m, const g4_tensor *t, int64_t rows, int64_t nblocks, int block, float *copy) {
    if (!(t->dtype == G4_DT_F32 || (block && t->dtype == G4_DT_F16)) || !shape_is(t, 2, rows, nblocks)) {
        char want[64];
        snprintf(want, sizeof want, "%s [%lld, %lld]", block ? "F32 or F16" : "F32", (long long)rows, (long long)nblocks);
        return wrong(m, t, want);
    }
    for (int64_t i = 0; i < t->numel; i++) {
        float s = scale_at(t, i);
        if (!isfinite(s) || (!block && !(s > 0)))
            return g4_fail("%s: tensor %s: scale %g at element %lld is not %s", g4_st_path(&m->st, t), t->name, s, (long long)i,
                           block ? "finite" : "positive and finite");
        if (copy) copy[i] = s;
    }
    return 0;
}

/* The mobile format's per-row scales: F32 [rows, nblocks]. */
static int check_scales(const g4_model *m, const g4_tensor *t, int64_t rows, int64_t nblocks, float *copy) {
    return read_scales(m, t, rows, nblocks, 0, copy);
}

/* A block-scaled linear's scales [out, in / block] (F32 or F16, kept as f32). Its recipe
 * quantizes no activations: activation-scale tensors may be absent, and must be 0 when present. */
static int bind_block_scales(g4_model *m, g4_linear *lin, const char *module, int block) {
    char name[192];
    int in = lin->w.in, out = lin->w.out;
    if (in % block)
        return g4_fail("%s/config.json: %s has %d inputs, not a multiple of its block_size %d", m->dir, module, in, block);
    float *scale = own(m, sizeof *scale * (size_t)out * (size_t)(in / block));
    if (!scale) return g4_fail("%s: out of memory", module);
    snprintf(name, sizeof name, "%s.weight_scale", module);
    const g4_tensor *s = find(m, name);
    if (!s || read_scales(m, s, out, in / block, 1, scale) != 0) return -1;
    lin->w.block = block;
    lin->w.w_scale = scale;
    static const char *const leaves[2] = {"input_activation_scale", "output_activation_scale"};
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s.%s", module, leaves[i]);
        float v = 0;
        if (g4_st_find(&m->st, name) && load_scalar(m, name, &v) != 0) return -1;
        if (v != 0)
            return g4_fail("%s: tensor %s is %g: static activation scales with block-scaled weights are not implemented", m->dir,
                           name, v);
    }
    return 0;
}

/* Binds the linear `module` ([out, in]); its bit width comes from the quantization config. */
static int bind_linear_stored(g4_model *m, g4_linear *lin, const char *module, int in, int out) {
    char name[192];
    snprintf(lin->name, sizeof lin->name, "%s", module);
    lin->id = m->n_linears++;
    int bits = g4_config_module_bits(&m->cfg, module);
    lin->w.in = in;
    lin->w.out = out;
    snprintf(name, sizeof name, "%s.weight", module);
    const g4_tensor *w = find(m, name);
    if (!w) return -1;
    if (bits == 0) { /* not converted: a float linear, BF16 on disk */
        if (w->dtype != G4_DT_BF16 || !shape_is(w, 2, out, in)) {
            char want[64];
            snprintf(want, sizeof want, "BF16 [%d, %d]", out, in);
            return wrong(m, w, want);
        }
        lin->w.bits = G4_WT_BF16;
        lin->w.row_bytes = (size_t)in * 2;
        lin->w.w = w->data;
        return 0;
    }
    if (check_bits(m, module, bits) != 0 || check_packed(m, w, bits, out, in) != 0) return -1;
    lin->w.bits = bits;
    lin->w.row_bytes = g4_packed_row_bytes(bits, (size_t)in);
    lin->w.w = w->data;
    int block = g4_config_module_block(&m->cfg, module);
    if (block > 0) return bind_block_scales(m, lin, module, block);
    float *scale = own(m, sizeof *scale * (size_t)out);
    if (!scale) return g4_fail("%s: out of memory", module);
    snprintf(name, sizeof name, "%s.weight_scale", module);
    const g4_tensor *s = find(m, name);
    if (!s || check_scales(m, s, out, 1, scale) != 0) return -1;
    lin->w.w_scale = scale;
    snprintf(name, sizeof name, "%s.input_activation_scale", module);
    if (load_activation_scale(m, name, &lin->s_in) != 0) return -1;
    snprintf(name, sizeof name, "%s.output_activation_scale", module);
    return load_activation_scale(m, name, &lin->s_out);
}

/* The weight-preparation hook (kernels.h, g4_wprep): lin's copy in the layout of the level the
 * model prepares for, kept with the model's other copies and freed with them. An optimization
 * only: without a copy (the level takes none for this weight, memory short) the level reads the
 * stored codes, with the same bits. */
static void prepare_linear(g4_model *m, g4_linear *lin) {
    if (!m->prep_level || lin->w.prep) return;
    g4_wprep *p = owned_room(m) == 0 ? m->prep_level->prepare(&lin->w) : NULL;
    if (!p) return;
    m->owned[m->n_owned++] = p->data; /* the model frees its owned pointers with free() */
    if (owned_room(m) != 0) {
        free(p); /* the data stays owned; the copy is not used */
        return;
    }
    m->owned[m->n_owned++] = p;
    lin->w.prep = p;
}

int g4_model_bind_linear(g4_model *m, g4_linear *lin, const char *module, int in, int out) {
    int rc = bind_linear_stored(m, lin, module, in, out);
    if (rc == 0) prepare_linear(m, lin); /* a tower's, bound after the load (the others wait for it: load) */
    return rc;
}

/* An embedding table that stays float: `module.weight`, BF16 [rows, cols]. */
static int bind_bf16_embedding(g4_model *m, g4_qembedding *e, const char *module, int rows, int cols) {
    char name[192];
    snprintf(name, sizeof name, "%s.weight", module);
    const g4_tensor *t = find(m, name);
    if (!t) return -1;
    if (t->dtype != G4_DT_BF16 || !shape_is(t, 2, rows, cols)) {
        char want[64];
        snprintf(want, sizeof want, "BF16 [%d, %d]", rows, cols);
        return wrong(m, t, want);
    }
    g4_st_advise_random(&m->st, t);
    *e = (g4_qembedding){.bits = G4_WT_BF16, .rows = rows, .cols = cols, .row_bytes = (size_t)cols * 2, .codes = t->data};
    return 0;
}

static int bind_embedding(g4_model *m, g4_qembedding *e, const char *module, int rows, int cols, int want_blocks) {
    char name[192];
    int bits = g4_config_module_bits(&m->cfg, module);
    if (!m->cfg.quant.quantize_embeddings || bits == 0) return bind_bf16_embedding(m, e, module, rows, cols);
    if (check_bits(m, module, bits) != 0) return -1;
    int block = g4_config_module_block(&m->cfg, module);
    if (block > 0) {
        if (cols % block)
            return g4_fail("%s/config.json: %s has %d columns, not a multiple of its block_size %d", m->dir, module, cols, block);
        want_blocks = cols / block;
    }
    snprintf(name, sizeof name, "%s.embedding_quantized", module);
    const g4_tensor *c = find(m, name);
    if (!c || check_packed(m, c, bits, rows, cols) != 0) return -1;
    snprintf(name, sizeof name, "%s.embedding_scale", module);
    const g4_tensor *s = find(m, name);
    if (!s) return -1;
    int nblocks = s->ndim == 2 ? (int)s->shape[1] : 0;
    if (want_blocks ? nblocks != want_blocks : (nblocks < 1 || cols % nblocks)) {
        char want[96];
        if (want_blocks) snprintf(want, sizeof want, "%s [%d, %d]", block > 0 ? "F32 or F16" : "F32", rows, want_blocks);
        else snprintf(want, sizeof want, "F32 [%d, k] with k dividing %d", rows, cols);
        return wrong(m, s, want);
    }
    if (read_scales(m, s, rows, nblocks, block > 0, NULL) != 0) return -1;
    g4_st_release(&m->st, s); /* validated whole, then gathered one row per token */
    g4_st_advise_random(&m->st, c);
    g4_st_advise_random(&m->st, s);
    *e = (g4_qembedding){.bits = bits, .rows = rows, .cols = cols, .nblocks = nblocks,
                         .row_bytes = g4_packed_row_bytes(bits, (size_t)cols), .codes = c->data, .scale = s};
    return 0;
}

/* Consumers read the K/V of the last non-shared layer of their own attention type. */
static int assign_kv_sources(g4_model *m) {
    const g4_config *c = &m->cfg;
    int first_shared = c->n_layers - c->n_kv_shared;
    for (int l = 0; l < c->n_layers; l++) {
        g4_layer *L = &m->layers[l];
        L->kv_source = l;
        if (c->assistant) L->kv_source = G4_KV_FROM_TARGET; /* a drafter's layers read the target's (draft.c) */
        if (l < first_shared || c->assistant) continue;
        L->kv_source = -1;
        for (int j = first_shared - 1; j >= 0; j--)
            if (c->layer_types[j] == c->layer_types[l]) {
                L->kv_source = j;
                break;
            }
        if (L->kv_source < 0)
            return g4_fail("%s/config.json: layer %d shares K/V but no earlier layer has its attention type", m->dir, l);
    }
    return 0;
}

/* RoPE frequencies (model.md §4.3): theta^(-2j/d) for the rotated pairs, 0 for the rest;
 * computed in f32 as transformers does. */
static float *rope_frequencies(g4_model *m, const g4_rope_config *r, int hd) {
    int half = hd / 2;
    int n_rot = r->proportional ? (int)floor(r->partial_rotary_factor * hd / 2) : half;
    float *f = own(m, sizeof *f * (size_t)half);
    if (!f) return NULL;
    for (int j = 0; j < n_rot && j < half; j++)
        f[j] = 1.0f / powf((float)r->theta, (float)(2 * j) / (float)hd);
    return f;
}

/* Global module `name` (modules.h): its checkpoint name into full, its dimensions into *out, *in. */
static const g4_module *global_module(const g4_model *m, const char *name, char *full, size_t cap, int *out, int *in) {
    const g4_module *md = g4_global_module(name);
    g4_global_module_name(full, cap, m->prefix, md);
    *out = g4_dim_size(&m->cfg, NULL, md->out);
    *in = g4_dim_size(&m->cfg, NULL, md->in);
    return md;
}

int g4_layer_linears(const g4_layer *L, int producer, const g4_linear *out[G4_LAYER_LINEARS]) {
    int n = 0;
    for (int i = 0; i < G4_LAYER_LINEARS; i++) {
        const g4_module *md = &g4_layer_modules[i];
        if (md->part != G4_PART_PRODUCER || producer) out[n++] = (const g4_linear *)((const char *)L + md->field);
    }
    return n;
}

/* Layer l's module md (modules.h) into its field of L. */
static int bind_layer_module(g4_model *m, g4_layer *L, int l, const g4_layer_shape *ls, const g4_module *md) {
    char name[192];
    g4_layer_module_name(name, sizeof name, m->prefix, l, md);
    void *field = (char *)L + md->field;
    int out = g4_dim_size(&m->cfg, ls, md->out);
    switch (md->kind) {
    case G4_MOD_LINEAR: return g4_model_bind_linear(m, field, name, g4_dim_size(&m->cfg, ls, md->in), out);
    case G4_MOD_VECTOR: {
        size_t at = strlen(name);
        snprintf(name + at, sizeof name - at, ".weight");
        float *v = load_vector(m, name, out);
        *(float **)field = v;
        return v ? 0 : -1;
    }
    case G4_MOD_SCALAR: return load_scalar(m, name, field);
    case G4_MOD_CACHE_SCALE: return load_cache_scale(m, name, field);
    case G4_MOD_EMBEDDING: break;
    }
    return g4_fail("%s: module %s: not a layer module", m->dir, name);
}

/* Layer l's shape and modules: first those of every layer (the linears' ids in the order the
 * per-session tables have always had), then a producer's K/V projections, k_norm and cache scales. */
static int bind_layer(g4_model *m, int l) {
    const g4_config *c = &m->cfg;
    g4_layer *L = &m->layers[l];
    g4_layer_shape ls = g4_layer_shape_of(c, l);
    L->type = ls.type;
    L->head_dim = ls.head_dim;
    L->n_kv_heads = ls.n_kv_heads;
    L->mlp_dim = ls.mlp_dim;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < g4_n_layer_modules; i++) {
            const g4_module *md = &g4_layer_modules[i];
            if ((md->part == G4_PART_PRODUCER) != pass || !g4_module_present(c, &ls, md)) continue;
            if (bind_layer_module(m, L, l, &ls, md) != 0) return -1;
        }
    if (ls.producer && (memcmp(&L->q.s_in, &L->k.s_in, 4) || memcmp(&L->q.s_in, &L->v.s_in, 4)))
        g4_warn("%s: layer %d: q/k/v input activation scales differ; each is quantized separately", m->dir, l);
    if (memcmp(&L->gate.s_in, &L->up.s_in, 4))
        g4_warn("%s: layer %d: gate/up input activation scales differ; each is quantized separately", m->dir, l);
    if (!(L->inv_freq = rope_frequencies(m, &c->rope[L->type], ls.head_dim))) return g4_fail("%s: out of memory", m->dir);
    return 0;
}

/* The lm_head: its own tensors, or the token embedding when the config ties them (BF16, one
 * scale per row, or one per block of the row). */
static int bind_lm_head(g4_model *m) {
    const g4_config *c = &m->cfg;
    const g4_qembedding *e = &m->embed;
    char mod[64];
    int out, in;
    global_module(m, "lm_head", mod, sizeof mod, &out, &in);
    char weight[80];
    snprintf(weight, sizeof weight, "%s.weight", mod);
    if (g4_st_find(&m->st, weight) || !c->tie_word_embeddings) {
        if (g4_model_bind_linear(m, &m->lm_head, mod, in, out) != 0) return -1;
        if (m->lm_head.s_in != 0 || m->lm_head.s_out != 0)
            /* defined as for every linear (activation-quant.md §2, G3/G4: transformers' QuantizedLinear
             * applies them); the published checkpoint has 0, so this is unusual enough to say */
            g4_warn("%s: lm_head.input_activation_scale %g, output_activation_scale %g (not 0): --act fake and int quantize the "
                    "lm_head input and output with them", m->dir, m->lm_head.s_in, m->lm_head.s_out);
        return 0;
    }
    snprintf(m->lm_head.name, sizeof m->lm_head.name, "lm_head (tied to embed_tokens)");
    m->lm_head.id = m->n_linears++; /* its own slot in the per-session tables, not linear 0's */
    m->lm_head.w = (g4_qweight){.bits = e->bits, .in = c->hidden, .out = c->vocab, .row_bytes = e->row_bytes, .w = e->codes};
    if (e->bits == G4_WT_BF16) return 0;
    size_t n = (size_t)c->vocab * (size_t)e->nblocks;
    float *scale = own(m, sizeof *scale * n);
    if (!scale) return g4_fail("%s: out of memory", m->dir);
    for (size_t i = 0; i < n; i++) scale[i] = scale_at(e->scale, (int64_t)i);
    m->lm_head.w.w_scale = scale;
    m->lm_head.w.block = e->nblocks > 1 ? e->cols / e->nblocks : 0;
    return 0;
}

/* The bit widths of the published mobile checkpoints (checkpoint.md §4 for E2B; E4B from
 * transformers' conversion script, convert_gemma4_weights.py, the source of g4 synth's e4b preset),
 * recognised by their shape. */
typedef struct {
    const char *name;
    int hidden, n_layers, vocab;
    int mlp_low_from, mlp_low_bits; /* layers from mlp_low_from on have MLPs of mlp_low_bits (else 4) */
    int embed_bits, ple_bits, lm_head_bits;
} published_bits;

static const published_bits published[] = {
    {"gemma-4-E2B-it-qat-mobile-transformers", 1536, 35, 262144, 15, 2, 2, 4, 2},
    {"gemma-4-E4B-it-qat-mobile-transformers", 2560, 42, 262144, 42, 4, 2, 2, 2},
};

/* For a mobile-format config with a published checkpoint's shape, the bit widths must be that
 * checkpoint's; a difference is worth a warning (a converter that got the patterns' order wrong
 * decodes layers at the wrong width). */
static void warn_if_not_published_bits(const g4_model *m) {
    const g4_config *c = &m->cfg;
    for (size_t k = 0; k < sizeof published / sizeof *published; k++) {
        const published_bits *p = &published[k];
        if (c->hidden != p->hidden || c->n_layers != p->n_layers || c->vocab != p->vocab) continue;
        int diffs = 0;
        for (int l = 0; l < c->n_layers; l++) {
            const g4_layer *L = &m->layers[l];
            int class_bits[] = {[G4_BITS_ATTN] = 4, [G4_BITS_MLP] = l >= p->mlp_low_from ? p->mlp_low_bits : 4, [G4_BITS_PLI] = 8};
            for (int i = 0; i < G4_LAYER_LINEARS; i++) {
                const g4_module *md = &g4_layer_modules[i];
                if (md->part == G4_PART_PRODUCER) continue; /* as bound on every layer */
                diffs += ((const g4_linear *)((const char *)L + md->field))->w.bits != class_bits[md->bits];
            }
        }
        diffs += m->lm_head.w.bits != p->lm_head_bits || m->embed.bits != p->embed_bits || m->embed_ple.bits != p->ple_bits ||
                 m->pmp.w.bits != G4_WT_BF16;
        if (diffs) g4_warn("%s: bit widths differ from the published %s checkpoint in %d places", m->dir, p->name, diffs);
    }
}

/* Whether any linear or KV-cache scale of the checkpoint is not 0 (model.h, static_act). */
static int has_static_activation_scales(const g4_model *m) {
    int any = m->lm_head.s_in != 0 || m->lm_head.s_out != 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const g4_layer *L = &m->layers[l];
        const g4_linear *lins[9];
        int n = g4_layer_linears(L, g4_layer_is_producer(m, l), lins);
        for (int i = 0; i < n; i++) any |= lins[i]->s_in != 0 || lins[i]->s_out != 0;
        any |= L->k_cache_scale != 0 || L->v_cache_scale != 0;
    }
    return any;
}

static int bind_decoder(g4_model *m);

static int bind_all(g4_model *m) {
    const g4_config *c = &m->cfg;
    char mod[160], name[192];
    int out, in;
    /* a drafter (Gemma4AssistantForCausalLM) keeps its decoder under model. */
    m->prefix = c->assistant ? "model." : "model.language_model.";
    global_module(m, "embed_tokens", mod, sizeof mod, &out, &in);
    if (bind_embedding(m, &m->embed, mod, out, in, 0) != 0) return -1;
    if (c->ple_dim == 0) return bind_decoder(m);
    global_module(m, "embed_tokens_per_layer", mod, sizeof mod, &out, &in);
    if (bind_embedding(m, &m->embed_ple, mod, out, in, 0) != 0) return -1;
    const g4_module *pmp = global_module(m, "per_layer_model_projection", mod, sizeof mod, &out, &in);
    if (g4_model_bind_linear(m, &m->pmp, mod, in, out) != 0) return -1;
    if (pmp->kept_float && m->pmp.w.bits != G4_WT_BF16)
        return g4_fail("%s: %s is expected to stay float (modules_to_not_convert)", m->dir, mod);
    global_module(m, "per_layer_projection_norm", name, sizeof name, &out, &in);
    snprintf(name + strlen(name), sizeof name - strlen(name), ".weight");
    if (!(m->ple_norm = load_vector(m, name, out))) return -1;
    return bind_decoder(m);
}

/* The final norm, the layers and the lm_head. */
static int bind_decoder(g4_model *m) {
    const g4_config *c = &m->cfg;
    char name[192];
    int out, in;
    global_module(m, "norm", name, sizeof name, &out, &in);
    snprintf(name + strlen(name), sizeof name - strlen(name), ".weight");
    if (!(m->final_norm = load_vector(m, name, out))) return -1;
    m->layers = own(m, sizeof *m->layers * (size_t)c->n_layers);
    if (!m->layers) return g4_fail("%s: out of memory", m->dir);
    if (assign_kv_sources(m) != 0) return -1;
    for (int l = 0; l < c->n_layers; l++)
        if (bind_layer(m, l) != 0) return -1;
    if (bind_lm_head(m) != 0) return -1;
    m->embed_scale = (float)sqrt((double)c->hidden);
    m->ple_embed_scale = (float)sqrt((double)c->ple_dim);
    m->static_act = has_static_activation_scales(m);
    if (mobile_format(m)) warn_if_not_published_bits(m);
    return 0;
}

/* ---- resident weights ----
 * Every decoded token streams each linear's weights once (model.md §11). Read through the file
 * mapping they sit on 4 KiB pages; copied into one anonymous block that asks for transparent huge
 * pages (2 MiB) they decode 7-9 % faster on E2B on the development machine (decode steps
 * alternating between the two copies in one process; 15 % in alternating whole runs), with fewer
 * TLB misses and page walks on every stream. The copy takes the mapping's place in the resident
 * set, since each tensor's file pages are released once it is copied, so memory use stays about
 * the same. Loading takes longer: 0.22-0.27 s for E2B's 790 MB with the copy on the pool (0.32-0.35 s
 * on one thread), most of it the kernel clearing the new pages, and up to 3 s on a VM whose host
 * has not backed that memory yet. Where transparent huge pages are off, the weights stay mapped:
 * a copy on 4 KiB pages gained 0-4 %. */
#define HUGE_PAGE ((size_t)2 << 20)

static int huge_pages_available(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[128] = "";
    if (!f) return 0;
    int ok = fgets(line, sizeof line, f) && !strstr(line, "[never]");
    fclose(f);
    return ok;
}

static size_t weight_bytes(const g4_linear *L) { return L->w.row_bytes * (size_t)L->w.out; }

/* Every linear the forward pass streams, the largest (the lm_head) first: copying it while the
 * block is still mostly empty keeps the peak of block + not yet released file pages low. */
static int streamed_linears(g4_model *m, g4_linear **out) {
    int n = 0;
    out[n++] = &m->lm_head;
    out[n++] = &m->pmp;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const g4_linear *lins[9];
        int k = g4_layer_linears(&m->layers[l], g4_layer_is_producer(m, l), lins);
        for (int i = 0; i < k; i++) out[n++] = (g4_linear *)lins[i];
    }
    return n;
}

/* An optimization only: on any failure the weights stay where they are. */
static void make_weights_resident(g4_model *m) {
    if (!huge_pages_available()) return;
    int cap = 2 + 9 * m->cfg.n_layers, n;
    g4_linear **lins = malloc(sizeof *lins * (size_t)cap);
    if (!lins) return;
    n = streamed_linears(m, lins);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (weight_bytes(lins[i]) + 63) & ~(size_t)63;
    size_t len = (total + 2 * HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE; /* room to align the start */
    void *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) {
        free(lins);
        return;
    }
    uint8_t *block = (uint8_t *)(((uintptr_t)map + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    madvise(block, total, MADV_HUGEPAGE);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const uint8_t *from = lins[i]->w.w;
        size_t bytes = weight_bytes(lins[i]);
        g4_pool_memcpy(block + at, from, bytes, HUGE_PAGE); /* the time goes into clearing the new pages */
        lins[i]->w.w = block + at;
        if (m->embed.codes == from) m->embed.codes = block + at; /* a tied lm_head: one table, one copy */
        g4_st_release_bytes(&m->st, from, bytes);
        at += (bytes + 63) & ~(size_t)63;
    }
    mprotect(map, len, PROT_READ);
    m->resident = map;
    m->resident_len = len;
    free(lins);
}

/* Every bound linear's copy for the level sessions will run (g4_kernels_get: the best, or the one
 * G4_DISPATCH forces), when that level has a prepare hook; the linears bound later (the towers')
 * get theirs as they are bound. After make_weights_resident, whose copy of the codes is what the
 * copies are made from (a copy records the codes it came from). Not with `--weights mapped`
 * (mapped: no anonymous copy of the weights; the level reads the mapped codes) nor for a drafter
 * (loaded mapped). A session running another level (g4 bench --kernels, say) reads the stored
 * codes: no level reads another's copy. */
static void prepare_weights(g4_model *m) {
    const g4_kernels *k = g4_kernels_get();
    if (!k->prepare) return;
    int cap = 2 + 9 * m->cfg.n_layers;
    g4_linear **lins = malloc(sizeof *lins * (size_t)cap);
    if (!lins) return;
    m->prep_level = k;
    int n = streamed_linears(m, lins);
    for (int i = 0; i < n; i++) prepare_linear(m, lins[i]);
    free(lins);
}

/* A target (assistant 0) or a drafter's decoder (assistant 1); each refuses the other kind. */
static g4_model *load(const char *dir, int mapped, int assistant) {
    g4_model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(dir))) {
        free(m);
        g4_fail("%s: out of memory", dir);
        return NULL;
    }
    int rc = g4_config_load(&m->cfg, dir);
    if (rc == 0 && m->cfg.assistant != assistant)
        rc = assistant ? g4_fail("%s/config.json: model_type is not gemma4_assistant: not a drafter (--draft takes one)", dir)
                       : g4_fail("%s/config.json: a gemma4_assistant is a drafter: load it with --draft beside its target model", dir);
    if (rc != 0 || g4_st_open_dir(&m->st, dir) != 0 || bind_all(m) != 0) {
        g4_model_free(m);
        return NULL;
    }
    if (!mapped) {
        make_weights_resident(m);
        prepare_weights(m);
    }
    return m;
}

g4_model *g4_model_load_drafter(const char *dir) { return load(dir, 1, 1); }

g4_model *g4_model_load(const char *dir) { return load(dir, 0, 0); }
g4_model *g4_model_load_mapped(const char *dir) { return load(dir, 1, 0); }
int g4_model_weights_resident(const g4_model *m) { return m->resident != NULL; }

void g4_model_free(g4_model *m) {
    if (!m) return;
    if (m->vision_free) m->vision_free(m->vision);
    if (m->audio_free) m->audio_free(m->audio);
    if (m->resident) munmap(m->resident, m->resident_len);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    g4_st_close(&m->st);
    g4_config_free(&m->cfg);
    free(m->dir);
    free(m);
}

int g4_model_vocab_size(const g4_model *m) { return m->cfg.vocab; }
int g4_model_bos_id(const g4_model *m) { return m->cfg.bos_id; }
const char *g4_model_dir(const g4_model *m) { return m->dir; }
int g4_model_has_per_layer_inputs(const g4_model *m) { return m->cfg.ple_dim > 0; }
int g4_model_stop_ids(const g4_model *m, const int **ids) {
    *ids = m->cfg.stop_ids;
    return m->cfg.n_stop_ids;
}
