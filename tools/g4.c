/* g4: command-line interface. Every failure prints one line "g4: error: ..." and exits 1. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#include "g4.h"
#include "model/capture.h"
#include "util/err.h"
#include "util/npy.h"

int g4_cmd_synth(int argc, char **argv); /* tools/synth_cmd.c */

static int die(const char *fmt, const char *arg) {
    fprintf(stderr, "g4: error: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    return 1;
}

static int die_lib(void) {
    fprintf(stderr, "g4: error: %s\n", g4_last_error());
    return 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static long peak_rss_kb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* ---- flag parsing ---- */

typedef struct {
    int argc, i;
    char **argv;
    const char *cmd;
} args_t;

/* The value of flag argv[i] (either "--flag value" or "--flag=value"). */
static const char *flag_value(args_t *a, const char *flag, int *bad) {
    const char *arg = a->argv[a->i];
    const char *eq = strchr(arg, '=');
    if (eq) return eq + 1;
    if (a->i + 1 >= a->argc) {
        fprintf(stderr, "g4 %s: error: %s needs a value\n", a->cmd, flag);
        *bad = 1;
        return NULL;
    }
    return a->argv[++a->i];
}

static int flag_is(const args_t *a, const char *name) {
    const char *arg = a->argv[a->i];
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && (arg[n] == 0 || (arg[n] == '=' && name[1] == '-'));
}

static int parse_int(const char *cmd, const char *flag, const char *v, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "g4 %s: error: %s %s: expected an integer in [%ld, %ld]\n", cmd, flag, v, lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_float(const char *cmd, const char *flag, const char *v, float *out) {
    char *end;
    errno = 0;
    float x = strtof(v, &end);
    if (errno || end == v || *end || !(x >= 0)) {
        fprintf(stderr, "g4 %s: error: %s %s: expected a non-negative number\n", cmd, flag, v);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_choice(const char *cmd, const char *flag, const char *v, const char *const *choices, int *out) {
    for (int i = 0; choices[i]; i++)
        if (strcmp(v, choices[i]) == 0) {
            *out = i;
            return 0;
        }
    fprintf(stderr, "g4 %s: error: %s %s: expected one of", cmd, flag, v);
    for (int i = 0; choices[i]; i++) fprintf(stderr, " %s", choices[i]);
    fputc('\n', stderr);
    return -1;
}

/* Comma-separated token ids. */
static int parse_ids(const char *cmd, const char *v, int32_t **ids, int *n) {
    int cap = 16, len = 0;
    int32_t *out = malloc(sizeof *out * (size_t)cap);
    const char *p = v;
    while (out && *p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            free(out);
            fprintf(stderr, "g4 %s: error: --ids %s: expected comma-separated token ids\n", cmd, v);
            return -1;
        }
        if (len == cap) {
            int32_t *bigger = realloc(out, sizeof *out * (size_t)(cap *= 2));
            if (!bigger) break;
            out = bigger;
        }
        out[len++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (!out || !len) {
        free(out);
        fprintf(stderr, "g4 %s: error: --ids: no token ids given\n", cmd);
        return -1;
    }
    *ids = out;
    *n = len;
    return 0;
}

/* Engine options shared by every command that runs the model. Returns 1 if argv[i] was one. */
static int engine_flag(args_t *a, g4_options *o, int *bad) {
    static const char *const acts[] = {"float", "fake", "int", NULL}, *const onoff[] = {"off", "on", NULL},
                             *const profiles[] = {"hf", "litert", NULL}, *const kv[] = {"f32", "int8", NULL},
                             *const placements[] = {"scaled", "raw", NULL}, *const rounds[] = {"even", "away", NULL},
                             *const qdivs[] = {"recip", "div", NULL},
                             *const requants[] = {"f32", "f64", "tfl-double", "tfl-single", "tfl-neon", "tfl-ref", NULL};
    const char *v;
    int choice;
    if (flag_is(a, "--act")) {
        if (!(v = flag_value(a, "--act", bad)) || parse_choice(a->cmd, "--act", v, acts, &choice)) return *bad = 1;
        o->act = (g4_act_mode)choice;
    } else if (flag_is(a, "--profile")) {
        if (!(v = flag_value(a, "--profile", bad)) || parse_choice(a->cmd, "--profile", v, profiles, &choice)) return *bad = 1;
        o->kv_quant = o->pmp_quant = choice; /* hf: linear points only; litert: + KV + projection */
    } else if (flag_is(a, "--kv")) {
        if (!(v = flag_value(a, "--kv", bad)) || parse_choice(a->cmd, "--kv", v, kv, &o->kv_quant)) return *bad = 1;
    } else if (flag_is(a, "--linear-quant")) {
        if (!(v = flag_value(a, "--linear-quant", bad)) || parse_choice(a->cmd, "--linear-quant", v, onoff, &o->linear_quant))
            return *bad = 1;
    } else if (flag_is(a, "--pmp-quant")) {
        if (!(v = flag_value(a, "--pmp-quant", bad)) || parse_choice(a->cmd, "--pmp-quant", v, onoff, &o->pmp_quant))
            return *bad = 1;
    } else if (flag_is(a, "--pmp-placement")) {
        if (!(v = flag_value(a, "--pmp-placement", bad)) ||
            parse_choice(a->cmd, "--pmp-placement", v, placements, &o->pmp_out_raw))
            return *bad = 1;
    } else if (flag_is(a, "--pmp-scales")) {
        char buf[64];
        if (!(v = flag_value(a, "--pmp-scales", bad))) return 1;
        const char *comma = strchr(v, ',');
        if (!comma || (size_t)(comma - v) >= sizeof buf) {
            fprintf(stderr, "g4 %s: error: --pmp-scales %s: expected S_IN,S_OUT\n", a->cmd, v);
            return *bad = 1;
        }
        memcpy(buf, v, (size_t)(comma - v));
        buf[comma - v] = 0;
        if (parse_float(a->cmd, "--pmp-scales", buf, &o->pmp_s_in) || parse_float(a->cmd, "--pmp-scales", comma + 1, &o->pmp_s_out))
            return *bad = 1;
    } else if (flag_is(a, "--round")) {
        if (!(v = flag_value(a, "--round", bad)) || parse_choice(a->cmd, "--round", v, rounds, &choice)) return *bad = 1;
        o->round = (g4_round)choice;
    } else if (flag_is(a, "--qdiv")) {
        if (!(v = flag_value(a, "--qdiv", bad)) || parse_choice(a->cmd, "--qdiv", v, qdivs, &choice)) return *bad = 1;
        o->qdiv = (g4_qdiv)choice;
    } else if (flag_is(a, "--requant")) {
        if (!(v = flag_value(a, "--requant", bad)) || parse_choice(a->cmd, "--requant", v, requants, &choice)) return *bad = 1;
        o->requant = (g4_requant_rule)choice;
    } else if (flag_is(a, "--lmhead-dynamic-q8")) {
        if (!(v = flag_value(a, "--lmhead-dynamic-q8", bad)) || parse_choice(a->cmd, "--lmhead-dynamic-q8", v, onoff, &o->lmhead_dynamic_q8))
            return *bad = 1;
    } else if (flag_is(a, "--ctx")) {
        if (!(v = flag_value(a, "--ctx", bad)) || parse_int(a->cmd, "--ctx", v, 1, 1 << 20, &o->ctx)) return *bad = 1;
    } else {
        return 0;
    }
    return 1;
}

/* Sampling flags. Returns 1 if argv[i] was one; sets *given when any was. */
static int sampling_flag(args_t *a, g4_sampling *p, int *given, int *bad) {
    const char *v = NULL;
    float f;
    int i;
    if (flag_is(a, "--temp") || flag_is(a, "--temperature")) {
        if (!(v = flag_value(a, "--temp", bad)) || parse_float(a->cmd, "--temp", v, &f)) return *bad = 1;
        p->temperature = f;
    } else if (flag_is(a, "--top-k")) {
        if (!(v = flag_value(a, "--top-k", bad)) || parse_int(a->cmd, "--top-k", v, 0, 1 << 30, &i)) return *bad = 1;
        p->top_k = i;
    } else if (flag_is(a, "--top-p")) {
        if (!(v = flag_value(a, "--top-p", bad)) || parse_float(a->cmd, "--top-p", v, &f)) return *bad = 1;
        if (!(f > 0 && f <= 1)) {
            fprintf(stderr, "g4 %s: error: --top-p %s: expected a number in (0, 1]\n", a->cmd, v);
            return *bad = 1;
        }
        p->top_p = f;
    } else if (flag_is(a, "--min-p")) {
        if (!(v = flag_value(a, "--min-p", bad)) || parse_float(a->cmd, "--min-p", v, &f)) return *bad = 1;
        if (f > 1) {
            fprintf(stderr, "g4 %s: error: --min-p %s: expected a number in [0, 1]\n", a->cmd, v);
            return *bad = 1;
        }
        p->min_p = f;
    } else if (flag_is(a, "--repeat-penalty")) {
        if (!(v = flag_value(a, "--repeat-penalty", bad)) || parse_float(a->cmd, "--repeat-penalty", v, &f)) return *bad = 1;
        if (!(f > 0)) {
            fprintf(stderr, "g4 %s: error: --repeat-penalty %s: expected a positive number\n", a->cmd, v);
            return *bad = 1;
        }
        p->repeat_penalty = f;
    } else if (flag_is(a, "--repeat-last-n")) {
        if (!(v = flag_value(a, "--repeat-last-n", bad)) || parse_int(a->cmd, "--repeat-last-n", v, 0, 1 << 30, &i)) return *bad = 1;
        p->repeat_last_n = i;
    } else if (flag_is(a, "--seed")) {
        char *end;
        if (!(v = flag_value(a, "--seed", bad))) return 1;
        errno = 0;
        unsigned long long seed = strtoull(v, &end, 10);
        if (errno || end == v || *end || v[0] == '-') {
            fprintf(stderr, "g4 %s: error: --seed %s: expected a non-negative integer\n", a->cmd, v);
            return *bad = 1;
        }
        p->seed = seed;
    } else {
        return 0;
    }
    *given = 1;
    return 1;
}

static int unknown_flag(const args_t *a) {
    fprintf(stderr, "g4 %s: error: unknown flag %s (see g4 help)\n", a->cmd, a->argv[a->i]);
    return 1;
}

/* ---- commands ---- */

static int cmd_inspect(args_t *a) {
    const char *dir = NULL;
    int bad = 0;
    for (a->i = 2; a->i < a->argc && !bad; a->i++) {
        if (flag_is(a, "-m") || flag_is(a, "--model")) dir = flag_value(a, "-m", &bad);
        else return unknown_flag(a);
    }
    if (bad) return 1;
    if (!dir) return die("g4 inspect needs -m DIR%s", "");
    double t0 = now_s();
    g4_model *m = g4_model_load(dir);
    if (!m) return die_lib();
    double load_s = now_s() - t0;
    g4_model_describe(m, stdout);
    printf("  load time: %.3f s, peak resident memory: %.1f MB\n", load_s, peak_rss_kb() / 1024.0);
    g4_model_free(m);
    return 0;
}

typedef struct {
    const char *dir, *ids, *logits_npy, *dump_dir;
    int n_new;
    g4_options o;
    g4_sampling sampling;
    int sampling_given;
} run_args;

static int parse_run(args_t *a, run_args *r) {
    int bad = 0;
    g4_options_default(&r->o);
    g4_sampling_default(&r->sampling);
    r->n_new = 16;
    for (a->i = 2; a->i < a->argc && !bad; a->i++) {
        if (flag_is(a, "-m") || flag_is(a, "--model")) r->dir = flag_value(a, "-m", &bad);
        else if (flag_is(a, "--ids")) r->ids = flag_value(a, "--ids", &bad);
        else if (flag_is(a, "-n") || flag_is(a, "--max-tokens")) {
            const char *v = flag_value(a, "-n", &bad);
            if (v && parse_int(a->cmd, "-n", v, 0, 1 << 20, &r->n_new)) bad = 1;
        } else if (flag_is(a, "--logits-npy")) r->logits_npy = flag_value(a, "--logits-npy", &bad);
        else if (flag_is(a, "--dump-dir")) r->dump_dir = flag_value(a, "--dump-dir", &bad);
        else if (!engine_flag(a, &r->o, &bad) && !sampling_flag(a, &r->sampling, &r->sampling_given, &bad)) return unknown_flag(a);
    }
    if (bad) return 1;
    if (!r->dir) return die("g4 run needs -m DIR%s", "");
    if (!r->ids) return die("g4 run needs --ids (comma-separated token ids)%s", "");
    return 0;
}

/* Prefill only, for --logits-npy and --dump-dir: all prompt logits and intermediate tensors. */
static int write_prefill_outputs(g4_session *s, const run_args *r, const int32_t *ids, int n) {
    int V = g4_model_vocab_size(g4_session_model(s));
    float *logits = malloc(sizeof *logits * (size_t)V * (size_t)n);
    g4_capture cap = {0};
    int rc = -1;
    if (!logits) {
        g4_fail("out of memory for %d x %d logits", n, V);
        return -1;
    }
    if (r->dump_dir) g4_session_set_trace(s, g4_capture_trace, &cap);
    if (g4_session_eval(s, ids, n, logits, 1) == 0 && (!r->dump_dir || g4_capture_write_npy(&cap, r->dump_dir) == 0)) {
        int64_t shape[2] = {n, V};
        rc = r->logits_npy ? g4_npy_write_f32(r->logits_npy, logits, 2, shape) : 0;
    }
    g4_session_set_trace(s, NULL, NULL);
    g4_session_reset(s);
    g4_capture_free(&cap);
    free(logits);
    return rc;
}

static int print_id(void *user, int32_t token) {
    int *count = user;
    printf((*count)++ ? " %d" : "%d", token);
    fflush(stdout);
    return 0;
}

static int cmd_run(args_t *a) {
    run_args r = {0};
    if (parse_run(a, &r) != 0) return 1;
    int32_t *ids;
    int n_ids;
    if (parse_ids(a->cmd, r.ids, &ids, &n_ids) != 0) return 1;
    if (r.dump_dir && mkdir(r.dump_dir, 0777) != 0 && errno != EEXIST) {
        free(ids);
        return die("--dump-dir %s: cannot create the folder", r.dump_dir);
    }
    g4_model *m = g4_model_load(r.dir);
    g4_session *s = m ? g4_session_new(m, &r.o) : NULL;
    int rc = 1, printed = 0;
    if (!s) goto done;
    if ((r.logits_npy || r.dump_dir) && write_prefill_outputs(s, &r, ids, n_ids) != 0) goto done;
    if (r.n_new > 0) {
        /* token ids in and out: greedy unless sampling flags are given, and no stop ids, so the
         * output has exactly -n ids (the tests compare it with golden sequences) */
        g4_generate_params gp = {.max_tokens = r.n_new, .sampling = r.sampling, .stop_ids = NULL, .n_stop_ids = 0};
        static const int none[1] = {-1};
        gp.stop_ids = none;
        g4_generate_result res;
        if (g4_generate(s, ids, n_ids, &gp, print_id, &printed, &res) != 0) goto done;
        printf("\n");
        if (res.stop == G4_STOP_CONTEXT)
            fprintf(stderr, "g4: warning: generation stopped after %d tokens: the context of %d tokens is full (--ctx)\n",
                    res.n_generated, r.o.ctx);
    }
    rc = 0;
done:
    if (rc) die_lib();
    free(ids);
    g4_session_free(s);
    g4_model_free(m);
    return rc;
}

static void usage(FILE *f) {
    fprintf(f,
            "g4 %s: Gemma 4 QAT (static int8 activation) inference engine\n"
            "usage:\n"
            "  g4 inspect -m DIR                      describe the checkpoint as loaded\n"
            "  g4 run -m DIR --ids 2,651,9 [-n 16]    greedy-decode from token ids; prints the new ids\n"
            "  g4 synth --preset e2b|tiny -o DIR      write a random checkpoint in the real layout\n"
            "      --logits-npy FILE   write the prefill logits [prompt_len, vocab] as .npy\n"
            "      --dump-dir DIR      write intermediate prefill tensors as .npy (golden names)\n"
            "engine options (run):\n"
            "  --act float|fake|int    activation mode (default int: int8 x intN -> int32 -> requantized linears)\n"
            "  --profile hf|litert     hf: linear clamps only; litert: + int8 KV + per_layer_model_projection (default)\n"
            "  --linear-quant on|off   points A1-A4, A7-A17 (default on)\n"
            "  --kv int8|f32           int8 K/V at cache write with k/v_cache_scale (default int8)\n"
            "  --pmp-quant on|off      per_layer_model_projection input/output quantization (default on)\n"
            "  --pmp-placement scaled|raw  where its output is quantized (default scaled)\n"
            "  --pmp-scales S_IN,S_OUT its static scales (default 0.038878,0.002353)\n"
            "  --round even|away       tie rule of every activation quantizer (default even)\n"
            "  --qdiv div|recip        x / s or x * (1/s) (default: div in fake mode, recip in int mode)\n"
            "  --requant f32|f64|tfl-double|tfl-single|tfl-neon|tfl-ref  int-mode requantization (default f32 = XNNPACK)\n"
            "  --lmhead-dynamic-q8 on|off  quantize the lm_head input per token at run time, as XNNPACK (default off)\n"
            "  --ctx N                 context length (default 4096)\n"
            "sampling (run -p, chat; run --ids is greedy unless given):\n"
            "  --temp T  --top-k K  --top-p P  --min-p P  --repeat-penalty R  --repeat-last-n N  --seed S\n",
            G4_VERSION);
}

int main(int argc, char **argv) {
    args_t a = {.argc = argc, .argv = argv, .i = 1, .cmd = argc > 1 ? argv[1] : ""};
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("g4 %s\n", G4_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "inspect")) return cmd_inspect(&a);
    if (!strcmp(argv[1], "synth")) return g4_cmd_synth(argc - 1, argv + 1);
    if (!strcmp(argv[1], "run")) return cmd_run(&a);
    fprintf(stderr, "g4: error: unknown command %s (commands: inspect, run, synth, help)\n", argv[1]);
    return 1;
}
