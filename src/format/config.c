#define _POSIX_C_SOURCE 200809L
#include "config.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "util/file.h"

/* Field readers: `where` names the object in messages ("config.json: text_config.hidden_size ..."). */
typedef struct {
    const char *path;  /* file */
    const char *where; /* "text_config." or "" */
} ctx_t;

static int need_int(const ctx_t *c, const cJSON *obj, const char *key, int lo, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return g4_fail("%s: %s%s missing", c->path, c->where, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > 1e9)
        return g4_fail("%s: %s%s must be an integer >= %d", c->path, c->where, key, lo);
    *out = (int)v->valuedouble;
    return 0;
}

/* Optional integer; null or absent gives `dflt`. */
static int opt_int(const ctx_t *c, const cJSON *obj, const char *key, int lo, int dflt, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    return need_int(c, obj, key, lo, out);
}

static int need_num(const ctx_t *c, const cJSON *obj, const char *key, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return g4_fail("%s: %s%s missing", c->path, c->where, key);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return g4_fail("%s: %s%s must be a number", c->path, c->where, key);
    *out = v->valuedouble;
    return 0;
}

/* A number in [lo, hi]: bounds that keep the forward pass inside float's range (a value the model
 * passes through float arithmetic, e.g. an eps of 1e300 or a softcap that rounds to inf, would
 * otherwise load fine and give NaN logits). */
static int need_num_in(const ctx_t *c, const cJSON *obj, const char *key, double lo, double hi, double *out) {
    if (need_num(c, obj, key, out) != 0) return -1;
    if (!(*out >= lo && *out <= hi)) return g4_fail("%s: %s%s %g: expected a number in [%g, %g]", c->path, c->where, key, *out, lo, hi);
    return 0;
}

static int opt_bool(const ctx_t *c, const cJSON *obj, const char *key, int dflt, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsBool(v)) return g4_fail("%s: %s%s must be true or false", c->path, c->where, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Refuses a feature the engine does not implement when the config turns it on. */
static int refuse_if_true(const ctx_t *c, const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (v && !cJSON_IsNull(v) && !cJSON_IsFalse(v))
        return g4_fail("%s: %s%s is set; g4 does not implement it", c->path, c->where, key);
    return 0;
}

static void *compile_regex(const char *pattern, uint32_t options, const char *path, const char *what) {
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | options, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        g4_fail("%s: %s: invalid regex \"%s\" at offset %zu: %s", path, what, pattern, (size_t)off, (char *)msg);
    }
    return re;
}

/* Start offset of the leftmost match of `re` in `s` (re.search), or -1. */
static long regex_search(void *re, const char *s) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) return -1;
    int rc = pcre2_match(re, (PCRE2_SPTR)s, strlen(s), 0, 0, md, NULL);
    long pos = rc >= 0 ? (long)pcre2_get_ovector_pointer(md)[0] : -1;
    pcre2_match_data_free(md);
    return pos;
}

/* The block_size field of `obj` (absent or null: `dflt`): inputs per weight scale, 0 for one
 * scale per output row. */
static int opt_block_size(const ctx_t *c, const cJSON *obj, int dflt, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "block_size");
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    if (need_int(c, obj, "block_size", 0, out) != 0) return -1;
    if (*out != 0 && (*out < 2 || *out > 4096 || *out % 2))
        return g4_fail("%s: %sblock_size %d: expected 0 (one scale per output row) or an even number of inputs up to 4096", c->path,
                       c->where, *out);
    return 0;
}

static int parse_quant_config(g4_config *cfg, const cJSON *root, const char *path) {
    ctx_t c = {path, "quantization_config."};
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    g4_quant_config *qc = &cfg->quant;
    if (!q || cJSON_IsNull(q)) { /* a plain checkpoint: every weight as stored (BF16) */
        qc->method = G4_QUANT_NONE;
        return 0;
    }
    if (!cJSON_IsObject(q)) return g4_fail("%s: quantization_config must be an object", path);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    if (!cJSON_IsString(m))
        return g4_fail("%s: quantization_config.quant_method missing (g4 reads \"gemma\" and unquantized checkpoints)", path);
    if (strcmp(m->valuestring, "gemma") != 0)
        return g4_fail("%s: quantization_config.quant_method \"%s\" is not implemented (g4 reads \"gemma\" and checkpoints "
                       "without quantization_config)",
                       path, m->valuestring);
    qc->method = G4_QUANT_GEMMA;
    if (need_int(&c, q, "num_bits", 0, &qc->num_bits) != 0) return -1;
    if (opt_bool(&c, q, "quantize_embeddings", 0, &qc->quantize_embeddings) != 0) return -1;
    if (opt_block_size(&c, q, 0, &qc->block_size) != 0) return -1;
    const cJSON *pats = cJSON_GetObjectItemCaseSensitive(q, "module_quant_configs");
    if (pats && !cJSON_IsNull(pats)) {
        if (!cJSON_IsObject(pats)) return g4_fail("%s: quantization_config.module_quant_configs must be an object", path);
        int n = cJSON_GetArraySize(pats);
        qc->patterns = calloc((size_t)(n ? n : 1), sizeof *qc->patterns);
        if (!qc->patterns) return g4_fail("%s: out of memory", path);
        for (const cJSON *e = pats->child; e; e = e->next) {
            g4_quant_pattern *p = &qc->patterns[qc->n_patterns++];
            if (!(p->pattern = strdup(e->string))) return g4_fail("%s: out of memory", path);
            ctx_t pc = {path, "quantization_config.module_quant_configs entry "};
            if (!cJSON_IsObject(e)) return g4_fail("%s: module_quant_configs[\"%s\"] must be an object", path, e->string);
            if (need_int(&pc, e, "num_bits", 0, &p->bits) != 0) return -1;
            if (opt_block_size(&pc, e, -1, &p->block_size) != 0) return -1;
            if (!(p->code = compile_regex(p->pattern, 0, path, "quantization_config.module_quant_configs"))) return -1;
        }
    }
    const cJSON *nc = cJSON_GetObjectItemCaseSensitive(q, "modules_to_not_convert");
    if (nc && !cJSON_IsNull(nc)) {
        if (!cJSON_IsArray(nc)) return g4_fail("%s: quantization_config.modules_to_not_convert must be a list", path);
        int n = cJSON_GetArraySize(nc);
        qc->not_convert = calloc((size_t)(n ? n : 1), sizeof *qc->not_convert);
        qc->not_convert_code = calloc((size_t)(n ? n : 1), sizeof *qc->not_convert_code);
        qc->not_convert_code_dot = calloc((size_t)(n ? n : 1), sizeof *qc->not_convert_code_dot);
        if (!qc->not_convert || !qc->not_convert_code || !qc->not_convert_code_dot) return g4_fail("%s: out of memory", path);
        for (const cJSON *e = nc->child; e; e = e->next) {
            if (!cJSON_IsString(e)) return g4_fail("%s: quantization_config.modules_to_not_convert entries must be strings", path);
            int i = qc->n_not_convert++;
            size_t len = strlen(e->valuestring);
            char *dot = malloc(len + 3);
            if (!dot || !(qc->not_convert[i] = strdup(e->valuestring))) {
                free(dot);
                return g4_fail("%s: out of memory", path);
            }
            memcpy(dot, e->valuestring, len);
            memcpy(dot + len, "\\.", 3);
            qc->not_convert_code[i] = compile_regex(e->valuestring, PCRE2_ANCHORED, path, "quantization_config.modules_to_not_convert");
            qc->not_convert_code_dot[i] = qc->not_convert_code[i] ? compile_regex(dot, PCRE2_ANCHORED, path, "quantization_config.modules_to_not_convert") : NULL;
            free(dot);
            if (!qc->not_convert_code_dot[i]) return -1;
        }
    }
    return 0;
}

/* Whether `module` stays float by modules_to_not_convert (re.match(k + "\\."), re.match(k), or
 * the name ends with k). */
static int not_converted(const g4_quant_config *qc, const char *module) {
    size_t mlen = strlen(module);
    for (int i = 0; i < qc->n_not_convert; i++) {
        size_t klen = strlen(qc->not_convert[i]);
        if (regex_search(qc->not_convert_code_dot[i], module) == 0 || regex_search(qc->not_convert_code[i], module) == 0 ||
            (klen <= mlen && strcmp(module + mlen - klen, qc->not_convert[i]) == 0))
            return 1;
    }
    return 0;
}

/* The module_quant_configs entry that decides `module`, or -1 for none. The patterns form one
 * alternation under re.search: the leftmost match wins, ties go to the earlier pattern. */
static int deciding_pattern(const g4_quant_config *qc, const char *module) {
    long best_pos = -1;
    int best = -1;
    for (int i = 0; i < qc->n_patterns; i++) {
        long pos = regex_search(qc->patterns[i].code, module);
        if (pos >= 0 && (best_pos < 0 || pos < best_pos)) {
            best_pos = pos;
            best = i;
        }
    }
    return best;
}

int g4_config_module_bits(const g4_config *cfg, const char *module) {
    const g4_quant_config *qc = &cfg->quant;
    if (qc->method == G4_QUANT_NONE || not_converted(qc, module)) return 0;
    int p = deciding_pattern(qc, module);
    return p >= 0 ? qc->patterns[p].bits : qc->num_bits;
}

int g4_config_module_block(const g4_config *cfg, const char *module) {
    const g4_quant_config *qc = &cfg->quant;
    if (qc->method == G4_QUANT_NONE || not_converted(qc, module)) return 0;
    int p = deciding_pattern(qc, module);
    return p >= 0 && qc->patterns[p].block_size >= 0 ? qc->patterns[p].block_size : qc->block_size;
}

static int parse_layer_types(g4_config *cfg, const ctx_t *c, const cJSON *tc) {
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(tc, "layer_types");
    if (!lt) return g4_fail("%s: %slayer_types missing", c->path, c->where);
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != cfg->n_layers)
        return g4_fail("%s: %slayer_types must list %d layer types", c->path, c->where, cfg->n_layers);
    cfg->layer_types = calloc((size_t)cfg->n_layers, sizeof *cfg->layer_types);
    if (!cfg->layer_types) return g4_fail("%s: out of memory", c->path);
    for (int i = 0; i < cfg->n_layers; i++) {
        const cJSON *v = cJSON_GetArrayItem(lt, i);
        if (cJSON_IsString(v) && strcmp(v->valuestring, "sliding_attention") == 0) cfg->layer_types[i] = G4_LAYER_SLIDING;
        else if (cJSON_IsString(v) && strcmp(v->valuestring, "full_attention") == 0) cfg->layer_types[i] = G4_LAYER_FULL;
        else return g4_fail("%s: %slayer_types[%d] must be \"sliding_attention\" or \"full_attention\"", c->path, c->where, i);
    }
    return 0;
}

/* per_layer_config, which transformers 5.17 writes instead of global_head_dim (and
 * num_global_key_value_heads): {"<layer>": {"head_dim": d, "num_key_value_heads": k}} overrides
 * per layer. When it is there, transformers ignores global_head_dim: a layer without an entry has
 * head_dim and num_key_value_heads. g4 keeps one shape per attention type, so the overrides must
 * agree within each type. */
static int parse_per_layer_config(g4_config *cfg, const ctx_t *c, const cJSON *tc) {
    const cJSON *plc = cJSON_GetObjectItemCaseSensitive(tc, "per_layer_config");
    if (!plc || cJSON_IsNull(plc)) return 0;
    if (!cJSON_IsObject(plc)) return g4_fail("%s: %sper_layer_config must be an object", c->path, c->where);
    int hd[2] = {-1, -1}, kv[2] = {-1, -1};
    for (int l = 0; l < cfg->n_layers; l++) {
        char key[16], where[160];
        snprintf(key, sizeof key, "%d", l);
        snprintf(where, sizeof where, "%sper_layer_config.%s.", c->where, key);
        ctx_t lc = {c->path, where};
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(plc, key);
        int t = cfg->layer_types[l], h = cfg->head_dim, k = cfg->n_kv_heads;
        if (o && !cJSON_IsObject(o)) return g4_fail("%s: %sper_layer_config.%s must be an object", c->path, c->where, key);
        for (const cJSON *e = o ? o->child : NULL; e; e = e->next)
            if (strcmp(e->string, "head_dim") != 0 && strcmp(e->string, "num_key_value_heads") != 0)
                return g4_fail("%s: %s%s is not implemented (g4 reads head_dim and num_key_value_heads)", c->path, where, e->string);
        if (o && (opt_int(&lc, o, "head_dim", 2, h, &h) != 0 || opt_int(&lc, o, "num_key_value_heads", 1, k, &k) != 0)) return -1;
        if ((hd[t] >= 0 && hd[t] != h) || (kv[t] >= 0 && kv[t] != k))
            return g4_fail("%s: %sper_layer_config gives the %s layers different shapes (layer %d: head_dim %d, %d KV heads); g4 "
                           "runs one shape per attention type",
                           c->path, c->where, t == G4_LAYER_FULL ? "full-attention" : "sliding", l, h, k);
        hd[t] = h;
        kv[t] = k;
    }
    for (const cJSON *e = plc->child; e; e = e->next) {
        char *end;
        long l = strtol(e->string, &end, 10);
        if (!*e->string || *end || l < 0 || l >= cfg->n_layers)
            return g4_fail("%s: %sper_layer_config: \"%s\" is not a layer index (0..%d)", c->path, c->where, e->string, cfg->n_layers - 1);
    }
    if (hd[G4_LAYER_SLIDING] >= 0) cfg->head_dim = hd[G4_LAYER_SLIDING], cfg->n_kv_heads = kv[G4_LAYER_SLIDING];
    if (hd[G4_LAYER_FULL] >= 0) cfg->global_head_dim = hd[G4_LAYER_FULL], cfg->n_global_kv_heads = kv[G4_LAYER_FULL];
    return 0;
}

static int parse_rope(g4_config *cfg, const ctx_t *c, const cJSON *tc) {
    static const char *names[2] = {"sliding_attention", "full_attention"};
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(tc, "rope_parameters");
    if (!cJSON_IsObject(rp)) return g4_fail("%s: %srope_parameters missing", c->path, c->where);
    for (int t = 0; t < 2; t++) {
        int used = 0;
        for (int i = 0; i < cfg->n_layers; i++) used |= cfg->layer_types[i] == t;
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(rp, names[t]);
        if (!r) {
            if (used) return g4_fail("%s: %srope_parameters.%s missing", c->path, c->where, names[t]);
            continue;
        }
        char where[128];
        snprintf(where, sizeof where, "%srope_parameters.%s.", c->where, names[t]);
        ctx_t rc = {c->path, where};
        g4_rope_config *rope = &cfg->rope[t];
        if (need_num_in(&rc, r, "rope_theta", 1, 1e12, &rope->theta) != 0) return -1;
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(r, "rope_type");
        const char *ts = cJSON_IsString(type) ? type->valuestring : "default";
        rope->partial_rotary_factor = 1.0;
        if (strcmp(ts, "proportional") == 0) {
            rope->proportional = 1;
            if (need_num(&rc, r, "partial_rotary_factor", &rope->partial_rotary_factor) != 0) return -1;
            if (!(rope->partial_rotary_factor > 0 && rope->partial_rotary_factor <= 1))
                return g4_fail("%s: %spartial_rotary_factor must be in (0, 1]", c->path, where);
        } else if (strcmp(ts, "default") != 0) {
            return g4_fail("%s: %srope_type \"%s\" is not implemented (default, proportional)", c->path, where, ts);
        }
        const cJSON *factor = cJSON_GetObjectItemCaseSensitive(r, "factor");
        if (factor && !cJSON_IsNull(factor) && !(cJSON_IsNumber(factor) && factor->valuedouble == 1.0))
            return g4_fail("%s: %sfactor is not implemented", c->path, where);
    }
    return 0;
}

/* Adds the eos ids of `v` (an int or a list of ints) to the stop set. */
static void add_stop_ids(g4_config *cfg, const cJSON *v) {
    const cJSON *one = v;
    int is_list = cJSON_IsArray(v);
    for (const cJSON *e = is_list ? v->child : one; e; e = is_list ? e->next : NULL) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 2147483647.0 || e->valuedouble != floor(e->valuedouble))
            continue;
        int id = (int)e->valuedouble, seen = 0;
        for (int i = 0; i < cfg->n_stop_ids; i++) seen |= cfg->stop_ids[i] == id;
        if (!seen && cfg->n_stop_ids < G4_MAX_STOP_IDS) cfg->stop_ids[cfg->n_stop_ids++] = id;
    }
}

static int parse_text_config(g4_config *cfg, const cJSON *tc, const char *path, const char *where) {
    ctx_t c = {path, where};
    if (need_int(&c, tc, "hidden_size", 1, &cfg->hidden) || need_int(&c, tc, "num_hidden_layers", 1, &cfg->n_layers) ||
        need_int(&c, tc, "num_attention_heads", 1, &cfg->n_heads) ||
        need_int(&c, tc, "num_key_value_heads", 1, &cfg->n_kv_heads) ||
        opt_int(&c, tc, "num_global_key_value_heads", 1, cfg->n_kv_heads, &cfg->n_global_kv_heads) ||
        need_int(&c, tc, "head_dim", 2, &cfg->head_dim) ||
        opt_int(&c, tc, "global_head_dim", 2, 512, &cfg->global_head_dim) || /* transformers' default */
        need_int(&c, tc, "intermediate_size", 1, &cfg->intermediate) ||
        opt_bool(&c, tc, "use_double_wide_mlp", 0, &cfg->double_wide_mlp) ||
        opt_int(&c, tc, "num_kv_shared_layers", 0, 0, &cfg->n_kv_shared) ||
        need_int(&c, tc, "hidden_size_per_layer_input", cfg->assistant ? 0 : 1, &cfg->ple_dim) ||
        need_int(&c, tc, "vocab_size", 1, &cfg->vocab) ||
        opt_int(&c, tc, "vocab_size_per_layer_input", cfg->assistant ? 0 : 1, cfg->vocab, &cfg->vocab_ple) ||
        opt_int(&c, tc, "max_position_embeddings", 1, 131072, &cfg->max_positions) ||
        need_num_in(&c, tc, "rms_norm_eps", 1e-12, 1, &cfg->rms_eps) ||
        opt_bool(&c, tc, "tie_word_embeddings", 0, &cfg->tie_word_embeddings) ||
        opt_int(&c, tc, "bos_token_id", 0, 2, &cfg->bos_id) || opt_int(&c, tc, "pad_token_id", 0, 0, &cfg->pad_id))
        return -1;
    if (cfg->n_layers > 4096 || cfg->hidden > (1 << 20) || cfg->vocab > (1 << 24))
        return g4_fail("%s: %shidden_size, num_hidden_layers or vocab_size is implausibly large", path, where);
    if (cfg->n_heads % cfg->n_kv_heads || cfg->n_heads % cfg->n_global_kv_heads)
        return g4_fail("%s: %snum_attention_heads must be a multiple of num_key_value_heads", path, where);
    if (cfg->assistant) {
        /* transformers' Gemma4AssistantConfig: every layer shares the target's K/V (0 means all) */
        if (cfg->n_kv_shared == 0) cfg->n_kv_shared = cfg->n_layers;
        if (cfg->n_kv_shared != cfg->n_layers)
            return g4_fail("%s: %snum_kv_shared_layers must equal num_hidden_layers in a gemma4_assistant", path, where);
        if (cfg->ple_dim != 0) return g4_fail("%s: %shidden_size_per_layer_input must be 0 in a gemma4_assistant", path, where);
    } else if (cfg->n_kv_shared >= cfg->n_layers) {
        return g4_fail("%s: %snum_kv_shared_layers must be below num_hidden_layers", path, where);
    }
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(tc, "final_logit_softcapping");
    if (sc && !cJSON_IsNull(sc) && need_num_in(&c, tc, "final_logit_softcapping", 1e-3, 1e6, &cfg->final_softcap) != 0) return -1;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(tc, "hidden_activation");
    if (!cJSON_IsString(act) || strcmp(act->valuestring, "gelu_pytorch_tanh") != 0)
        return g4_fail("%s: %shidden_activation must be \"gelu_pytorch_tanh\" (the only one g4 implements)", path, where);
    if (refuse_if_true(&c, tc, "enable_moe_block") || refuse_if_true(&c, tc, "attention_k_eq_v") ||
        refuse_if_true(&c, tc, "use_bidirectional_attention") || refuse_if_true(&c, tc, "attention_bias"))
        return -1;
    const cJSON *asc = cJSON_GetObjectItemCaseSensitive(tc, "attn_logit_softcapping");
    if (asc && !cJSON_IsNull(asc)) return g4_fail("%s: %sattn_logit_softcapping is set; g4 does not implement it", path, where);
    if (parse_layer_types(cfg, &c, tc) != 0 || parse_per_layer_config(cfg, &c, tc) != 0) return -1;
    if (cfg->head_dim % 2 || cfg->global_head_dim % 2) return g4_fail("%s: %shead_dim and global_head_dim must be even", path, where);
    if (cfg->n_heads % cfg->n_kv_heads || cfg->n_heads % cfg->n_global_kv_heads)
        return g4_fail("%s: %snum_attention_heads must be a multiple of num_key_value_heads", path, where);
    if (parse_rope(cfg, &c, tc) != 0) return -1;
    int any_sliding = 0;
    for (int i = 0; i < cfg->n_layers; i++) any_sliding |= cfg->layer_types[i] == G4_LAYER_SLIDING;
    if (any_sliding && need_int(&c, tc, "sliding_window", 1, &cfg->sliding_window) != 0) return -1;
    add_stop_ids(cfg, cJSON_GetObjectItemCaseSensitive(tc, "eos_token_id"));
    return 0;
}

/* The top level of a gemma4_assistant config (transformers' Gemma4AssistantConfig and its defaults). */
static int parse_assistant(g4_config *cfg, const cJSON *root, const cJSON *tc, const char *path) {
    ctx_t c = {path, ""};
    if (!cJSON_IsObject(tc)) return g4_fail("%s: a gemma4_assistant needs its text_config object", path);
    if (opt_int(&c, root, "backbone_hidden_size", 1, 1536, &cfg->backbone_hidden) ||
        opt_bool(&c, root, "use_ordered_embeddings", 0, &cfg->ordered_embeddings) ||
        opt_int(&c, root, "num_centroids", 1, 2048, &cfg->n_centroids) ||
        opt_int(&c, root, "centroid_intermediate_top_k", 1, 32, &cfg->centroid_top_k))
        return -1;
    if (cfg->centroid_top_k > cfg->n_centroids)
        return g4_fail("%s: centroid_intermediate_top_k %d exceeds num_centroids %d", path, cfg->centroid_top_k, cfg->n_centroids);
    return 0;
}

int g4_config_parse(g4_config *cfg, const char *text, const char *path) {
    memset(cfg, 0, sizeof *cfg);
    cJSON *root = cJSON_Parse(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return g4_fail("%s: not a JSON object", path);
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    cfg->assistant = cJSON_IsString(mt) && strcmp(mt->valuestring, "gemma4_assistant") == 0;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    int rc = cfg->assistant ? parse_assistant(cfg, root, tc, path) : 0;
    if (rc != 0) {
        cJSON_Delete(root);
        return -1;
    }
    if (tc) rc = cJSON_IsObject(tc) ? parse_text_config(cfg, tc, path, "text_config.") : g4_fail("%s: text_config must be an object", path);
    else rc = parse_text_config(cfg, root, path, "");
    if (rc == 0) rc = parse_quant_config(cfg, root, path);
    if (rc == 0) {
        add_stop_ids(cfg, cJSON_GetObjectItemCaseSensitive(root, "eos_token_id"));
        int tie;
        if (opt_bool(&(ctx_t){path, ""}, root, "tie_word_embeddings", cfg->tie_word_embeddings, &tie) != 0) rc = -1;
        else cfg->tie_word_embeddings = tie;
    }
    cJSON_Delete(root);
    if (rc != 0) g4_config_free(cfg);
    return rc;
}

static int load_generation_config(g4_config *cfg, const char *dir) {
    char path[4096];
    if (g4_path_join(path, sizeof path, dir, "generation_config.json") != 0) return -1;
    if (!g4_file_exists(path)) return 0;
    char *text;
    if (g4_read_file(path, &text, NULL) != 0) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return g4_fail("%s: not a JSON object", path);
    }
    add_stop_ids(cfg, cJSON_GetObjectItemCaseSensitive(root, "eos_token_id"));
    const cJSON *sample = cJSON_GetObjectItemCaseSensitive(root, "do_sample");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "temperature");
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(root, "top_k");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "top_p");
    /* g4_sampling_check's bound: a temperature that is no finite number >= 0 is refused, not replaced */
    if (cJSON_IsNumber(t) && !(t->valuedouble >= 0 && t->valuedouble <= FLT_MAX)) {
        g4_fail("%s: temperature %g: expected a finite number >= 0", path, t->valuedouble);
        cJSON_Delete(root);
        return -1;
    }
    cfg->temperature = cJSON_IsNumber(t) ? t->valuedouble : 1.0;
    cfg->top_k = cJSON_IsNumber(k) && k->valuedouble >= 0 && k->valuedouble < 1e9 ? (int)k->valuedouble : 0;
    cfg->top_p = cJSON_IsNumber(p) && p->valuedouble > 0 && p->valuedouble <= 1 ? p->valuedouble : 1.0;
    cfg->has_sampling = !cJSON_IsFalse(sample) && (cJSON_IsNumber(t) || cJSON_IsNumber(k) || cJSON_IsNumber(p));
    cJSON_Delete(root);
    return 0;
}

int g4_config_load(g4_config *cfg, const char *dir) {
    char path[4096];
    char *text;
    memset(cfg, 0, sizeof *cfg);
    if (g4_path_join(path, sizeof path, dir, "config.json") != 0 || g4_read_file(path, &text, NULL) != 0) return -1;
    int rc = g4_config_parse(cfg, text, path);
    free(text);
    if (rc == 0 && load_generation_config(cfg, dir) != 0) {
        g4_config_free(cfg);
        rc = -1;
    }
    return rc;
}

void g4_config_free(g4_config *cfg) {
    g4_quant_config *qc = &cfg->quant;
    for (int i = 0; i < qc->n_patterns; i++) {
        free(qc->patterns[i].pattern);
        pcre2_code_free(qc->patterns[i].code);
    }
    free(qc->patterns);
    for (int i = 0; i < qc->n_not_convert; i++) {
        free(qc->not_convert[i]);
        pcre2_code_free(qc->not_convert_code[i]);
        pcre2_code_free(qc->not_convert_code_dot[i]);
    }
    free(qc->not_convert);
    free(qc->not_convert_code);
    free(qc->not_convert_code_dot);
    free(cfg->layer_types);
    memset(cfg, 0, sizeof *cfg);
}
