/* Text in, text out, driven as a user would: `g4 tokenize` against the golden encodings, and
 * `g4 chat` through a pipe (two turns that share the KV cache, /reset, Ctrl-C, end of input). */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

/* Command lines are built in fixed buffers sized far above what the temporary paths need; a
 * truncated one would fail its test, not pass it. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

static const char *bin;
static char tmp[256], model[600];

/* Runs a shell command line; returns the exit status. */
static int sh(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

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

/* Ctrl-C during an answer stops it; the chat goes on to the next line, then ends at EOF. */
static void test_chat_interrupt(void) {
    int to_child[2];
    if (pipe(to_child) != 0) exit(2);
    char err_path[700];
    snprintf(err_path, sizeof err_path, "%s/int.err", tmp);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(to_child[0], 0);
        close(to_child[1]);
        FILE *e = freopen(err_path, "w", stderr);
        (void)e;
        if (!freopen("/dev/null", "w", stdout)) _exit(3);
        execl(bin, bin, "chat", "-m", model, "--temp", "0", "--ctx", "60000", "--ignore-eos", (char *)NULL);
        _exit(127);
    }
    close(to_child[0]);
    const char *first = "tell me everything\n";
    if (write(to_child[1], first, strlen(first)) < 0) exit(2);
    struct timespec ts = {0, 400 * 1000 * 1000};
    nanosleep(&ts, NULL);
    kill(pid, SIGINT);
    nanosleep(&ts, NULL);
    const char *rest = "/reset\n/exit\n";
    if (write(to_child[1], rest, strlen(rest)) < 0) exit(2);
    close(to_child[1]);
    int st = 0;
    /* the chat must be back at its prompt and leave on /exit; give it 30 s at most */
    for (int i = 0; i < 300 && waitpid(pid, &st, WNOHANG) == 0; i++) nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
    if (waitpid(pid, &st, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        CHECK(0, "chat did not stop after Ctrl-C and /exit");
    }
    char *err = slurp(err_path);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "chat after Ctrl-C: status %d, stderr %s", st, err);
    CHECK(strstr(err, "(stopped)") != NULL && strstr(err, "(new conversation)") != NULL, "no (stopped) after Ctrl-C: %s", err);
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

int main(void) {
    if (!(bin = check_bin())) return check_report("text_cli");
    snprintf(tmp, sizeof tmp, "/tmp/g4-text-XXXXXX");
    if (!mkdtemp(tmp)) return 2;
    snprintf(model, sizeof model, "%s/tiny", tmp);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s synth --preset tiny -o %s > /dev/null", bin, model);
    if (sh(cmd) != 0) return 2;
    test_tokenize();
    test_tokenize_cache_switch();
    test_chat_pipe();
    test_chat_interrupt();
    test_run_prompt_sources();
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (sh(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return check_report("text_cli");
}
