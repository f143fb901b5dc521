/* Command-line plumbing shared by every g4 command: one-line errors, flag parsing, and the
 * engine and sampling flags. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <unistd.h>

#include "g4dev.h"


#ifndef G4_SOURCE_DIR
#define G4_SOURCE_DIR "."
#endif

int die(const char *fmt, const char *arg) {
    fprintf(stderr, "g4: error: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    return 1;
}

int die_lib(void) {
    fprintf(stderr, "g4: error: %s\n", g4_last_error());
    return 1;
}

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

long peak_rss_kb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* ---- flag parsing ---- */


/* The value of flag argv[i] (either "--flag value" or "--flag=value"). */
const char *flag_value(args_t *a, const char *flag, int *bad) {
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

int flag_is(const args_t *a, const char *name) {
    const char *arg = a->argv[a->i];
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && (arg[n] == 0 || (arg[n] == '=' && name[1] == '-'));
}

int parse_int(const char *cmd, const char *flag, const char *v, long lo, long hi, int *out) {
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

int parse_float(const char *cmd, const char *flag, const char *v, float *out) {
    char *end;
    /* an underflow (1e-40) gives the nearest float, what was asked for; an overflow gives inf */
    float x = strtof(v, &end);
    if (end == v || *end || !(x >= 0 && isfinite(x))) {
        fprintf(stderr, "g4 %s: error: %s %s: expected a finite number >= 0\n", cmd, flag, v);
        return -1;
    }
    *out = x;
    return 0;
}

int parse_choice(const char *cmd, const char *flag, const char *v, const char *const *choices, int *out) {
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
int parse_ids(const char *cmd, const char *v, int32_t **ids, int *n) {
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

g4_model *load_model(const char *dir, const g4_options *o) { return g4_model_load_options(dir, o); }

/* The engine options are the rows of the library's options table (g4.h): each row's flag is
 * --NAME with '-' for '_' (and its short flag), its values and messages the table's, so the
 * command line, the API and the eval header name the same options. */
int engine_flag(args_t *a, g4_options *o, int *bad) {
    const char *arg = a->argv[a->i];
    char flag[64];
    size_t len = strcspn(arg, "=");
    if (arg[0] != '-' || len >= sizeof flag || (arg[len] == '=' && arg[1] != '-')) return 0; /* "=" only after a --flag */
    memcpy(flag, arg, len);
    flag[len] = 0;
    if (!g4_option_find(flag)) return 0;
    const char *v = flag_value(a, flag, bad);
    if (v && g4_options_set(o, flag, v) != 0) {
        fprintf(stderr, "g4 %s: error: %s\n", a->cmd, g4_last_error());
        *bad = 1;
    }
    return 1;
}

/* One line per engine option, from the table: its flags, values, default and what it does. */
void print_engine_options(FILE *f) {
    for (int i = 0; i < g4_option_count(); i++) {
        const g4_option_info *opt = g4_option_at(i);
        char flags[160], values[160];
        int n = snprintf(flags, sizeof flags, "%s%s--", opt->short_flag ? opt->short_flag : "", opt->short_flag ? ", " : "");
        for (const char *c = opt->name; *c && n < (int)sizeof flags - 1; c++) flags[n++] = *c == '_' ? '-' : *c;
        flags[n] = 0;
        if (opt->choices) {
            values[0] = 0;
            for (int k = 0, used = 0; opt->choices[k].name && used < (int)sizeof values; k++)
                used += snprintf(values + used, sizeof values - (size_t)used, "%s%s", k ? "|" : "", opt->choices[k].name);
        } else {
            snprintf(values, sizeof values, "%s", opt->values);
        }
        fprintf(f, "  %s %s\n      %s (default %s)\n", flags, values, opt->help, opt->def);
    }
}

/* Sampling flags. Returns 1 if argv[i] was one; sets *given when any was. */
/* A finite number, of either sign. */
static int parse_signed(const char *v, float *out) {
    char *end;
    errno = 0;
    float x = strtof(v, &end);
    if (errno || end == v || *end || !isfinite(x)) return -1;
    *out = x;
    return 0;
}

/* --logit-bias ID=V: one more entry of the command's bias table (a command parses its flags once). */
static int logit_bias_flag(const char *cmd, const char *v, g4_sampling *p) {
    enum { MAX_BIAS = 1024 };
    static int32_t ids[MAX_BIAS];
    static float values[MAX_BIAS];
    static int n;
    char *end;
    errno = 0;
    long id = strtol(v, &end, 10);
    float x = 0;
    int ok = !errno && end != v && *end == '=' && id >= 0 && id <= INT32_MAX && !parse_signed(end + 1, &x);
    if (!ok || !(x >= -G4_MAX_LOGIT_BIAS && x <= G4_MAX_LOGIT_BIAS)) {
        fprintf(stderr, "g4 %s: error: --logit-bias %s: expected TOKEN_ID=BIAS, the bias in [-100, 100]\n", cmd, v);
        return 1;
    }
    if (n == MAX_BIAS) {
        fprintf(stderr, "g4 %s: error: --logit-bias: at most %d entries\n", cmd, MAX_BIAS);
        return 1;
    }
    ids[n] = (int32_t)id, values[n] = x, n++;
    p->bias_ids = ids, p->bias_values = values, p->n_bias = n;
    return 0;
}

int sampling_flag(args_t *a, g4_sampling *p, int *given, int *bad) {
    const char *v = NULL;
    float f;
    int i, field;
    if (flag_is(a, "--temp") || flag_is(a, "--temperature")) {
        if (!(v = flag_value(a, "--temp", bad)) || parse_float(a->cmd, "--temp", v, &f)) return *bad = 1;
        p->temperature = f;
        field = G4_SAMPLE_TEMP;
    } else if (flag_is(a, "--top-k")) {
        if (!(v = flag_value(a, "--top-k", bad)) || parse_int(a->cmd, "--top-k", v, 0, 1 << 30, &i)) return *bad = 1;
        p->top_k = i;
        field = G4_SAMPLE_TOP_K;
    } else if (flag_is(a, "--top-p")) {
        if (!(v = flag_value(a, "--top-p", bad)) || parse_float(a->cmd, "--top-p", v, &f)) return *bad = 1;
        if (!(f > 0 && f <= 1)) {
            fprintf(stderr, "g4 %s: error: --top-p %s: expected a number in (0, 1]\n", a->cmd, v);
            return *bad = 1;
        }
        p->top_p = f;
        field = G4_SAMPLE_TOP_P;
    } else if (flag_is(a, "--min-p")) {
        if (!(v = flag_value(a, "--min-p", bad)) || parse_float(a->cmd, "--min-p", v, &f)) return *bad = 1;
        if (f > 1) {
            fprintf(stderr, "g4 %s: error: --min-p %s: expected a number in [0, 1]\n", a->cmd, v);
            return *bad = 1;
        }
        p->min_p = f;
        field = G4_SAMPLE_MIN_P;
    } else if (flag_is(a, "--repeat-penalty")) {
        if (!(v = flag_value(a, "--repeat-penalty", bad)) || parse_float(a->cmd, "--repeat-penalty", v, &f)) return *bad = 1;
        if (!(f > 0)) {
            fprintf(stderr, "g4 %s: error: --repeat-penalty %s: expected a positive number\n", a->cmd, v);
            return *bad = 1;
        }
        p->repeat_penalty = f;
        field = G4_SAMPLE_PENALTY;
    } else if (flag_is(a, "--repeat-last-n")) {
        if (!(v = flag_value(a, "--repeat-last-n", bad)) || parse_int(a->cmd, "--repeat-last-n", v, 0, 1 << 30, &i)) return *bad = 1;
        p->repeat_last_n = i;
        field = G4_SAMPLE_LAST_N;
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
        field = G4_SAMPLE_SEED;
    } else if (flag_is(a, "--frequency-penalty") || flag_is(a, "--presence-penalty")) {
        int freq = flag_is(a, "--frequency-penalty");
        const char *name = freq ? "--frequency-penalty" : "--presence-penalty";
        if (!(v = flag_value(a, name, bad))) return *bad = 1;
        if (parse_signed(v, &f) || !(f >= -2 && f <= 2)) {
            fprintf(stderr, "g4 %s: error: %s %s: expected a number in [-2, 2] (OpenAI's range)\n", a->cmd, name, v);
            return *bad = 1;
        }
        *(freq ? &p->frequency_penalty : &p->presence_penalty) = f;
        field = freq ? G4_SAMPLE_FREQUENCY : G4_SAMPLE_PRESENCE;
    } else if (flag_is(a, "--logit-bias")) {
        if (!(v = flag_value(a, "--logit-bias", bad)) || logit_bias_flag(a->cmd, v, p)) return *bad = 1;
        field = G4_SAMPLE_BIAS;
    } else {
        return 0;
    }
    *given |= field;
    return 1;
}

int unknown_flag(const args_t *a) {
    fprintf(stderr, "g4 %s: error: unknown flag %s (see g4 %s --help)\n", a->cmd, a->argv[a->i], a->cmd);
    return 1;
}

long read_line_max(FILE *f, char **line, size_t *cap, size_t max) {
    size_t len = 0;
    for (int c; (c = getc(f)) != EOF;) {
        if (len >= max) return LINE_TOO_LONG;
        if (len + 2 > *cap) {
            size_t grow = *cap < 128 ? 256 : *cap * 2;
            if (grow > max + 2) grow = max + 2;
            char *bigger = realloc(*line, grow);
            if (!bigger) return LINE_TOO_LONG;
            *line = bigger;
            *cap = grow;
        }
        (*line)[len++] = (char)c;
        if (c == '\n') break;
    }
    if (!len) return -1;
    (*line)[len] = 0;
    return (long)len;
}

/* ---- usage ---- */

/* The flags sampling_flag and draft_flag parse. */
static const usage_line sampling_usage[] = {
    {"--temp, --temperature T", "sampling temperature; 0 is greedy"},
    {"--top-k K", "sample among the K most likely tokens (0: all)"},
    {"--top-p P", "nucleus: the fewest tokens whose probability adds up to P, in (0, 1]"},
    {"--min-p P", "drop tokens below P times the most likely one's probability, in [0, 1]"},
    {"--repeat-penalty R", "divide the logits of recent tokens by R (HF rule; 1: off)"},
    {"--repeat-last-n N", "how many recent tokens the penalty looks at"},
    {"--seed S", "random seed: the same seed gives the same output"},
    {"--frequency-penalty F", "OpenAI's: a generated token's logit loses F times its count so far (0: off)"},
    {"--presence-penalty P", "OpenAI's: a generated token's logit loses P once it occurred (0: off)"},
    {"--logit-bias ID=B", "add B (in [-100, 100]) to token ID's logit; repeatable"},
    {NULL, NULL},
};
static const usage_line draft_usage[] = {
    {"--draft DIR", "a gemma4_assistant drafter made for the model: greedy decoding verifies its drafts (the same tokens)"},
    {"--draft-tokens K", "tokens a drafting round proposes (1-16, default 3)"},
    {NULL, NULL},
};
static const usage_line help_usage[] = {{"-h, --help", "this help"}, {NULL, NULL}};

/* Whether the line names the flag arg[0..n) (its words that start with '-'); *takes_value is set
 * when the line has a placeholder word. */
static int line_names(const char *flags, const char *arg, size_t n, int *takes_value) {
    int found = 0;
    *takes_value = 0;
    for (const char *p = flags; *p;) {
        p += strspn(p, " ,");
        size_t len = strcspn(p, " ,");
        if (!len) break;
        if (p[0] == '-') found |= len == n && !strncmp(p, arg, n);
        else *takes_value = 1;
        p += len;
    }
    return found;
}

static int table_takes_value(const usage_line *lines, const char *arg, size_t n) {
    int value;
    for (int i = 0; lines[i].flags; i++)
        if (line_names(lines[i].flags, arg, n, &value)) return value;
    return 0;
}

/* Whether argv word arg is a flag of the command that takes its value from the next word. */
static int takes_value(const command_usage *u, const char *arg) {
    size_t n = strcspn(arg, "=");
    if (arg[0] != '-' || arg[n] == '=') return 0; /* not a flag, or --flag=value */
    char flag[64];
    if (n < sizeof flag && (u->groups & USAGE_ENGINE)) {
        memcpy(flag, arg, n);
        flag[n] = 0;
        if (g4_option_find(flag)) return 1; /* every engine option takes a value */
    }
    return table_takes_value(u->lines, arg, n) || ((u->groups & USAGE_SAMPLING) && table_takes_value(sampling_usage, arg, n)) ||
           ((u->groups & USAGE_DRAFT) && table_takes_value(draft_usage, arg, n));
}

int asks_help(const command_usage *u, int argc, char **argv, int first) {
    for (int k = first; k < argc; k++) {
        if (!strcmp(argv[k], "-h") || !strcmp(argv[k], "--help")) return 1;
        if (takes_value(u, argv[k])) k++;
    }
    return 0;
}

static void print_lines(FILE *f, const usage_line *lines) {
    for (int i = 0; lines[i].flags; i++) {
        if (strlen(lines[i].flags) <= 24) fprintf(f, "  %-24s  %s\n", lines[i].flags, lines[i].help);
        else fprintf(f, "  %s\n  %-24s  %s\n", lines[i].flags, "", lines[i].help);
    }
}

void print_command_usage(FILE *f, const command_usage *u) {
    fprintf(f, "usage: g4 %s\n%s\n", u->synopsis, u->about);
    print_lines(f, u->lines);
    print_lines(f, help_usage);
    if (u->groups & USAGE_SAMPLING) {
        fprintf(f, "sampling (unset flags take the model's generation_config.json values):\n");
        print_lines(f, sampling_usage);
    }
    if (u->groups & USAGE_DRAFT) {
        fprintf(f, "multi-token prediction:\n");
        print_lines(f, draft_usage);
    }
    if (u->groups & USAGE_ENGINE) {
        fprintf(f, "engine options (--NAME VALUE or --NAME=VALUE):\n");
        print_engine_options(f);
    }
}


/* The built-in model: $G4_MODEL, else models/gemma4-tiny-math of the source tree this binary was
 * built in (found beside the executable first, so a moved checkout still works). */
const char *default_model_dir(void) {
    static char path[4096];
    const char *env = getenv("G4_MODEL");
    if (env && *env) return env;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0; /* build/release */
        if (snprintf(path, sizeof path, "%s/../../models/gemma4-tiny-math", exe) < (int)sizeof path && g4_file_exists(path))
            return path;
    }
    snprintf(path, sizeof path, "%s/models/gemma4-tiny-math", G4_SOURCE_DIR);
    return path;
}

/* ---- the MTP drafter (--draft DIR, --draft-tokens K) ---- */

int draft_flag(args_t *a, draft_args *d, int *bad) {
    if (flag_is(a, "--draft")) {
        d->dir = flag_value(a, "--draft", bad);
        return 1;
    }
    if (flag_is(a, "--draft-tokens")) {
        const char *v = flag_value(a, "--draft-tokens", bad);
        if (v && parse_int(a->cmd, "--draft-tokens", v, 1, G4_MAX_DRAFT_TOKENS, &d->tokens) != 0) *bad = 1;
        return 1;
    }
    return 0;
}

int draft_open(draft_args *d, const g4_model *m, g4_session *s) {
    if (!d->dir) return d->tokens ? g4_fail("--draft-tokens needs --draft DIR") : 0;
    if (!d->d && !(d->d = g4_draft_load(d->dir, m))) return -1;
    return (d->dr = g4_drafter_new(d->d, s)) ? 0 : -1;
}

void draft_apply(const draft_args *d, g4_generate_params *p) {
    p->draft = d->dr;
    p->draft_tokens = d->tokens;
}

void draft_close(draft_args *d) {
    g4_drafter_free(d->dr);
    g4_draft_free(d->d);
    d->dr = NULL;
    d->d = NULL;
}
