/* The engine options table (g4.h) and what reads it, against references written here from the
 * README's option table and the spec: g4_options_default gives the fields the spec's litert
 * profile names; every name=value the README lists sets the field it documents, and bad ones are
 * refused without touching the options; qdiv resolves as activation-quant.md says; the command
 * line takes each row's flag and refuses a bad value naming it; `g4 help` lists every row; the
 * eval header holds exactly the result-affecting rows, resolved; a resumed eval with any other
 * result-affecting value is refused naming that option, while one that only changes how it runs
 * (threads, weights) resumes. Also the log function (a library warning reaches it, silence
 * silences, the default writes the line it always wrote) and threads / weight placement through
 * the API. */
#define _POSIX_C_SOURCE 200809L
#include <sys/wait.h>
#include <unistd.h>

#include "model/synth.h"
#include "quant/int8.h"
#include "testutil.h"
#include "cli_util.h"
#include "model/feed.h"

/* Command lines are built in fixed buffers sized far above what the temporary paths need; a
 * truncated one would fail its test, not pass it. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

static const char *bin;
static char tmp[256], out_path[600], err_path[600];

/* `g4 ARGS`, stdout and stderr into out_path and err_path; the exit status. */
static int run(const char *args) { return run_into(bin, args, out_path, err_path); }

/* stderr is exactly one line "g4...error: ..." holding `what`. */
static int one_error_line(const char *what) {
    char *err = slurp(err_path);
    const char *nl = strchr(err, '\n');
    int ok = strstr(err, "error: ") && strstr(err, what) && nl && !nl[1];
    if (!ok) fprintf(stderr, "stderr was: %s\n", err);
    free(err);
    return ok;
}

/* ---------------------------------------------------------------- the table in the library */

/* g4_version: the header's version, as the shared library exports it to a binding (python/). */
static void test_version(void) {
    CHECK(g4_version() && !strcmp(g4_version(), G4_VERSION), "g4_version() %s, G4_VERSION %s", g4_version() ? g4_version() : "NULL",
          G4_VERSION);
}

static void test_defaults(void) {
    g4_options o;
    memset(&o, 0x5a, sizeof o); /* every field must be set, not left as it was */
    g4_options_default(&o);
    /* the spec's litert profile in int mode (README, "Activation quantization options") */
    CHECK(o.act == G4_ACT_INT && o.linear_quant == 1 && o.kv_quant == 1 && o.pmp_quant == 1 && o.pmp_out_raw == 0,
          "act %d linear %d kv %d pmp %d raw %d", o.act, o.linear_quant, o.kv_quant, o.pmp_quant, o.pmp_out_raw);
    CHECK(o.pmp_s_in == 0.038878f && o.pmp_s_out == 0.002353f, "pmp scales %.9g %.9g", (double)o.pmp_s_in, (double)o.pmp_s_out);
    CHECK(o.round == G4_ROUND_EVEN && o.qdiv == G4_QDIV_DEFAULT && o.requant == G4_REQUANT_F32 && o.lmhead_dynamic_q8 == 0,
          "round %d qdiv %d requant %d lmhead %d", o.round, o.qdiv, o.requant, o.lmhead_dynamic_q8);
    CHECK(o.ctx == 4096 && o.n_seq == 0 && o.threads == 0 && o.weights == G4_WEIGHTS_RESIDENT, "ctx %d n_seq %d threads %d weights %d",
          o.ctx, o.n_seq, o.threads, o.weights);
    /* each row's default is what g4_options_get says of the defaults (presets: what their fields make) */
    for (int i = 0; i < g4_option_count(); i++) {
        const g4_option_info *opt = g4_option_at(i);
        char v[128];
        CHECK(g4_options_get(&o, opt->name, v, sizeof v) >= 0 && !strcmp(v, opt->def), "%s: default %s, the defaults hold %s", opt->name,
              opt->def, v);
    }
    CHECK(g4_option_at(-1) == NULL && g4_option_at(g4_option_count()) == NULL, "rows past the table");
}

/* The rows, against the README's list: names, kinds, and which g4_options fields they set. */
static void test_rows(void) {
    static const char *const result[] = {"act", "linear_quant", "kv", "pmp_quant", "pmp_placement", "pmp_scales",
                                         "round", "qdiv", "requant", "lmhead_dynamic_q8", "ctx"};
    static const char *const run_rows[] = {"threads", "weights"};
    static const char *const fields[] = {"act",   "linear_quant", "kv_quant", "pmp_quant", "pmp_out_raw", "pmp_s_in",  "pmp_s_out",
                                         "round", "qdiv",         "requant",  "lmhead_dynamic_q8", "ctx", "threads", "weights"};
    int n_result = 0, n_run = 0, n_preset = 0;
    for (int i = 0; i < g4_option_count(); i++) {
        const g4_option_info *opt = g4_option_at(i);
        CHECK(opt->name && opt->help && *opt->help && opt->def && opt->fields && (opt->choices != NULL) != (opt->values != NULL),
              "row %d (%s) is incomplete", i, opt->name ? opt->name : "?");
        for (int j = 0; j < i; j++) CHECK(strcmp(opt->name, g4_option_at(j)->name) != 0, "%s appears twice", opt->name);
        n_result += opt->kind == G4_OPTION_RESULT;
        n_run += opt->kind == G4_OPTION_RUN;
        n_preset += opt->kind == G4_OPTION_PRESET;
    }
    CHECK(n_result == 11 && n_run == 2 && n_preset == 1, "%d result, %d run, %d preset rows", n_result, n_run, n_preset);
    for (size_t i = 0; i < sizeof result / sizeof *result; i++) {
        const g4_option_info *opt = g4_option_find(result[i]);
        CHECK(opt && opt->kind == G4_OPTION_RESULT, "%s is not a result-affecting row", result[i]);
    }
    for (size_t i = 0; i < sizeof run_rows / sizeof *run_rows; i++) {
        const g4_option_info *opt = g4_option_find(run_rows[i]);
        CHECK(opt && opt->kind == G4_OPTION_RUN, "%s is not a run row", run_rows[i]);
    }
    CHECK(g4_option_find("profile") && g4_option_find("profile")->kind == G4_OPTION_PRESET, "profile is not a preset");
    /* ctx, which eval derives from others, is the last result-affecting row */
    int last_result = -1;
    for (int i = 0; i < g4_option_count(); i++)
        if (g4_option_at(i)->kind == G4_OPTION_RESULT) last_result = i;
    CHECK(last_result >= 0 && !strcmp(g4_option_at(last_result)->name, "ctx"), "the last result-affecting row is not ctx");
    /* every field of g4_options but n_seq (the caller's) is some row's */
    for (size_t f = 0; f < sizeof fields / sizeof *fields; f++) {
        int found = 0;
        for (int i = 0; i < g4_option_count() && !found; i++) {
            const char *list = g4_option_at(i)->fields;
            size_t len = strlen(fields[f]);
            for (const char *p = strstr(list, fields[f]); p && !found; p = strstr(p + 1, fields[f]))
                found = (p == list || p[-1] == ' ') && (p[len] == 0 || p[len] == ',');
        }
        CHECK(found, "no row sets g4_options.%s", fields[f]);
    }
    /* names, flags (--NAME with '-' for '_') and the short flag find the same row */
    CHECK(g4_option_find("--pmp-scales") == g4_option_find("pmp_scales") && g4_option_find("pmp_scales"), "--pmp-scales");
    CHECK(g4_option_find("--lmhead-dynamic-q8") == g4_option_find("lmhead_dynamic_q8"), "--lmhead-dynamic-q8");
    CHECK(g4_option_find("-t") == g4_option_find("threads") && g4_option_find("--threads") == g4_option_find("threads"), "-t");
    CHECK(!g4_option_find("pmp-scales") && !g4_option_find("--bogus") && !g4_option_find("") && !g4_option_find("-") &&
              !g4_option_find(NULL) && !g4_option_find("act=int"),
          "a name that is no row was found");
}

typedef struct {
    const char *assignment;
    int field; /* which field to read, below */
    double want;
} set_case;

enum { F_ACT, F_LINEAR, F_KV, F_PMP, F_RAW, F_S_IN, F_S_OUT, F_ROUND, F_QDIV, F_REQUANT, F_LMHEAD, F_CTX, F_THREADS, F_WEIGHTS };

static double field_of(const g4_options *o, int f) {
    switch (f) {
    case F_ACT: return o->act;
    case F_LINEAR: return o->linear_quant;
    case F_KV: return o->kv_quant;
    case F_PMP: return o->pmp_quant;
    case F_RAW: return o->pmp_out_raw;
    case F_S_IN: return o->pmp_s_in;
    case F_S_OUT: return o->pmp_s_out;
    case F_ROUND: return o->round;
    case F_QDIV: return o->qdiv;
    case F_REQUANT: return o->requant;
    case F_LMHEAD: return o->lmhead_dynamic_q8;
    case F_CTX: return o->ctx;
    case F_THREADS: return o->threads;
    case F_WEIGHTS: return o->weights;
    }
    return -1;
}

/* Each value the README documents, into the field it names. */
static void test_set_values(void) {
    static const set_case cases[] = {
        {"act=float", F_ACT, G4_ACT_FLOAT},
        {"act=fake", F_ACT, G4_ACT_FAKE},
        {"act=int", F_ACT, G4_ACT_INT},
        {"linear_quant=off", F_LINEAR, 0},
        {"kv=f32", F_KV, 0},
        {"kv=int8", F_KV, 1},
        {"pmp_quant=off", F_PMP, 0},
        {"pmp_placement=raw", F_RAW, 1},
        {"pmp_placement=scaled", F_RAW, 0},
        {"pmp_scales=0.5,0.25", F_S_IN, 0.5},
        {"pmp_scales=0.5,0.25", F_S_OUT, 0.25},
        {"pmp_scales=0,0.003", F_S_OUT, (double)0.003f},
        {"round=away", F_ROUND, G4_ROUND_AWAY},
        {"round=even", F_ROUND, G4_ROUND_EVEN},
        {"qdiv=div", F_QDIV, G4_QDIV_DIVIDE},
        {"qdiv=recip", F_QDIV, G4_QDIV_RECIPROCAL},
        {"qdiv=auto", F_QDIV, G4_QDIV_DEFAULT},
        {"requant=f64", F_REQUANT, G4_REQUANT_F64},
        {"requant=tfl-double", F_REQUANT, G4_REQUANT_TFL_DOUBLE},
        {"requant=tfl-single", F_REQUANT, G4_REQUANT_TFL_SINGLE},
        {"requant=tfl-neon", F_REQUANT, G4_REQUANT_TFL_NEON},
        {"requant=tfl-ref", F_REQUANT, G4_REQUANT_TFL_REF},
        {"requant=f32", F_REQUANT, G4_REQUANT_F32},
        {"lmhead_dynamic_q8=on", F_LMHEAD, 1},
        {"ctx=1", F_CTX, 1},
        {"ctx=1048576", F_CTX, 1048576},
        {"threads=3", F_THREADS, 3},
        {"threads=auto", F_THREADS, 0},
        {"weights=mapped", F_WEIGHTS, G4_WEIGHTS_MAPPED},
        {"profile=hf", F_KV, 0},
        {"profile=hf", F_PMP, 0},
        {"profile=litert", F_KV, 1},
        {"profile=litert", F_PMP, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        g4_options o;
        g4_options_default(&o);
        if (!strncmp(cases[i].assignment, "profile=litert", 14)) o.kv_quant = o.pmp_quant = 0; /* so the preset must set them */
        int rc = g4_options_parse(&o, cases[i].assignment);
        CHECK(rc == 0 && field_of(&o, cases[i].field) == cases[i].want, "%s: rc %d, field %g, expected %g (%s)", cases[i].assignment, rc,
              field_of(&o, cases[i].field), cases[i].want, rc ? g4_last_error() : "");
        /* and back: get gives the value that was set (the preset: the setting its fields now match) */
        const char *eq = strchr(cases[i].assignment, '=');
        char name[32], v[64];
        memcpy(name, cases[i].assignment, (size_t)(eq - cases[i].assignment));
        name[eq - cases[i].assignment] = 0;
        int n = g4_options_get(&o, name, v, sizeof v);
        CHECK(n == (int)strlen(eq + 1) && !strcmp(v, eq + 1), "get %s after %s: %s", name, cases[i].assignment, n >= 0 ? v : g4_last_error());
    }
    /* every named value of every row round-trips */
    for (int i = 0; i < g4_option_count(); i++) {
        const g4_option_info *opt = g4_option_at(i);
        for (int k = 0; opt->choices && opt->choices[k].name; k++) {
            g4_options o;
            char v[64];
            g4_options_default(&o);
            CHECK(g4_options_set(&o, opt->name, opt->choices[k].name) == 0 && g4_options_get(&o, opt->name, v, sizeof v) >= 0 &&
                      !strcmp(v, opt->choices[k].name),
                  "%s %s does not round-trip", opt->name, opt->choices[k].name);
        }
    }
    g4_options o;
    char small[4];
    g4_options_default(&o);
    CHECK(g4_options_get(&o, "pmp_scales", small, sizeof small) == -1, "a value longer than the buffer was given");
    CHECK(g4_options_get(&o, "bogus", small, sizeof small) == -1 && strstr(g4_last_error(), "unknown option bogus"), "get bogus");
    o.kv_quant = 1;
    o.pmp_quant = 0;
    CHECK(g4_options_get(&o, "profile", small, sizeof small) == -1, "a profile for kv int8 without pmp_quant");
}

static void expect_refused(const char *assignment, const char *message) {
    g4_options o, before;
    g4_options_default(&o);
    o.ctx = 77; /* not a default: a failed set must leave every field as it was */
    before = o;
    int rc = g4_options_parse(&o, assignment);
    CHECK(rc == -1 && !memcmp(&o, &before, sizeof o) && strstr(g4_last_error(), message), "%s: rc %d, error \"%s\", expected \"%s\"",
          assignment, rc, g4_last_error(), message);
}

static void test_refusals(void) {
    expect_refused("act=fast", "act fast: expected one of float fake int");
    expect_refused("kv=int4", "kv int4: expected one of f32 int8");
    expect_refused("requant=tfl", "expected one of f32 f64 tfl-double tfl-single tfl-neon tfl-ref");
    expect_refused("qdiv=divide", "qdiv divide: expected one of auto recip div");
    expect_refused("ctx=0", "ctx 0: expected an integer in [1, 1048576]");
    expect_refused("ctx=1048577", "ctx 1048577: expected an integer");
    expect_refused("ctx=12x", "ctx 12x: expected an integer");
    expect_refused("ctx=", "ctx : expected an integer");
    expect_refused("threads=0", "threads 0: expected an integer in [1, 256] or auto");
    expect_refused("threads=-2", "expected an integer");
    expect_refused("pmp_scales=0.5", "pmp_scales 0.5: expected S_IN,S_OUT");
    expect_refused("pmp_scales=-1,0.5", "two non-negative numbers");
    expect_refused("pmp_scales=0.5,x", "two non-negative numbers");
    expect_refused("pmp_scales=,0.5", "two non-negative numbers");
    expect_refused("pmp_scales=nan,0.5", "two non-negative numbers");
    expect_refused("profile=tflite", "profile tflite: expected one of hf litert");
    expect_refused("weights=disk", "weights disk: expected one of resident mapped");
    expect_refused("bogus=1", "unknown option bogus");
    expect_refused("act", "act: expected name=value");
    expect_refused("=int", "expected name=value");
    g4_options o;
    g4_options_default(&o);
    CHECK(g4_options_set(&o, "--act", "fast") == -1 && !strcmp(g4_last_error(), "--act fast: expected one of float fake int"),
          "a flag's message names the flag: %s", g4_last_error());
    CHECK(g4_options_set(&o, "act", NULL) == -1 && strstr(g4_last_error(), "act needs a value"), "no value: %s", g4_last_error());
}

static g4_capture run_captured(const g4_model *m, const g4_options *o) {
    static const int32_t ids[] = {2, 10, 20, 30, 40, 50, 60, 70};
    g4_capture cap = {0};
    g4_session *s = g4_session_new(m, o);
    float *logits = malloc(sizeof *logits * (size_t)g4_model_vocab_size(m));
    if (s) g4_session_set_trace(s, g4_capture_trace, &cap);
    CHECK(s && g4_session_feed(s, ids, 8, logits, 0) == 0 && !cap.failed, "%s", g4_last_error());
    free(logits);
    g4_session_free(s);
    return cap;
}

static int same_pli(const g4_capture *a, const g4_capture *b) {
    const g4_captured *x = g4_capture_get(a, "per_layer_inputs"), *y = g4_capture_get(b, "per_layer_inputs");
    return x && y && x->rows == y->rows && x->width == y->width && !memcmp(x->data, y->data, sizeof(float) * (size_t)x->rows * x->width);
}

/* activation-quant.md / README: the quantizers divide in fake mode and multiply by the reciprocal
 * in int mode unless told; float mode has no quantizer, and takes fake mode's rule. */
static void test_resolve(void) {
    static const struct { g4_act_mode act; g4_qdiv given, want; } cases[] = {
        {G4_ACT_INT, G4_QDIV_DEFAULT, G4_QDIV_RECIPROCAL}, {G4_ACT_FAKE, G4_QDIV_DEFAULT, G4_QDIV_DIVIDE},
        {G4_ACT_FLOAT, G4_QDIV_DEFAULT, G4_QDIV_DIVIDE},   {G4_ACT_INT, G4_QDIV_DIVIDE, G4_QDIV_DIVIDE},
        {G4_ACT_FAKE, G4_QDIV_RECIPROCAL, G4_QDIV_RECIPROCAL}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        g4_options o, before;
        g4_options_default(&o);
        o.act = cases[i].act;
        o.qdiv = cases[i].given;
        before = o;
        g4_options_resolve(&o);
        before.qdiv = cases[i].want;
        CHECK(!memcmp(&o, &before, sizeof o), "act %d qdiv %d resolved to qdiv %d, expected %d (and nothing else changed)", cases[i].act,
              cases[i].given, o.qdiv, cases[i].want);
    }
    /* A session runs the resolved options. With the projection's input scale set so that x / s and
     * x * (1/s) round the first embedding value to different codes (as test_switches finds one),
     * the per-layer inputs of qdiv auto are recip's in int mode and div's in fake mode, bit for bit,
     * and the two rules' differ (so the comparison can fail). */
    g4_model *m = g4_model_load(tiny_dir());
    CHECK(m != NULL, "%s", g4_last_error());
    if (!m) return;
    g4_options f;
    g4_options_default(&f);
    f.act = G4_ACT_FLOAT;
    f.ctx = 16;
    g4_capture emb = run_captured(m, &f);
    const g4_captured *e = g4_capture_get(&emb, "inputs_embeds");
    float v = 0, found = 0;
    for (int i = 0; e && i < e->width && v == 0; i++) v = fabsf(e->data[i]);
    g4_capture_free(&emb);
    for (int k = 0; k < 127 && !found && v > 0; k++) {
        float t = v / ((float)k + 0.5f); /* v / t is (about) a tie: try the few scales around it */
        for (int i = 0; i < 4; i++) t = nextafterf(t, 0.0f);
        for (int i = 0; i < 9 && !found; i++, t = nextafterf(t, INFINITY)) {
            g4_quantizer d, r;
            g4_quantizer_init(&d, t, 0, G4_ROUND_EVEN, G4_QDIV_DIVIDE);
            g4_quantizer_init(&r, t, 0, G4_ROUND_EVEN, G4_QDIV_RECIPROCAL);
            if (g4_quantize(&d, v) != g4_quantize(&r, v)) found = t;
        }
    }
    CHECK(found != 0, "no scale separates x/s from x*(1/s) for %g", (double)v);
    static const g4_act_mode acts[2] = {G4_ACT_INT, G4_ACT_FAKE};
    for (int a = 0; a < 2 && found != 0; a++) {
        g4_capture c[3];
        const g4_qdiv rule[3] = {G4_QDIV_DEFAULT, G4_QDIV_RECIPROCAL, G4_QDIV_DIVIDE};
        for (int k = 0; k < 3; k++) {
            g4_options o;
            g4_options_default(&o);
            o.act = acts[a];
            o.ctx = 16;
            o.pmp_s_in = found;
            o.qdiv = rule[k];
            c[k] = run_captured(m, &o);
        }
        int same_as = acts[a] == G4_ACT_INT ? 1 : 2;
        CHECK(same_pli(&c[0], &c[same_as]), "act %d: qdiv auto does not run %s", acts[a], same_as == 1 ? "recip" : "div");
        CHECK(!same_pli(&c[1], &c[2]), "act %d: div and recip give the same per-layer inputs: the check above shows nothing", acts[a]);
        for (int k = 0; k < 3; k++) g4_capture_free(&c[k]);
    }
    /* an unresolvable rule is refused when a session is made */
    g4_options bad;
    g4_options_default(&bad);
    bad.round = (g4_round)7;
    CHECK(g4_session_new(m, &bad) == NULL && strstr(g4_last_error(), "unknown rounding rule 7"), "round 7: %s", g4_last_error());
    g4_options_default(&bad);
    bad.qdiv = (g4_qdiv)5;
    CHECK(g4_session_new(m, &bad) == NULL && strstr(g4_last_error(), "unknown quantizer division 5"), "qdiv 5: %s", g4_last_error());
    g4_model_free(m);
}

/* ---------------------------------------------------------------- logging, threads, weights */

typedef struct {
    int calls;
    g4_log_level level;
    char last[512];
} log_capture;

static void capture_log(void *user, g4_log_level level, const char *message) {
    log_capture *c = user;
    c->calls++;
    c->level = level;
    snprintf(c->last, sizeof c->last, "%s", message);
}

/* What f() writes to file descriptor 2. */
static char *stderr_of(void (*f)(const char *), const char *arg) {
    FILE *cap = tmpfile();
    fflush(stderr);
    int saved = dup(2);
    dup2(fileno(cap), 2);
    f(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fseek(cap, 0, SEEK_END);
    long n = ftell(cap);
    rewind(cap);
    char *text = calloc(1, (size_t)n + 1);
    if (fread(text, 1, (size_t)n, cap) != (size_t)n) text[0] = 0;
    fclose(cap);
    return text;
}

/* A load that warns: G4_TOKENIZER_CACHE holding neither on nor off (src/text/tokenizer.c). */
static void load_warning_tokenizer(const char *path) {
    setenv("G4_TOKENIZER_CACHE", "maybe", 1);
    g4_tokenizer *t = g4_tokenizer_load(path);
    CHECK(t != NULL, "%s", g4_last_error());
    g4_tokenizer_free(t);
    unsetenv("G4_TOKENIZER_CACHE");
}

static void test_log(void) {
    char path[700];
    snprintf(path, sizeof path, "%s/tokenizer.json", tmp);
    if (g4_synth_write_tokenizer(path, 512) != 0) exit(2);
    const char *want = "G4_TOKENIZER_CACHE=maybe: expected on or off; the cache stays on";
    log_capture c = {0};
    g4_set_log(capture_log, &c);
    char *err = stderr_of(load_warning_tokenizer, path);
    CHECK(c.calls == 1 && c.level == G4_LOG_WARNING && !strcmp(c.last, want), "%d calls, last \"%s\"", c.calls, c.last);
    CHECK(!*err, "with a log function the library wrote to stderr: %s", err);
    free(err);
    /* a warning from the kernels: an unknown G4_DISPATCH (once per process) */
    const char *outer = getenv("G4_DISPATCH");
    char *saved = outer ? strdup(outer) : NULL;
    setenv("G4_DISPATCH", "bogus", 1);
    const g4_kernels *k = g4_kernels_get();
    CHECK(k == g4_kernels_best() && c.calls == 2 && strstr(c.last, "G4_DISPATCH=bogus is unknown"), "dispatch warning: %d calls, \"%s\"",
          c.calls, c.last);
    if (saved) setenv("G4_DISPATCH", saved, 1);
    else unsetenv("G4_DISPATCH");
    free(saved);
    /* silence */
    g4_set_log(NULL, NULL);
    err = stderr_of(load_warning_tokenizer, path);
    CHECK(c.calls == 2 && !*err, "silenced, yet %d calls and stderr \"%s\"", c.calls, err);
    free(err);
    /* the default: the line the library always wrote */
    g4_set_log(g4_log_stderr, NULL);
    err = stderr_of(load_warning_tokenizer, path);
    char line[256];
    snprintf(line, sizeof line, "g4: warning: %s\n", want);
    CHECK(!strcmp(err, line), "g4_log_stderr wrote \"%s\"", err);
    free(err);
}

static void test_threads_and_weights(void) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    g4_set_threads(3);
    CHECK_EQ_INT(g4_threads(), 3);
    g4_set_threads(0);
    CHECK_EQ_INT(g4_threads(), online > 256 ? 256 : online);
    g4_options o;
    g4_options_default(&o);
    o.threads = 2;
    o.weights = G4_WEIGHTS_MAPPED;
    g4_model *m = g4_model_load_options(tiny_dir(), &o);
    CHECK(m && !g4_model_weights_resident(m) && g4_threads() == 2, "mapped, 2 threads: %s, resident %d, threads %d",
          m ? "loaded" : g4_last_error(), m ? g4_model_weights_resident(m) : -1, g4_threads());
    g4_model_free(m);
    /* threads 0 leaves the pool as it is; resident weights as g4_model_load places them */
    o.threads = 0;
    o.weights = G4_WEIGHTS_RESIDENT;
    m = g4_model_load_options(tiny_dir(), &o);
    g4_model *plain = g4_model_load(tiny_dir());
    CHECK(m && plain && g4_model_weights_resident(m) == g4_model_weights_resident(plain) && g4_threads() == 2,
          "resident: %d vs g4_model_load's %d, threads %d", m ? g4_model_weights_resident(m) : -1,
          plain ? g4_model_weights_resident(plain) : -1, g4_threads());
    g4_model_free(m);
    g4_model_free(plain);
    g4_set_threads(0);
}

/* ---------------------------------------------------------------- the command line */

/* A value of the row other than its default: its first other choice, or a number in range. */
static const char *other_value(const g4_option_info *opt) {
    if (opt->choices) {
        for (int k = 0; opt->choices[k].name; k++)
            if (strcmp(opt->choices[k].name, opt->def)) return opt->choices[k].name;
        return NULL;
    }
    if (!strcmp(opt->name, "pmp_scales")) return "0.04,0.0025";
    return "2";
}

/* Every row's flag is a flag of `g4 run` (default and another value accepted; a bad value refused
 * in one line that names the flag as typed), and `g4 help` lists it. */
static void test_cli_flags(void) {
    char args[4096], flag[64];
    CHECK(run("help") == 0, "g4 help failed");
    char *help = slurp(out_path);
    for (int i = 0; i < g4_option_count(); i++) {
        const g4_option_info *opt = g4_option_at(i);
        int n = snprintf(flag, sizeof flag, "--");
        for (const char *c = opt->name; *c; c++) flag[n++] = *c == '_' ? '-' : *c;
        flag[n] = 0;
        CHECK(strstr(help, flag) != NULL, "g4 help does not list %s", flag);
        snprintf(args, sizeof args, "run -m %s --ids 2,3 -n 2 --ctx 8 %s %s", tiny_dir(), flag, opt->def);
        if (strcmp(opt->name, "ctx")) CHECK(run(args) == 0, "g4 %s failed", args);
        snprintf(args, sizeof args, "run -m %s --ids 2,3 -n 2 --ctx 8 %s=%s", tiny_dir(), flag, other_value(opt));
        if (strcmp(opt->name, "ctx")) CHECK(run(args) == 0, "g4 %s failed", args);
        snprintf(args, sizeof args, "run -m %s --ids 2,3 -n 2 %s nonsense", tiny_dir(), flag);
        char what[96];
        snprintf(what, sizeof what, "%s nonsense: expected", flag);
        CHECK(run(args) == 1 && one_error_line(what), "g4 %s: not refused naming %s", args, flag);
        if (opt->short_flag) {
            snprintf(args, sizeof args, "run -m %s --ids 2,3 -n 2 %s 0", tiny_dir(), opt->short_flag);
            snprintf(what, sizeof what, "%s 0: expected", opt->short_flag);
            CHECK(run(args) == 1 && one_error_line(what), "g4 %s: not refused naming %s", args, opt->short_flag);
            CHECK(strstr(help, opt->short_flag) != NULL, "g4 help does not list %s", opt->short_flag);
        }
    }
    free(help);
    snprintf(args, sizeof args, "run -m %s --ids 2,3 -n 2 --ctx 4", tiny_dir());
    CHECK(run(args) == 0, "--ctx 4 failed");
    snprintf(args, sizeof args, "run -m %s --ids 2,3 -n 2 --requant", tiny_dir());
    CHECK(run(args) == 1 && one_error_line("--requant needs a value"), "--requant without a value");
    snprintf(args, sizeof args, "run -m %s --ids 2,3 -n 2 -t=2", tiny_dir());
    CHECK(run(args) == 1 && one_error_line("unknown flag -t=2"), "-t=2 taken");
}

/* ---------------------------------------------------------------- the eval header and resume */

static char model_dir[600], data_path[600];

static int eval_run(const char *out, const char *flags) {
    char args[4096];
    snprintf(args, sizeof args, "eval gsm8k -m %s --data %s --n 3 --max-tokens 8 --out %s %s", model_dir, data_path, out, flags);
    return run(args);
}

static cJSON *header_of(const char *path) {
    char *text = slurp(path), *nl = strchr(text, '\n');
    if (nl) *nl = 0;
    cJSON *h = cJSON_Parse(text);
    free(text);
    return h;
}

/* The header's options: exactly the eval's own and the table's result-affecting rows, each as
 * g4_options_get says of the same flags parsed through the API and resolved. */
static void test_header(const char *out, const char *flags, const char *const *assignments, int n_assign) {
    CHECK(eval_run(out, flags) == 0, "g4 eval %s failed", flags);
    cJSON *h = header_of(out);
    const cJSON *opts = cJSON_GetObjectItemCaseSensitive(h, "options");
    CHECK(cJSON_IsObject(opts), "%s: no options in the header", out);
    g4_options o;
    g4_options_default(&o);
    for (int i = 0; i < n_assign; i++) CHECK(g4_options_parse(&o, assignments[i]) == 0, "%s", g4_last_error());
    g4_options_resolve(&o);
    const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(opts, "ctx");
    if (cJSON_IsNumber(ctx)) o.ctx = (int)ctx->valuedouble; /* eval derives it from the prompts */
    int engine = 0;
    for (int i = 0; i < g4_option_count(); i++) {
        const g4_option_info *opt = g4_option_at(i);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(opts, opt->name);
        char want[128];
        g4_options_get(&o, opt->name, want, sizeof want);
        if (opt->kind != G4_OPTION_RESULT) {
            CHECK(v == NULL, "%s (not result-affecting) is in the header", opt->name);
            continue;
        }
        engine++;
        int ok = opt->integer ? cJSON_IsNumber(v) && v->valuedouble == strtod(want, NULL) : cJSON_IsString(v) && !strcmp(v->valuestring, want);
        CHECK(ok, "header option %s is not %s", opt->name, want);
    }
    static const char *const own[] = {"max_tokens", "think", "chat_form", "decoding", "stop_ids", "n", "offset"};
    for (size_t i = 0; i < sizeof own / sizeof *own; i++) CHECK(cJSON_GetObjectItemCaseSensitive(opts, own[i]), "no %s in the header", own[i]);
    CHECK(cJSON_GetArraySize(opts) == engine + 7, "%d header options, expected %d", cJSON_GetArraySize(opts), engine + 7);
    cJSON_Delete(h);
}

/* A resume with any other value of a result-affecting row is refused naming it, the file left
 * as it was; the same options, or other threads and weights, resume. */
static void test_resume(void) {
    char out[700], args[1024];
    snprintf(out, sizeof out, "%s/resume.jsonl", tmp);
    CHECK(eval_run(out, "") == 0, "first run failed");
    char *before = slurp(out);
    g4_options defaults;
    g4_options_default(&defaults);
    g4_options_resolve(&defaults);
    int refused = 0;
    for (int i = 0; i < g4_option_count(); i++) {
        const g4_option_info *opt = g4_option_at(i);
        if (opt->kind != G4_OPTION_RESULT) continue;
        /* a value whose resolved form differs from the file's (qdiv auto is recip in int mode) */
        const char *value = NULL;
        char in_file[128], now[128];
        g4_options_get(&defaults, opt->name, in_file, sizeof in_file);
        for (int k = 0; opt->choices && opt->choices[k].name && !value; k++) {
            g4_options o = defaults;
            g4_options_set(&o, opt->name, opt->choices[k].name);
            g4_options_resolve(&o);
            g4_options_get(&o, opt->name, now, sizeof now);
            if (strcmp(now, in_file)) value = opt->choices[k].name;
        }
        if (!opt->choices) value = !strcmp(opt->name, "ctx") ? "500" : "0.04,0.0025";
        char flag[64], what[256];
        int n = snprintf(flag, sizeof flag, "--");
        for (const char *c = opt->name; *c; c++) flag[n++] = *c == '_' ? '-' : *c;
        flag[n] = 0;
        snprintf(args, sizeof args, "%s %s", flag, value);
        snprintf(what, sizeof what, "option %s is ", opt->name);
        int rc = eval_run(out, args);
        CHECK(rc == 1 && one_error_line(what) && one_error_line("(rerun with the same options and data"), "resume with %s: exit %d", args, rc);
        refused++;
    }
    CHECK_EQ_INT(refused, 11);
    /* the examples, word for word */
    CHECK(eval_run(out, "--requant tfl-ref") == 1 && one_error_line("option requant is \"f32\" in the file, \"tfl-ref\" now"), "--requant");
    CHECK(eval_run(out, "--kv f32") == 1 && one_error_line("option kv is \"int8\" in the file, \"f32\" now"), "--kv");
    CHECK(eval_run(out, "--profile hf") == 1 && one_error_line("option kv is \"int8\" in the file, \"f32\" now"), "--profile hf");
    char *after = slurp(out);
    CHECK(!strcmp(before, after), "a refused resume changed the file");
    free(after);
    /* the same options, spelled otherwise or with the engine's own choice given, and other threads
     * or weights: it resumes (nothing left to run) */
    static const char *const same[] = {"", "--qdiv recip", "--qdiv auto", "--profile litert", "-t 1", "--threads 2 --weights mapped",
                                       "--act=int --requant=f32"};
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        int rc = eval_run(out, same[i]);
        char *err = slurp(err_path);
        CHECK(rc == 0 && strstr(err, "3 already in") && strstr(err, "0 to run"), "resume with \"%s\": exit %d, %s", same[i], rc, err);
        free(err);
    }
    free(before);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/g4-options-XXXXXX");
    if (!mkdtemp(tmp)) return 2;
    snprintf(out_path, sizeof out_path, "%s/stdout", tmp);
    snprintf(err_path, sizeof err_path, "%s/stderr", tmp);
    test_version();
    test_defaults();
    test_rows();
    test_set_values();
    test_refusals();
    test_resolve();
    test_log();
    test_threads_and_weights();
    bin = check_bin();
    if (bin) {
        snprintf(model_dir, sizeof model_dir, "models/gemma4-tiny-math");
        snprintf(data_path, sizeof data_path, "models/gemma4-tiny-math/test.jsonl");
        test_cli_flags();
        char out[700];
        snprintf(out, sizeof out, "%s/header-default.jsonl", tmp);
        test_header(out, "", NULL, 0);
        static const char *const set[] = {"requant=tfl-ref", "round=away", "qdiv=div", "pmp_scales=0.04,0.0025", "kv=f32"};
        snprintf(out, sizeof out, "%s/header-set.jsonl", tmp);
        test_header(out, "--requant tfl-ref --round away --qdiv div --pmp-scales 0.04,0.0025 --kv f32 -t 1 --weights mapped", set, 5);
        static const char *const fake[] = {"act=fake", "profile=hf"};
        snprintf(out, sizeof out, "%s/header-fake.jsonl", tmp);
        test_header(out, "--act fake --profile hf", fake, 2);
        test_resume();
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (sh(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return check_report("options");
}
