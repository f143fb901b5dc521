/* Text in, text out: `g4 run -p`, `g4 chat` and `g4 tokenize`. The conversation (the template,
 * turn continuation, streaming and the thought spans) is the library's (g4_conversation). */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "g4dev.h"

/* ---- Ctrl-C: stops the current answer (and, at a prompt, the program) ---- */

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

static void catch_sigint(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint; /* no SA_RESTART: a read at the prompt returns EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

/* ---- options shared by run -p and chat ---- */

enum { TEXT_MAX_MEDIA = 16 }; /* media parts of one user turn from the command line */
enum { TEXT_MAX_STOP = 16 };  /* --stop strings */

typedef struct {
    const char *dir, *prompt, *prompt_file, *system;
    int raw, think, show_thinking, form, form_given, max_tokens, parse_special, verbose, ignore_eos;
    g4_options o;
    g4_sampling sampling;
    int sampling_given;
    draft_args draft;
    /* structured output: one of --grammar FILE, --json-schema FILE|JSON, --json */
    const char *grammar_file, *json_schema;
    int json;
    g4_media_kind media_kind[TEXT_MAX_MEDIA]; /* --image/--audio, in the order given */
    const char *media_path[TEXT_MAX_MEDIA];
    int n_media, image_tokens; /* image_tokens: 0 is the model's default budget */
    const char *stop[TEXT_MAX_STOP]; /* --stop, in the order given */
    int n_stop;
} text_args;

static const char *const onoff[] = {"off", "on", NULL};
static const char *const forms[] = {"e2b", "26b", NULL};
static const char *const image_budgets[] = {"70", "140", "280", "560", "1120", NULL}; /* the processor's soft-token budgets */

/* --image FILE / --audio FILE: one more media part for the first user turn. */
static int media_flag(args_t *a, text_args *t, g4_media_kind kind, const char *flag, int *bad) {
    const char *v = flag_value(a, flag, bad);
    if (!v) return 1;
    if (t->n_media == TEXT_MAX_MEDIA) {
        fprintf(stderr, "g4 %s: error: %s %s: at most %d media files a turn\n", a->cmd, flag, v, TEXT_MAX_MEDIA);
        return *bad = 1;
    }
    t->media_kind[t->n_media] = kind;
    t->media_path[t->n_media++] = v;
    return 1;
}

/* --stop STR: one more stop string (the reply reader checks it is non-empty UTF-8). */
static int stop_flag(args_t *a, text_args *t, int *bad) {
    const char *v = flag_value(a, "--stop", bad);
    if (!v) return 1;
    if (t->n_stop == TEXT_MAX_STOP) {
        fprintf(stderr, "g4 %s: error: --stop %s: at most %d stop strings\n", a->cmd, v, TEXT_MAX_STOP);
        return *bad = 1;
    }
    if (!*v) {
        fprintf(stderr, "g4 %s: error: --stop: a stop string may not be empty\n", a->cmd);
        return *bad = 1;
    }
    t->stop[t->n_stop++] = v;
    return 1;
}

/* Returns 1 if argv[i] was a text option; sets *bad on a bad value. */
static int text_flag(args_t *a, text_args *t, int *bad) {
    const char *v;
    if (flag_is(a, "-m") || flag_is(a, "--model")) t->dir = flag_value(a, "-m", bad);
    else if (flag_is(a, "--system")) t->system = flag_value(a, "--system", bad);
    else if (flag_is(a, "--raw")) t->raw = 1;
    else if (flag_is(a, "--show-thinking")) t->show_thinking = 1;
    else if (flag_is(a, "--verbose")) t->verbose = 1;
    else if (flag_is(a, "--ignore-eos")) t->ignore_eos = 1;
    else if (flag_is(a, "--image")) media_flag(a, t, G4_MEDIA_IMAGE, "--image", bad);
    else if (flag_is(a, "--audio")) media_flag(a, t, G4_MEDIA_AUDIO, "--audio", bad);
    else if (flag_is(a, "--stop")) stop_flag(a, t, bad);
    else if (flag_is(a, "--image-tokens")) {
        int k;
        if ((v = flag_value(a, "--image-tokens", bad)) && parse_choice(a->cmd, "--image-tokens", v, image_budgets, &k)) *bad = 1;
        else if (v) t->image_tokens = atoi(image_budgets[k]);
    } else if (flag_is(a, "--think")) {
        if ((v = flag_value(a, "--think", bad)) && parse_choice(a->cmd, "--think", v, onoff, &t->think)) *bad = 1;
    } else if (flag_is(a, "--chat-form")) {
        if ((v = flag_value(a, "--chat-form", bad)) && parse_choice(a->cmd, "--chat-form", v, forms, &t->form)) *bad = 1;
        t->form_given = 1;
    } else if (flag_is(a, "--parse-special")) {
        if ((v = flag_value(a, "--parse-special", bad)) && parse_choice(a->cmd, "--parse-special", v, onoff, &t->parse_special))
            *bad = 1;
    } else if (flag_is(a, "-n") || flag_is(a, "--max-tokens")) {
        if ((v = flag_value(a, "-n", bad)) && parse_int(a->cmd, "--max-tokens", v, 1, 1 << 24, &t->max_tokens)) *bad = 1;
    } else if (flag_is(a, "--grammar")) {
        t->grammar_file = flag_value(a, "--grammar", bad);
    } else if (flag_is(a, "--json-schema")) {
        t->json_schema = flag_value(a, "--json-schema", bad);
    } else if (flag_is(a, "--json")) {
        t->json = 1;
    } else if (!engine_flag(a, &t->o, bad) && !sampling_flag(a, &t->sampling, &t->sampling_given, bad) &&
               !draft_flag(a, &t->draft, bad)) {
        return 0;
    }
    return 1;
}

/* ---- usage ---- */

/* The flags text_flag parses, shared by run and chat. */
#define TEXT_USAGE_LINES \
    {"-m, --model DIR", "the checkpoint folder (default: the built-in model, $G4_MODEL or models/gemma4-tiny-math)"}, \
    {"--system TEXT", "a system turn before the first user turn"}, \
    {"--think on|off", "thinking (switched in the system turn; default off)"}, \
    {"--show-thinking", "print the thought spans too (left out by default)"}, \
    {"--chat-form e2b|26b", "the template's form of \"thinking off\" (default: the model's)"}, \
    {"-n, --max-tokens N", "at most N new tokens an answer (default: to the end of the context)"}, \
    {"--ignore-eos", "no stop ids: generate until -n or the context end"}, \
    {"--stop STR", "end the answer before STR (not printed); repeatable, the first to appear wins; thoughts are not read"}, \
    {"--verbose", "prompt and generated ids on stderr"}, \
    {"--raw", "g4 run: the prompt as it is, without the chat template"}, \
    {"--parse-special on|off", "g4 run --raw: special-token strings in the prompt as those tokens (default on)"}, \
    {"--grammar FILE", "answers constrained to a GBNF grammar (llama.cpp's dialect; README \"Structured output\")"}, \
    {"--json-schema FILE|JSON", "answers constrained to a JSON schema (a file, or the schema itself if it starts with {)"}, \
    {"--json", "answers constrained to one JSON object (JSON mode)"}, \
    {"--image FILE", "a PNG or JPEG before the (first) turn's text; repeatable, kept in order"}, \
    {"--audio FILE", "a WAV recording (at most 30 s) before the (first) turn's text; repeatable, kept in order with --image"}, \
    {"--image-tokens N", "an image's soft-token budget: 70, 140, 280, 560 or 1120 (default: the model's)"}

const command_usage usage_run = {
    "run [-m DIR] (-p TEXT | -f FILE | < FILE) [flags]\n       g4 run [-m DIR] --ids 2,651,9 [-n 16] [--logits-npy FILE] [--dump-dir DIR] [flags]",
    "Answers a prompt through the chat template, streaming the answer; with --ids, decodes from token ids (greedy unless\n"
    "sampling flags are given) and prints the new ids on one line.",
    (const usage_line[]){
        {"-p, --prompt TEXT", "the prompt (- or none: standard input)"},
        {"-f, --file FILE", "the prompt from a file (at most 64 MiB)"},
        TEXT_USAGE_LINES,
        {"--ids IDS", "comma-separated token ids in; the generated ids out"},
        {"--logits-npy FILE", "with --ids: write the prefill logits [prompt_len, vocab] as .npy"},
        {"--dump-dir DIR", "with --ids: write intermediate prefill tensors as .npy (golden names)"},
        {NULL, NULL},
    },
    USAGE_ENGINE | USAGE_SAMPLING | USAGE_DRAFT,
};

const command_usage usage_chat = {
    "chat [-m DIR] [flags]",
    "Interactive chat that keeps the KV cache across turns: /image PATH, /audio PATH (attached to the next message), /reset, /think on|off, /exit; Ctrl-C stops an answer,\n"
    "Ctrl-C or Ctrl-D at the prompt leaves. Lines from a pipe are turns too.",
    (const usage_line[]){TEXT_USAGE_LINES, {NULL, NULL}},
    USAGE_ENGINE | USAGE_SAMPLING | USAGE_DRAFT,
};

const command_usage usage_tokenize = {
    "tokenize [-m DIR | --tokenizer FILE] [--add-bos] [--plain] [--decode]",
    "JSON lines on standard input: each a JSON string, to one JSON array of ids per line; --decode the reverse.",
    (const usage_line[]){
        {"-m, --model DIR", "the model's tokenizer.json (default: the built-in model)"},
        {"--tokenizer FILE", "this tokenizer.json instead"},
        {"--add-bos", "put <bos> first"},
        {"--plain", "special-token strings as plain text"},
        {"--decode", "id arrays in, strings out"},
        {NULL, NULL},
    },
    0,
};

static void text_args_init(text_args *t) {
    memset(t, 0, sizeof *t);
    g4_options_default(&t->o);
    g4_sampling_default(&t->sampling);
    t->parse_special = 1;
}

/* ---- a loaded model with its tokenizer and conversation, and the streaming printer ---- */

typedef struct {
    g4_model *m;
    g4_session *s;
    g4_tokenizer *tok;
    g4_conversation *conv;
    g4_chat_options chat;
    int show_thinking, verbose;
    int n_stop, stopped; /* stopped: a --stop string ended the last answer */
    draft_args draft;
    g4_grammar *grammar; /* structured output: the grammar, its start state, the tokenizer's trie */
    g4_grammar_state *start;
    g4_grammar_vocab *vocab;
    g4_options o;     /* the options the model was loaded with: the media towers run in them */
    int image_tokens; /* --image-tokens (0: the model's default) */
} text_model;

static void text_model_free(text_model *t) {
    g4_conversation_free(t->conv);
    draft_close(&t->draft);
    g4_tokenizer_free(t->tok);
    g4_session_free(t->s);
    g4_model_free(t->m);
    g4_grammar_state_free(t->start);
    g4_grammar_free(t->grammar);
    g4_grammar_vocab_free(t->vocab);
    memset(t, 0, sizeof *t);
}

/* The grammar --grammar, --json-schema or --json asks for (NULL *g and 0 without one). */
static int compile_constraint(const text_args *a, g4_grammar **g) {
    *g = NULL;
    if (!!a->grammar_file + !!a->json_schema + a->json > 1) return g4_fail("--grammar, --json-schema and --json: give one of them");
    char *text = NULL;
    size_t len = 0;
    const char *flag = a->grammar_file ? "--grammar" : "--json-schema", *src = a->grammar_file ? a->grammar_file : a->json_schema;
    if (a->json) *g = g4_grammar_json(1);
    else if (!src) return 0;
    else if (a->json_schema && a->json_schema[strspn(a->json_schema, " \t\n")] == '{') *g = g4_grammar_from_json_schema(src, strlen(src));
    else if (g4_read_file(src, &text, &len) == 0) *g = a->grammar_file ? g4_grammar_compile(text, len) : g4_grammar_from_json_schema(text, len);
    free(text);
    if (!*g && !a->json) {
        char why[512];
        snprintf(why, sizeof why, "%s", g4_last_error()); /* g4_fail writes over it */
        return g4_fail("%s %s: %s", flag, src[0] == '{' ? "(inline schema)" : src, why);
    }
    if (!*g) return -1;
    return 0;
}

/* Structured output on every reply: the start state each reply copies, the trie; with thinking on
 * the constraint takes the answer after a thought (g4_generate_params.thought_open). */
static int apply_constraint(text_model *t, const text_args *a, g4_generate_params *gen) {
    if (compile_constraint(a, &t->grammar) != 0) return -1;
    if (!t->grammar) return 0;
    if (!(t->start = g4_grammar_start(t->grammar)) || !(t->vocab = g4_grammar_vocab_new(t->tok))) return -1;
    gen->constraint = t->start;
    gen->constraint_vocab = t->vocab;
    int32_t open = g4_tokenizer_piece_to_id(t->tok, "<|channel>"), close = g4_tokenizer_piece_to_id(t->tok, "<channel|>");
    if (a->think && open > 0 && close > 0) gen->thought_open = open, gen->thought_close = close;
    return 0;
}

static int text_model_open(text_model *t, const text_args *a) {
    g4_checkpoint ck;
    memset(t, 0, sizeof *t);
    t->draft = a->draft;
    if (g4_checkpoint_open(&ck, a->dir, &a->o, a->draft.dir) != 0) return -1;
    t->m = ck.model, t->tok = ck.tok, t->draft.d = ck.draft; /* text_model_free frees them */
    if ((int)g4_tokenizer_vocab_size(t->tok) > g4_model_vocab_size(t->m) + 1024)
        g4_warn("%s/tokenizer.json: the tokenizer has %zu tokens, the model %d", a->dir, g4_tokenizer_vocab_size(t->tok), g4_model_vocab_size(t->m));
    g4_conversation_options co;
    if (!(t->s = g4_session_new(t->m, &a->o)) || g4_conversation_default_options(t->s, &co) != 0) return -1;
    if (draft_open(&t->draft, t->m, t->s) != 0) return -1;
    draft_apply(&t->draft, &co.gen);
    if (a->form_given) co.chat.form = a->form ? G4_CHAT_FORM_26B : G4_CHAT_FORM_E2B;
    co.chat.thinking = a->think;
    g4_sampling_override(&co.gen.sampling, &a->sampling, a->sampling_given);
    if (a->max_tokens) co.gen.max_tokens = a->max_tokens;
    if (a->ignore_eos) {
        static const int none[1] = {-1};
        co.gen.stop_ids = none;
        co.gen.n_stop_ids = 1;
    }
    /* the answer is all but the thoughts (tool-call text too), cut at the first --stop string */
    co.stop = a->stop, co.n_stop = a->n_stop, co.calls = G4_CALLS_TEXT;
    g4_reply *probe = g4_reply_new(t->tok, &(g4_reply_options){.stop = a->stop, .n_stop = a->n_stop, .calls = G4_CALLS_TEXT});
    if (!probe) return g4_fail_prefix("--stop: "); /* the reader's message names which string and why */
    g4_reply_free(probe);
    if (apply_constraint(t, a, &co.gen) != 0) return -1;
    if (co.gen.constraint && a->ignore_eos) return g4_fail("--ignore-eos with a constraint: the reply ends where the grammar does");
    if (!(t->conv = g4_conversation_new(t->s, t->tok, &co))) return -1;
    t->chat = co.chat;
    t->show_thinking = a->show_thinking;
    t->n_stop = a->n_stop;
    t->verbose = a->verbose;
    t->o = a->o;
    t->image_tokens = a->image_tokens;
    return 0;
}

/* Reads an image (PNG, JPEG) or a recording (WAV) and adds its soft tokens to the next user message; an error names the file. */
static int attach_media(text_model *t, g4_media_kind kind, const char *path) {
    char *bytes;
    size_t len;
    if (g4_read_file(path, &bytes, &len) != 0) return -1;
    float *embd = NULL;
    int n = 0, rc = -1;
    if (kind == G4_MEDIA_IMAGE) rc = g4_image_soft_tokens(t->m, &t->o, bytes, len, t->image_tokens, &embd, &n);
    else rc = g4_audio_soft_tokens(t->m, &t->o, bytes, len, &embd, &n);
    free(bytes);
    if (rc != 0) {
        char why[1024];
        snprintf(why, sizeof why, "%s", g4_last_error());
        return g4_fail("%s: %s", path, why);
    }
    rc = g4_conversation_add_media(t->conv, kind, embd, n);
    free(embd);
    return rc;
}

/* The command line's media parts, in order, for the next user message. */
static int attach_all(text_model *t, const text_args *a) {
    for (int i = 0; i < a->n_media; i++)
        if (attach_media(t, a->media_kind[i], a->media_path[i]) != 0) return -1;
    return 0;
}

static void emit(const char *bytes, size_t len) {
    if (len) fwrite(bytes, 1, len, stdout);
}

/* Streams the reply: as decoded (markers too), or by spans: the answer cut at a --stop string,
 * the thoughts (without their markers) only with --show-thinking. */
static int print_delta(void *user, const g4_reply_delta *d) {
    text_model *t = user;
    if (t->show_thinking && !t->n_stop) emit(d->text, d->len);
    else
        for (int i = 0; i < d->n_spans; i++)
            if (d->spans[i].span != G4_SPAN_THOUGHT || t->show_thinking) emit(d->spans[i].text, d->spans[i].len);
    if (d->len || d->n_spans) fflush(stdout);
    t->stopped |= d->stop_string >= 0;
    return interrupted;
}

static void print_ids(const char *what, const int32_t *ids, int n) {
    fprintf(stderr, "g4: %s:", what);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

/* Generates the conversation's next reply, streaming it to stdout. */
static int answer(text_model *t, g4_generate_result *res) {
    interrupted = 0;
    t->stopped = 0;
    if (t->verbose) {
        const int32_t *ids;
        size_t n;
        if (g4_conversation_prompt(t->conv, &ids, &n) != 0) return -1;
        print_ids("prompt ids", ids, (int)n);
    }
    if (g4_conversation_reply(t->conv, print_delta, t, res) != 0) return -1;
    fputc('\n', stdout);
    fflush(stdout);
    if (t->verbose) {
        int n;
        const int32_t *ids = g4_conversation_reply_tokens(t->conv, &n);
        print_ids("generated ids", ids, n);
    }
    return 0;
}

/* ---- g4 run -p ---- */

static int read_prompt(const text_args *a, char **text) {
    size_t len;
    if (a->prompt_file) return g4_read_file(a->prompt_file, text, &len);
    if (a->prompt && strcmp(a->prompt, "-") != 0) {
        *text = strdup(a->prompt);
        return *text ? 0 : g4_fail("out of memory");
    }
    if (!a->prompt && isatty(0)) return g4_fail("no prompt: give -p TEXT, -f FILE, or text on standard input");
    return g4_read_file("/dev/stdin", text, &len);
}

int cmd_run_text(args_t *a) {
    text_args ta;
    text_args_init(&ta);
    int bad = 0;
    for (a->i = 2; a->i < a->argc && !bad; a->i++) {
        if (flag_is(a, "-p") || flag_is(a, "--prompt")) ta.prompt = flag_value(a, "-p", &bad);
        else if (flag_is(a, "-f") || flag_is(a, "--file")) ta.prompt_file = flag_value(a, "-f", &bad);
        else if (!text_flag(a, &ta, &bad)) return unknown_flag(a);
    }
    if (bad) return 1;
    if (!ta.dir) ta.dir = default_model_dir();
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    text_model t = {0};
    int rc = 1;
    if (read_prompt(&ta, &text) != 0 || text_model_open(&t, &ta) != 0) goto done;
    if (ta.raw && ta.n_media) {
        g4_fail("--raw takes no media: the chat template places the --image/--audio parts");
        goto done;
    }
    if (ta.raw) {
        if (g4_tokenizer_encode(t.tok, text, strlen(text), ta.parse_special, &ids, &n_ids) != 0 ||
            g4_conversation_add_tokens(t.conv, ids, n_ids) != 0)
            goto done;
    } else if ((ta.system && g4_conversation_add(t.conv, G4_CHAT_SYSTEM, ta.system) != 0) || attach_all(&t, &ta) != 0 ||
               g4_conversation_add(t.conv, G4_CHAT_USER, text) != 0) {
        goto done;
    }
    catch_sigint();
    g4_generate_result res;
    if (answer(&t, &res) != 0) goto done;
    if (res.stop == G4_STOP_CONTEXT) g4_warn("the answer was cut off: the context of %d tokens is full (--ctx)", ta.o.ctx);
    rc = 0;
done:
    if (rc) die_lib();
    free(text);
    free(ids);
    text_model_free(&t);
    return rc;
}

/* ---- g4 chat ---- */

/* The system message once, first in a conversation: before its first media part or user turn. */
static int chat_system(text_model *t, int *system_in, const char *system) {
    if (!*system_in && system && g4_conversation_add(t->conv, G4_CHAT_SYSTEM, system) != 0) return -1;
    *system_in = 1;
    return 0;
}

/* A user turn (after the media parts attached to it) and its answer. */
static int chat_turn(text_model *t, const char *line, int *system_in, const char *system, g4_generate_result *res) {
    if (chat_system(t, system_in, system) != 0 || g4_conversation_add(t->conv, G4_CHAT_USER, line) != 0 || answer(t, res) != 0) {
        g4_conversation_discard(t->conv); /* the failed turn (its media parts too) is not part of the conversation */
        return -1;
    }
    return 0;
}

/* "/image PATH", "/audio PATH": attaches the file to the next user message; 0 if the line is no such command. */
static int chat_media_command(text_model *t, const char *line, int *system_in, const char *system) {
    static const struct {
        const char *cmd;
        g4_media_kind kind;
    } cmds[] = {{"/image", G4_MEDIA_IMAGE}, {"/audio", G4_MEDIA_AUDIO}};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        size_t n = strlen(cmds[i].cmd);
        if (strncmp(line, cmds[i].cmd, n) != 0 || (line[n] != ' ' && line[n] != 0)) continue;
        const char *path = line + n;
        while (*path == ' ') path++;
        if (!*path) fprintf(stderr, "g4 chat: %s takes a file: %s PATH\n", cmds[i].cmd, cmds[i].cmd);
        else if (chat_system(t, system_in, system) != 0 || attach_media(t, cmds[i].kind, path) != 0)
            fprintf(stderr, "g4: error: %s\n", g4_last_error());
        else fprintf(stderr, "(%s attached to your next message)\n", path);
        return 1;
    }
    return 0;
}

static void chat_help(void) {
    fprintf(stderr, "commands: /image PATH, /audio PATH (attach to your next message), /reset (new conversation), /think on|off (restarts the conversation), /exit; "
                    "Ctrl-C stops an answer; Ctrl-D or Ctrl-C at the prompt leaves\n");
}

int cmd_chat(args_t *a) {
    text_args ta;
    text_args_init(&ta);
    int bad = 0;
    for (a->i = 2; a->i < a->argc && !bad; a->i++)
        if (!text_flag(a, &ta, &bad)) return unknown_flag(a);
    if (bad) return 1;
    if (!ta.dir) ta.dir = default_model_dir();
    text_model t;
    if (text_model_open(&t, &ta) != 0) {
        die_lib();
        text_model_free(&t);
        return 1;
    }
    int system_in = 0; /* the system message was added to the conversation */
    if (chat_system(&t, &system_in, ta.system) != 0 || attach_all(&t, &ta) != 0) {
        die_lib();
        text_model_free(&t);
        return 1;
    }
    int tty = isatty(0);
    if (tty) {
        fprintf(stderr, "g4 chat: %s (context %d tokens, thinking %s)\n", ta.dir, ta.o.ctx, t.chat.thinking ? "on" : "off");
        chat_help();
    }
    catch_sigint();
    char *line = NULL;
    size_t cap = 0;
    int first = 1, failed = 0, bad_line = 0; /* a failed turn (e.g. a non-finite output) makes the exit status 1 */
    for (;;) {
        if (tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        interrupted = 0;
        long len = read_line_max(stdin, &line, &cap, G4_READ_FILE_MAX);
        if (len == LINE_TOO_LONG) {
            fprintf(stderr, "g4: error: standard input: a line longer than %zu MiB, the limit for a turn\n", G4_READ_FILE_MAX >> 20);
            bad_line = 1;
            break;
        }
        if (len < 0) break; /* end of input, or Ctrl-C at the prompt */
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/help")) {
            chat_help();
            continue;
        }
        if (!strcmp(line, "/reset") || !strncmp(line, "/think", 6)) {
            if (!strncmp(line, "/think", 6)) {
                const char *v = line + 6;
                while (*v == ' ') v++;
                if (strcmp(v, "on") && strcmp(v, "off")) {
                    fprintf(stderr, "g4 chat: /think takes on or off\n");
                    continue;
                }
                t.chat.thinking = !strcmp(v, "on");
            }
            if (g4_conversation_reset(t.conv, &t.chat) != 0) {
                fprintf(stderr, "g4: error: %s\n", g4_last_error());
                continue;
            }
            first = 1, system_in = 0;
            fprintf(stderr, "(new conversation%s)\n", t.chat.thinking ? ", thinking on" : "");
            continue;
        }
        if (chat_media_command(&t, line, &system_in, ta.system)) continue;
        if (line[0] == '/') {
            fprintf(stderr, "g4 chat: unknown command %s\n", line);
            chat_help();
            continue;
        }
        g4_generate_result res;
        if (chat_turn(&t, line, &system_in, ta.system, &res) != 0) {
            fprintf(stderr, "g4: error: %s%s\n", g4_last_error(), first ? "" : " (/reset starts a new conversation)");
            if (first) system_in = 0; /* discarded with the turn */
            failed = 1;
            continue;
        }
        first = 0;
        if (res.stop == G4_STOP_USER && !t.stopped) fprintf(stderr, "(stopped)\n"); /* Ctrl-C, not a --stop string */
        if (res.stop == G4_STOP_CONTEXT) fprintf(stderr, "(the context of %d tokens is full: /reset)\n", ta.o.ctx);
    }
    free(line);
    if (tty) fputc('\n', stdout);
    text_model_free(&t);
    return failed || bad_line;
}

/* ---- g4 tokenize ---- */

/* One JSON line in, one out: a string -> its ids, or (--decode) an id array -> its text. */
static int tokenize_line(const g4_tokenizer *tok, const char *line, int decode, int add_bos, int parse_special, int32_t bos,
                         long lineno) {
    cJSON *in = cJSON_Parse(line), *out = NULL;
    int rc = -1;
    if (!decode) {
        int32_t *ids;
        size_t n;
        if (!cJSON_IsString(in)) g4_fail("line %ld: expected a JSON string", lineno);
        else if (g4_tokenizer_encode(tok, in->valuestring, strlen(in->valuestring), parse_special, &ids, &n) == 0) {
            out = cJSON_CreateArray();
            if (add_bos) cJSON_AddItemToArray(out, cJSON_CreateNumber(bos));
            for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(out, cJSON_CreateNumber(ids[i]));
            free(ids);
        }
    } else if (!cJSON_IsArray(in)) {
        g4_fail("line %ld: expected a JSON array of token ids", lineno);
    } else {
        int n = cJSON_GetArraySize(in), ok = 1;
        int32_t *ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
        for (int i = 0; ids && i < n && ok; i++) {
            const cJSON *v = cJSON_GetArrayItem(in, i);
            ok = cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < (double)g4_tokenizer_vocab_size(tok) &&
                 v->valuedouble == (int32_t)v->valuedouble;
            if (ok) ids[i] = (int32_t)v->valuedouble;
        }
        char *text;
        size_t len;
        if (!ids || !ok) g4_fail("line %ld: token ids must be integers in [0, %zu)", lineno, g4_tokenizer_vocab_size(tok));
        else if (g4_tokenizer_decode(tok, ids, (size_t)n, &text, &len) == 0) {
            out = cJSON_CreateString(text);
            free(text);
        }
        free(ids);
    }
    if (out) {
        char *s = cJSON_PrintUnformatted(out);
        if (s) {
            puts(s);
            rc = 0;
        }
        free(s);
    }
    cJSON_Delete(in);
    cJSON_Delete(out);
    return rc;
}

int cmd_tokenize(args_t *a) {
    const char *dir = NULL, *file = NULL;
    int bad = 0, decode = 0, add_bos = 0, plain = 0;
    for (a->i = 2; a->i < a->argc && !bad; a->i++) {
        if (flag_is(a, "-m") || flag_is(a, "--model")) dir = flag_value(a, "-m", &bad);
        else if (flag_is(a, "--tokenizer")) file = flag_value(a, "--tokenizer", &bad);
        else if (flag_is(a, "--decode")) decode = 1;
        else if (flag_is(a, "--add-bos")) add_bos = 1;
        else if (flag_is(a, "--plain")) plain = 1;
        else return unknown_flag(a);
    }
    if (bad) return 1;
    if (dir && file) return die("g4 tokenize takes -m DIR or --tokenizer FILE, not both%s", "");
    if (!dir && !file) dir = default_model_dir();
    char path[4096];
    if (dir && g4_path_join(path, sizeof path, dir, "tokenizer.json") != 0) return die_lib();
    g4_tokenizer *tok = g4_tokenizer_load(dir ? path : file);
    if (!tok) return die_lib();
    int32_t bos = g4_tokenizer_piece_to_id(tok, "<bos>");
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    int rc = 0;
    long len = 0;
    while (rc == 0 && (len = read_line_max(stdin, &line, &cap, G4_READ_FILE_MAX)) >= 0) {
        lineno++;
        if (len == 0 || (len == 1 && line[0] == '\n')) continue;
        if (tokenize_line(tok, line, decode, add_bos, !plain, bos < 0 ? 2 : bos, lineno) != 0) rc = die_lib();
        fflush(stdout);
    }
    if (len == LINE_TOO_LONG) {
        fprintf(stderr, "g4: error: standard input: line %ld is longer than %zu MiB, the limit for a line\n", lineno + 1,
                G4_READ_FILE_MAX >> 20);
        rc = 1;
    }
    free(line);
    g4_tokenizer_free(tok);
    return rc;
}
