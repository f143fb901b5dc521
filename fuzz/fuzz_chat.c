/* Fuzz target: chat rendering and reply parsing (src/text/chat.h).
 *
 * Input: one flag byte, then messages separated by NUL bytes, each "<role>\n<content>".
 * The role goes through g4_chat_role_parse; an unknown name picks system/user/model from
 * its length. At most 16 messages. Per input:
 *   - g4_chat_render with all 16 option combinations (form x thinking x generation prompt x
 *     BOS): it fails exactly when a tool message answers no tool call of the model message
 *     before it; the BOS prefix and the end (generation prompt, or what tool calls leave) are
 *     checked, and when no content has '<' or surrounding whitespace (nothing to trim or strip,
 *     no tool calls) the whole text is compared with a plain concatenation of the template (an
 *     independent oracle);
 *   - g4_chat_encode with the Gemma 4 tokenizer for 4 combinations: with no '<' in any
 *     content, the ids must equal encoding the rendered text with parse_special=1;
 *   - on the bytes after the flag byte (NULs included): g4_chat_strip_thinking,
 *     g4_chat_parse_reply, and the streaming thought filter fed in chunks (sizes from the
 *     flag byte) must give exactly what one push gives. */
#include "text/chat.h"
#include "g4.h"
#include "util/err.h"

#include "fuzz_common.h"

static g4_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g4_set_log(NULL, NULL);
    tok = fz_load_gemma_tokenizer();
    return 0;
}

#define MAX_MSGS 16

struct text {
    char *p;
    size_t n;
};

static void text_add(struct text *t, const char *s, size_t n) {
    t->p = realloc(t->p, t->n + n + 1);
    if (!t->p) abort();
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
}

static void text_adds(struct text *t, const char *s) { text_add(t, s, strlen(s)); }

/* Nothing for the template to trim or strip: no '<', and no ASCII space or non-ASCII byte
 * at either end (Python's whitespace set includes some non-ASCII characters). */
static int plain_content(const char *c) {
    size_t n = strlen(c);
    if (strchr(c, '<')) return 0;
    if (n == 0) return 1;
    unsigned char a = (unsigned char)c[0], z = (unsigned char)c[n - 1];
    int ws_a = (a >= 0x09 && a <= 0x0D) || (a >= 0x1C && a <= 0x20) || a >= 0x80;
    int ws_z = (z >= 0x09 && z <= 0x0D) || (z >= 0x1C && z <= 0x20) || z >= 0x80;
    return !ws_a && !ws_z;
}

static const char *role_text(g4_chat_role r) {
    return r == G4_CHAT_SYSTEM ? "system" : r == G4_CHAT_USER ? "user" : r == G4_CHAT_MODEL ? "model" : "tool";
}

/* Complete "<|tool_call>...<tool_call|>" spans in a content, one after another. */
static size_t calls_in(const char *c) {
    size_t n = 0;
    const char *p = c, *open, *close;
    while ((open = strstr(p, "<|tool_call>")) && (close = strstr(open + 12, "<tool_call|>"))) n++, p = close + 12;
    return n;
}

/* Whether every tool message answers a call of the model message before it (in order). */
static int tools_valid(const g4_chat_message *m, size_t n) {
    size_t calls = 0, answered = 0;
    for (size_t i = 0; i < n; i++) {
        if (m[i].role != G4_CHAT_TOOL) calls = m[i].role == G4_CHAT_MODEL ? calls_in(m[i].content) : 0, answered = 0;
        else if (++answered > calls) return 0;
    }
    return 1;
}

/* The template, written out for contents that need no trimming or thought stripping and hold
 * no tool calls (so no tool messages either): a model message right after another continues its
 * turn. */
static void oracle(const g4_chat_message *m, size_t n, const g4_chat_options *o, struct text *t) {
    if (o->add_bos) text_adds(t, "<bos>");
    size_t first = 0;
    int has_system = n > 0 && m[0].role == G4_CHAT_SYSTEM;
    if (o->thinking || has_system) {
        text_adds(t, "<|turn>system\n");
        if (o->thinking) text_adds(t, "<|think|>\n");
        if (has_system) text_adds(t, m[0].content), first = 1;
        text_adds(t, "<turn|>\n");
    }
    for (size_t i = first; i < n; i++) {
        int model = m[i].role == G4_CHAT_MODEL;
        if (!(model && i > first && m[i - 1].role == G4_CHAT_MODEL)) {
            text_adds(t, "<|turn>");
            text_adds(t, role_text(m[i].role));
            text_adds(t, "\n");
        }
        text_adds(t, m[i].content);
        if (!(model && i + 1 < n && m[i + 1].role == G4_CHAT_MODEL)) text_adds(t, "<turn|>\n");
    }
    if (o->add_generation_prompt) {
        text_adds(t, "<|turn>model\n");
        if (o->form == G4_CHAT_FORM_26B && !o->thinking) text_adds(t, "<|channel>thought\n<channel|>");
    }
    if (!t->p) text_add(t, "", 0);
}

static int ends_with(const char *s, size_t n, const char *suf) {
    size_t k = strlen(suf);
    return n >= k && memcmp(s + n - k, suf, k) == 0;
}

/* Whether a model message's content is its tool calls and nothing else. */
static int only_calls(const char *c) {
    const char *open, *close;
    while (*c && (open = strstr(c, "<|tool_call>")) == c && (close = strstr(open + 12, "<tool_call|>"))) c = close + 12;
    return *c == 0;
}

/* What a valid rendering ends with: the generation prompt, or nothing after tool responses
 * (thinking: an opened thought), or "<|tool_response>" after calls nobody answered. NULL where
 * the model message before the responses has text of its own (not checked). */
static const char *expected_end(const g4_chat_message *m, size_t n, const g4_chat_options *o) {
    if (n && m[n - 1].role == G4_CHAT_TOOL) {
        size_t k = n - 1;
        while (m[k].role == G4_CHAT_TOOL) k--; /* tools_valid: a model message is there */
        if (!only_calls(m[k].content)) return NULL;
        return o->thinking && o->add_generation_prompt ? "<tool_response|><|channel>thought\n" : "<tool_response|>";
    }
    if (n && m[n - 1].role == G4_CHAT_MODEL && calls_in(m[n - 1].content)) return "<|tool_response>";
    if (!o->add_generation_prompt) return "";
    return o->form == G4_CHAT_FORM_26B && !o->thinking ? "<|turn>model\n<|channel>thought\n<channel|>" : "<|turn>model\n";
}

static void check_render(const g4_chat_message *m, size_t n, int all_plain) {
    int valid = tools_valid(m, n);
    for (int combo = 0; combo < 16; combo++) {
        g4_chat_options o = g4_chat_default_options();
        o.form = combo & 1 ? G4_CHAT_FORM_26B : G4_CHAT_FORM_E2B;
        o.thinking = combo >> 1 & 1;
        o.add_generation_prompt = combo >> 2 & 1;
        o.add_bos = combo >> 3 & 1;
        char *out = NULL;
        size_t out_n = 0;
        int rc = g4_chat_render(m, n, &o, &out, &out_n);
        if (!valid) {
            FZ_CHECK(rc != 0 && out == NULL && strstr(g4_last_error(), "(tool)"), "a tool message answering no call: %s",
                     rc ? g4_last_error() : "accepted");
            continue;
        }
        FZ_CHECK(rc == 0, "render failed: %s", g4_last_error());
        FZ_CHECK(out && out[out_n] == 0 && strlen(out) == out_n, "render output length/termination");
        FZ_CHECK(o.add_bos == (out_n >= 5 && memcmp(out, "<bos>", 5) == 0), "BOS prefix (combo %d)", combo);
        const char *end = expected_end(m, n, &o);
        FZ_CHECK(!end || ends_with(out, out_n, end), "the end of the rendering (combo %d)", combo);
        if (all_plain) {
            struct text want = {0};
            oracle(m, n, &o, &want);
            FZ_CHECK(want.n == out_n && memcmp(want.p, out, out_n) == 0, "render differs from the template (combo %d)",
                     combo);
            free(want.p);
        }
        /* g4_chat_encode on a few combinations (it runs the tokenizer per template part). */
        if ((combo & 5) == 4) {
            int32_t *ids = NULL;
            size_t n_ids = 0;
            FZ_CHECK(g4_chat_encode(tok, m, n, &o, &ids, &n_ids) == 0, "chat_encode failed: %s", g4_last_error());
            FZ_CHECK(ids != NULL, "chat_encode gave NULL ids");
            if (all_plain) {
                int32_t *ref = NULL;
                size_t n_ref = 0;
                FZ_CHECK(g4_tokenizer_encode(tok, out, out_n, 1, &ref, &n_ref) == 0, "encode failed");
                FZ_CHECK(n_ref == n_ids && memcmp(ref, ids, n_ids * sizeof *ids) == 0,
                         "chat_encode ids differ from encode(render) (combo %d): %zu vs %zu ids", combo, n_ids, n_ref);
                free(ref);
            }
            free(ids);
        }
        free(out);
    }
}

/* One push of everything vs pushes of sizes drawn from `seed`: same answer, thought, blocks. */
static void check_filter(const char *s, size_t n, int starts_in_thought, unsigned seed) {
    struct text ans[2] = {{0}}, th[2] = {{0}};
    int blocks[2], in_thought[2];
    for (int mode = 0; mode < 2; mode++) {
        g4_thought_filter *f = g4_thought_filter_new(starts_in_thought);
        FZ_CHECK(f != NULL, "thought_filter_new");
        unsigned x = seed * 2654435761u + 1;
        for (size_t at = 0; at < n || (at == 0 && n == 0);) {
            size_t take = n - at;
            if (mode == 1) {
                x = x * 1103515245u + 12345u;
                size_t c = (x >> 16) % 13; /* 0..12 bytes: empty pushes too */
                if (c < take) take = c;
            }
            const char *a, *t;
            size_t an, tn;
            FZ_CHECK(g4_thought_filter_push(f, s + at, take, &a, &an, &t, &tn) == 0, "push failed");
            text_add(&ans[mode], a, an);
            text_add(&th[mode], t, tn);
            at += take;
            if (n == 0) break;
        }
        const char *a, *t;
        size_t an, tn;
        FZ_CHECK(g4_thought_filter_finish(f, &a, &an, &t, &tn) == 0, "finish failed");
        text_add(&ans[mode], a, an);
        text_add(&th[mode], t, tn);
        blocks[mode] = g4_thought_filter_blocks(f);
        in_thought[mode] = g4_thought_filter_in_thought(f);
        g4_thought_filter_free(f);
    }
    FZ_CHECK(ans[0].n == ans[1].n && memcmp(ans[0].p, ans[1].p, ans[0].n) == 0,
             "chunked answer differs from one push (%zu vs %zu bytes)", ans[1].n, ans[0].n);
    FZ_CHECK(th[0].n == th[1].n && memcmp(th[0].p, th[1].p, th[0].n) == 0,
             "chunked thought differs from one push (%zu vs %zu bytes)", th[1].n, th[0].n);
    FZ_CHECK(blocks[0] == blocks[1] && in_thought[0] == in_thought[1], "chunked blocks/state differ");
    FZ_CHECK(ans[0].n + th[0].n <= n, "filter output longer than its input");
    for (int i = 0; i < 2; i++) free(ans[i].p), free(th[i].p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    unsigned flags = data[0];
    const char *body = (const char *)data + 1;
    size_t body_n = size - 1;

    char *parts[MAX_MSGS];
    size_t lens[MAX_MSGS];
    int n_parts = body_n ? fz_split_nul((const uint8_t *)body, body_n, parts, lens, MAX_MSGS) : 0;
    g4_chat_message msgs[MAX_MSGS];
    int all_plain = 1;
    for (int i = 0; i < n_parts; i++) {
        char *nl = strchr(parts[i], '\n');
        const char *content = nl ? nl + 1 : "";
        if (nl) *nl = 0;
        g4_chat_role role;
        if (g4_chat_role_parse(parts[i], &role) != 0) role = (g4_chat_role)(strlen(parts[i]) % 3);
        msgs[i].role = role;
        msgs[i].content = content;
        all_plain &= plain_content(content);
    }
    check_render(msgs, (size_t)n_parts, all_plain);
    g4_chat_options bad = g4_chat_default_options();
    bad.form = (g4_chat_form)7;
    char *out = NULL;
    size_t out_n;
    FZ_CHECK(g4_chat_render(msgs, (size_t)n_parts, &bad, &out, &out_n) != 0 && out == NULL, "bad form accepted");
    for (int i = 0; i < n_parts; i++) free(parts[i]);

    /* The reply side on the raw bytes. */
    FZ_CHECK(g4_chat_strip_thinking(body, body_n, &out, &out_n) == 0, "strip_thinking failed");
    FZ_CHECK(out && out[out_n] == 0 && out_n <= body_n, "strip_thinking output");
    free(out);

    g4_chat_reply r;
    FZ_CHECK(g4_chat_parse_reply(body, body_n, &r) == 0, "parse_reply failed: %s", g4_last_error());
    FZ_CHECK(r.answer && r.thinking && r.answer[r.answer_len] == 0 && r.thinking[r.thinking_len] == 0,
             "parse_reply outputs");
    size_t calls_len = 0;
    for (int i = 0; i < r.n_tool_calls; i++) calls_len += strlen(r.tool_calls[i].name) + strlen(r.tool_calls[i].arguments);
    FZ_CHECK(r.answer_len + r.thinking_len + calls_len <= body_n, "parse_reply output longer than its input");
    FZ_CHECK(r.thought_blocks >= r.thought_unclosed && r.thought_blocks >= 0, "thought_blocks %d unclosed %d",
             r.thought_blocks, r.thought_unclosed);
    if (!memchr(body, '<', body_n))
        FZ_CHECK(r.thought_blocks == 0 && r.thinking_len == 0 && !r.thought_unclosed && r.n_tool_calls == 0 && !r.tool_call_unclosed,
                 "thought or tool call found without markers");
    g4_chat_reply_free(&r);

    check_filter(body, body_n, flags & 1, flags >> 1);
    return 0;
}
