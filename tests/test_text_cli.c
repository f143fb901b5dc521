/* Text in, text out, driven as a user would: `g4 tokenize` against the golden encodings, and
 * `g4 chat` through a pipe (two turns that share the KV cache, /reset, Ctrl-C, end of input),
 * Ctrl-C in `g4 run`. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "cli_util.h"
#include "overflow_util.h"

/* Command lines are built in fixed buffers sized far above what the temporary paths need; a
 * truncated one would fail its test, not pass it. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

static const char *bin;
static char tmp[256], model[600];

/* Runs a shell command line; returns the exit status. */
/* The ids after "g4: <what>:" on the n-th such line (0-based) of a stderr capture. */
static int ids_line(const char *text, const char *what, int nth, int32_t *ids, int cap) {
    char key[64];
    snprintf(key, sizeof key, "g4: %s:", what);
    const char *p = text;
    for (int i = 0; i <= nth; i++) {
        p = strstr(p, key);
        if (!p) return -1;
        if (i < nth) p += strlen(key);
    }
    p += strlen(key);
    int n = 0;
    while (*p && *p != '\n' && n < cap) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        ids[n++] = (int32_t)v;
        p = end;
    }
    return n;
}

/* The shared tokenizer.json is reference data: the CLI must not leave its cache beside it, even
 * where the folder is writable (test_tokenize_cache_switch checks that this switch works). */
static void test_tokenize(void) {
    setenv("G4_TOKENIZER_CACHE", "off", 1);
    char in[600], out[600], cmd[4096], golden[4096];
    snprintf(golden, sizeof golden, "%s/data/tokenizers/gemma4/golden-gsm8k-test.jsonl", check_shared_dir());
    snprintf(in, sizeof in, "%s/in.jsonl", tmp);
    snprintf(out, sizeof out, "%s/out.jsonl", tmp);
    FILE *g = fopen(golden, "r"), *f = fopen(in, "w");
    if (!g || !f) exit(2);
    char *line = NULL;
    size_t cap = 0;
    cJSON *want = cJSON_CreateArray();
    for (int i = 0; i < 200 && getline(&line, &cap, g) > 0; i++) {
        cJSON *row = cJSON_Parse(line);
        char *text = cJSON_PrintUnformatted(cJSON_GetObjectItem(row, "text"));
        fprintf(f, "%s\n", text);
        free(text);
        cJSON_AddItemToArray(want, cJSON_Duplicate(cJSON_GetObjectItem(row, "ids"), 1));
        cJSON_Delete(row);
    }
    fclose(f);
    fclose(g);
    snprintf(cmd, sizeof cmd, "%s tokenize --tokenizer %s/data/tokenizers/gemma4/tokenizer.json < %s > %s", bin, check_shared_dir(), in, out);
    CHECK(sh(cmd) == 0, "g4 tokenize failed");
    FILE *o = fopen(out, "r");
    int rows = 0, bad = 0;
    while (o && getline(&line, &cap, o) > 0) {
        cJSON *got = cJSON_Parse(line);
        bad += !cJSON_Compare(got, cJSON_GetArrayItem(want, rows), 1);
        rows++;
        cJSON_Delete(got);
    }
    if (o) fclose(o);
    CHECK(rows == cJSON_GetArraySize(want) && bad == 0, "tokenize: %d rows, %d differ from the golden ids", rows, bad);
    /* decode the ids back: the text of each row */
    snprintf(cmd, sizeof cmd, "%s tokenize --decode --tokenizer %s/data/tokenizers/gemma4/tokenizer.json < %s > %s.dec", bin,
             check_shared_dir(), out, out);
    CHECK(sh(cmd) == 0, "g4 tokenize --decode failed");
    snprintf(cmd, sizeof cmd, "cmp -s %s %s.dec", in, out);
    CHECK(sh(cmd) == 0, "decoded text differs from the input");
    /* --add-bos, --plain, and a bad line */
    snprintf(cmd, sizeof cmd, "printf '\"<|turn>x\"\\n' | %s tokenize --add-bos --plain --tokenizer %s/data/tokenizers/gemma4/tokenizer.json > %s",
             bin, check_shared_dir(), out);
    CHECK(sh(cmd) == 0, "tokenize --plain failed");
    char *plain = slurp(out);
    CHECK(strncmp(plain, "[2,", 3) == 0 && !strstr(plain, ",105,") && !strstr(plain, "[2,105"), "--plain/--add-bos: %s", plain);
    free(plain);
    snprintf(cmd, sizeof cmd, "printf '42\\n' | %s tokenize --tokenizer %s/data/tokenizers/gemma4/tokenizer.json 2> %s", bin,
             check_shared_dir(), out);
    CHECK(sh(cmd) == 1, "tokenize accepted a number");
    char *err = slurp(out);
    CHECK(strstr(err, "line 1: expected a JSON string") != NULL, "tokenize error: %s", err);
    free(err);
    free(line);
    cJSON_Delete(want);
    unsetenv("G4_TOKENIZER_CACHE");
}

/* `g4 tokenize` on a private tokenizer.json: G4_TOKENIZER_CACHE=off leaves no cache beside it,
 * without the switch the cache appears (so the check above is not vacuous). */
/* Without -m, tokenize uses the built-in model ($G4_MODEL here): the ids of -m's. */
static void test_tokenize_default_model(void) {
    char cmd[4096], with_path[700], without_path[700];
    snprintf(with_path, sizeof with_path, "%s/tok-with.txt", tmp);
    snprintf(without_path, sizeof without_path, "%s/tok-without.txt", tmp);
    snprintf(cmd, sizeof cmd, "echo '\"hello world\"' | %s tokenize -m %s > %s && echo '\"hello world\"' | G4_MODEL=%s %s tokenize > %s", bin,
             model, with_path, model, bin, without_path);
    CHECK(sh(cmd) == 0, "tokenize without -m failed");
    char *with = slurp(with_path), *without = slurp(without_path);
    CHECK(!strcmp(with, without) && with[0] == '[', "tokenize without -m: %s, with -m: %s", without, with);
    free(with);
    free(without);
}

static void test_tokenize_cache_switch(void) {
    char cmd[4096], tok[700], cache[800];
    snprintf(tok, sizeof tok, "%s/tokenizer.json", model);
    snprintf(cache, sizeof cache, "%s.g4cache", tok);
    unlink(cache);
    snprintf(cmd, sizeof cmd, "printf '\"abc\"\\n' | G4_TOKENIZER_CACHE=off %s tokenize --tokenizer %s > /dev/null", bin, tok);
    CHECK(sh(cmd) == 0, "tokenize with G4_TOKENIZER_CACHE=off failed");
    CHECK(access(cache, F_OK) != 0, "G4_TOKENIZER_CACHE=off: %s was written", cache);
    snprintf(cmd, sizeof cmd, "printf '\"abc\"\\n' | %s tokenize --tokenizer %s > /dev/null", bin, tok);
    CHECK(sh(cmd) == 0, "tokenize failed");
    CHECK(access(cache, F_OK) == 0, "no %s without G4_TOKENIZER_CACHE=off", cache);
}

/* Two turns, /reset, then the first turn again; greedy, so everything is reproducible. */
static void test_chat_pipe(void) {
    char cmd[4096], err_path[700], out_path[700];
    snprintf(err_path, sizeof err_path, "%s/chat.err", tmp);
    snprintf(out_path, sizeof out_path, "%s/chat.out", tmp);
    snprintf(cmd, sizeof cmd, "printf 'hi\\nsecond turn\\n/reset\\nhi\\n' | %s chat -m %s -n 6 --temp 0 --verbose > %s 2> %s", bin,
             model, out_path, err_path);
    CHECK(sh(cmd) == 0, "g4 chat exited non-zero");
    char *err = slurp(err_path);
    int32_t p1[256], g1[64], p2[256], g2[64], p3[256], g3[64];
    int np1 = ids_line(err, "prompt ids", 0, p1, 256), ng1 = ids_line(err, "generated ids", 0, g1, 64);
    int np2 = ids_line(err, "prompt ids", 1, p2, 256), ng2 = ids_line(err, "generated ids", 1, g2, 64);
    int np3 = ids_line(err, "prompt ids", 2, p3, 256), ng3 = ids_line(err, "generated ids", 2, g3, 64);
    CHECK(np1 > 0 && ng1 == 6 && np2 > 0 && ng2 == 6 && np3 > 0 && ng3 == 6, "chat: missing turns in %s", err);
    if (np1 > 0 && ng1 == 6 && np2 > 0 && ng2 == 6 && np3 > 0 && ng3 == 6) {
        /* turn 2 continues the cache: its prompt starts by feeding back turn 1's last token */
        CHECK(p2[0] == g1[5], "turn 2 does not start with the last generated token");
        CHECK(p1[0] == 2 && p2[0] != 2 && p3[0] == 2, "only a new conversation starts with <bos>");
        /* the same answer as one prompt holding the whole conversation */
        char ids[4096];
        size_t len = 0;
        for (int i = 0; i < np1; i++) len += (size_t)snprintf(ids + len, sizeof ids - len, "%s%d", len ? "," : "", p1[i]);
        for (int i = 0; i < ng1; i++) len += (size_t)snprintf(ids + len, sizeof ids - len, ",%d", g1[i]);
        for (int i = 1; i < np2; i++) len += (size_t)snprintf(ids + len, sizeof ids - len, ",%d", p2[i]);
        snprintf(cmd, sizeof cmd, "%s run -m %s --ids %s -n 6 > %s", bin, model, ids, out_path);
        CHECK(sh(cmd) == 0, "run --ids failed");
        char *out = slurp(out_path), want[512];
        len = 0;
        for (int i = 0; i < 6; i++) len += (size_t)snprintf(want + len, sizeof want - len, "%s%d", i ? " " : "", g2[i]);
        snprintf(want + len, sizeof want - len, "\n");
        CHECK(strcmp(out, want) == 0, "turn 2 of the chat (%s) differs from one prompt of the whole conversation (%s)", want, out);
        free(out);
        /* after /reset the same question gets the same answer as at first */
        CHECK(np3 == np1 && !memcmp(p1, p3, sizeof *p1 * (size_t)np1) && !memcmp(g1, g3, sizeof *g1 * 6), "/reset did not start over");
    }
    free(err);
}

/* ---- Ctrl-C: a child with its stdout on a pipe, signalled once its answer has begun ---- */

/* Every wait below ends by this many seconds after the child started: a hung child fails its
 * test (and is killed) instead of hanging the run. Far above the tiny model's real times, also
 * under the sanitizers. */
#define CHILD_DEADLINE_S 120.0

/* An answer long enough that Ctrl-C lands in its middle: the tiny model would need seconds for
 * it, while the signal comes with its first printed bytes. */
#define LONG_ANSWER 20000
#define LONG_ANSWER_S "20000"

typedef struct {
    pid_t pid;
    int out;          /* read end of the child's stdout */
    int in;           /* write end of its stdin, or -1 */
    double deadline;  /* CLOCK_MONOTONIC seconds */
    char buf[4096];   /* the first bytes of its stdout */
    size_t len;       /* bytes read in all (may exceed the buffer) */
    int eof;
} child;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Starts bin with argv: stdout to a pipe, stderr to err_path, stdin from a pipe when
 * with_stdin (else /dev/null). */
static void child_start(child *c, char *const argv[], int with_stdin, const char *err_path) {
    int out[2], in[2] = {-1, -1};
    if (pipe(out) != 0 || (with_stdin && pipe(in) != 0)) exit(2);
    memset(c, 0, sizeof *c);
    c->pid = fork();
    if (c->pid < 0) exit(2);
    if (c->pid == 0) {
        int fd_in = with_stdin ? in[0] : open("/dev/null", O_RDONLY), fd_err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd_in < 0 || fd_err < 0 || dup2(fd_in, 0) < 0 || dup2(out[1], 1) < 0 || dup2(fd_err, 2) < 0) _exit(3);
        close(out[0]);
        if (with_stdin) close(in[1]);
        execv(bin, argv);
        _exit(127);
    }
    close(out[1]);
    if (with_stdin) close(in[0]);
    c->out = out[0];
    c->in = with_stdin ? in[1] : -1;
    c->deadline = now_s() + CHILD_DEADLINE_S;
}

/* Reads what the child printed until it has printed at least `want` bytes in all, closed its
 * stdout, or ran past its deadline. Returns 1 if `want` bytes arrived. */
static int child_read(child *c, size_t want) {
    while (c->len < want && !c->eof) {
        double left = c->deadline - now_s();
        if (left <= 0) return 0;
        struct pollfd p = {.fd = c->out, .events = POLLIN};
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) continue;
        char tmpbuf[4096];
        ssize_t n = read(c->out, tmpbuf, sizeof tmpbuf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            c->eof = 1;
            break;
        }
        if (c->len < sizeof c->buf - 1) {
            size_t keep = sizeof c->buf - 1 - c->len < (size_t)n ? sizeof c->buf - 1 - c->len : (size_t)n;
            memcpy(c->buf + c->len, tmpbuf, keep);
            c->buf[c->len + keep] = 0;
        }
        c->len += (size_t)n;
    }
    return c->len >= want;
}

/* Drains the child's stdout to its end and reaps it; at the deadline it is killed. Returns 1
 * if it exited by itself in time, with its wait status in *status. */
static int child_finish(child *c, int *status) {
    if (c->in >= 0) close(c->in);
    child_read(c, (size_t)-1);
    int pid = 0;
    while ((pid = waitpid(c->pid, status, WNOHANG)) == 0 && now_s() < c->deadline) poll(NULL, 0, 10);
    close(c->out);
    if (pid == c->pid) return 1;
    kill(c->pid, SIGKILL);
    waitpid(c->pid, status, 0);
    return 0;
}

/* The uninterrupted greedy continuation of `prompt` for n tokens equals `got`: Ctrl-C cut the
 * answer short without changing the tokens before the cut. */
static void expect_greedy_prefix(const int32_t *prompt, int n_prompt, const int32_t *got, int n, const char *what) {
    static char cmd[1 << 16];
    char out_path[700], want[1 << 15];
    snprintf(out_path, sizeof out_path, "%s/prefix.out", tmp);
    size_t len = (size_t)snprintf(cmd, sizeof cmd, "%s run -m %s -n %d --ids ", bin, model, n);
    for (int i = 0; i < n_prompt; i++) len += (size_t)snprintf(cmd + len, sizeof cmd - len, "%s%d", i ? "," : "", prompt[i]);
    snprintf(cmd + len, sizeof cmd - len, " > %s", out_path);
    CHECK(sh(cmd) == 0, "%s: run --ids failed", what);
    len = 0;
    for (int i = 0; i < n && len < sizeof want; i++) len += (size_t)snprintf(want + len, sizeof want - len, "%s%d", i ? " " : "", got[i]);
    if (len < sizeof want) snprintf(want + len, sizeof want - len, "\n");
    char *out = slurp(out_path);
    CHECK(strcmp(out, want) == 0, "%s: the %d tokens before Ctrl-C are not the greedy answer's first %d", what, n, n);
    free(out);
}

/* Checks one interrupted answer's ids (the nth on stderr): it began and stopped before its end. */
static int expect_cut_short(const char *err, int nth, int32_t *prompt, int *n_prompt, int32_t *gen, int cap, const char *what) {
    *n_prompt = ids_line(err, "prompt ids", nth, prompt, 4096);
    int n = ids_line(err, "generated ids", nth, gen, cap), cut = *n_prompt > 0 && n >= 1 && n < LONG_ANSWER;
    CHECK(cut, "%s: %d prompt ids, %d of %d tokens generated before Ctrl-C", what, *n_prompt, n, LONG_ANSWER);
    if (cut) printf("ok %s: Ctrl-C after %d of %d tokens\n", what, n, LONG_ANSWER);
    return cut ? n : 0;
}

/* Ctrl-C once `g4 run` has printed the start of its answer: the answer stops there (fewer
 * tokens than asked for, each the greedy one), the line is closed and the exit status is 0. */
static void test_run_interrupt(void) {
    char err_path[700];
    snprintf(err_path, sizeof err_path, "%s/run-int.err", tmp);
    char *argv[] = {(char *)bin, "run", "-m", model, "-p", "tell me everything", "--temp", "0", "--ignore-eos", "--show-thinking",
                    "--verbose", "-n", LONG_ANSWER_S, "--ctx", "30000", NULL};
    child c;
    child_start(&c, argv, 0, err_path);
    int began = child_read(&c, 1);
    CHECK(began, "g4 run printed nothing within %.0f s", CHILD_DEADLINE_S);
    if (began) kill(c.pid, SIGINT);
    int st = 0, exited = child_finish(&c, &st);
    char *err = slurp(err_path);
    CHECK(exited && WIFEXITED(st) && WEXITSTATUS(st) == 0, "g4 run after Ctrl-C: status %d, stderr %s", st, err);
    CHECK(c.len > 0 && c.len <= sizeof c.buf - 1 && c.buf[c.len - 1] == '\n', "the cut answer (%zu bytes) does not end its line", c.len);
    static int32_t prompt[4096], gen[LONG_ANSWER];
    int n_prompt, n = expect_cut_short(err, 0, prompt, &n_prompt, gen, LONG_ANSWER, "run");
    if (n) expect_greedy_prefix(prompt, n_prompt, gen, n, "run");
    free(err);
}

/* Ctrl-C once the chat's answer has begun stops that answer (cut short, "(stopped)"); the chat
 * then reads its next lines (/reset, /exit) and leaves with status 0. */
static void test_chat_interrupt(void) {
    char err_path[700];
    snprintf(err_path, sizeof err_path, "%s/int.err", tmp);
    char *argv[] = {(char *)bin, "chat", "-m", model, "--temp", "0", "--ctx", "30000", "--ignore-eos", "--show-thinking", "--verbose",
                    "-n", LONG_ANSWER_S, NULL};
    child c;
    child_start(&c, argv, 1, err_path);
    const char *first = "tell me everything\n", *rest = "/reset\n/exit\n";
    CHECK(write(c.in, first, strlen(first)) == (ssize_t)strlen(first), "cannot write to g4 chat");
    int began = child_read(&c, 1);
    CHECK(began, "g4 chat printed nothing within %.0f s", CHILD_DEADLINE_S);
    if (began) kill(c.pid, SIGINT);
    /* read only once the answer has stopped: lines waiting in the pipe cannot change that */
    CHECK(write(c.in, rest, strlen(rest)) == (ssize_t)strlen(rest), "cannot write to g4 chat after Ctrl-C");
    int st = 0, exited = child_finish(&c, &st);
    char *err = slurp(err_path);
    CHECK(exited, "chat did not stop after Ctrl-C and /exit within %.0f s", CHILD_DEADLINE_S);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "chat after Ctrl-C: status %d, stderr %s", st, err);
    const char *stopped = strstr(err, "(stopped)");
    CHECK(stopped && strstr(stopped, "(new conversation)"), "no (stopped), then (new conversation), after Ctrl-C: %s", err);
    static int32_t prompt[4096], gen[LONG_ANSWER];
    int n_prompt, n = expect_cut_short(err, 0, prompt, &n_prompt, gen, LONG_ANSWER, "chat");
    if (n) expect_greedy_prefix(prompt, n_prompt, gen, n, "chat");
    CHECK(ids_line(err, "generated ids", 1, gen, LONG_ANSWER) < 0, "/reset or /exit was answered as a question: %s", err);
    free(err);
}

static void test_run_prompt_sources(void) {
    char cmd[4096], a[700], b[700], c[700], f[700];
    snprintf(a, sizeof a, "%s/a.out", tmp);
    snprintf(b, sizeof b, "%s/b.out", tmp);
    snprintf(c, sizeof c, "%s/c.out", tmp);
    snprintf(f, sizeof f, "%s/prompt.txt", tmp);
    FILE *pf = fopen(f, "w");
    fputs("What is 2+2?", pf);
    fclose(pf);
    snprintf(cmd, sizeof cmd, "%s run -m %s -p 'What is 2+2?' -n 8 --temp 0 > %s", bin, model, a);
    CHECK(sh(cmd) == 0, "run -p failed");
    snprintf(cmd, sizeof cmd, "%s run -m %s -f %s -n 8 --temp 0 > %s", bin, model, f, b);
    CHECK(sh(cmd) == 0, "run -f failed");
    snprintf(cmd, sizeof cmd, "%s run -m %s -n 8 --temp 0 < %s > %s", bin, model, f, c);
    CHECK(sh(cmd) == 0, "run from stdin failed");
    snprintf(cmd, sizeof cmd, "cmp -s %s %s && cmp -s %s %s", a, b, a, c);
    CHECK(sh(cmd) == 0, "-p, -f and standard input give different answers");
    /* same seed, same output; the prompt past the context is an error */
    snprintf(cmd, sizeof cmd, "%s run -m %s -p hello -n 12 --temp 1 --seed 7 > %s && %s run -m %s -p hello -n 12 --temp 1 --seed 7 > %s && cmp -s %s %s",
             bin, model, a, bin, model, b, a, b);
    CHECK(sh(cmd) == 0, "same seed, different output");
    snprintf(cmd, sizeof cmd, "%s run -m %s -p 'a long prompt that does not fit' --ctx 8 2> %s", bin, model, a);
    CHECK(sh(cmd) == 1, "prompt past the context accepted");
    char *err = slurp(a);
    CHECK(strstr(err, "does not fit the context") != NULL, "context error: %s", err);
    free(err);
}

/* The greedy line on the command line (issue 33, defect 9): --temp 1e-40 (which strtof flags as an
 * underflow) and 9e-6 print --temp 0's answer; inf, nan and 1e39 are refused with one line. */
static void test_temperature_flag(void) {
    char a[700], b[700], err[700], args[1024];
    snprintf(a, sizeof a, "%s/t0.out", tmp);
    snprintf(b, sizeof b, "%s/t.out", tmp);
    snprintf(err, sizeof err, "%s/t.err", tmp);
    snprintf(args, sizeof args, "run -m %s -p 'What is 2+2?' -n 12 --temp 0", model);
    CHECK(run_into(bin, args, a, err) == 0, "--temp 0 failed");
    char *want = slurp(a);
    const char *tiny[] = {"1e-40", "9e-6"};
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "run -m %s -p 'What is 2+2?' -n 12 --temp %s --seed 3", model, tiny[i]);
        int rc = run_into(bin, args, b, err);
        char *got = slurp(b);
        CHECK(rc == 0 && *want && strcmp(got, want) == 0, "--temp %s: status %d, \"%s\" vs --temp 0's \"%s\"", tiny[i], rc, got, want);
        free(got);
    }
    free(want);
    const char *bad[] = {"inf", "nan", "1e39"};
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "run -m %s -p hi --temp %s", model, bad[i]);
        int rc = run_into(bin, args, b, err);
        char *e = slurp(err), line[128];
        snprintf(line, sizeof line, "g4 run: error: --temp %s: expected a finite number >= 0\n", bad[i]);
        CHECK(rc == 1 && strcmp(e, line) == 0, "--temp %s: status %d, stderr \"%s\"", bad[i], rc, e);
        free(e);
    }
    printf("ok --temp below 1e-5 is greedy, non-finite values are refused\n");
}

/* --stop STR (issue 34): the built-in model's greedy answer without it, cut before the first stop
 * string to appear (which is not printed), the line still closed; a string that never appears
 * changes nothing; an empty one is refused by name. */
static void test_stop_flag(void) {
    char a[700], b[700], err[700], args[1024];
    snprintf(a, sizeof a, "%s/s0.out", tmp);
    snprintf(b, sizeof b, "%s/s.out", tmp);
    snprintf(err, sizeof err, "%s/s.err", tmp);
    const char *q = "run -m models/gemma4-tiny-math -p 'What is 12 plus 30?' -n 24 --temp 0";
    CHECK(run_into(bin, q, a, err) == 0, "the answer without --stop failed");
    char *whole = slurp(a), *at = strstr(whole, "final");
    CHECK(at != NULL, "the built-in model's answer has no \"final\": \"%s\"", whole);
    if (at) {
        char want[1024];
        snprintf(want, sizeof want, "%.*s\n", (int)(at - whole), whole);
        const char *forms[] = {"--stop final", "--stop nowhere --stop final", "--stop final --stop answer"};
        for (int i = 0; i < 3; i++) {
            snprintf(args, sizeof args, "%s %s", q, forms[i]);
            int rc = run_into(bin, args, b, err);
            char *got = slurp(b);
            CHECK(rc == 0 && strcmp(got, want) == 0, "%s: status %d, \"%s\", want \"%s\"", forms[i], rc, got, want);
            free(got);
        }
        snprintf(args, sizeof args, "%s --stop nowhere", q);
        int rc = run_into(bin, args, b, err);
        char *got = slurp(b);
        CHECK(rc == 0 && strcmp(got, whole) == 0, "--stop nowhere: status %d, \"%s\", want \"%s\"", rc, got, whole);
        free(got);
    }
    free(whole);
    snprintf(args, sizeof args, "%s --stop ''", q);
    int rc = run_into(bin, args, b, err);
    char *e = slurp(err);
    CHECK(rc == 1 && strcmp(e, "g4 run: error: --stop: a stop string may not be empty\n") == 0, "--stop '': status %d, stderr \"%s\"", rc, e);
    free(e);
    printf("ok --stop cuts the answer before the first stop string\n");
}

/* A checkpoint whose output is NaN (overflow_util.h): `g4 run` (greedy, top-k, every logit) and
 * `g4 chat` exit 1 with one line naming it, instead of crashing (sampling overflowed the top-k
 * selection's array) or printing <pad> forever (greedy). */
static void test_non_finite(void) {
    char dir[700], out[700], err[700], args[2048];
    snprintf(dir, sizeof dir, "%s/overflowing", tmp);
    snprintf(out, sizeof out, "%s/nf.out", tmp);
    snprintf(err, sizeof err, "%s/nf.err", tmp);
    mkdir(dir, 0777);
    CHECK(write_overflowing_copy(model, dir) == 0, "the synthesized model has no F32 " OVERFLOW_TENSOR);
    const char *forms[] = {"--temp 0", "--temp 1 --top-k 5", "--temp 0.8", "--temp 0 --repeat-penalty 1.3"};
    for (size_t i = 0; i < sizeof forms / sizeof *forms; i++) {
        snprintf(args, sizeof args, "run -m %s -p hello -n 8 %s", dir, forms[i]);
        int rc = run_into(bin, args, out, err);
        char *e = slurp(err), *o = slurp(out), *nl = strchr(e, '\n');
        CHECK(rc == 1 && strncmp(e, "g4: error: the model's ", 23) == 0 && strstr(e, "non-finite (NaN or infinite)") && nl && !nl[1] && !*o,
              "run %s: status %d, stdout \"%s\", stderr \"%s\"", forms[i], rc, o, e);
        free(e), free(o);
    }
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "echo hello | %s chat -m %s > %s 2> %s", bin, dir, out, err);
    int rc = sh(cmd);
    char *e = slurp(err);
    CHECK(rc == 1 && strstr(e, "g4: error: the model's ") && strstr(e, "non-finite"), "chat: status %d, stderr \"%s\"", rc, e);
    free(e);
    remove_overflowing_copy(dir);
    printf("ok non-finite output: run (4 forms) and chat exit 1 with one line\n");
}

/* `g4 ARGS` must fail with one line "g4: error: ..." containing `what`. */
static void expect_one_error(const char *args, const char *what) {
    char out[700], err[700];
    snprintf(out, sizeof out, "%s/bound.out", tmp);
    snprintf(err, sizeof err, "%s/bound.err", tmp);
    int rc = run_into(bin, args, out, err);
    char *text = slurp(err);
    const char *nl = strchr(text, '\n');
    CHECK(rc == 1 && !strncmp(text, "g4: error: ", 11) && strstr(text, what) && nl && !nl[1], "g4 %s: exit %d, stderr: %s", args, rc,
          text);
    free(text);
}

/* Whole-file reads are bounded (G4_READ_FILE_MAX, 64 MiB): an endless prompt file (/dev/zero) is
 * refused once it has given more, a larger regular one (sparse, so the test writes nothing) before
 * it is read, and so is a checkpoint whose config.json is endless; so are the lines tokenize and
 * chat read from standard input. */
static void test_read_bounds(void) {
    char args[4096], big[700], dir[700];
    snprintf(args, sizeof args, "run -m %s -f /dev/zero -n 1", model);
    expect_one_error(args, "/dev/zero: larger than 64 MiB, the limit for this file");
    snprintf(big, sizeof big, "%s/big-prompt.txt", tmp);
    snprintf(args, sizeof args, "truncate -s 67108865 %s", big);
    if (sh(args) != 0) exit(2);
    snprintf(args, sizeof args, "run -m %s -f %s -n 1", model, big);
    expect_one_error(args, "big-prompt.txt: larger than 64 MiB, the limit for this file");
    unlink(big);
    snprintf(dir, sizeof dir, "%s/endless-config", tmp);
    snprintf(args, sizeof args, "cp -r %s %s && ln -sf /dev/zero %s/config.json", model, dir, dir);
    if (sh(args) != 0) exit(2);
    snprintf(args, sizeof args, "inspect -m %s", dir);
    expect_one_error(args, "config.json: larger than 64 MiB, the limit for this file");
    /* lines from standard input: an endless one is refused at 64 MiB */
    const char *line_cmds[][2] = {{"tokenize", "line 1 is longer than 64 MiB, the limit for a line"},
                                  {"chat", "a line longer than 64 MiB, the limit for a turn"}};
    for (int i = 0; i < 2; i++) {
        char err[700];
        snprintf(err, sizeof err, "%s/line.err", tmp);
        snprintf(args, sizeof args, "%s %s -m %s < /dev/zero > /dev/null 2> %s", bin, line_cmds[i][0], model, err);
        int rc = sh(args);
        char *text = slurp(err);
        const char *nl = strchr(text, '\n');
        CHECK(rc == 1 && !strncmp(text, "g4: error: standard input: ", 27) && strstr(text, line_cmds[i][1]) && nl && !nl[1],
              "g4 %s < /dev/zero: exit %d, stderr: %s", line_cmds[i][0], rc, text);
        free(text);
    }
    printf("ok read bounds\n");
}

/* Structured output from the command line: --grammar, --json-schema (file and inline) and --json
 * constrain the random model's sampled answers (a grammar of two words gives one of them exactly,
 * an enum schema one of its JSON strings); bad grammars, schemas, files and combinations are
 * refused with one line naming the flag. */
static void test_constraint_flags(void) {
    char gpath[700], spath[700], out[700], err[700], args[2048];
    snprintf(gpath, sizeof gpath, "%s/yn.gbnf", tmp);
    snprintf(spath, sizeof spath, "%s/color.json", tmp);
    snprintf(out, sizeof out, "%s/c.out", tmp);
    snprintf(err, sizeof err, "%s/c.err", tmp);
    FILE *f = fopen(gpath, "w");
    fputs("# yes or no\nroot ::= \"yes\" | \"no\"\n", f);
    fclose(f);
    f = fopen(spath, "w");
    fputs("{\"enum\": [\"red\", \"green\", \"blue\"]}", f);
    fclose(f);
    for (int seed = 1; seed <= 8; seed++) {
        const char *forms[3][2] = {{"--grammar", gpath}, {"--json-schema", spath}, {"--json-schema", "'{\"enum\": [\"red\", \"green\", \"blue\"]}'"}};
        for (int k = 0; k < 3; k++) {
            snprintf(args, sizeof args, "run -m %s -p 'Colour?' -n 40 --temp 1 --seed %d %s %s", model, seed, forms[k][0], forms[k][1]);
            int rc = run_into(bin, args, out, err);
            char *got = slurp(out);
            int ok = k == 0 ? !strcmp(got, "yes\n") || !strcmp(got, "no\n")
                            : !strcmp(got, "\"red\"\n") || !strcmp(got, "\"green\"\n") || !strcmp(got, "\"blue\"\n");
            CHECK(rc == 0 && ok, "g4 %s: exit %d, answer \"%s\"", args, rc, got);
            free(got);
        }
    }
    /* --json: one JSON object (the random model may run out of budget inside it: a prefix then) */
    snprintf(args, sizeof args, "run -m %s -p 'JSON?' -n 60 --temp 1 --seed 2 --json", model);
    CHECK(run_into(bin, args, out, err) == 0, "--json failed");
    char *got = slurp(out);
    CHECK(got[0] == '{', "--json answer \"%s\"", got);
    free(got);
    snprintf(args, sizeof args, "run -m %s -p x --json-schema '{\"type\": \"strin\"}'", model);
    expect_one_error(args, "--json-schema (inline schema): json schema: type: unknown type");
    snprintf(args, sizeof args, "run -m %s -p x --json-schema %s/none.json", model, tmp);
    expect_one_error(args, "--json-schema");
    snprintf(args, sizeof args, "run -m %s -p x --grammar %s", model, spath);
    expect_one_error(args, "--grammar");
    snprintf(args, sizeof args, "run -m %s -p x --json --grammar %s", model, gpath);
    expect_one_error(args, "give one of them");
    snprintf(args, sizeof args, "run -m %s -p x --json --ignore-eos", model);
    expect_one_error(args, "--ignore-eos with a constraint");
    printf("ok constraint flags: --grammar, --json-schema (file, inline), --json; 5 refusals\n");
}

int main(void) {
    if (!(bin = check_bin())) return check_report("text_cli");
    signal(SIGPIPE, SIG_IGN); /* a child that died early fails its checks, not this program */
    snprintf(tmp, sizeof tmp, "/tmp/g4-text-XXXXXX");
    if (!mkdtemp(tmp)) return 2;
    snprintf(model, sizeof model, "%s/tiny", tmp);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s synth --preset tiny -o %s > /dev/null", bin, model);
    if (sh(cmd) != 0) return 2;
    test_tokenize();
    test_tokenize_cache_switch();
    test_tokenize_default_model();
    test_chat_pipe();
    test_chat_interrupt();
    test_run_interrupt();
    test_run_prompt_sources();
    test_non_finite();
    test_temperature_flag();
    test_stop_flag();
    test_read_bounds();
    test_constraint_flags();
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (sh(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return check_report("text_cli");
}
