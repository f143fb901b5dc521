/* Command-line plumbing shared by the g4 commands (tools/cli.c). */
#ifndef G4_TOOLS_CLI_H
#define G4_TOOLS_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "g4.h"

typedef struct {
    int argc, i;
    char **argv;
    const char *cmd;
} args_t;

/* "g4: error: <fmt with arg>" on stderr; returns 1 (the exit status). */
int die(const char *fmt, const char *arg);
/* "g4: error: <g4_last_error()>"; returns 1. */
int die_lib(void);
double now_s(void);
long peak_rss_kb(void);

/* The value of flag argv[i] ("--flag value" or "--flag=value"); sets *bad with a message. */
const char *flag_value(args_t *a, const char *flag, int *bad);
int flag_is(const args_t *a, const char *name);
int parse_int(const char *cmd, const char *flag, const char *v, long lo, long hi, int *out);
int parse_float(const char *cmd, const char *flag, const char *v, float *out);
int parse_choice(const char *cmd, const char *flag, const char *v, const char *const *choices, int *out);
int parse_ids(const char *cmd, const char *v, int32_t **ids, int *n);
/* Engine options: the flags of the options table (g4.h), --NAME or a short flag. Returns 1 if
 * argv[i] was one. */
int engine_flag(args_t *a, g4_options *o, int *bad);
/* The engine options' help lines, from the table. */
void print_engine_options(FILE *f);
/* The model at dir, loaded with the options' threads and weight placement (g4_model_load_options). */
g4_model *load_model(const char *dir, const g4_options *o);
/* Sampling flags (--temp, --top-k, ..., --frequency-penalty, --presence-penalty, --logit-bias ID=V
 * repeated: its entries live in a table of the process, as the flags do). Returns 1 if argv[i] was one; *given gets a bit per
 * field set (G4_SAMPLE_*, g4.h), so model defaults can fill the rest (g4_sampling_override). */
int sampling_flag(args_t *a, g4_sampling *p, int *given, int *bad);
int unknown_flag(const args_t *a);
/* getline with a bound: the line's length (newline included), -1 at the end of the input or on an
 * interrupted read, -2 when the line runs past max bytes (what is read is kept within max). */
enum { LINE_TOO_LONG = -2 };
long read_line_max(FILE *f, char **line, size_t *cap, size_t max);
/* The MTP drafter flags: --draft DIR (a gemma4_assistant folder for the model) and --draft-tokens K
 * (the tokens a round drafts, 1..G4_MAX_DRAFT_TOKENS; default G4_DRAFT_TOKENS_DEFAULT). */
typedef struct {
    const char *dir;
    int tokens;     /* 0: the default */
    g4_draft *d;
    g4_drafter *dr; /* over the command's session */
} draft_args;
/* Returns 1 if argv[i] was one of them. */
int draft_flag(args_t *a, draft_args *d, int *bad);
/* Loads the drafter for m and its state over s (nothing without --draft); -1 with the message
 * in g4_last_error(). */
int draft_open(draft_args *d, const g4_model *m, g4_session *s);
/* The generation settings' drafter (none without --draft). */
void draft_apply(const draft_args *d, g4_generate_params *p);
void draft_close(draft_args *d);
/* The folder `run`, `chat` and `eval` use when -m is not given: the built-in trained model. */
const char *default_model_dir(void);

/* ---- usage: one table per command ----
 * A line is a flag as typed with its value's placeholder ("-m, --model DIR"; none: the flag takes
 * no value) and what it does. The same table prints `g4 COMMAND --help` and tells which flags take
 * a value, so that a "--help" given as a value (g4 run -p --help) is not taken for the flag. */
typedef struct {
    const char *flags, *help;
} usage_line;
enum { USAGE_ENGINE = 1, USAGE_SAMPLING = 2, USAGE_DRAFT = 4 }; /* the shared flag groups a command takes */
typedef struct {
    const char *synopsis;    /* after "usage: g4 " */
    const char *about;       /* what the command does, one or more lines */
    const usage_line *lines; /* ends with {NULL, NULL} */
    unsigned groups;         /* USAGE_* */
} command_usage;
void print_command_usage(FILE *f, const command_usage *u);
/* 1 when argv[first..] ask for help: -h or --help where a flag stands, not as a flag's value. */
int asks_help(const command_usage *u, int argc, char **argv, int first);
extern const command_usage usage_run, usage_chat, usage_tokenize;                              /* text_cmds.c */
extern const command_usage usage_eval, usage_eval_gsm8k, usage_eval_merge, usage_eval_compare; /* eval_cmd.c */
extern const command_usage usage_bench;                                                         /* bench_cmd.c */
extern const command_usage usage_serve;                                                         /* serve_cmd.c */
extern const command_usage usage_synth;                                                         /* synth_cmd.c */
extern const command_usage usage_quantize;                                                      /* quantize_cmd.c */

int g4_cmd_synth(int argc, char **argv);     /* tools/synth_cmd.c */
int g4_cmd_quantize(int argc, char **argv);  /* tools/quantize_cmd.c */
int cmd_tokenize(args_t *a);                 /* tools/text_cmds.c */
int cmd_chat(args_t *a);
int cmd_run_text(args_t *a);
int cmd_bench(args_t *a);                    /* tools/bench_cmd.c */
int cmd_eval(args_t *a);                     /* tools/eval_cmd.c */
int cmd_serve(args_t *a);                    /* tools/serve_cmd.c */

#endif
