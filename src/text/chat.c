/* Gemma 4 chat template rendering (g4.h): the messages of a conversation in the template's form,
 * as text or straight to token ids, whole or from where a generated reply stopped; and the
 * template form a checkpoint asks for. The rules follow the upstream E2B template of 2026-07-09
 * (spec chat-and-tokenizer.md C.1-C.3; tests/fixtures/chat/README.md says where it is), which
 * every line below names where it is not obvious. */
#define _POSIX_C_SOURCE 200809L
#include "text/chat.h"

#include <cjson/cJSON.h>
#include <unistd.h>

#include "text/textbuf.h"
#include "util/file.h"

static const char OPEN_THOUGHT[] = "<|channel>";
static const char CLOSE_THOUGHT[] = "<channel|>";
static const char OPEN_CALL[] = "<|tool_call>";
static const char CLOSE_CALL[] = "<tool_call|>";
static const char QUOTE[] = "<|\"|>"; /* the string delimiter of the tool syntax */
#define LIT_LEN(s) (sizeof(s) - 1)

/* ---------------------------------------------------------------- trimming (Python str.strip) */

/* Python's str.isspace set, which Jinja's `trim` strips. */
static int is_py_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Code point of the well-formed character at s[0..n), its length in *len; 0 length for
 * anything malformed (never whitespace, so trimming stops there). */
static uint32_t decode_char(const unsigned char *s, size_t n, size_t *len) {
    *len = 0;
    if (n == 0) return 0;
    size_t k = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (k == 0 || k > n) return 0;
    uint32_t cp = k == 1 ? s[0] : s[0] & (0x3F >> (k - 1));
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    *len = k;
    return cp;
}

void g4_chat_trim(const char *s, size_t n, size_t *start, size_t *end) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, b = n, k;
    while (a < b) {
        uint32_t cp = decode_char(u + a, b - a, &k);
        if (!k || !is_py_space(cp)) break;
        a += k;
    }
    while (b > a) {
        size_t c = b - 1;
        while (c > a && b - c < 4 && (u[c] & 0xC0) == 0x80) c--;
        uint32_t cp = decode_char(u + c, b - c, &k);
        if (!k || c + k != b || !is_py_space(cp)) break;
        b = c;
    }
    *start = a, *end = b;
}

/* ---------------------------------------------------------------- strip_thinking (template macro) */

static const char *find_lit(const char *s, size_t n, const char *lit, size_t lit_n) {
    for (size_t i = 0; i + lit_n <= n; i++)
        if (s[i] == lit[0] && memcmp(s + i, lit, lit_n) == 0) return s + i;
    return NULL;
}

/* Split on "<channel|>"; of each part keep what precedes its first "<|channel>"; trim. */
static int strip_thinking_into(const char *text, size_t len, g4_textbuf *out) {
    g4_textbuf kept = {0};
    const char *p = text, *end = text + len;
    int rc = 0;
    while (rc == 0) {
        const char *close = find_lit(p, (size_t)(end - p), CLOSE_THOUGHT, LIT_LEN(CLOSE_THOUGHT));
        const char *part_end = close ? close : end;
        const char *open = find_lit(p, (size_t)(part_end - p), OPEN_THOUGHT, LIT_LEN(OPEN_THOUGHT));
        rc = g4_textbuf_append(&kept, p, (size_t)((open ? open : part_end) - p));
        if (!close) break;
        p = close + LIT_LEN(CLOSE_THOUGHT);
    }
    size_t a = 0, b = 0;
    if (rc == 0 && kept.p) g4_chat_trim(kept.p, kept.n, &a, &b);
    if (rc == 0) rc = g4_textbuf_append(out, kept.p ? kept.p + a : "", b - a);
    free(kept.p);
    return rc;
}

int g4_chat_strip_thinking(const char *text, size_t len, char **out, size_t *out_len) {
    g4_textbuf b = {0};
    if (strip_thinking_into(text, len, &b) || g4_textbuf_take(&b, out, out_len)) {
        free(b.p);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- a model message's tool calls */

/* The next complete "<|tool_call>...<tool_call|>" span in s[0, n): its start and length. */
static int next_call(const char *s, size_t n, size_t *start, size_t *len) {
    const char *open = find_lit(s, n, OPEN_CALL, LIT_LEN(OPEN_CALL));
    if (!open) return 0;
    size_t at = (size_t)(open - s) + LIT_LEN(OPEN_CALL);
    const char *close = find_lit(s + at, n - at, CLOSE_CALL, LIT_LEN(CLOSE_CALL));
    if (!close) return 0;
    *start = (size_t)(open - s);
    *len = (size_t)(close - open) + LIT_LEN(CLOSE_CALL);
    return 1;
}

static size_t count_calls(const char *content) {
    const char *c = content ? content : "";
    size_t n = strlen(c), at = 0, start, len, calls = 0;
    while (next_call(c + at, n - at, &start, &len)) calls++, at += start + len;
    return calls;
}

/* The function a call span names: what follows "<|tool_call>call:" up to "{". */
static void call_name(const char *span, size_t len, const char **name, size_t *name_len) {
    static const char prefix[] = "<|tool_call>call:";
    size_t body = len - LIT_LEN(CLOSE_CALL);
    *name = "", *name_len = 0;
    if (body < LIT_LEN(prefix) || memcmp(span, prefix, LIT_LEN(prefix)) != 0) return;
    *name = span + LIT_LEN(prefix);
    const char *brace = memchr(*name, '{', body - LIT_LEN(prefix));
    *name_len = brace ? (size_t)(brace - *name) : body - LIT_LEN(prefix);
}

/* ---------------------------------------------------------------- the sink */

/* Rendering goes to text, or straight to ids (tok != NULL), where template parts may hold
 * control tokens and message contents may not. Contents that follow one another (two model
 * messages in one turn) are encoded together, as the rendered text would be. While `quiet`,
 * nothing is written: a continuation walks the whole conversation (every message's rendering
 * depends on its neighbours) but writes only what the sequence does not hold yet. */
struct sink {
    const g4_tokenizer *tok;
    int quiet;
    g4_textbuf text;
    g4_textbuf content; /* contents not encoded yet */
    int32_t *ids;
    size_t n_ids, cap_ids;
};

static int sink_ids_append(struct sink *s, const int32_t *ids, size_t n) {
    if (s->n_ids + n > s->cap_ids) {
        size_t cap = s->cap_ids ? s->cap_ids : 256;
        while (cap < s->n_ids + n) cap *= 2;
        int32_t *p = realloc(s->ids, cap * sizeof *p);
        if (!p) return g4_fail("chat: out of memory");
        s->ids = p, s->cap_ids = cap;
    }
    if (n) memcpy(s->ids + s->n_ids, ids, n * sizeof *ids);
    s->n_ids += n;
    return 0;
}

static int sink_encode(struct sink *s, const char *str, size_t n, int trusted) {
    int32_t *ids = NULL;
    size_t k = 0;
    if (g4_tokenizer_encode(s->tok, str, n, trusted, &ids, &k)) return -1;
    int rc = sink_ids_append(s, ids, k);
    free(ids);
    return rc;
}

static int sink_flush(struct sink *s) {
    if (!s->tok || !s->content.n) return 0;
    int rc = sink_encode(s, s->content.p, s->content.n, 0);
    g4_textbuf_clear(&s->content);
    return rc;
}

static int sink_emit(struct sink *s, const char *str, size_t n, int trusted) {
    if (s->quiet) return 0;
    if (!s->tok) return g4_textbuf_append(&s->text, str, n);
    if (!trusted) return g4_textbuf_append(&s->content, str, n);
    return sink_flush(s) || sink_encode(s, str, n, 1) ? -1 : 0;
}

static int emit_template(struct sink *s, const char *str) { return sink_emit(s, str, strlen(str), 1); }

/* Text in the tool syntax (a call, a declaration): its string delimiters <|"|> are control
 * tokens, the rest stays text. The pieces between delimiters are whole segments of the
 * tokenizer's added-token split, so the ids equal those of encoding the rendered text. */
static int emit_tool_syntax(struct sink *s, const char *str, size_t n) {
    const char *q;
    while ((q = find_lit(str, n, QUOTE, LIT_LEN(QUOTE)))) {
        size_t k = (size_t)(q - str);
        if (sink_emit(s, str, k, 0) || emit_template(s, QUOTE)) return -1;
        str += k + LIT_LEN(QUOTE), n -= k + LIT_LEN(QUOTE);
    }
    return sink_emit(s, str, n, 0);
}

static int emit_trimmed(struct sink *s, const char *text, size_t *kept) {
    const char *c = text ? text : "";
    size_t a, b;
    g4_chat_trim(c, strlen(c), &a, &b);
    if (kept) *kept = b - a;
    return sink_emit(s, c + a, b - a, 0);
}

/* ---------------------------------------------------------------- the template */

/* What the last message left behind (the template's ns.prev_message_type): it decides the
 * generation prompt. */
enum prev_type { PREV_NONE, PREV_THINK, PREV_TOOLS, PREV_TOOL_CALL, PREV_TOOL_RESPONSE };

struct walk {
    const g4_chat_message *msgs;
    size_t n;
    const g4_chat_options *o;
    enum prev_type prev;
    int prev_was_model; /* the last message other than a tool response was a model message */
    const g4_chat_media *media; /* the messages' media parts (g4_chat_encode_media) */
    size_t n_media;
};

/* The template's placeholder of a media part, and the markers the processor expands it into. */
static const char *const MEDIA_MARKERS[2][3] = {{"<|image>", "<|image|>", "<image|>"}, {"<|audio>", "<|audio|>", "<audio|>"}};

int g4_media_marker_ids(const g4_tokenizer *tok, g4_media_kind kind, int32_t ids[3]) {
    if (!tok) return g4_fail("media markers: the tokenizer is NULL");
    if (kind != G4_MEDIA_IMAGE && kind != G4_MEDIA_AUDIO) return g4_fail("media markers: unknown media kind %d", (int)kind);
    for (int k = 0; k < 3; k++) {
        ids[k] = g4_tokenizer_piece_to_id(tok, MEDIA_MARKERS[kind][k]);
        if (ids[k] < 0 || !g4_tokenizer_is_special(tok, ids[k]))
            return g4_fail("the tokenizer has no special token %s (a Gemma 4 %s marker)", MEDIA_MARKERS[kind][k], kind == G4_MEDIA_IMAGE ? "image" : "audio");
    }
    return 0;
}

/* Message i's media parts: as text, the template's placeholder each; as ids, begin marker, n
 * placeholders, end marker. */
static int render_media(struct sink *s, const struct walk *w, size_t i) {
    for (size_t k = 0; k < w->n_media; k++) {
        const g4_chat_media *md = &w->media[k];
        if (md->msg != i) continue;
        const char *const *mk = MEDIA_MARKERS[md->kind];
        if (!s->tok) {
            if (emit_template(s, mk[1])) return -1;
            continue;
        }
        int32_t ids[3];
        if (g4_media_marker_ids(s->tok, md->kind, ids) || emit_template(s, mk[0]) || sink_flush(s)) return -1;
        for (int r = 0; r < md->n && !s->quiet; r++)
            if (sink_ids_append(s, &ids[1], 1)) return -1;
        if (emit_template(s, mk[2])) return -1;
    }
    return 0;
}

static const char *role_name(g4_chat_role r) {
    switch (r) {
    case G4_CHAT_SYSTEM: return "system";
    case G4_CHAT_USER: return "user";
    case G4_CHAT_MODEL: return "model";
    case G4_CHAT_TOOL: return "tool";
    }
    return NULL;
}

/* The first turn: only when thinking is on, tools are declared or the conversation opens with a
 * system message. Returns how many messages it consumed (0 or 1), or -1. */
static int render_system_turn(struct sink *s, struct walk *w) {
    int has_system = w->n > 0 && w->msgs[0].role == G4_CHAT_SYSTEM;
    if (!w->o->thinking && !w->o->n_tools && !has_system) return 0;
    if (emit_template(s, "<|turn>system\n")) return -1;
    if (w->o->thinking) {
        if (emit_template(s, "<|think|>\n")) return -1;
        w->prev = PREV_THINK;
    }
    if (has_system && emit_trimmed(s, w->msgs[0].content, NULL)) return -1;
    for (size_t i = 0; i < w->o->n_tools; i++) {
        const char *d = w->o->tools[i];
        size_t a, b;
        g4_chat_trim(d, strlen(d), &a, &b);
        if (emit_template(s, "<|tool>") || emit_tool_syntax(s, d + a, b - a) || emit_template(s, "<tool|>")) return -1;
        w->prev = PREV_TOOLS;
    }
    if (emit_template(s, "<turn|>\n")) return -1;
    return has_system;
}

/* A model message's tool calls, in the template's place: before the rest of its content. */
static int render_calls(struct sink *s, const char *content, size_t *n_calls) {
    const char *c = content ? content : "";
    size_t n = strlen(c), at = 0, start, len;
    *n_calls = 0;
    while (next_call(c + at, n - at, &start, &len)) {
        const char *span = c + at + start;
        if (emit_template(s, OPEN_CALL) ||
            emit_tool_syntax(s, span + LIT_LEN(OPEN_CALL), len - LIT_LEN(OPEN_CALL) - LIT_LEN(CLOSE_CALL)) ||
            emit_template(s, CLOSE_CALL))
            return -1;
        (*n_calls)++;
        at += start + len;
    }
    return 0;
}

/* A model message's content without its calls, thought spans stripped (strip_thinking). */
static int render_model_text(struct sink *s, const char *content, size_t *kept) {
    const char *c = content ? content : "";
    size_t n = strlen(c), at = 0, start, len;
    g4_textbuf rest = {0}, stripped = {0};
    int rc = 0;
    while (rc == 0 && next_call(c + at, n - at, &start, &len)) {
        rc = g4_textbuf_append(&rest, c + at, start);
        at += start + len;
    }
    if (rc == 0) rc = g4_textbuf_append(&rest, c + at, n - at);
    if (rc == 0) rc = strip_thinking_into(rest.p, rest.n, &stripped);
    if (rc == 0) rc = sink_emit(s, stripped.p ? stripped.p : "", stripped.n, 0);
    *kept = stripped.n;
    free(rest.p), free(stripped.p);
    return rc;
}

/* The tool messages after model message i answer its calls in order; each becomes
 * "<|tool_response>response:NAME{value:<|"|>TEXT<|"|>}<tool_response|>", NAME from its call. */
static int render_responses(struct sink *s, const struct walk *w, size_t i, size_t *n_responses) {
    const char *c = w->msgs[i].content ? w->msgs[i].content : "";
    size_t n = strlen(c), at = 0, start, len;
    *n_responses = 0;
    for (size_t k = i + 1; k < w->n && w->msgs[k].role == G4_CHAT_TOOL; k++) {
        next_call(c + at, n - at, &start, &len); /* check_input made sure there is one */
        const char *name;
        size_t name_len;
        call_name(c + at + start, len, &name, &name_len);
        at += start + len;
        g4_textbuf head = {0};
        const char *body = w->msgs[k].content ? w->msgs[k].content : "";
        int rc = g4_textbuf_appends(&head, "response:") || g4_textbuf_append(&head, name, name_len) ||
                 g4_textbuf_appends(&head, "{value:");
        /* "response:NAME{value:" is one segment of the tokenizer's split: one piece, and the
         * name, the model's own text, is no control token */
        rc = rc || emit_template(s, "<|tool_response>") || sink_emit(s, head.p, head.n, 0) || emit_template(s, QUOTE) ||
             sink_emit(s, body, strlen(body), 0) || emit_template(s, QUOTE) || emit_template(s, "}<tool_response|>");
        free(head.p);
        if (rc) return -1;
        (*n_responses)++;
    }
    return 0;
}

/* The next message that is not a tool response after i: whether there is one and is a model message. */
static void next_message(const struct walk *w, size_t i, int *found, int *is_model) {
    *found = *is_model = 0;
    for (size_t j = i + 1; j < w->n; j++)
        if (w->msgs[j].role != G4_CHAT_TOOL) {
            *found = 1;
            *is_model = w->msgs[j].role == G4_CHAT_MODEL;
            return;
        }
}

/* Message i (not a tool response). A model message continues the turn of a model message just
 * before it; its turn stays open when a model message follows (a reply after tool responses),
 * and after calls nobody answered it ends with the "<|tool_response>" the model stopped at.
 * resume_close: message i is a reply the sequence holds up to its end: only its closing is written. */
static int render_message(struct sink *s, struct walk *w, size_t i, int resume_close) {
    const g4_chat_message *m = &w->msgs[i];
    int model = m->role == G4_CHAT_MODEL, quiet = s->quiet;
    size_t n_calls = 0, n_responses = 0, kept = 0;
    w->prev = PREV_NONE;
    if (resume_close) s->quiet = 1;
    if (!(model && w->prev_was_model) &&
        (emit_template(s, "<|turn>") || emit_template(s, role_name(m->role)) || emit_template(s, "\n")))
        return -1;
    if (model && render_calls(s, m->content, &n_calls)) return -1;
    if (n_calls) w->prev = PREV_TOOL_CALL;
    if (resume_close) s->quiet = quiet;
    if (n_calls && render_responses(s, w, i, &n_responses)) return -1;
    if (n_responses) w->prev = PREV_TOOL_RESPONSE;
    if (resume_close) s->quiet = 1;
    if (render_media(s, w, i)) return -1;
    if (model ? render_model_text(s, m->content, &kept) : emit_trimmed(s, m->content, &kept)) return -1;
    if (resume_close) s->quiet = quiet;
    int next_found, next_model;
    next_message(w, i, &next_found, &next_model);
    int continues = model && next_model && (!n_calls || n_responses);
    int rc = 0;
    if (w->prev == PREV_TOOL_CALL) rc = emit_template(s, "<|tool_response>");
    else if (!continues && !(n_responses && !kept && !next_found)) rc = emit_template(s, "<turn|>\n");
    w->prev_was_model = model;
    return rc;
}

static int render_generation_prompt(struct sink *s, const struct walk *w, int *opens_thought) {
    *opens_thought = 0;
    if (w->prev == PREV_TOOL_RESPONSE) {
        /* the model goes on in its turn after the responses; with thinking on, in a thought */
        *opens_thought = w->o->thinking;
        return w->o->thinking ? emit_template(s, "<|channel>thought\n") : 0;
    }
    if (w->prev == PREV_TOOL_CALL) return 0; /* the history ends where the model stopped for a response */
    if (emit_template(s, "<|turn>model\n")) return -1;
    /* Only the 26B/31B template pre-fills an empty thought when thinking is off; doing so for
     * E2B/E4B hurts them (spec C.2). */
    if (w->o->form == G4_CHAT_FORM_26B && !w->o->thinking) return emit_template(s, "<|channel>thought\n<channel|>");
    return 0;
}

/* Every message's role is known, and every tool response answers a call of the model message
 * before it (in order: Gemma's calls carry no ids). */
static int check_input(const g4_chat_message *msgs, size_t n, const g4_chat_options *o, size_t resume) {
    if (!o) return g4_fail("chat: options are NULL");
    if (o->form != G4_CHAT_FORM_E2B && o->form != G4_CHAT_FORM_26B) return g4_fail("chat: unknown template form %d", (int)o->form);
    if (n && !msgs) return g4_fail("chat: %zu messages but the array is NULL", n);
    if (o->n_tools && !o->tools) return g4_fail("chat: %zu tool declarations but the array is NULL", o->n_tools);
    for (size_t i = 0; i < o->n_tools; i++)
        if (!o->tools[i]) return g4_fail("chat: tool declaration %zu is NULL", i);
    if (resume > n) return g4_fail("chat: a continuation after message %zu of %zu", resume - 1, n);
    if (resume && msgs[resume - 1].role != G4_CHAT_MODEL)
        return g4_fail("chat: a continuation resumes after a model message (message %zu is not one)", resume - 1);
    size_t calls = 0, answered = 0;
    for (size_t i = 0; i < n; i++) {
        if (!role_name(msgs[i].role)) return g4_fail("chat: message %zu has an invalid role (%d)", i, (int)msgs[i].role);
        if (msgs[i].role != G4_CHAT_TOOL) {
            calls = msgs[i].role == G4_CHAT_MODEL ? count_calls(msgs[i].content) : 0;
            answered = 0;
        } else if (++answered > calls) {
            return calls ? g4_fail("chat: message %zu (tool) answers no call: the model message before it made %zu", i, calls)
                         : g4_fail("chat: message %zu (tool) does not follow a model message with a tool call", i);
        }
    }
    return 0;
}

static int render(struct sink *s, const g4_chat_message *msgs, size_t n, size_t resume, const g4_chat_options *o,
                  const g4_chat_media *media, size_t n_media, int *opens_thought) {
    int dummy;
    if (!opens_thought) opens_thought = &dummy;
    if (check_input(msgs, n, o, resume)) return -1;
    struct walk w = {msgs, n, o, PREV_NONE, 0, media, n_media};
    s->quiet = resume > 0;
    if (o->add_bos && emit_template(s, "<bos>")) return -1;
    int first = render_system_turn(s, &w);
    if (first < 0) return -1;
    for (size_t i = (size_t)first; i < n; i++) {
        if (msgs[i].role == G4_CHAT_TOOL) continue; /* rendered by the model message it answers */
        s->quiet = i + 1 < resume;
        if (render_message(s, &w, i, i + 1 == resume)) return -1;
    }
    s->quiet = 0;
    *opens_thought = 0;
    if (o->add_generation_prompt && render_generation_prompt(s, &w, opens_thought)) return -1;
    return sink_flush(s);
}

int g4_chat_check(const g4_chat_message *msgs, size_t n, const g4_chat_options *opt) { return check_input(msgs, n, opt, 0); }

g4_chat_options g4_chat_default_options(void) {
    g4_chat_options o = {.form = G4_CHAT_FORM_E2B, .thinking = 0, .add_generation_prompt = 1, .add_bos = 1};
    return o;
}

int g4_chat_role_parse(const char *name, g4_chat_role *role) {
    static const struct {
        const char *name;
        g4_chat_role role;
    } names[] = {{"system", G4_CHAT_SYSTEM}, {"developer", G4_CHAT_SYSTEM}, {"user", G4_CHAT_USER},
                 {"model", G4_CHAT_MODEL},   {"assistant", G4_CHAT_MODEL},  {"tool", G4_CHAT_TOOL}};
    for (size_t i = 0; name && i < sizeof names / sizeof *names; i++)
        if (strcmp(name, names[i].name) == 0) return *role = names[i].role, 0;
    return g4_fail("chat: unknown role \"%s\" (want system, user, model, assistant or tool)", name ? name : "(null)");
}

int g4_chat_render_from(const g4_chat_message *msgs, size_t n, size_t resume, const g4_chat_options *opt, char **out,
                        size_t *out_len, int *opens_thought) {
    struct sink s = {0};
    if (render(&s, msgs, n, resume, opt, NULL, 0, opens_thought) || g4_textbuf_take(&s.text, out, out_len)) {
        free(s.text.p);
        return -1;
    }
    return 0;
}

int g4_chat_encode_from(const g4_tokenizer *tok, const g4_chat_message *msgs, size_t n, size_t resume, const g4_chat_options *opt,
                        int32_t **ids, size_t *n_ids, int *opens_thought) {
    return g4_chat_encode_media(tok, msgs, n, resume, opt, NULL, 0, ids, n_ids, opens_thought);
}

int g4_chat_encode_media(const g4_tokenizer *tok, const g4_chat_message *msgs, size_t n, size_t resume, const g4_chat_options *opt,
                         const g4_chat_media *media, size_t n_media, int32_t **ids, size_t *n_ids, int *opens_thought) {
    if (!tok) return g4_fail("chat: tokenizer is NULL");
    for (size_t k = 0; k < n_media; k++)
        if (media[k].msg >= n || media[k].n < 1 || (media[k].kind != G4_MEDIA_IMAGE && media[k].kind != G4_MEDIA_AUDIO))
            return g4_fail("chat: media part %zu (kind %d, %d soft tokens) of message %zu of %zu is invalid", k, (int)media[k].kind, media[k].n,
                           media[k].msg, n);
    struct sink s = {0};
    s.tok = tok;
    /* The first append guarantees a non-NULL array even for an empty result. */
    int rc = sink_ids_append(&s, NULL, 0) || render(&s, msgs, n, resume, opt, media, n_media, opens_thought);
    free(s.content.p);
    if (rc) {
        free(s.ids);
        return -1;
    }
    *ids = s.ids, *n_ids = s.n_ids;
    return 0;
}

int g4_chat_render(const g4_chat_message *msgs, size_t n, const g4_chat_options *opt, char **out, size_t *out_len) {
    return g4_chat_render_from(msgs, n, 0, opt, out, out_len, NULL);
}

int g4_chat_encode(const g4_tokenizer *tok, const g4_chat_message *msgs, size_t n, const g4_chat_options *opt,
                   int32_t **ids, size_t *n_ids) {
    return g4_chat_encode_from(tok, msgs, n, 0, opt, ids, n_ids, NULL);
}

/* ---------------------------------------------------------------- the form a checkpoint asks for */

/* The 26B/31B templates pre-fill an empty thought when thinking is off; the E2B/E4B ones never
 * write that string (spec C.2). In a template's source its newline is an escape or a newline. */
static g4_chat_form form_of_template(const char *src) {
    return strstr(src, "<|channel>thought\\n<channel|>") || strstr(src, "<|channel>thought\n<channel|>") ? G4_CHAT_FORM_26B
                                                                                                      : G4_CHAT_FORM_E2B;
}

/* The checkpoint's chat template: chat_template.jinja, else tokenizer_config.json's
 * "chat_template" (a string, or a list of {name, template} whose "default" counts). *src is NULL
 * when it has none. */
static int read_template(const char *dir, char **src) {
    char path[4096];
    size_t len;
    *src = NULL;
    if (g4_path_join(path, sizeof path, dir, "chat_template.jinja")) return -1;
    if (access(path, F_OK) == 0) return g4_read_file(path, src, &len);
    if (g4_path_join(path, sizeof path, dir, "tokenizer_config.json")) return -1;
    if (access(path, F_OK) != 0) return 0;
    char *text;
    if (g4_read_file(path, &text, &len)) return -1;
    cJSON *cfg = cJSON_ParseWithLength(text, len), *t = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *e;
    free(text);
    if (!cfg) return g4_fail("%s: not valid JSON", path);
    if (cJSON_IsArray(t)) {
        cJSON_ArrayForEach(e, t) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0) t = cJSON_GetObjectItemCaseSensitive(e, "template");
        }
    }
    int rc = 0;
    if (cJSON_IsString(t) && !(*src = strdup(t->valuestring))) rc = g4_fail("%s: out of memory", path);
    else if (t && !cJSON_IsString(t) && !cJSON_IsArray(t)) rc = g4_fail("%s: chat_template is neither a string nor a list", path);
    cJSON_Delete(cfg);
    return rc;
}

int g4_model_chat_form(const g4_model *m, g4_chat_form *form) {
    char *src;
    if (read_template(g4_model_dir(m), &src)) return -1;
    /* Without a template, the family decides: E2B/E4B have per-layer embeddings, 26B and 31B not. */
    *form = src ? form_of_template(src) : g4_model_has_per_layer_inputs(m) ? G4_CHAT_FORM_E2B : G4_CHAT_FORM_26B;
    free(src);
    return 0;
}
