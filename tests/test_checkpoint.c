/* g4_checkpoint_open (include/g4.h): a checkpoint folder opened whole, as the front ends open it.
 * - the built-in model's folder: the model is the folder's (its config.json's vocab_size and
 *   hidden_size), the tokenizer the folder's tokenizer.json (the same ids as g4_tokenizer_load of
 *   that file), no drafter unless asked; with its drafter folder, a drafter that drafts over a
 *   session of the model;
 * - failures leave nothing open and *c zeroed, each one line naming what failed: a folder without
 *   tokenizer.json, a drafter folder that is not one, a missing folder. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "util/err.h"

#define BUILTIN "models/gemma4-tiny-math"
#define BUILTIN_DRAFT "models/gemma4-tiny-math-drafter"

static int is_zero(const g4_checkpoint *c) { return !c->model && !c->tok && !c->draft; }

static int config_int(const char *dir, const char *field) {
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *cfg = read_json(path), *tc = cJSON_GetObjectItem(cfg, "text_config");
    const cJSON *v = cJSON_GetObjectItem(tc ? tc : cfg, field);
    int x = cJSON_IsNumber(v) ? v->valueint : -1;
    cJSON_Delete(cfg);
    return x;
}

static void check_builtin(void) {
    g4_checkpoint c;
    CHECK(g4_checkpoint_open(&c, BUILTIN, NULL, NULL) == 0, "%s", g4_last_error());
    if (!c.model) return;
    CHECK(c.tok && !c.draft, "tokenizer %p, drafter %p without a draft folder", (void *)c.tok, (void *)c.draft);
    CHECK(g4_model_vocab_size(c.model) == config_int(BUILTIN, "vocab_size") &&
              g4_model_hidden_size(c.model) == config_int(BUILTIN, "hidden_size"),
          "model vocab %d hidden %d, config.json %d %d", g4_model_vocab_size(c.model), g4_model_hidden_size(c.model),
          config_int(BUILTIN, "vocab_size"), config_int(BUILTIN, "hidden_size"));
    g4_tokenizer *ref = g4_tokenizer_load(BUILTIN "/tokenizer.json");
    const char *text = "Natalia sold clips to 48 of her friends in April.";
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    CHECK(ref && g4_tokenizer_encode(c.tok, text, strlen(text), 0, &a, &na) == 0 && g4_tokenizer_encode(ref, text, strlen(text), 0, &b, &nb) == 0 &&
              na == nb && na > 0 && memcmp(a, b, sizeof *a * na) == 0,
          "the checkpoint's tokenizer encodes otherwise than tokenizer.json's (%zu and %zu ids)", na, nb);
    free(a);
    free(b);
    g4_tokenizer_free(ref);
    g4_checkpoint_close(&c);
    CHECK(is_zero(&c), "g4_checkpoint_close left handles behind");
    printf("ok %s: the folder's model and tokenizer.json, no drafter\n", BUILTIN);

    g4_options o;
    g4_options_default(&o);
    o.ctx = 16;
    CHECK(g4_checkpoint_open(&c, BUILTIN, &o, BUILTIN_DRAFT) == 0 && c.draft, "with its drafter: %s", g4_last_error());
    if (!c.draft) return;
    g4_session *s = g4_session_new(c.model, &o);
    g4_drafter *dr = s ? g4_drafter_new(c.draft, s) : NULL;
    CHECK(dr != NULL, "a drafter over a session of the model: %s", g4_last_error());
    g4_drafter_free(dr);
    g4_session_free(s);
    g4_checkpoint_close(&c);
    printf("ok %s with %s: a drafter for the model\n", BUILTIN, BUILTIN_DRAFT);
}

static void expect_failure(const char *what, const char *dir, const char *draft, const char *needle) {
    g4_checkpoint c;
    memset(&c, 0xff, sizeof c); /* whatever the caller's struct held */
    int rc = g4_checkpoint_open(&c, dir, NULL, draft);
    CHECK(rc != 0 && is_zero(&c) && strstr(g4_last_error(), needle) && !strchr(g4_last_error(), '\n'),
          "%s: rc %d, message \"%s\" lacks \"%s\"", what, rc, g4_last_error(), needle);
    printf("ok refused %s: %s\n", what, g4_last_error());
}

static void check_failures(void) {
    char tmp[] = "/tmp/g4_checkpoint_XXXXXX", a[1024], b[1024];
    if (!mkdtemp(tmp)) exit(2);
    char *cwd = getcwd(NULL, 0);
    /* the model without its tokenizer: config.json and model.safetensors linked */
    static const char *const files[] = {"config.json", "generation_config.json", "model.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(a, sizeof a, "%s/%s/%s", cwd, BUILTIN, files[i]);
        snprintf(b, sizeof b, "%s/%s", tmp, files[i]);
        if (symlink(a, b) != 0) exit(2);
    }
    expect_failure("a folder without tokenizer.json", tmp, NULL, "tokenizer.json");
    expect_failure("a drafter folder that is not one", BUILTIN, tmp, tmp);
    expect_failure("a missing folder", "/nonexistent/g4-model", NULL, "/nonexistent/g4-model");
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(b, sizeof b, "%s/%s", tmp, files[i]);
        unlink(b);
    }
    rmdir(tmp);
    free(cwd);
}

int main(void) {
    check_builtin();
    check_failures();
    return check_report("checkpoint");
}
