#define _DEFAULT_SOURCE /* realpath, DT_REG */
#include "quantize.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/config.h"
#include "format/safetensors.h"
#include "format/safetensors_write.h"
#include "model/modules.h"
#include "quant/blockq.h"
#include "util/err.h"
#include "util/file.h"

/* The decoder's prefix in a target's checkpoint and in a drafter's (modules.h names are under it). */
static const char *decoder_prefix(int assistant) { return assistant ? "model." : "model.language_model."; }

/* What one output tensor is made of. */
typedef enum { OUT_COPY, OUT_CODES, OUT_SCALES } out_kind;

typedef struct {
    out_kind kind;
    int bits; /* OUT_CODES / OUT_SCALES: the code width, 4 (Q4_0) or 8 (Q8_0) */
    const g4_tensor *src;
} out_item;

typedef struct {
    g4_stw w;
    out_item *items; /* parallel to w.t */
    int cap;
    const g4_safetensors *st;
    char err[1024]; /* a failure of the input's (fill): reported as it is, not under the output's name */
    char **kept;    /* the modules kept BF16 (keeps_float), for modules_to_not_convert */
    int n_kept;
} plan_t;

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* A quantized linear's weight: a layer linear of the module table (modules.h), or a drafter's own
 * projection (pre/post_projection, the centroids); every other linear (per_layer_model_projection,
 * the towers') stays as it is. */
static int is_linear(const char *name, int assistant) {
    char full[256];
    for (int i = 0; i < g4_n_global_modules; i++) {
        const g4_module *md = &g4_global_modules[i];
        if (md->part != G4_PART_DRAFTER || !assistant) continue;
        g4_global_module_name(full, sizeof full, decoder_prefix(assistant), md);
        if (strncmp(name, full, strlen(full)) == 0 && strcmp(name + strlen(full), ".weight") == 0) return 1;
    }
    const char *layers = assistant ? "model.layers." : "model.language_model.layers.";
    if (strncmp(name, layers, strlen(layers)) != 0) return 0;
    for (int i = 0; i < G4_LAYER_LINEARS; i++) {
        snprintf(full, sizeof full, ".%s.weight", g4_layer_modules[i].name);
        if (ends_with(name, full)) return 1;
    }
    return 0;
}

/* The embedding tables (a drafter's one is its tied lm_head). */
static int is_embedding(const char *name, int assistant) {
    char full[256];
    for (int i = 0; i < g4_n_global_modules; i++) {
        const g4_module *md = &g4_global_modules[i];
        if (md->kind != G4_MOD_EMBEDDING || (assistant && md->part == G4_PART_PLI)) continue;
        g4_global_module_name(full, sizeof full, decoder_prefix(assistant), md);
        if (strncmp(name, full, strlen(full)) == 0 && strcmp(name + strlen(full), ".weight") == 0) return 1;
    }
    return 0;
}

static int plan_add(plan_t *p, const char *name, g4_dtype dt, int ndim, const int64_t *shape, out_item item) {
    if (p->w.n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 256;
        out_item *it = realloc(p->items, sizeof *it * (size_t)cap);
        if (!it) return g4_fail("%s: out of memory", name);
        p->items = it;
        p->cap = cap;
    }
    if (g4_stw_add(&p->w, name, dt, ndim, shape) != 0) return -1;
    p->items[p->w.n - 1] = item;
    return 0;
}

/* The output name: `name` without its trailing ".weight", then `suffix`. */
static void derived_name(char *buf, size_t cap, const char *name, const char *suffix) {
    size_t n = strlen(name) - strlen(".weight");
    snprintf(buf, cap, "%.*s%s", (int)n, name, suffix);
}

/* A float matrix whose rows split into whole blocks of 32, or an error naming it. */
static int check_quantizable(const g4_safetensors *st, const g4_tensor *t) {
    char sh[96];
    if (t->dtype != G4_DT_BF16 && t->dtype != G4_DT_F16 && t->dtype != G4_DT_F32)
        return g4_fail("%s: tensor %s: %s %s: g4 quantize reads BF16, F16 or F32 weights", g4_st_path(st, t), t->name,
                       g4_dtype_name(t->dtype), g4_shape_str(t, sh, sizeof sh));
    if (t->ndim != 2 || t->shape[1] % G4_QBLOCK != 0 || t->shape[1] == 0)
        return g4_fail("%s: tensor %s: %s %s: its rows are not whole blocks of %d inputs, and only a BF16 matrix can stay float "
                       "(g4 reads float linears as BF16)",
                       g4_st_path(st, t), t->name, g4_dtype_name(t->dtype), g4_shape_str(t, sh, sizeof sh), G4_QBLOCK);
    return 0;
}

/* Whether src cannot be block-quantized but can stay as it is: a BF16 matrix whose rows are not
 * whole blocks of 32 (a 16-wide per_layer_projection). Q8_0, the wider block type, has blocks of
 * 32 too, so BF16 is the one type left, as llama.cpp's quantizer falls back to a float type for
 * rows its block types do not divide. */
static int keeps_float(const g4_tensor *t) {
    return t->dtype == G4_DT_BF16 && t->ndim == 2 && t->shape[0] > 0 && t->shape[1] > 0 && t->shape[1] % G4_QBLOCK != 0;
}

/* src copied as it is (BF16) and its module (the name without ".weight") listed for
 * modules_to_not_convert. */
static int add_kept_float(plan_t *p, const g4_tensor *src) {
    char module[512];
    derived_name(module, sizeof module, src->name, "");
    char **k = realloc(p->kept, sizeof *k * (size_t)(p->n_kept + 1));
    if (!k) return g4_fail("%s: out of memory", src->name);
    p->kept = k;
    if (!(p->kept[p->n_kept] = strdup(module))) return g4_fail("%s: out of memory", src->name);
    p->n_kept++;
    return plan_add(p, src->name, src->dtype, src->ndim, src->shape, (out_item){OUT_COPY, 0, src});
}

/* The quantized pair of src: codes (U8 packed 4-bit, or I8) under codes_name and F16 block
 * scales under scale_name; or src kept BF16 when its rows are not whole blocks (keeps_float). */
static int add_quantized(plan_t *p, const g4_tensor *src, int bits, const char *codes_name, const char *scale_name) {
    if (keeps_float(src)) return add_kept_float(p, src);
    if (check_quantizable(p->st, src) != 0) return -1;
    int64_t rows = src->shape[0], cols = src->shape[1];
    int64_t cshape[2] = {rows, bits == 4 ? cols / 2 : cols}, sshape[2] = {rows, cols / G4_QBLOCK};
    if (plan_add(p, codes_name, bits == 4 ? G4_DT_U8 : G4_DT_I8, 2, cshape, (out_item){OUT_CODES, bits, src}) != 0) return -1;
    return plan_add(p, scale_name, G4_DT_F16, 2, sshape, (out_item){OUT_SCALES, bits, src});
}

static int build_plan(plan_t *p, g4_embed_quant embed, int assistant) {
    const g4_safetensors *st = p->st;
    int embed_bits = embed == G4_EMBED_Q8_0 ? 8 : 4;
    for (int i = 0; i < st->n_tensors; i++) {
        const g4_tensor *t = &st->tensors[i];
        char a[512], b[512];
        int rc;
        if (is_linear(t->name, assistant)) {
            derived_name(b, sizeof b, t->name, ".weight_scale");
            rc = add_quantized(p, t, 4, t->name, b);
        } else if (is_embedding(t->name, assistant) && embed != G4_EMBED_BF16) {
            derived_name(a, sizeof a, t->name, ".embedding_quantized");
            derived_name(b, sizeof b, t->name, ".embedding_scale");
            rc = add_quantized(p, t, embed_bits, a, b);
        } else if (strcmp(t->name, "lm_head.weight") == 0 && embed != G4_EMBED_BF16) {
            rc = add_quantized(p, t, embed_bits, t->name, "lm_head.weight_scale");
        } else {
            rc = plan_add(p, t->name, t->dtype, t->ndim, t->shape, (out_item){OUT_COPY, 0, t});
        }
        if (rc != 0) return -1;
    }
    return 0;
}

/* Block k (row-major over [rows][cols / 32]) of src as f32; fails on a value that is not finite. */
static int read_block(const g4_tensor *src, int64_t k, float *x) {
    int64_t e0 = k * G4_QBLOCK;
    for (int i = 0; i < G4_QBLOCK; i++) {
        x[i] = g4_tensor_float(src, e0 + i);
        if (!isfinite(x[i])) {
            int64_t cols = src->shape[1];
            return g4_fail("tensor %s: element [%lld, %lld] is %g: g4 quantize needs finite weights", src->name,
                           (long long)((e0 + i) / cols), (long long)((e0 + i) % cols), x[i]);
        }
    }
    return 0;
}

/* Quantizes block k of it->src: codes into codes[32], the float16 scale as the result. */
static int quantize_block(const out_item *it, int64_t k, int8_t *codes, uint16_t *scale16) {
    float x[G4_QBLOCK];
    if (read_block(it->src, k, x) != 0) return -1;
    float d = it->bits == 4 ? g4_q4_0_block(x, codes) : g4_q8_0_block(x, codes);
    *scale16 = g4_f32_to_f16(d);
    if ((*scale16 & 0x7c00u) == 0x7c00u)
        return g4_fail("tensor %s: block %lld needs a scale of %g, past float16's range", it->src->name, (long long)k, d);
    return 0;
}

/* The writer's callback: bytes [off, off + n) of output tensor `index`. Every chunk but a
 * tensor's last is a multiple of G4_STW_CHUNK (4 MiB), so chunks hold whole blocks (16 or 32
 * code bytes, 2 scale bytes). */
static int fill(void *user, int index, const g4_stw_tensor *t, uint64_t off, uint8_t *buf, size_t n) {
    (void)t;
    plan_t *p = user;
    const out_item *it = &p->items[index];
    if (it->kind == OUT_COPY) {
        memcpy(buf, it->src->data + off, n);
        g4_st_release_bytes(p->st, it->src->data + off, n); /* read once: keep the input out of the resident set */
        return 0;
    }
    size_t per = it->kind == OUT_SCALES ? 2 : it->bits == 4 ? G4_QBLOCK / 2 : G4_QBLOCK;
    for (size_t at = 0; at < n; at += per) {
        int8_t codes[G4_QBLOCK];
        uint16_t s16;
        if (quantize_block(it, (int64_t)((off + at) / per), codes, &s16) != 0) {
            g4_fail_prefix("%s: ", g4_st_path(p->st, it->src));
            snprintf(p->err, sizeof p->err, "%s", g4_last_error());
            return -1;
        }
        if (it->kind == OUT_SCALES) {
            buf[at] = (uint8_t)(s16 & 0xff);
            buf[at + 1] = (uint8_t)(s16 >> 8);
        } else if (it->bits == 4) {
            for (int j = 0; j < G4_QBLOCK / 2; j++) buf[at + j] = (uint8_t)((codes[2 * j] + 8) | (codes[2 * j + 1] + 8) << 4);
        } else {
            memcpy(buf + at, codes, G4_QBLOCK);
        }
    }
    return 0;
}

/* {"num_bits": bits} */
static cJSON *bits_entry(int bits) {
    cJSON *o = cJSON_CreateObject();
    if (o) cJSON_AddNumberToObject(o, "num_bits", bits);
    return o;
}

void *g4_quantize_config_json(g4_embed_quant embed, int assistant) {
    cJSON *q = cJSON_CreateObject(), *m = cJSON_CreateObject(), *nc = cJSON_CreateArray();
    if (!q || !m || !nc) {
        cJSON_Delete(q);
        cJSON_Delete(m);
        cJSON_Delete(nc);
        return NULL;
    }
    cJSON_AddNumberToObject(q, "block_size", G4_QBLOCK);
    if (embed != G4_EMBED_BF16) {
        int bits = embed == G4_EMBED_Q8_0 ? 8 : 4;
        cJSON_AddItemToObject(m, "^lm_head$", bits_entry(bits));
        cJSON_AddItemToObject(m, "language_model\\.embed_tokens$", bits_entry(bits));
        cJSON_AddItemToObject(m, "language_model\\.embed_tokens_per_layer$", bits_entry(bits));
        if (assistant) cJSON_AddItemToObject(m, "^model\\.embed_tokens$", bits_entry(bits)); /* a drafter's (g4_draft_load) */
    }
    cJSON_AddItemToObject(q, "module_quant_configs", m);
    /* float: the towers and their embedders, then the decoder's kept-float linears (modules.h) */
    for (int i = 0; i < g4_n_media_parts; i++) cJSON_AddItemToArray(nc, cJSON_CreateString(g4_media_parts[i]));
    for (int i = 0; i < g4_n_global_modules; i++)
        if (g4_global_modules[i].kind == G4_MOD_LINEAR && g4_global_modules[i].kept_float)
            cJSON_AddItemToArray(nc, cJSON_CreateString(g4_global_modules[i].name));
    if (embed == G4_EMBED_BF16) cJSON_AddItemToArray(nc, cJSON_CreateString(g4_global_module("lm_head")->name));
    cJSON_AddItemToObject(q, "modules_to_not_convert", nc);
    cJSON_AddNumberToObject(q, "num_bits", 4);
    cJSON_AddStringToObject(q, "quant_method", "gemma");
    cJSON_AddBoolToObject(q, "quantize_embeddings", embed != G4_EMBED_BF16);
    return q;
}

/* in_dir/config.json with the quantization_config added (a cJSON tree), after checking that the
 * input is a Gemma 4 text config g4 runs (a target, or a drafter: *assistant) and carries no
 * quantization yet. */
static cJSON *output_config(const char *in_dir, g4_embed_quant embed, int *assistant) {
    char path[4096];
    char *text;
    if (g4_path_join(path, sizeof path, in_dir, "config.json") != 0 || g4_read_file(path, &text, NULL) != 0) return NULL;
    g4_config cfg;
    int rc = g4_config_parse(&cfg, text, path);
    if (rc == 0) {
        if (cfg.quant.method != G4_QUANT_NONE)
            rc = g4_fail("%s: the checkpoint is quantized already (quantization_config); g4 quantize reads checkpoints without one "
                         "(BF16)",
                         path);
        *assistant = cfg.assistant;
        g4_config_free(&cfg);
    }
    cJSON *root = rc == 0 ? cJSON_Parse(text) : NULL;
    free(text);
    if (rc != 0) return NULL;
    cJSON *q = g4_quantize_config_json(embed, *assistant);
    if (!root || !q) {
        cJSON_Delete(root);
        cJSON_Delete(q);
        g4_fail("%s: out of memory", path);
        return NULL;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization_config"); /* a null one */
    cJSON_AddItemToObject(root, "quantization_config", q);
    return root;
}

/* config's text with the modules kept BF16 (keeps_float) added to modules_to_not_convert
 * (malloc'd), or NULL when out of memory. */
static char *config_text(cJSON *config, char *const *kept, int n_kept) {
    cJSON *nc = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(config, "quantization_config"), "modules_to_not_convert");
    for (int i = 0; i < n_kept; i++) {
        cJSON *name = cJSON_CreateString(kept[i]);
        if (!name || !cJSON_AddItemToArray(nc, name)) {
            cJSON_Delete(name);
            return NULL;
        }
    }
    return cJSON_Print(config);
}

/* The files of the folder that are not the checkpoint itself: tokenizer, generation config,
 * chat template. */
static int is_companion_file(const char *name) {
    return strcmp(name, "config.json") != 0 && !ends_with(name, ".safetensors") && strcmp(name, "model.safetensors.index.json") != 0 &&
           !ends_with(name, ".g4cache") && !ends_with(name, ".partial");
}

static int copy_companions(const char *in_dir, const char *out_dir) {
    DIR *d = opendir(in_dir);
    if (!d) return g4_fail("%s: cannot list the folder: %s", in_dir, strerror(errno));
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        char a[4096], b[4096];
        struct stat sb;
        if (e->d_name[0] == '.' || !is_companion_file(e->d_name)) continue;
        if (g4_path_join(a, sizeof a, in_dir, e->d_name) != 0 || g4_path_join(b, sizeof b, out_dir, e->d_name) != 0) rc = -1;
        else if (stat(a, &sb) == 0 && S_ISREG(sb.st_mode)) rc = g4_copy_file(a, b);
    }
    closedir(d);
    return rc;
}

/* Refuses writing into the input folder, whose files the output would replace while they are read. */
static int check_folders(const char *in_dir, const char *out_dir) {
    char a[PATH_MAX], b[PATH_MAX];
    if (!realpath(in_dir, a)) return g4_fail("%s: %s", in_dir, strerror(errno));
    if (realpath(out_dir, b) && strcmp(a, b) == 0) return g4_fail("%s: the output folder is the input folder", out_dir);
    return 0;
}

int g4_quantize_q4_0(const char *in_dir, const char *out_dir, g4_embed_quant embed, g4_quantize_stats *stats) {
    if (stats) memset(stats, 0, sizeof *stats);
    if (embed != G4_EMBED_Q8_0 && embed != G4_EMBED_Q4_0 && embed != G4_EMBED_BF16) return g4_fail("unknown embedding type %d", (int)embed);
    if (check_folders(in_dir, out_dir) != 0) return -1;
    int assistant = 0;
    cJSON *config = output_config(in_dir, embed, &assistant);
    if (!config) return -1;
    g4_safetensors st;
    if (g4_st_open_dir(&st, in_dir) != 0) {
        cJSON_Delete(config);
        return -1;
    }
    char cfg_path[4096], st_path[4096], *cfg_text = NULL;
    plan_t plan = {.st = &st};
    g4_stw_init(&plan.w);
    uint64_t file_bytes = 0;
    int rc = g4_path_join(cfg_path, sizeof cfg_path, out_dir, "config.json") || g4_path_join(st_path, sizeof st_path, out_dir, "model.safetensors");
    if (rc == 0) rc = g4_make_dirs(out_dir);
    if (rc == 0) rc = build_plan(&plan, embed, assistant);
    if (rc == 0 && !(cfg_text = config_text(config, plan.kept, plan.n_kept))) rc = g4_fail("%s: out of memory", cfg_path);
    if (rc == 0 && (rc = g4_stw_write(&plan.w, st_path, fill, &plan, &file_bytes)) != 0 && plan.err[0]) g4_fail("%s", plan.err);
    if (rc == 0) rc = g4_write_text(cfg_path, cfg_text);
    if (rc == 0) rc = copy_companions(in_dir, out_dir);
    if (rc == 0 && stats) {
        stats->file_bytes = file_bytes;
        for (int i = 0; i < st.n_tensors; i++) stats->bytes_in += st.tensors[i].nbytes;
        for (int i = 0; i < plan.w.n; i++) {
            stats->n_copied += plan.items[i].kind == OUT_COPY;
            stats->n_quantized += plan.items[i].kind == OUT_CODES;
        }
        stats->kept_bf16 = plan.kept; /* the caller's now (g4_quantize_stats_free) */
        stats->n_kept_bf16 = plan.n_kept;
        plan.kept = NULL;
        plan.n_kept = 0;
    }
    for (int i = 0; i < plan.n_kept; i++) free(plan.kept[i]);
    free(plan.kept);
    free(plan.items);
    g4_stw_free(&plan.w);
    g4_st_close(&st);
    free(cfg_text);
    cJSON_Delete(config);
    return rc;
}

void g4_quantize_stats_free(g4_quantize_stats *stats) {
    for (int i = 0; stats && i < stats->n_kept_bf16; i++) free(stats->kept_bf16[i]);
    if (stats) free(stats->kept_bf16);
    if (stats) stats->kept_bf16 = NULL, stats->n_kept_bf16 = 0;
}
