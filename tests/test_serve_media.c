/* g4 serve's prompt cache with media in the prompt (serve_job_set_media): the cache is keyed on the
 * media rows' bytes, not on their placeholder ids. Over the built-in tiny model, through the
 * engine (its thread, its stepper, its slots), greedy chat jobs of one prompt whose positions
 * 6..13 are an image's soft tokens:
 *  - image X, then image X again: the second reuses everything the stepper allows (n_prompt - 1);
 *  - then image Y, equal to X but in its third row: only the prefix before that row is reused, and
 *    the reply is the one an engine without a prompt cache gives for Y;
 *  - a span outside the prompt is refused with a message naming it. */
#include <pthread.h>

#include "serve/engine.h"
#include "testutil.h"

#define MODEL "models/gemma4-tiny-math"
#define TOKENIZER MODEL "/tokenizer.json"

enum { N_PROMPT = 24, AT = 6, N_IMG = 8 };

static g4_model *m;
static g4_tokenizer *tok;
static int H;

/* A greedy chat job of the prompt with the image at AT; its whole JSON reply's text into content
 * and usage.prompt_tokens_details.cached_tokens into *cached. */
static void run_job(serve_engine *e, const float *image, char *content, size_t cap, int *cached) {
    serve_request r = {.kind = SERVE_CHAT, .n = 1};
    int32_t *prompt = malloc(sizeof *prompt * N_PROMPT);
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = 2 + (i * 37) % 200;
    for (int i = AT; i < AT + N_IMG; i++) prompt[i] = 7; /* the placeholders: the same id for every image */
    serve_job *j = serve_job_new(&r, prompt, N_PROMPT, 0, NULL, 6, "tiny");
    CHECK(j != NULL, "job: %s", g4_last_error());
    g4_embd_span span = {.at = AT, .n = N_IMG, .embd = image};
    CHECK(serve_job_set_media(j, &span, 1, H) == 0, "%s", g4_last_error());
    serve_error err = {0};
    CHECK(serve_engine_submit(e, j, &err) == 0, "submit refused");
    CHECK(serve_job_wait(e, j, 60000), "the job did not finish");
    size_t len;
    const char *out = serve_job_output(j, &len);
    cJSON *whole = cJSON_ParseWithLength(out, len);
    const cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(whole, "choices"), 0), "message");
    const cJSON *c = cJSON_GetObjectItem(msg, "content");
    const cJSON *det = cJSON_GetObjectItem(cJSON_GetObjectItem(whole, "usage"), "prompt_tokens_details");
    CHECK(whole && cJSON_IsString(c) && det, "reply: %.*s", (int)len, out);
    snprintf(content, cap, "%s", cJSON_IsString(c) ? c->valuestring : "");
    *cached = det ? cJSON_GetObjectItem(det, "cached_tokens")->valueint : -1;
    cJSON_Delete(whole);
    serve_job_release(e, j);
}

static serve_engine *engine(g4_session *s, int prompt_cache) {
    serve_engine_config c = {.queue = 4, .prompt_chunk = 5, .max_unread = 1 << 20, .prompt_cache = prompt_cache};
    g4_sampling_default(&c.sampling);
    c.sampling_given = ~0; /* greedy, whatever the model's defaults */
    serve_engine *e = serve_engine_new(s, tok, &c);
    CHECK(e != NULL, "%s", g4_last_error());
    return e;
}

static g4_session *session(void) {
    g4_options o;
    g4_options_default(&o);
    o.ctx = 128;
    o.n_seq = 2;
    g4_session *s = g4_session_new(m, &o);
    CHECK(s != NULL, "%s", g4_last_error());
    return s;
}

int main(void) {
    m = g4_model_load(MODEL);
    tok = g4_tokenizer_load_ex(TOKENIZER, G4_TOKENIZER_NO_CACHE);
    CHECK(m && tok, "%s", g4_last_error());
    if (!m || !tok) return check_report("serve_media");
    H = g4_model_hidden_size(m);
    float *x = malloc(sizeof *x * N_IMG * (size_t)H), *y = malloc(sizeof *y * N_IMG * (size_t)H);
    uint32_t r = 5;
    for (int i = 0; i < N_IMG * H; i++) {
        r = r * 1103515245u + 12345u;
        x[i] = y[i] = (float)((int)(r >> 8) % 2001 - 1000) / 100.0f;
    }
    for (int c = 0; c < H; c++) y[2 * H + c] = -y[2 * H + c]; /* Y differs from X in its third row only */
    char a[4096], b[4096], cy[4096], fresh[4096];
    int ca, cb, cc, cf;

    g4_session *s = session();
    serve_engine *e = engine(s, 1);
    run_job(e, x, a, sizeof a, &ca);
    run_job(e, x, b, sizeof b, &cb);
    run_job(e, y, cy, sizeof cy, &cc);
    CHECK(ca == 0 && cb == N_PROMPT - 1 && !strcmp(a, b), "image X twice: cached %d then %d (want 0, %d), replies '%s' / '%s'", ca, cb,
          N_PROMPT - 1, a, b);
    CHECK(cc == AT + 2, "image Y after X (same placeholders, the third row different): %d tokens reused, want %d", cc, AT + 2);
    printf("ok prompt cache: image X again reuses %d of %d positions; image Y (its third row different) reuses %d, the rows before it\n", cb,
           N_PROMPT, cc);

    /* the reply to Y is the one an engine without a cache gives */
    g4_session *s2 = session();
    serve_engine *e2 = engine(s2, 0);
    run_job(e2, y, fresh, sizeof fresh, &cf);
    CHECK(cf == 0 && !strcmp(cy, fresh), "image Y: '%s' after X's cache, '%s' fresh", cy, fresh);
    printf("ok image Y's reply after X's cache equals a fresh engine's: '%s'\n", fresh);

    /* a span outside the prompt */
    serve_request rq = {.kind = SERVE_CHAT, .n = 1};
    int32_t *prompt = calloc(N_PROMPT, sizeof *prompt);
    serve_job *j = serve_job_new(&rq, prompt, N_PROMPT, 0, NULL, 4, "tiny");
    g4_embd_span bad = {.at = N_PROMPT - 2, .n = 3, .embd = x};
    CHECK(serve_job_set_media(j, &bad, 1, H) != 0 && strstr(g4_last_error(), "media span 0"), "a span past the prompt: %s", g4_last_error());
    printf("ok a span past the prompt: %s\n", g4_last_error());
    serve_job_release(e, j);

    serve_engine_free(e, 0);
    serve_engine_free(e2, 0);
    g4_session_free(s);
    g4_session_free(s2);
    free(x), free(y);
    g4_tokenizer_free(tok);
    g4_model_free(m);
    return check_report("serve_media");
}
