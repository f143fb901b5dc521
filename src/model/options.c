/* The engine options table (g4.h): one row per option, read by name=value parsing, the command
 * line, the eval header and g4_options_default, so none of them can name an option, a value or a
 * default the others do not. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "g4.h"
#include "kernels/kernels.h"
#include "util/err.h"

/* Named values and integers are stored through an int lvalue at the field's offset: every enum of
 * g4_options is int-sized (GCC and Clang give these int or unsigned int, which int may alias). */
_Static_assert(sizeof(g4_act_mode) == sizeof(int), "g4_act_mode is stored as an int");
_Static_assert(sizeof(g4_round) == sizeof(int), "g4_round is stored as an int");
_Static_assert(sizeof(g4_qdiv) == sizeof(int), "g4_qdiv is stored as an int");
_Static_assert(sizeof(g4_requant_rule) == sizeof(int), "g4_requant_rule is stored as an int");
_Static_assert(sizeof(g4_weights) == sizeof(int), "g4_weights is stored as an int");

typedef enum {
    VALUE_CHOICE, /* one of the named choices, into an int-sized field */
    VALUE_INT,    /* an integer in [lo, hi], or `zero_text` for 0 */
    VALUE_SCALES, /* "S_IN,S_OUT": two non-negative floats */
    VALUE_PRESET, /* a named setting of several choice fields (preset_fields) */
} value_type;

typedef struct {
    g4_option_info info;
    value_type type;
    size_t offset;         /* of the field (VALUE_CHOICE, VALUE_INT) */
    long lo, hi;           /* VALUE_INT */
    const char *zero_text; /* VALUE_INT: the word for 0 ("auto"), or NULL when 0 is not a value */
} option;

static const g4_option_choice acts[] = {{"float", G4_ACT_FLOAT}, {"fake", G4_ACT_FAKE}, {"int", G4_ACT_INT}, {NULL, 0}};
static const g4_option_choice onoff[] = {{"off", 0}, {"on", 1}, {NULL, 0}};
static const g4_option_choice kv_kinds[] = {{"f32", 0}, {"int8", 1}, {NULL, 0}};
static const g4_option_choice placements[] = {{"scaled", 0}, {"raw", 1}, {NULL, 0}};
static const g4_option_choice rounds[] = {{"even", G4_ROUND_EVEN}, {"away", G4_ROUND_AWAY}, {NULL, 0}};
static const g4_option_choice qdivs[] = {
    {"auto", G4_QDIV_DEFAULT}, {"recip", G4_QDIV_RECIPROCAL}, {"div", G4_QDIV_DIVIDE}, {NULL, 0}};
static const g4_option_choice requants[] = {{"f32", G4_REQUANT_F32},
                                            {"f64", G4_REQUANT_F64},
                                            {"tfl-double", G4_REQUANT_TFL_DOUBLE},
                                            {"tfl-single", G4_REQUANT_TFL_SINGLE},
                                            {"tfl-neon", G4_REQUANT_TFL_NEON},
                                            {"tfl-ref", G4_REQUANT_TFL_REF},
                                            {NULL, 0}};
static const g4_option_choice weight_kinds[] = {{"resident", G4_WEIGHTS_RESIDENT}, {"mapped", G4_WEIGHTS_MAPPED}, {NULL, 0}};

/* The profile preset: each setting gives every one of these fields its value (hf: linear points
 * only, what transformers computes; litert: + int8 KV + per_layer_model_projection). */
static const g4_option_choice profiles[] = {{"hf", 0}, {"litert", 1}, {NULL, 0}};
static const size_t preset_fields[] = {offsetof(g4_options, kv_quant), offsetof(g4_options, pmp_quant)};
static const int preset_values[][2] = {{0, 0}, {1, 1}};

#define CHOICE(name_, fields_, field_, choices_, def_, kind_, help_) \
    {{name_, NULL, choices_, NULL, fields_, def_, kind_, 0, help_}, VALUE_CHOICE, offsetof(g4_options, field_), 0, 0, NULL}

/* Table order is the eval header's order; ctx, which eval derives from the prompts and the
 * budget, comes last among the result-affecting rows. */
static const option table[] = {
    CHOICE("act", "act", act, acts, "int", G4_OPTION_RESULT,
           "activation mode: float ignores the activation scales, fake quantizes in f32, int runs int8 x intN -> int32 linears"),
    {{"profile", NULL, profiles, NULL, "kv_quant, pmp_quant", "litert", G4_OPTION_PRESET, 0,
      "hf: the linear points only; litert: + int8 KV + per_layer_model_projection"},
     VALUE_PRESET, 0, 0, 0, NULL},
    CHOICE("linear_quant", "linear_quant", linear_quant, onoff, "on", G4_OPTION_RESULT, "points A1-A4, A7-A17 (every linear's input and output)"),
    CHOICE("kv", "kv_quant", kv_quant, kv_kinds, "int8", G4_OPTION_RESULT, "int8 K/V at cache write with k/v_cache_scale"),
    CHOICE("pmp_quant", "pmp_quant", pmp_quant, onoff, "on", G4_OPTION_RESULT, "per_layer_model_projection input/output quantization"),
    CHOICE("pmp_placement", "pmp_out_raw", pmp_out_raw, placements, "scaled", G4_OPTION_RESULT,
           "where its output is quantized: after (scaled) or before (raw) the x H^-1/2"),
    {{"pmp_scales", NULL, NULL, "S_IN,S_OUT (non-negative numbers)", "pmp_s_in, pmp_s_out", "0.038878,0.002353", G4_OPTION_RESULT, 0,
      "per_layer_model_projection's static input and output scales"},
     VALUE_SCALES, 0, 0, 0, NULL},
    CHOICE("round", "round", round, rounds, "even", G4_OPTION_RESULT, "tie rule of every activation quantizer"),
    CHOICE("qdiv", "qdiv", qdiv, qdivs, "auto", G4_OPTION_RESULT, "x / s (div) or x * (1/s) (recip); auto: div in fake mode, recip in int mode"),
    CHOICE("requant", "requant", requant, requants, "f32", G4_OPTION_RESULT, "int-mode requantization (f32 = XNNPACK's)"),
    CHOICE("lmhead_dynamic_q8", "lmhead_dynamic_q8", lmhead_dynamic_q8, onoff, "off", G4_OPTION_RESULT,
           "quantize the lm_head input per token at run time, as XNNPACK"),
    {{"ctx", NULL, NULL, "N in [1, 1048576]", "ctx", "4096", G4_OPTION_RESULT, 1, "context length in tokens (per sequence)"},
     VALUE_INT, offsetof(g4_options, ctx), 1, 1 << 20, NULL},
    {{"threads", "-t", NULL, "N in [1, 256], or auto", "threads", "auto", G4_OPTION_RUN, 1,
      "worker threads for the matmuls (auto: as they are, one per CPU unless set)"},
     VALUE_INT, offsetof(g4_options, threads), 1, 256, "auto"},
    CHOICE("weights", "weights", weights, weight_kinds, "resident", G4_OPTION_RUN,
           "copy the streamed weights into huge-page memory at load (faster decode) or read them mapped"),
};

#define N_OPTIONS ((int)(sizeof table / sizeof *table))

int g4_option_count(void) { return N_OPTIONS; }

const g4_option_info *g4_option_at(int i) { return i >= 0 && i < N_OPTIONS ? &table[i].info : NULL; }

/* name as an option name, with '-' for '_' when it comes as a flag ("pmp-scales"). */
static int name_matches(const char *row, const char *name, int dashes) {
    for (; *row && *name; row++, name++)
        if (*name != *row && !(dashes && *row == '_' && *name == '-')) return 0;
    return *row == 0 && *name == 0;
}

static const option *find_row(const char *name) {
    if (!name) return NULL;
    int flag = name[0] == '-' && name[1] == '-';
    for (int i = 0; i < N_OPTIONS; i++) {
        const option *r = &table[i];
        if (flag ? name_matches(r->info.name, name + 2, 1) : name_matches(r->info.name, name, 0)) return r;
        if (r->info.short_flag && !strcmp(r->info.short_flag, name)) return r;
    }
    return NULL;
}

const g4_option_info *g4_option_find(const char *name) {
    const option *r = find_row(name);
    return r ? &r->info : NULL;
}

static int *int_field(g4_options *o, size_t offset) { return (int *)(void *)((char *)o + offset); }
static int int_value(const g4_options *o, size_t offset) { return *(const int *)(const void *)((const char *)o + offset); }

/* ---- parsing one value ---- */

static int choice_index(const g4_option_choice *c, const char *v) {
    for (int i = 0; c[i].name; i++)
        if (!strcmp(c[i].name, v)) return i;
    return -1;
}

/* "expected one of a b c", the way the command line has always said it. */
static int fail_choice(const char *name, const char *v, const g4_option_choice *c) {
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; c[i].name && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, " %s", c[i].name);
    return g4_fail("%s %s: expected one of%s", name, v, list);
}

static int parse_long(const char *v, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end) return -1;
    *out = x;
    return 0;
}

static int parse_scale(const char *v, size_t len, float *out) {
    char buf[64], *end;
    if (len == 0 || len >= sizeof buf) return -1;
    memcpy(buf, v, len);
    buf[len] = 0;
    errno = 0;
    float x = strtof(buf, &end);
    if (errno || end == buf || *end || !(x >= 0)) return -1;
    *out = x;
    return 0;
}

static int set_row(const option *r, g4_options *o, const char *name, const char *v) {
    switch (r->type) {
    case VALUE_CHOICE: {
        int i = choice_index(r->info.choices, v);
        if (i < 0) return fail_choice(name, v, r->info.choices);
        *int_field(o, r->offset) = r->info.choices[i].value;
        return 0;
    }
    case VALUE_PRESET: {
        int i = choice_index(r->info.choices, v);
        if (i < 0) return fail_choice(name, v, r->info.choices);
        for (size_t f = 0; f < sizeof preset_fields / sizeof *preset_fields; f++) *int_field(o, preset_fields[f]) = preset_values[i][f];
        return 0;
    }
    case VALUE_INT: {
        long x;
        if (r->zero_text && !strcmp(v, r->zero_text)) x = 0;
        else if (parse_long(v, &x) != 0 || x < r->lo || x > r->hi)
            return g4_fail("%s %s: expected an integer in [%ld, %ld]%s%s", name, v, r->lo, r->hi, r->zero_text ? " or " : "",
                           r->zero_text ? r->zero_text : "");
        *int_field(o, r->offset) = (int)x;
        return 0;
    }
    case VALUE_SCALES: {
        const char *comma = strchr(v, ',');
        float s_in, s_out;
        if (!comma) return g4_fail("%s %s: expected S_IN,S_OUT", name, v);
        if (parse_scale(v, (size_t)(comma - v), &s_in) != 0 || parse_scale(comma + 1, strlen(comma + 1), &s_out) != 0)
            return g4_fail("%s %s: expected S_IN,S_OUT, two non-negative numbers", name, v);
        o->pmp_s_in = s_in;
        o->pmp_s_out = s_out;
        return 0;
    }
    }
    return g4_fail("%s: unknown option type", name);
}

int g4_options_set(g4_options *o, const char *name, const char *value) {
    const option *r = find_row(name);
    if (!r) return g4_fail("unknown option %s", name ? name : "(null)");
    if (!value) return g4_fail("%s needs a value", name);
    return set_row(r, o, name, value);
}

int g4_options_parse(g4_options *o, const char *assignment) {
    const char *eq = strchr(assignment, '=');
    char name[64];
    if (!eq || eq == assignment) return g4_fail("%s: expected name=value", assignment);
    if ((size_t)(eq - assignment) >= sizeof name) return g4_fail("unknown option %.*s", (int)(eq - assignment), assignment);
    memcpy(name, assignment, (size_t)(eq - assignment));
    name[eq - assignment] = 0;
    return g4_options_set(o, name, eq + 1);
}

/* ---- a value as text ---- */

/* The shortest decimal that reads back as the same float, so headers stay readable. */
static void float_text(char *buf, size_t cap, float x) {
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, cap, "%.*g", digits, (double)x);
        if (strtof(buf, NULL) == x) return;
    }
}

static const char *choice_name(const g4_option_choice *c, int value) {
    for (int i = 0; c[i].name; i++)
        if (c[i].value == value) return c[i].name;
    return NULL;
}

/* The preset setting that every field of the options matches, or NULL. */
static const char *preset_name(const option *r, const g4_options *o) {
    for (int i = 0; r->info.choices[i].name; i++) {
        int all = 1;
        for (size_t f = 0; f < sizeof preset_fields / sizeof *preset_fields; f++)
            all &= int_value(o, preset_fields[f]) == preset_values[i][f];
        if (all) return r->info.choices[i].name;
    }
    return NULL;
}

static int put_text(char *buf, size_t cap, const char *text) {
    size_t n = strlen(text);
    if (n >= cap) return -1;
    memcpy(buf, text, n + 1);
    return (int)n;
}

int g4_options_get(const g4_options *o, const char *name, char *buf, size_t cap) {
    const option *r = find_row(name);
    if (!r) return g4_fail("unknown option %s", name ? name : "(null)");
    char text[80];
    const char *v = text;
    switch (r->type) {
    case VALUE_CHOICE:
        v = choice_name(r->info.choices, int_value(o, r->offset));
        if (!v) return g4_fail("%s: the field holds %d, none of its values", name, int_value(o, r->offset));
        break;
    case VALUE_PRESET:
        if (!(v = preset_name(r, o))) return g4_fail("%s: the options match none of its settings", name);
        break;
    case VALUE_INT:
        if (int_value(o, r->offset) == 0 && r->zero_text) v = r->zero_text;
        else snprintf(text, sizeof text, "%d", int_value(o, r->offset));
        break;
    case VALUE_SCALES: {
        char s_in[32], s_out[32];
        float_text(s_in, sizeof s_in, o->pmp_s_in);
        float_text(s_out, sizeof s_out, o->pmp_s_out);
        snprintf(text, sizeof text, "%s,%s", s_in, s_out);
        break;
    }
    }
    int n = put_text(buf, cap, v);
    return n >= 0 ? n : g4_fail("%s: its value does not fit %zu bytes", name, cap);
}

/* ---- defaults and resolution ---- */

void g4_options_default(g4_options *o) {
    memset(o, 0, sizeof *o);
    /* presets only repeat their fields' own defaults (a test checks that they agree) */
    for (int i = 0; i < N_OPTIONS; i++)
        if (table[i].info.kind != G4_OPTION_PRESET) set_row(&table[i], o, table[i].info.name, table[i].info.def);
}

void g4_options_resolve(g4_options *o) {
    /* int mode multiplies by the reciprocal as XNNPACK does; fake (and float, where no quantizer
     * runs) divides as HF does */
    if (o->qdiv == G4_QDIV_DEFAULT) o->qdiv = o->act == G4_ACT_INT ? G4_QDIV_RECIPROCAL : G4_QDIV_DIVIDE;
}

/* ---- threads and weights ---- */

void g4_set_threads(int n) { g4_kernels_set_threads(n); }

int g4_threads(void) { return g4_kernels_threads(); }

g4_model *g4_model_load_options(const char *dir, const g4_options *o) {
    if (o->threads != 0) g4_set_threads(o->threads);
    return o->weights == G4_WEIGHTS_MAPPED ? g4_model_load_mapped(dir) : g4_model_load(dir);
}
