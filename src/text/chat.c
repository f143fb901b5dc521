/* Gemma 4 chat template rendering and thought-channel parsing. See chat.h. */
#include "text/chat.h"

#include "util/err.h"

#include <stdlib.h>
#include <string.h>

static const char OPEN_THOUGHT[] = "<|channel>";
static const char CLOSE_THOUGHT[] = "<channel|>";
static const char THOUGHT_HEADER[] = "thought\n";
#define LIT_LEN(s) (sizeof(s) - 1)

/* ---------------------------------------------------------------- growable string */

struct strbuf {
    char *p;
    size_t n, cap;
};

static int sb_append(struct strbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return g4_fail("chat: out of memory");
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

/* Hands the buffer to the caller; an empty result is still a valid "" string. */
static int sb_take(struct strbuf *b, char **out, size_t *out_len) {
    if (!b->p && sb_append(b, "", 0)) return -1;
    *out = b->p;
    if (out_len) *out_len = b->n;
    b->p = NULL, b->n = b->cap = 0;
    return 0;
}

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

static void trim_span(const char *s, size_t n, size_t *start, size_t *end) {
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
static int strip_thinking_into(const char *text, size_t len, struct strbuf *out) {
    struct strbuf kept = {0};
    const char *p = text, *end = text + len;
    int rc = 0;
    while (rc == 0) {
        const char *close = find_lit(p, (size_t)(end - p), CLOSE_THOUGHT, LIT_LEN(CLOSE_THOUGHT));
        const char *part_end = close ? close : end;
        const char *open = find_lit(p, (size_t)(part_end - p), OPEN_THOUGHT, LIT_LEN(OPEN_THOUGHT));
        rc = sb_append(&kept, p, (size_t)((open ? open : part_end) - p));
        if (!close) break;
        p = close + LIT_LEN(CLOSE_THOUGHT);
    }
    size_t a = 0, b = 0;
    if (rc == 0 && kept.p) trim_span(kept.p, kept.n, &a, &b);
    if (rc == 0) rc = sb_append(out, kept.p ? kept.p + a : "", b - a);
    free(kept.p);
    return rc;
}

int g4_chat_strip_thinking(const char *text, size_t len, char **out, size_t *out_len) {
    struct strbuf b = {0};
    if (strip_thinking_into(text, len, &b) || sb_take(&b, out, out_len)) {
        free(b.p);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- rendering */

/* Rendering goes to text, or straight to ids (tok != NULL), where template parts may hold
 * control tokens and message contents may not. */
struct sink {
    const g4_tokenizer *tok;
    struct strbuf text;
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

static int sink_emit(struct sink *s, const char *str, size_t n, int trusted) {
    if (!s->tok) return sb_append(&s->text, str, n);
    int32_t *ids = NULL;
    size_t k = 0;
    if (g4_tokenizer_encode(s->tok, str, n, trusted, &ids, &k)) return -1;
    int rc = sink_ids_append(s, ids, k);
    free(ids);
    return rc;
}

static int emit_template(struct sink *s, const char *str) { return sink_emit(s, str, strlen(str), 1); }

/* Message text: trimmed; a model turn also loses its thought spans. */
static int emit_content(struct sink *s, g4_chat_role role, const char *content) {
    const char *c = content ? content : "";
    size_t n = strlen(c);
    if (role == G4_CHAT_MODEL) {
        struct strbuf stripped = {0};
        int rc = strip_thinking_into(c, n, &stripped) || sink_emit(s, stripped.p ? stripped.p : "", stripped.n, 0);
        free(stripped.p);
        return rc ? -1 : 0;
    }
    size_t a, b;
    trim_span(c, n, &a, &b);
    return sink_emit(s, c + a, b - a, 0);
}

static const char *role_name(g4_chat_role r) {
    switch (r) {
    case G4_CHAT_SYSTEM: return "system";
    case G4_CHAT_USER: return "user";
    case G4_CHAT_MODEL: return "model";
    }
    return NULL;
}

/* The first turn: only when thinking is on or the conversation opens with a system message.
 * Returns how many messages it consumed (0 or 1), or -1. */
static int render_system_turn(struct sink *s, const g4_chat_message *msgs, size_t n, const g4_chat_options *o) {
    int has_system = n > 0 && msgs[0].role == G4_CHAT_SYSTEM;
    if (!o->thinking && !has_system) return 0;
    if (emit_template(s, "<|turn>system\n")) return -1;
    if (o->thinking && emit_template(s, "<|think|>\n")) return -1;
    if (has_system && emit_content(s, G4_CHAT_SYSTEM, msgs[0].content)) return -1;
    if (emit_template(s, "<turn|>\n")) return -1;
    return has_system;
}

static int render_turn(struct sink *s, const g4_chat_message *m) {
    return emit_template(s, "<|turn>") || emit_template(s, role_name(m->role)) || emit_template(s, "\n") ||
                   emit_content(s, m->role, m->content) || emit_template(s, "<turn|>\n")
               ? -1
               : 0;
}

static int render_generation_prompt(struct sink *s, const g4_chat_options *o) {
    if (emit_template(s, "<|turn>model\n")) return -1;
    /* Only the 26B/31B template pre-fills an empty thought when thinking is off; doing so for
     * E2B/E4B hurts them (spec C.2). */
    if (o->form == G4_CHAT_FORM_26B && !o->thinking) return emit_template(s, "<|channel>thought\n<channel|>");
    return 0;
}

static int check_input(const g4_chat_message *msgs, size_t n, const g4_chat_options *o) {
    if (!o) return g4_fail("chat: options are NULL");
    if (o->form != G4_CHAT_FORM_E2B && o->form != G4_CHAT_FORM_26B) return g4_fail("chat: unknown template form %d", (int)o->form);
    if (n && !msgs) return g4_fail("chat: %zu messages but the array is NULL", n);
    for (size_t i = 0; i < n; i++)
        if (!role_name(msgs[i].role)) return g4_fail("chat: message %zu has an invalid role (%d)", i, (int)msgs[i].role);
    return 0;
}

static int render(struct sink *s, const g4_chat_message *msgs, size_t n, const g4_chat_options *o) {
    if (check_input(msgs, n, o)) return -1;
    if (o->add_bos && emit_template(s, "<bos>")) return -1;
    int first = render_system_turn(s, msgs, n, o);
    if (first < 0) return -1;
    for (size_t i = (size_t)first; i < n; i++)
        if (render_turn(s, &msgs[i])) return -1;
    return o->add_generation_prompt ? render_generation_prompt(s, o) : 0;
}

g4_chat_options g4_chat_default_options(void) {
    g4_chat_options o = {G4_CHAT_FORM_E2B, 0, 1, 1};
    return o;
}

int g4_chat_role_parse(const char *name, g4_chat_role *role) {
    static const struct {
        const char *name;
        g4_chat_role role;
    } names[] = {{"system", G4_CHAT_SYSTEM}, {"developer", G4_CHAT_SYSTEM}, {"user", G4_CHAT_USER},
                 {"model", G4_CHAT_MODEL}, {"assistant", G4_CHAT_MODEL}};
    for (size_t i = 0; name && i < sizeof names / sizeof *names; i++)
        if (strcmp(name, names[i].name) == 0) return *role = names[i].role, 0;
    return g4_fail("chat: unknown role \"%s\" (want system, user, model or assistant)", name ? name : "(null)");
}

int g4_chat_render(const g4_chat_message *msgs, size_t n, const g4_chat_options *opt, char **out, size_t *out_len) {
    struct sink s = {0};
    if (render(&s, msgs, n, opt) || sb_take(&s.text, out, out_len)) {
        free(s.text.p);
        return -1;
    }
    return 0;
}

int g4_chat_encode(const g4_tokenizer *tok, const g4_chat_message *msgs, size_t n, const g4_chat_options *opt,
                   int32_t **ids, size_t *n_ids) {
    if (!tok) return g4_fail("chat: tokenizer is NULL");
    struct sink s = {0};
    s.tok = tok;
    /* The first append guarantees a non-NULL array even for an empty result. */
    if (sink_ids_append(&s, NULL, 0) || render(&s, msgs, n, opt)) {
        free(s.ids);
        return -1;
    }
    *ids = s.ids, *n_ids = s.n_ids;
    return 0;
}

/* ---------------------------------------------------------------- thought filter */

enum filter_state {
    IN_ANSWER,
    IN_HEADER, /* just after "<|channel>": a "thought\n" header is dropped */
    IN_THOUGHT,
};

struct g4_thought_filter {
    enum filter_state state;
    int blocks;
    struct strbuf pending, answer, thought;
};

/* 1: s starts with lit; -1: s is a proper prefix of lit (more text may complete it); 0: no. */
static int match_lit(const char *s, size_t n, const char *lit, size_t lit_n) {
    if (n >= lit_n) return memcmp(s, lit, lit_n) == 0;
    return memcmp(s, lit, n) == 0 ? -1 : 0;
}

/* Consumes a marker or header at p if there is one; returns bytes consumed, 0 if none,
 * -1 when p might be the start of one and more text is needed. */
static long filter_marker(g4_thought_filter *f, const char *p, size_t left, int final) {
    if (f->state == IN_HEADER) {
        int m = match_lit(p, left, THOUGHT_HEADER, LIT_LEN(THOUGHT_HEADER));
        if (m < 0 && !final) return -1;
        f->state = IN_THOUGHT;
        return m == 1 ? (long)LIT_LEN(THOUGHT_HEADER) : 0;
    }
    int mo = match_lit(p, left, OPEN_THOUGHT, LIT_LEN(OPEN_THOUGHT));
    int mc = match_lit(p, left, CLOSE_THOUGHT, LIT_LEN(CLOSE_THOUGHT));
    if (mo == 1) {
        if (f->state == IN_ANSWER) f->state = IN_HEADER, f->blocks++;
        return (long)LIT_LEN(OPEN_THOUGHT); /* an opener inside a thought is dropped */
    }
    if (mc == 1) {
        f->state = IN_ANSWER; /* a stray closer in the answer is dropped */
        return (long)LIT_LEN(CLOSE_THOUGHT);
    }
    return (mo < 0 || mc < 0) && !final ? -1 : 0;
}

/* Moves pending text to the answer/thought outputs, keeping back a possible partial marker. */
static int filter_run(g4_thought_filter *f, int final) {
    const char *d = f->pending.p;
    size_t n = f->pending.n, i = 0;
    while (i < n) {
        long used = filter_marker(f, d + i, n - i, final);
        if (used < 0) break;
        if (used > 0 || f->state == IN_HEADER) {
            i += (size_t)used;
            continue;
        }
        /* Plain text up to the next possible marker start. */
        const char *lt = memchr(d + i + 1, '<', n - i - 1);
        size_t run = lt ? (size_t)(lt - (d + i)) : n - i;
        if (sb_append(f->state == IN_ANSWER ? &f->answer : &f->thought, d + i, run)) return -1;
        i += run;
    }
    memmove(f->pending.p, d + i, n - i);
    f->pending.n = n - i;
    f->pending.p[f->pending.n] = 0;
    return 0;
}

static void filter_reset_outputs(g4_thought_filter *f) {
    f->answer.n = f->thought.n = 0;
    f->answer.p[0] = f->thought.p[0] = 0;
}

static void filter_outputs(g4_thought_filter *f, const char **answer, size_t *answer_len, const char **thought,
                           size_t *thought_len) {
    if (answer) *answer = f->answer.p;
    if (answer_len) *answer_len = f->answer.n;
    if (thought) *thought = f->thought.p;
    if (thought_len) *thought_len = f->thought.n;
}

g4_thought_filter *g4_thought_filter_new(int starts_in_thought) {
    g4_thought_filter *f = calloc(1, sizeof *f);
    if (!f || sb_append(&f->pending, "", 0) || sb_append(&f->answer, "", 0) || sb_append(&f->thought, "", 0)) {
        g4_thought_filter_free(f);
        g4_fail("chat: out of memory");
        return NULL;
    }
    f->state = starts_in_thought ? IN_THOUGHT : IN_ANSWER;
    f->blocks = starts_in_thought ? 1 : 0;
    return f;
}

int g4_thought_filter_push(g4_thought_filter *f, const char *text, size_t len, const char **answer, size_t *answer_len,
                           const char **thought, size_t *thought_len) {
    filter_reset_outputs(f);
    if (sb_append(&f->pending, text, len) || filter_run(f, 0)) return -1;
    filter_outputs(f, answer, answer_len, thought, thought_len);
    return 0;
}

int g4_thought_filter_finish(g4_thought_filter *f, const char **answer, size_t *answer_len, const char **thought,
                             size_t *thought_len) {
    filter_reset_outputs(f);
    if (filter_run(f, 1)) return -1;
    filter_outputs(f, answer, answer_len, thought, thought_len);
    return 0;
}

int g4_thought_filter_in_thought(const g4_thought_filter *f) { return f->state != IN_ANSWER; }

int g4_thought_filter_blocks(const g4_thought_filter *f) { return f->blocks; }

void g4_thought_filter_free(g4_thought_filter *f) {
    if (!f) return;
    free(f->pending.p), free(f->answer.p), free(f->thought.p);
    free(f);
}

/* ---------------------------------------------------------------- whole replies */

static int take_trimmed(const char *s, size_t n, char **out, size_t *out_len) {
    size_t a, b;
    trim_span(s, n, &a, &b);
    struct strbuf t = {0};
    if (sb_append(&t, s + a, b - a) || sb_take(&t, out, out_len)) {
        free(t.p);
        return -1;
    }
    return 0;
}

int g4_chat_parse_reply(const char *text, size_t len, g4_chat_reply *r) {
    memset(r, 0, sizeof *r);
    const char *open = find_lit(text, len, OPEN_THOUGHT, LIT_LEN(OPEN_THOUGHT));
    const char *close = find_lit(text, len, CLOSE_THOUGHT, LIT_LEN(CLOSE_THOUGHT));
    /* A closer before any opener ends a thought the prompt opened. */
    g4_thought_filter *f = g4_thought_filter_new(close && (!open || close < open));
    if (!f) return -1;
    const char *answer, *thought;
    size_t answer_n, thought_n;
    struct strbuf all_answer = {0}, all_thought = {0};
    int rc = g4_thought_filter_push(f, text, len, &answer, &answer_n, &thought, &thought_n);
    if (rc == 0) rc = sb_append(&all_answer, answer, answer_n) || sb_append(&all_thought, thought, thought_n);
    if (rc == 0) rc = g4_thought_filter_finish(f, &answer, &answer_n, &thought, &thought_n);
    if (rc == 0) rc = sb_append(&all_answer, answer, answer_n) || sb_append(&all_thought, thought, thought_n);
    if (rc == 0) {
        r->thought_blocks = g4_thought_filter_blocks(f);
        r->thought_unclosed = g4_thought_filter_in_thought(f);
        rc = take_trimmed(all_answer.p ? all_answer.p : "", all_answer.n, &r->answer, &r->answer_len) ||
             take_trimmed(all_thought.p ? all_thought.p : "", all_thought.n, &r->thinking, &r->thinking_len);
    }
    free(all_answer.p), free(all_thought.p);
    g4_thought_filter_free(f);
    if (rc) g4_chat_reply_free(r);
    return rc ? -1 : 0;
}

void g4_chat_reply_free(g4_chat_reply *r) {
    if (!r) return;
    free(r->answer), free(r->thinking);
    memset(r, 0, sizeof *r);
}
