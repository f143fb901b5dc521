/* Text in, text out: `g4 run -p`, `g4 chat` and `g4 tokenize`. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "util/err.h"
#include "util/file.h"

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

typedef struct {
    const char *dir, *prompt, *prompt_file, *system;
    int raw, think, show_thinking, form, form_given, max_tokens, parse_special, verbose, ignore_eos;
    g4_options o;
    g4_sampling sampling;
    int sampling_given;
} text_args;

static const char *const onoff[] = {"off", "on", NULL};
static const char *const forms[] = {"e2b", "26b", NULL};

/* Returns 1 if argv[i] was a text option; sets *bad on a bad value. */
static int text_flag(args_t *a, text_args *t, int *bad) {
    const char *v;
    if (flag_is(a, "-m") || flag_is(a, "--model")) t->dir = flag_value(a, "-m", bad);
    else if (flag_is(a, "--system")) t->system = flag_value(a, "--system", bad);
    else if (flag_is(a, "--raw")) t->raw = 1;
    else if (flag_is(a, "--show-thinking")) t->show_thinking = 1;
    else if (flag_is(a, "--verbose")) t->verbose = 1;
    else if (flag_is(a, "--ignore-eos")) t->ignore_eos = 1;
    else if (flag_is(a, "--think")) {
        if ((v = flag_value(a, "--think", bad)) && parse_choice(a->cmd, "--think", v, onoff, &t->think)) *bad = 1;
    } else if (flag_is(a, "--chat-form")) {
        if ((v = flag_value(a, "--chat-form", bad)) && parse_choice(a->cmd, "--chat-form", v, forms, &t->form)) *bad = 1;
        t->form_given = 1;
    } else if (flag_is(a, "--parse-special")) {
        if ((v = flag_value(a, "--parse-special", bad)) && parse_choice(a->cmd, "--parse-special", v, onoff, &t->parse_special))
            *bad = 1;
    } else if (flag_is(a, "-n") || flag_is(a, "--max-tokens")) {
        if ((v = flag_value(a, "-n", bad)) && parse_int(a->cmd, "--max-tokens", v, 1, 1 << 24, &t->max_tokens)) *bad = 1;
    } else if (!engine_flag(a, &t->o, bad) && !sampling_flag(a, &t->sampling, &t->sampling_given, bad)) {
        return 0;
    }
    return 1;
}

static void text_args_init(text_args *t) {
    memset(t, 0, sizeof *t);
    g4_options_default(&t->o);
    g4_sampling_default(&t->sampling);
    t->parse_special = 1;
}

/* ---- a loaded model with its tokenizer, and the streaming printer ---- */

typedef struct {
    g4_model *m;
    g4_session *s;
    g4_tokenizer *tok;
    g4_detokenizer *detok;
    g4_thought_filter *filter;
    g4_chat_options chat;
    g4_generate_params gen;
    int show_thinking, verbose;
    int32_t *generated; /* this answer's ids, for --verbose */
    int n_generated, cap_generated;
    int32_t last_token;
    int32_t turn_end, newline;
} text_model;

static void text_model_free(text_model *t) {
    free(t->generated);
    g4_thought_filter_free(t->filter);
    g4_detokenizer_free(t->detok);
    g4_tokenizer_free(t->tok);
    g4_session_free(t->s);
    g4_model_free(t->m);
    memset(t, 0, sizeof *t);
}

static int text_model_open(text_model *t, const text_args *a) {
    char path[4096];
    memset(t, 0, sizeof *t);
    if (!(t->m = load_model(a->dir, &a->o))) return -1;
    if (g4_path_join(path, sizeof path, a->dir, "tokenizer.json") != 0 || !(t->tok = g4_tokenizer_load(path))) return -1;
    if ((int)g4_tokenizer_vocab_size(t->tok) > g4_model_vocab_size(t->m) + 1024)
        g4_warn("%s: the tokenizer has %zu tokens, the model %d", path, g4_tokenizer_vocab_size(t->tok), g4_model_vocab_size(t->m));
    if (!(t->s = g4_session_new(t->m, &a->o)) || !(t->detok = g4_detokenizer_new(t->tok))) return -1;
    t->chat = g4_chat_default_options();
    /* E2B/E4B (models with per-layer embeddings) and 26B/31B render "thinking off" differently */
    t->chat.form = a->form_given ? (a->form ? G4_CHAT_FORM_26B : G4_CHAT_FORM_E2B)
                                 : (g4_model_has_per_layer_inputs(t->m) ? G4_CHAT_FORM_E2B : G4_CHAT_FORM_26B);
    t->chat.thinking = a->think;
    g4_model_sampling_defaults(t->m, &t->gen.sampling);
    sampling_override(&t->gen.sampling, &a->sampling, a->sampling_given);
    t->gen.max_tokens = a->max_tokens ? a->max_tokens : a->o.ctx;
    if (a->ignore_eos) {
        static const int none[1] = {-1};
        t->gen.stop_ids = none;
        t->gen.n_stop_ids = 1;
    }
    t->show_thinking = a->show_thinking;
    t->verbose = a->verbose;
    t->turn_end = g4_tokenizer_piece_to_id(t->tok, "<turn|>");
    t->newline = g4_tokenizer_piece_to_id(t->tok, "\n");
    return 0;
}

static void emit(const char *bytes, size_t len) {
    if (len) fwrite(bytes, 1, len, stdout);
}

/* Streams one generated token: decoded, with the thought channel hidden unless asked for. */
static int print_token(void *user, int32_t id) {
    text_model *t = user;
    const int *stops;
    int n_stops = g4_model_stop_ids(t->m, &stops);
    t->last_token = id;
    if (t->n_generated == t->cap_generated) {
        int cap = t->cap_generated ? 2 * t->cap_generated : 256;
        int32_t *g = realloc(t->generated, sizeof *g * (size_t)cap);
        if (!g) return 1;
        t->generated = g;
        t->cap_generated = cap;
    }
    t->generated[t->n_generated++] = id;
    for (int i = 0; i < n_stops; i++)
        if (stops[i] == id) return interrupted;
    const char *bytes, *answer, *thought;
    size_t len, alen, tlen;
    if (g4_detokenizer_push(t->detok, id, &bytes, &len) != 0) return 1;
    if (t->show_thinking) emit(bytes, len);
    else if (g4_thought_filter_push(t->filter, bytes, len, &answer, &alen, &thought, &tlen) == 0) emit(answer, alen);
    fflush(stdout);
    return interrupted;
}

static void finish_answer(text_model *t) {
    const char *bytes, *answer, *thought;
    size_t len, alen, tlen;
    if (g4_detokenizer_flush(t->detok, &bytes, &len) == 0) {
        if (t->show_thinking) emit(bytes, len);
        else if (g4_thought_filter_push(t->filter, bytes, len, &answer, &alen, &thought, &tlen) == 0) emit(answer, alen);
    }
    if (!t->show_thinking && g4_thought_filter_finish(t->filter, &answer, &alen, &thought, &tlen) == 0) emit(answer, alen);
    fputc('\n', stdout);
    fflush(stdout);
    g4_detokenizer_reset(t->detok);
}

static void print_ids(const char *what, const int32_t *ids, int n) {
    fprintf(stderr, "g4: %s:", what);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

/* Generates an answer to `ids` (already in chat form or raw), streaming it to stdout. */
static int answer(text_model *t, const int32_t *ids, int n, g4_generate_result *res) {
    g4_thought_filter_free(t->filter);
    if (!(t->filter = g4_thought_filter_new(0))) return g4_fail("out of memory");
    interrupted = 0;
    t->n_generated = 0;
    if (t->verbose) print_ids("prompt ids", ids, n);
    int rc = g4_generate(t->s, ids, n, &t->gen, print_token, t, res);
    if (rc == 0) finish_answer(t);
    if (rc == 0 && t->verbose) print_ids("generated ids", t->generated, t->n_generated);
    return rc;
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
    text_model t;
    int rc = 1;
    if (read_prompt(&ta, &text) != 0 || text_model_open(&t, &ta) != 0) goto done;
    if (ta.raw) {
        if (g4_tokenizer_encode(t.tok, text, strlen(text), ta.parse_special, &ids, &n_ids) != 0) goto done;
    } else {
        g4_chat_message msgs[2];
        size_t n = 0;
        if (ta.system) msgs[n++] = (g4_chat_message){G4_CHAT_SYSTEM, ta.system};
        msgs[n++] = (g4_chat_message){G4_CHAT_USER, text};
        if (g4_chat_encode(t.tok, msgs, n, &t.chat, &ids, &n_ids) != 0) goto done;
    }
    catch_sigint();
    g4_generate_result res;
    if (answer(&t, ids, (int)n_ids, &res) != 0) goto done;
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

/* Ids that continue the conversation with a user turn: close the model's previous turn (its
 * last token was never fed back), then "\n<|turn>user\n...<turn|>\n<|turn>model\n". */
static int next_turn_ids(text_model *t, const char *line, int first, const char *system, int32_t **ids, size_t *n) {
    g4_chat_message msgs[2];
    size_t m = 0;
    g4_chat_options opt = t->chat;
    opt.add_bos = first;
    if (first && system) msgs[m++] = (g4_chat_message){G4_CHAT_SYSTEM, system};
    msgs[m++] = (g4_chat_message){G4_CHAT_USER, line};
    if (!first) opt.thinking = 0; /* the system turn with <|think|> is only at the top */
    int32_t *turn;
    size_t n_turn;
    if (g4_chat_encode(t->tok, msgs, m, &opt, &turn, &n_turn) != 0) return -1;
    size_t pre = first ? 0 : 3;
    int32_t *all = malloc(sizeof *all * (n_turn + pre));
    if (!all) {
        free(turn);
        return g4_fail("out of memory");
    }
    size_t k = 0;
    if (!first) {
        all[k++] = t->last_token;
        if (t->last_token != t->turn_end) all[k++] = t->turn_end;
        all[k++] = t->newline;
    }
    memcpy(all + k, turn, sizeof *turn * n_turn);
    free(turn);
    *ids = all;
    *n = k + n_turn;
    return 0;
}

static void chat_help(void) {
    fprintf(stderr, "commands: /reset (new conversation), /think on|off (restarts the conversation), /exit; "
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
    int tty = isatty(0);
    if (tty) {
        fprintf(stderr, "g4 chat: %s (context %d tokens, thinking %s)\n", ta.dir, ta.o.ctx, t.chat.thinking ? "on" : "off");
        chat_help();
    }
    catch_sigint();
    char *line = NULL;
    size_t cap = 0;
    int first = 1;
    for (;;) {
        if (tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        interrupted = 0;
        ssize_t len = getline(&line, &cap, stdin);
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
            g4_session_reset(t.s);
            first = 1;
            fprintf(stderr, "(new conversation%s)\n", t.chat.thinking ? ", thinking on" : "");
            continue;
        }
        if (line[0] == '/') {
            fprintf(stderr, "g4 chat: unknown command %s\n", line);
            chat_help();
            continue;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        g4_generate_result res;
        if (next_turn_ids(&t, line, first, ta.system, &ids, &n) != 0 || answer(&t, ids, (int)n, &res) != 0) {
            fprintf(stderr, "g4: error: %s%s\n", g4_last_error(), first ? "" : " (/reset starts a new conversation)");
            free(ids);
            continue;
        }
        free(ids);
        first = 0;
        if (res.stop == G4_STOP_USER) fprintf(stderr, "(stopped)\n");
        if (res.stop == G4_STOP_CONTEXT) fprintf(stderr, "(the context of %d tokens is full: /reset)\n", ta.o.ctx);
    }
    free(line);
    if (tty) fputc('\n', stdout);
    text_model_free(&t);
    return 0;
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
    if (!dir == !file) return die("g4 tokenize needs -m DIR or --tokenizer FILE%s", "");
    char path[4096];
    if (dir && g4_path_join(path, sizeof path, dir, "tokenizer.json") != 0) return die_lib();
    g4_tokenizer *tok = g4_tokenizer_load(dir ? path : file);
    if (!tok) return die_lib();
    int32_t bos = g4_tokenizer_piece_to_id(tok, "<bos>");
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    int rc = 0;
    ssize_t len;
    while (rc == 0 && (len = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        if (len == 0 || (len == 1 && line[0] == '\n')) continue;
        if (tokenize_line(tok, line, decode, add_bos, !plain, bos < 0 ? 2 : bos, lineno) != 0) rc = die_lib();
        fflush(stdout);
    }
    free(line);
    g4_tokenizer_free(tok);
    return rc;
}
