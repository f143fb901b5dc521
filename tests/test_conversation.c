/* The conversation layer (g4_conversation and the chat template under it):
 *  - rendering against the real Gemma 4 templates run through Jinja2 (tests/fixtures/chat:
 *    system, user, model and tool roles, tool declarations, thinking on and off), as text and as
 *    ids, whole and continued from where a generated reply stopped;
 *  - the chat form each checkpoint's template asks for;
 *  - on the built-in model (greedy): a continued conversation feeds exactly the tokens of its
 *    whole history rendered from scratch, and its second answer is the one a fresh session gives
 *    that history;
 *  - streaming on a random model sampled at a high temperature (byte tokens, markers): every
 *    delta is whole UTF-8, the deltas join to the tokens' decode, and their spans are what a
 *    whole-text reference splitter gives;
 *  - span splitting (thought, answer, tool call) on scripted replies, in every chunking;
 *  - bad input: one-line errors, nothing half done. Environment: G4_SHARED (shared dir). */
#define _POSIX_C_SOURCE 200809L
#include <unistd.h>

#include "model/synth.h"
#include "testutil.h"
#include "text/chat.h"
#include "text/reply.h"
#include "eval/gsm8k.h"
#include <sys/stat.h>

#define TINY_MATH "models/gemma4-tiny-math"
#define CASES "tests/fixtures/chat/template_cases.jsonl"

static char tmp[256];

/* ---------------------------------------------------------------- independent helpers */

/* Whole, shortest-form UTF-8 with no surrogates (RFC 3629), written here from the RFC. */
static int valid_utf8(const char *p, size_t n) {
    const unsigned char *s = (const unsigned char *)p;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        if (k == 3 && c == 0xE0 && s[i + 1] < 0xA0) return 0;
        if (k == 3 && c == 0xED && s[i + 1] > 0x9F) return 0;
        if (k == 4 && c == 0xF0 && s[i + 1] < 0x90) return 0;
        if (k == 4 && c == 0xF4 && s[i + 1] > 0x8F) return 0;
        i += k;
    }
    return 1;
}

static int ids_equal(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s (%zu):", label, n);
    for (size_t i = 0; i < n && i < 60; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 60 ? " ...\n" : "\n");
}

static int one_line(const char *msg) { return msg && *msg && !strchr(msg, '\n'); }

static g4_tokenizer *load_tokenizer(const char *path) {
    g4_tokenizer *t = g4_tokenizer_load_ex(path, G4_TOKENIZER_NO_CACHE);
    CHECK(t != NULL, "%s: %s", path, g4_last_error());
    return t;
}

/* ---------------------------------------------------------------- the template cases */

typedef struct {
    cJSON *row;
    g4_chat_message msgs[16];
    size_t n;
    const char *tools[8];
    g4_chat_options o;
} tcase;

static int load_case(cJSON *row, tcase *c) {
    memset(c, 0, sizeof *c);
    c->row = row;
    c->o = g4_chat_default_options();
    c->o.thinking = cJSON_IsTrue(cJSON_GetObjectItem(row, "thinking"));
    c->o.add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItem(row, "add_generation_prompt"));
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(row, "tools")) if (c->o.n_tools < 8) c->tools[c->o.n_tools++] = e->valuestring;
    c->o.tools = c->tools;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(row, "messages")) {
        if (c->n == 16) return -1;
        g4_chat_role role;
        if (g4_chat_role_parse(cJSON_GetObjectItem(e, "role")->valuestring, &role)) return -1;
        c->msgs[c->n++] = (g4_chat_message){role, cJSON_GetObjectItem(e, "content")->valuestring};
    }
    return 0;
}

static const char *case_name(const tcase *c, char *buf, size_t cap) {
    snprintf(buf, cap, "%s [%s]", cJSON_GetObjectItem(c->row, "name")->valuestring,
             cJSON_GetObjectItem(c->row, "template")->valuestring);
    return buf;
}

/* The rendered text, and the ids (g4_chat_encode against encoding the template's text with its
 * control tokens): the cases hold no control-token strings but the template's and the tool syntax's. */
static void check_case_rendering(const g4_tokenizer *tok, const tcase *c, const char *what) {
    const char *want = cJSON_GetObjectItem(c->row, "text")->valuestring;
    char *text = NULL;
    size_t len = 0;
    int rc = g4_chat_render(c->msgs, c->n, &c->o, &text, &len);
    CHECK(rc == 0 && strcmp(text, want) == 0, "%s: rendered\n%s\nthe template gives\n%s", what, rc ? g4_last_error() : text, want);
    int32_t *ids = NULL, *ref = NULL;
    size_t n_ids = 0, n_ref = 0;
    CHECK(g4_chat_encode(tok, c->msgs, c->n, &c->o, &ids, &n_ids) == 0, "%s: encode: %s", what, g4_last_error());
    CHECK(g4_tokenizer_encode(tok, want, strlen(want), 1, &ref, &n_ref) == 0, "%s: encode the template's text", what);
    int same = ids && ref && ids_equal(ids, n_ids, ref, n_ref);
    CHECK(same, "%s: g4_chat_encode's ids differ from the template text's", what);
    if (!same && ids && ref) print_ids("g4", ids, n_ids), print_ids("template", ref, n_ref);
    free(ids), free(ref), free(text);
}

/* A reply the model just wrote after the prompt of messages [0, k-1), then the rest: the
 * template's prompt + the model's text + the continuation is the template's whole rendering. */
static void check_case_continuation(const tcase *c, const char *what) {
    const char *full = cJSON_GetObjectItem(c->row, "text")->valuestring;
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(c->row, "prefixes")) {
        size_t k = (size_t)atoi(p->string);
        const char *prefix = p->valuestring, *body = c->msgs[k - 1].content;
        char *cont = NULL;
        size_t len = 0;
        int rc = g4_chat_render_from(c->msgs, c->n, k, &c->o, &cont, &len, NULL);
        size_t lp = strlen(prefix), lb = strlen(body);
        int ok = rc == 0 && strlen(full) == lp + lb + len && strncmp(full, prefix, lp) == 0 && strncmp(full + lp, body, lb) == 0 &&
                 strcmp(full + lp + lb, cont) == 0;
        CHECK(ok, "%s: continued after message %zu: \"%s\"; the template's whole rendering\n%s\nits prompt then\n%s", what, k - 1,
              rc ? g4_last_error() : cont, full, prefix);
        free(cont);
    }
}

static void test_template_cases(const g4_tokenizer *tok) {
    FILE *f = fopen(CASES, "r");
    CHECK(f != NULL, "cannot read %s (run from the repository root)", CASES);
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    int rows = 0, continued = 0, tools = 0;
    while (getline(&line, &cap, f) > 0) {
        cJSON *row = cJSON_Parse(line);
        tcase c;
        char what[256];
        CHECK(row && load_case(row, &c) == 0, "%s: row %d unreadable", CASES, rows + 1);
        if (row && load_case(row, &c) == 0) {
            case_name(&c, what, sizeof what);
            check_case_rendering(tok, &c, what);
            check_case_continuation(&c, what);
            continued += cJSON_GetArraySize(cJSON_GetObjectItem(row, "prefixes"));
            for (size_t i = 0; i < c.n; i++) tools += c.msgs[i].role == G4_CHAT_TOOL;
        }
        cJSON_Delete(row);
        rows++;
    }
    free(line);
    fclose(f);
    CHECK(rows >= 20 && continued >= 8 && tools >= 5, "%d template cases, %d continuations, %d tool messages", rows, continued, tools);
    printf("ok template: %d cases rendered as the Jinja templates do, %d continuations\n", rows, continued);
}

/* ---------------------------------------------------------------- the chat form */

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

/* A checkpoint folder of the built-in model whose template (or tokenizer_config.json) is ours. */
static const char *model_with(const char *name, const char *template_file, const char *tokenizer_config) {
    static char dir[512];
    char src[4096], dst[1024], cwd[2048];
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    CHECK(mkdir(dir, 0755) == 0 && getcwd(cwd, sizeof cwd), "mkdir %s", dir);
    const char *files[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(src, sizeof src, "%s/%s/%s", cwd, TINY_MATH, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        CHECK(symlink(src, dst) == 0, "symlink %s", dst);
    }
    if (template_file) {
        snprintf(dst, sizeof dst, "%s/chat_template.jinja", dir);
        CHECK(write_text(dst, template_file) == 0, "%s", dst);
    }
    if (tokenizer_config) {
        snprintf(dst, sizeof dst, "%s/tokenizer_config.json", dir);
        CHECK(write_text(dst, tokenizer_config) == 0, "%s", dst);
    }
    return dir;
}

static void expect_form(const char *dir, int want_ok, g4_chat_form want, const char *what) {
    g4_model *m = g4_model_load(dir);
    CHECK(m != NULL, "%s: load: %s", what, g4_last_error());
    if (!m) return;
    g4_chat_form form = (g4_chat_form)-1;
    int rc = g4_model_chat_form(m, &form);
    if (want_ok) CHECK(rc == 0 && form == want, "%s: form %d (rc %d: %s), want %d", what, (int)form, rc, g4_last_error(), (int)want);
    else CHECK(rc == -1 && one_line(g4_last_error()) && strstr(g4_last_error(), "tokenizer_config.json"), "%s: %s", what, g4_last_error());
    g4_model_free(m);
}

/* The thinking-off generation prompt of the 26B/31B template (spec C.2), in a template of our own. */
static const char GEN_PROMPT_26B[] =
    "{{- bos_token -}}{%- for m in messages -%}{{- '<|turn>' + m['role'] + '\\n' + m['content'] | trim + '<turn|>\\n' -}}{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|turn>model\\n' -}}\n"
    "{%- if not enable_thinking | default(false) -%}{{- '<|channel>thought\\n<channel|>' -}}{%- endif -%}{%- endif -%}\n";

static void test_chat_form(void) {
    expect_form(TINY_MATH, 1, G4_CHAT_FORM_E2B, "the built-in model's E2B template");
    expect_form(model_with("t26", GEN_PROMPT_26B, NULL), 1, G4_CHAT_FORM_26B, "a 26B template");
    char *cfg = NULL;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "chat_template", GEN_PROMPT_26B);
    cfg = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    expect_form(model_with("cfg26", NULL, cfg), 1, G4_CHAT_FORM_26B, "a 26B template in tokenizer_config.json");
    free(cfg);
    expect_form(model_with("none", NULL, "{\"bos_token\": \"<bos>\"}"), 1, G4_CHAT_FORM_E2B,
                "no template: the family of a model with per-layer embeddings");
    expect_form(model_with("broken", NULL, "{\"chat_template\": "), 0, G4_CHAT_FORM_E2B, "a broken tokenizer_config.json");
}

/* ---------------------------------------------------------------- spans, and a reference splitter */

enum { MAX_PIECES = 4096, MAX_TEXT = 1 << 17 };

/* Text split into spans, adjacent text of one span joined. */
typedef struct {
    int span[MAX_PIECES];
    size_t start[MAX_PIECES];
    int n;
    char buf[MAX_TEXT];
    size_t len;
} pieces_t;

static void pieces_add(pieces_t *p, int span, const char *s, size_t n) {
    if (n == 0 || p->len + n > MAX_TEXT || p->n == MAX_PIECES) return;
    if (!p->n || p->span[p->n - 1] != span) p->span[p->n] = span, p->start[p->n] = p->len, p->n++;
    memcpy(p->buf + p->len, s, n);
    p->len += n;
}

static int pieces_equal(const pieces_t *a, const pieces_t *b) {
    return a->n == b->n && a->len == b->len && memcmp(a->span, b->span, sizeof *a->span * (size_t)a->n) == 0 &&
           memcmp(a->start, b->start, sizeof *a->start * (size_t)a->n) == 0 && memcmp(a->buf, b->buf, a->len) == 0;
}

static void pieces_print(const char *label, const pieces_t *p) {
    fprintf(stderr, "  %s:", label);
    for (int i = 0; i < p->n && i < 12; i++) {
        size_t end = i + 1 < p->n ? p->start[i + 1] : p->len;
        fprintf(stderr, " %c\"%.*s\"", "ATC"[p->span[i]], (int)(end - p->start[i] > 60 ? 60 : end - p->start[i]), p->buf + p->start[i]);
    }
    fputc('\n', stderr);
}

static int at(const char *s, size_t n, size_t i, const char *lit) {
    size_t k = strlen(lit);
    return i + k <= n && memcmp(s + i, lit, k) == 0;
}

/* The span rules of g4.h on a whole text, one byte at a time: no streaming, nothing held back. */
static void reference_split(const char *s, size_t n, int starts_in_thought, pieces_t *out) {
    enum { ANSWER, HEADER, THOUGHT, CALL } st = starts_in_thought ? THOUGHT : ANSWER;
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < n;) {
        if (st == ANSWER) {
            if (at(s, n, i, "<|channel>")) i += 10, st = HEADER;
            else if (at(s, n, i, "<channel|>")) i += 10;
            else if (at(s, n, i, "<|tool_call>")) pieces_add(out, G4_SPAN_TOOL_CALL, s + i, 12), i += 12, st = CALL;
            else pieces_add(out, G4_SPAN_ANSWER, s + i, 1), i++;
        } else if (st == HEADER) {
            if (at(s, n, i, "thought\n")) i += 8;
            st = THOUGHT;
        } else if (st == THOUGHT) {
            if (at(s, n, i, "<|channel>")) i += 10;
            else if (at(s, n, i, "<channel|>")) i += 10, st = ANSWER;
            else pieces_add(out, G4_SPAN_THOUGHT, s + i, 1), i++;
        } else {
            if (at(s, n, i, "<tool_call|>")) pieces_add(out, G4_SPAN_TOOL_CALL, s + i, 12), i += 12, st = ANSWER;
            else pieces_add(out, G4_SPAN_TOOL_CALL, s + i, 1), i++;
        }
    }
}

static pieces_t got_pieces, want_pieces;

/* The streaming splitter fed in pushes of `chunk` bytes (0: all at once). */
static void stream_split(const char *s, size_t n, int starts_in_thought, size_t chunk, pieces_t *out) {
    memset(out, 0, sizeof *out);
    g4_spans *sp = g4_spans_new(starts_in_thought, 1);
    const g4_span_text *pc;
    int np;
    for (size_t i = 0; sp && i < n; i += chunk ? chunk : n) {
        size_t k = chunk && n - i > chunk ? chunk : n - i;
        CHECK(g4_spans_push(sp, s + i, k, &pc, &np) == 0, "push");
        for (int j = 0; j < np; j++) pieces_add(out, pc[j].span, pc[j].text, pc[j].len);
    }
    CHECK(sp && g4_spans_finish(sp, "", 0, &pc, &np) == 0, "finish");
    for (int j = 0; sp && j < np; j++) pieces_add(out, pc[j].span, pc[j].text, pc[j].len);
    g4_spans_free(sp);
}

struct span_case {
    const char *text;
    int starts_in_thought;
    const char *want[4]; /* "A|...", "T|...", "C|..." in order */
};

static const struct span_case span_cases[] = {
    {"<|channel>thought\nLet me think.<channel|>The answer is 4.", 0, {"T|Let me think.", "A|The answer is 4."}},
    {"I'll check.<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>", 0,
     {"A|I'll check.", "C|<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>"}},
    {"<|channel>thought\nneed both<channel|><|tool_call>call:f{}<tool_call|><|tool_call>call:g{x:1}<tool_call|>", 0,
     {"T|need both", "C|<|tool_call>call:f{}<tool_call|><|tool_call>call:g{x:1}<tool_call|>"}},
    {"reasoning<channel|>answer", 1, {"T|reasoning", "A|answer"}},
    {"a <tool_call|>b<channel|>c", 0, {"A|a <tool_call|>bc"}},
    {"<|tool_call>call:f{s:<|\"|><|channel><|\"|>}<tool_call|>x", 0, {"C|<|tool_call>call:f{s:<|\"|><|channel><|\"|>}<tool_call|>", "A|x"}},
    {"<|tool_call>call:f{a:1", 0, {"C|<|tool_call>call:f{a:1"}},
    {"x < y <|tool", 0, {"A|x < y <|tool"}},
    {"<|channel>thought\nhmm <|tool_call>call:f{}<tool_call|> no<channel|>ok", 0, {"T|hmm <|tool_call>call:f{}<tool_call|> no", "A|ok"}},
    {"<|channel><channel|>ok", 0, {"A|ok"}},
    {"<|channel>thought\nstill", 0, {"T|still"}},
};

static void expected_pieces(const struct span_case *c, pieces_t *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < 4 && c->want[i]; i++)
        pieces_add(out, c->want[i][0] == 'A' ? G4_SPAN_ANSWER : c->want[i][0] == 'T' ? G4_SPAN_THOUGHT : G4_SPAN_TOOL_CALL, c->want[i] + 2,
                   strlen(c->want[i] + 2));
}

static pieces_t ref_pieces;

static void test_span_cases(void) {
    for (size_t i = 0; i < sizeof span_cases / sizeof *span_cases; i++) {
        const struct span_case *c = &span_cases[i];
        size_t n = strlen(c->text);
        expected_pieces(c, &want_pieces);
        reference_split(c->text, n, c->starts_in_thought, &ref_pieces);
        CHECK(pieces_equal(&ref_pieces, &want_pieces), "span case %zu: the reference splitter disagrees", i);
        for (size_t chunk = 0; chunk <= 7; chunk++) {
            stream_split(c->text, n, c->starts_in_thought, chunk, &got_pieces);
            int ok = pieces_equal(&got_pieces, &want_pieces);
            CHECK(ok, "span case %zu \"%s\" in pushes of %zu bytes", i, c->text, chunk);
            if (!ok) pieces_print("got", &got_pieces), pieces_print("want", &want_pieces);
        }
    }
    /* whole replies: the tool calls listed with their names and arguments */
    g4_chat_reply r;
    const char *two = span_cases[2].text;
    CHECK(g4_chat_parse_reply(two, strlen(two), &r) == 0 && r.n_tool_calls == 2 && !r.tool_call_unclosed &&
              !strcmp(r.tool_calls[0].name, "f") && !strcmp(r.tool_calls[0].arguments, "{}") && !strcmp(r.tool_calls[1].name, "g") &&
              !strcmp(r.tool_calls[1].arguments, "{x:1}") && !strcmp(r.thinking, "need both") && !strcmp(r.answer, ""),
          "parse_reply: two calls (%d)", r.n_tool_calls);
    g4_chat_reply_free(&r);
    const char *one = span_cases[1].text;
    CHECK(g4_chat_parse_reply(one, strlen(one), &r) == 0 && r.n_tool_calls == 1 && !strcmp(r.tool_calls[0].name, "get_weather") &&
              !strcmp(r.tool_calls[0].arguments, "{city:<|\"|>Paris<|\"|>}") && !strcmp(r.answer, "I'll check."),
          "parse_reply: one call with text");
    g4_chat_reply_free(&r);
    CHECK(g4_chat_parse_reply("<|tool_call>call:f{a:1", 21, &r) == 0 && r.n_tool_calls == 0 && r.tool_call_unclosed, "unclosed call");
    g4_chat_reply_free(&r);
    const char *odd = "<|tool_call>oops<tool_call|> done";
    CHECK(g4_chat_parse_reply(odd, strlen(odd), &r) == 0 && r.n_tool_calls == 1 && !strcmp(r.tool_calls[0].name, "") &&
              !strcmp(r.tool_calls[0].arguments, "oops") && !strcmp(r.answer, "done"),
          "a call of another shape");
    g4_chat_reply_free(&r);
}

/* ---------------------------------------------------------------- streaming */

/* What the deltas of one reply gave. */
typedef struct {
    char text[MAX_TEXT];
    size_t len;
    int tokens, last_deltas, after_last, bad_utf8;
    pieces_t pieces;
} stream_log;

static int log_delta(void *user, const g4_reply_delta *d) {
    stream_log *l = user;
    l->after_last += l->last_deltas > 0;
    if (d->token < 0) l->last_deltas++;
    else l->tokens++;
    l->bad_utf8 += !valid_utf8(d->text, d->len);
    for (int i = 0; i < d->n_spans; i++) {
        l->bad_utf8 += !valid_utf8(d->spans[i].text, d->spans[i].len);
        pieces_add(&l->pieces, d->spans[i].span, d->spans[i].text, d->spans[i].len);
    }
    if (l->len + d->len <= MAX_TEXT) memcpy(l->text + l->len, d->text, d->len), l->len += d->len;
    return 0;
}

static int is_model_stop(const g4_model *m, int32_t id) {
    const int *stops;
    int n = g4_model_stop_ids(m, &stops);
    for (int i = 0; i < n; i++)
        if (stops[i] == id) return 1;
    return 0;
}

static stream_log slog;

/* One reply's deltas against the reply's tokens: whole UTF-8 every one, the last delta last and
 * once, their text the tokenizer's decode of the tokens (stop ids aside), their spans the
 * reference splitter's on that text. */
static void check_stream(const g4_conversation *c, const g4_tokenizer *tok, const g4_model *m, int starts_in_thought, const char *what) {
    int n;
    const int32_t *gen = g4_conversation_reply_tokens(c, &n);
    int32_t *kept = malloc(sizeof *kept * (size_t)(n ? n : 1));
    size_t nk = 0;
    for (int i = 0; i < n; i++)
        if (!is_model_stop(m, gen[i])) kept[nk++] = gen[i];
    char *dec = NULL;
    size_t dec_len = 0;
    CHECK(g4_tokenizer_decode(tok, kept, nk, &dec, &dec_len) == 0, "%s: decode", what);
    CHECK(slog.bad_utf8 == 0, "%s: %d deltas or spans are not whole UTF-8", what, slog.bad_utf8);
    CHECK(slog.tokens == n && slog.last_deltas == 1 && slog.after_last == 0, "%s: %d token deltas for %d tokens, %d last deltas", what,
          slog.tokens, n, slog.last_deltas);
    CHECK(dec && slog.len == dec_len && memcmp(slog.text, dec, dec_len) == 0, "%s: the deltas (%zu bytes) are not the decode (%zu bytes)",
          what, slog.len, dec_len);
    size_t tl;
    const char *t = g4_conversation_reply_text(c, &tl);
    CHECK(dec && tl == dec_len && memcmp(t, dec, dec_len) == 0, "%s: g4_conversation_reply_text is not the decode", what);
    if (dec) reference_split(dec, dec_len, starts_in_thought, &ref_pieces);
    int ok = dec && pieces_equal(&slog.pieces, &ref_pieces);
    CHECK(ok, "%s: the streamed spans differ from the reference splitter's", what);
    if (!ok) pieces_print("streamed", &slog.pieces), pieces_print("reference", &ref_pieces);
    free(dec), free(kept);
}

/* A random model sampled hot writes byte tokens (split UTF-8), markers and stray closers. */
static void test_streaming(void) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/random", tmp);
    CHECK(g4_synth("tiny", dir, 7, NULL) == 0, "synth: %s", g4_last_error());
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    g4_model *m = g4_model_load(dir);
    g4_tokenizer *tok = load_tokenizer(path);
    g4_options o;
    g4_options_default(&o);
    o.ctx = 2048;
    g4_session *s = m ? g4_session_new(m, &o) : NULL;
    CHECK(s != NULL, "%s", g4_last_error());
    if (!s || !tok) goto done;
    static const int no_stop[1] = {-1};
    g4_conversation_options co;
    CHECK(g4_conversation_default_options(s, &co) == 0, "%s", g4_last_error());
    co.gen.sampling.temperature = 2.0f, co.gen.sampling.top_k = 0, co.gen.sampling.top_p = 1.0f, co.gen.sampling.seed = 11;
    co.gen.max_tokens = 400;
    co.gen.stop_ids = no_stop, co.gen.n_stop_ids = 1;
    g4_conversation *c = g4_conversation_new(s, tok, &co);
    CHECK(c != NULL, "%s", g4_last_error());
    if (!c) goto done;
    int byte_tokens = 0, markers = 0, multibyte = 0;
    for (int turn = 0; turn < 2; turn++) {
        memset(&slog, 0, sizeof slog);
        CHECK(g4_conversation_add(c, G4_CHAT_USER, turn ? "and then?" : "hello") == 0 &&
                  g4_conversation_reply(c, log_delta, &slog, NULL) == 0,
              "turn %d: %s", turn, g4_last_error());
        check_stream(c, tok, m, 0, turn ? "random model, turn 2" : "random model, turn 1");
        int n;
        const int32_t *gen = g4_conversation_reply_tokens(c, &n);
        for (int i = 0; i < n; i++) byte_tokens += gen[i] >= 238 && gen[i] < 494, markers += gen[i] == 48 || gen[i] == 100 || gen[i] == 101;
        for (size_t i = 0; i < slog.len; i++) multibyte += (unsigned char)slog.text[i] >= 0xC0;
    }
    CHECK(byte_tokens >= 50 && multibyte >= 5, "the random replies held %d byte tokens, %d multi-byte characters: too few to test", byte_tokens,
          multibyte);
    printf("ok streaming: %d byte tokens, %d multi-byte characters, %d span markers in two random replies\n", byte_tokens, multibyte, markers);

    /* a tool's response with thinking on: the prompt opens a thought, the reply starts in it */
    g4_chat_options think = co.chat;
    think.thinking = 1;
    memset(&slog, 0, sizeof slog);
    int rc = g4_conversation_reset(c, &think) || g4_conversation_add(c, G4_CHAT_USER, "weather?") ||
             g4_conversation_add(c, G4_CHAT_MODEL, "<|tool_call>call:w{}<tool_call|>") || g4_conversation_add(c, G4_CHAT_TOOL, "rain") ||
             g4_conversation_reply(c, log_delta, &slog, NULL);
    CHECK(rc == 0, "tool response, thinking on: %s", g4_last_error());
    const g4_chat_message *msgs;
    size_t nm;
    g4_conversation_messages(c, &msgs, &nm);
    CHECK(nm == 4 && msgs[3].role == G4_CHAT_MODEL && !strncmp(msgs[3].content, "<|channel>thought\n", 18),
          "the reply's message opens with the prompt's thought");
    if (rc == 0) check_stream(c, tok, m, 1, "random model after a tool response, thinking on");
    g4_conversation_free(c);
done:
    g4_session_free(s);
    g4_tokenizer_free(tok);
    g4_model_free(m);
}

/* ---------------------------------------------------------------- continuation on the built-in model */

typedef struct {
    int32_t ids[512];
    int n;
} collected;

static int collect(void *user, int32_t t) {
    collected *c = user;
    if (c->n < 512) c->ids[c->n++] = t;
    return 0;
}

static void test_continuation(void) {
    g4_model *m = g4_model_load(TINY_MATH);
    g4_tokenizer *tok = load_tokenizer(TINY_MATH "/tokenizer.json");
    g4_options o;
    g4_options_default(&o);
    o.ctx = 1024;
    g4_session *s = m ? g4_session_new(m, &o) : NULL, *fresh = m ? g4_session_new(m, &o) : NULL;
    CHECK(s && fresh && tok, "%s", g4_last_error());
    char *q1 = NULL, *q2 = g4_gsm8k_prompt("Tom has 12 shells. He finds 30 shells. How many shells does Tom have at the end?");
    size_t len;
    CHECK(g4_read_file(TINY_MATH "/example_prompt.txt", &q1, &len) == 0, "example prompt");
    g4_conversation *c = NULL;
    g4_conversation_options co;
    if (s && fresh && tok && q1 && q2 && g4_conversation_default_options(s, &co) == 0) {
        g4_sampling_default(&co.gen.sampling);
        co.gen.max_tokens = 256;
        c = g4_conversation_new(s, tok, &co);
    }
    CHECK(c != NULL, "%s", g4_last_error());
    if (!c) goto done;
    CHECK(co.chat.form == G4_CHAT_FORM_E2B, "the built-in model's form");
    g4_generate_result r1, r2;
    memset(&slog, 0, sizeof slog);
    int rc = g4_conversation_add(c, G4_CHAT_USER, q1) || g4_conversation_reply(c, log_delta, &slog, &r1);
    CHECK(rc == 0 && r1.stop == G4_STOP_EOS, "turn 1: %s (stop %d)", g4_last_error(), (int)r1.stop);
    if (rc) goto done;
    check_stream(c, tok, m, 0, "built-in model, turn 1");
    CHECK(strstr(g4_conversation_reply_text(c, NULL), "The final answer is 890") != NULL, "turn 1 (the README's example): %s",
          g4_conversation_reply_text(c, NULL));
    int n1;
    const int32_t *g1 = g4_conversation_reply_tokens(c, &n1);
    int32_t last1 = g1[n1 - 1];
    /* the reply encodes back to its own tokens: the condition for the equality below */
    int32_t *re = NULL;
    size_t n_re = 0;
    const char *t1 = g4_conversation_reply_text(c, &len);
    CHECK(g4_tokenizer_encode(tok, t1, len, 1, &re, &n_re) == 0 && ids_equal(re, n_re, g1, (size_t)n1 - 1),
          "turn 1's text does not encode back to its tokens");
    free(re);

    const int32_t *p2;
    size_t np2;
    rc = g4_conversation_add(c, G4_CHAT_USER, q2) || g4_conversation_prompt(c, &p2, &np2);
    CHECK(rc == 0 && np2 > 3 && p2[0] == last1, "turn 2 starts with turn 1's last token, never fed back");
    int pos_before = g4_session_seq_pos(s, 0);
    memset(&slog, 0, sizeof slog);
    rc = rc || g4_conversation_reply(c, log_delta, &slog, &r2);
    CHECK(rc == 0 && r2.n_prompt == (int)np2, "turn 2: %s", g4_last_error());
    if (rc) goto done;
    CHECK(g4_session_seq_pos(s, 0) == pos_before + r2.n_prompt + r2.n_generated - 1, "turn 2 fed only its new tokens");
    check_stream(c, tok, m, 0, "built-in model, turn 2");

    /* the whole history rendered from scratch: the very tokens the conversation fed */
    const g4_chat_message *msgs;
    size_t nm, nt;
    g4_conversation_messages(c, &msgs, &nm);
    g4_chat_options chat = g4_chat_default_options();
    int32_t *scratch = NULL;
    size_t ns = 0;
    int n2;
    const int32_t *g2 = g4_conversation_reply_tokens(c, &n2);
    const int32_t *all = g4_conversation_tokens(c, &nt);
    CHECK(nm == 4 && g4_chat_encode(tok, msgs, 3, &chat, &scratch, &ns) == 0, "history: %zu messages", nm);
    int same = scratch && nt == ns + (size_t)n2 && ids_equal(all, ns, scratch, ns) && ids_equal(all + ns, (size_t)n2, g2, (size_t)n2);
    CHECK(same, "the continued conversation fed other tokens than its history rendered from scratch");
    if (!same && scratch) print_ids("continued", all, nt), print_ids("from scratch", scratch, ns);

    /* ... and a fresh session given that history answers as the continued conversation did */
    collected fresh_gen = {{0}, 0};
    g4_generate_params gp = co.gen;
    g4_generate_result rf;
    CHECK(scratch && g4_generate(fresh, scratch, (int)ns, &gp, collect, &fresh_gen, &rf) == 0 &&
              ids_equal(fresh_gen.ids, (size_t)fresh_gen.n, g2, (size_t)n2),
          "turn 2's answer differs from a fresh session's answer to the history rendered from scratch");
    printf("ok continuation: turn 2 fed %zu new tokens and answered \"%s\" as the history from scratch does\n", np2,
           strstr(g4_conversation_reply_text(c, NULL), "The final") ? strstr(g4_conversation_reply_text(c, NULL), "The final") : "?");
    free(scratch);
done:
    g4_conversation_free(c);
    free(q1), free(q2);
    g4_session_free(s), g4_session_free(fresh);
    g4_tokenizer_free(tok);
    g4_model_free(m);
}

/* ---------------------------------------------------------------- bad input */

static void expect_error(int rc, const char *needle, const char *what) {
    const char *e = g4_last_error();
    CHECK(rc < 0 && one_line(e) && strstr(e, needle), "%s: rc %d, error \"%s\" (want one line with \"%s\")", what, rc, e, needle);
}

static void test_errors(void) {
    g4_model *m = g4_model_load(TINY_MATH);
    g4_tokenizer *tok = load_tokenizer(TINY_MATH "/tokenizer.json");
    g4_options o;
    g4_options_default(&o);
    o.ctx = 96;
    g4_session *s = m ? g4_session_new(m, &o) : NULL;
    CHECK(s && tok, "%s", g4_last_error());
    if (!s || !tok) goto done;
    g4_conversation_options co;
    CHECK(g4_conversation_default_options(s, &co) == 0, "%s", g4_last_error());
    g4_sampling_default(&co.gen.sampling);
    co.seq = 3;
    CHECK(g4_conversation_new(s, tok, &co) == NULL && strstr(g4_last_error(), "seq 3") && one_line(g4_last_error()), "seq 3: %s",
          g4_last_error());
    co.seq = 0;
    co.chat.form = (g4_chat_form)9;
    CHECK(g4_conversation_new(s, tok, &co) == NULL && strstr(g4_last_error(), "form"), "bad form: %s", g4_last_error());
    co.chat.form = G4_CHAT_FORM_E2B;
    g4_conversation *c = g4_conversation_new(s, tok, &co);
    CHECK(c != NULL, "%s", g4_last_error());
    if (!c) goto done;
    const g4_chat_message *msgs;
    size_t nm;
    expect_error(g4_conversation_add(c, (g4_chat_role)9, "x"), "unknown role", "an unknown role");
    expect_error(g4_conversation_add(c, G4_CHAT_USER, "caf\xC3"), "not valid UTF-8 (byte 3)", "a cut-off character");
    expect_error(g4_conversation_add(c, G4_CHAT_USER, "ok \xED\xA0\x80"), "not valid UTF-8 (byte 3)", "a surrogate");
    expect_error(g4_conversation_add(c, G4_CHAT_TOOL, "sunny"), "does not follow a model message with a tool call", "a stray tool message");
    expect_error(g4_conversation_reply(c, NULL, NULL, NULL), "nothing to reply to", "a reply to nothing");
    g4_conversation_messages(c, &msgs, &nm);
    CHECK(nm == 0, "refused messages were kept (%zu)", nm);
    CHECK(g4_conversation_add(c, G4_CHAT_MODEL, "<|tool_call>call:f{}<tool_call|>") == 0 && g4_conversation_add(c, G4_CHAT_TOOL, "1") == 0,
          "%s", g4_last_error());
    expect_error(g4_conversation_add(c, G4_CHAT_TOOL, "2"), "answers no call", "a second response to one call");
    expect_error(g4_conversation_add_tokens(c, (const int32_t[]){2}, 1), "takes no raw tokens", "raw tokens after messages");
    g4_conversation_discard(c);

    /* past the context: refused before anything is fed, the conversation unchanged */
    char longq[2048] = "";
    for (int i = 0; i < 60; i++) strcat(longq, "Leo has 785 apples. ");
    CHECK(g4_conversation_add(c, G4_CHAT_USER, longq) == 0, "%s", g4_last_error());
    expect_error(g4_conversation_reply(c, NULL, NULL, NULL), "does not fit the context", "a prompt past the context");
    CHECK(g4_session_seq_pos(s, 0) == 0, "a refused prompt was fed (%d tokens)", g4_session_seq_pos(s, 0));
    g4_conversation_discard(c);
    g4_conversation_messages(c, &msgs, &nm);
    CHECK(nm == 0, "discard left %zu messages", nm);
    /* a conversation that fills the context: its reply stops there, the next turn is refused */
    g4_generate_result r;
    int rc = g4_conversation_add(c, G4_CHAT_USER, "Lily has 149 coins. Lily doubles the number of coins.") ||
             g4_conversation_reply(c, NULL, NULL, &r);
    CHECK(rc == 0, "%s", g4_last_error());
    int turns = 1;
    while (rc == 0 && turns < 10) {
        rc = g4_conversation_add(c, G4_CHAT_USER, "And then?") || g4_conversation_reply(c, NULL, NULL, &r);
        turns++;
    }
    expect_error(rc ? -1 : 0, "does not fit the context", "a turn past the context");
    CHECK(g4_session_seq_pos(s, 0) <= o.ctx, "the sequence holds %d tokens, the context %d", g4_session_seq_pos(s, 0), o.ctx);

    /* a conversation of raw tokens takes no messages */
    CHECK(g4_conversation_reset(c, NULL) == 0 && g4_session_seq_pos(s, 0) == 0, "reset");
    CHECK(g4_conversation_add_tokens(c, (const int32_t[]){2, 5}, 2) == 0, "%s", g4_last_error());
    expect_error(g4_conversation_add(c, G4_CHAT_USER, "hi"), "takes no messages", "a message in a raw conversation");
    g4_chat_options bad = co.chat;
    bad.form = (g4_chat_form)5;
    expect_error(g4_conversation_reset(c, &bad), "form", "reset with a bad form");
    g4_conversation_free(c);
done:
    g4_session_free(s);
    g4_tokenizer_free(tok);
    g4_model_free(m);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/g4-conv-XXXXXX");
    if (!mkdtemp(tmp)) return 2;
    char path[512];
    snprintf(path, sizeof path, "%s/data/tokenizers/gemma4/tokenizer.json", check_shared_dir());
    g4_tokenizer *gemma = load_tokenizer(path);
    if (gemma) test_template_cases(gemma);
    g4_tokenizer_free(gemma);
    test_chat_form();
    test_span_cases();
    test_streaming();
    test_continuation();
    test_errors();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return check_report("conversation");
}
