/* The model's reply split into thought, answer and tool-call spans (spec chat-and-tokenizer.md
 * C.3): the streaming splitter (reply.h), the thought filter on top of it, and whole replies
 * (g4_chat_parse_reply) with their tool calls. */
#include "text/reply.h"

#include "text/chat.h"
#include "text/textbuf.h"

static const char OPEN_THOUGHT[] = "<|channel>";
static const char CLOSE_THOUGHT[] = "<channel|>";
static const char THOUGHT_HEADER[] = "thought\n";
static const char OPEN_CALL[] = "<|tool_call>";
static const char CLOSE_CALL[] = "<tool_call|>";
#define LIT_LEN(s) (sizeof(s) - 1)

/* ---------------------------------------------------------------- the splitter */

enum state {
    IN_ANSWER,
    IN_HEADER, /* just after "<|channel>": a "thought\n" header is dropped */
    IN_THOUGHT,
    IN_TOOL_CALL,
};

enum counts { COUNTS_NOTHING, COUNTS_THOUGHT, COUNTS_CALL };

/* A marker read in one state. A tool call keeps its markers in its text, so that the call can be
 * handed back as a model message exactly as the model wrote it; a thought loses them. A stray
 * "<channel|>" in the answer closes a thought the prompt may have opened (spec C.3) and goes; a
 * stray "<tool_call|>" closes nothing and stays answer text. */
struct marker {
    const char *text;
    size_t len;
    enum state from, to;
    int kept;       /* the marker is part of the tool call's text */
    int tools_only; /* read only when tool calls are split out */
    enum counts counts;
};

static const struct marker markers[] = {
    {OPEN_THOUGHT, LIT_LEN(OPEN_THOUGHT), IN_ANSWER, IN_HEADER, 0, 0, COUNTS_THOUGHT},
    {CLOSE_THOUGHT, LIT_LEN(CLOSE_THOUGHT), IN_ANSWER, IN_ANSWER, 0, 0, COUNTS_NOTHING},   /* a stray closer is dropped */
    {OPEN_THOUGHT, LIT_LEN(OPEN_THOUGHT), IN_THOUGHT, IN_THOUGHT, 0, 0, COUNTS_NOTHING},   /* so is an opener in a thought */
    {CLOSE_THOUGHT, LIT_LEN(CLOSE_THOUGHT), IN_THOUGHT, IN_ANSWER, 0, 0, COUNTS_NOTHING},
    {OPEN_CALL, LIT_LEN(OPEN_CALL), IN_ANSWER, IN_TOOL_CALL, 1, 1, COUNTS_CALL},
    {CLOSE_CALL, LIT_LEN(CLOSE_CALL), IN_TOOL_CALL, IN_ANSWER, 1, 1, COUNTS_NOTHING},
};

struct piece {
    g4_span span;
    size_t off, len; /* in out */
};

struct g4_spans {
    enum state state;
    int tools;
    int thoughts, calls;
    g4_textbuf pending; /* pushed text not yet final (a possible marker start) */
    g4_textbuf out;     /* this call's final text, pieces pointing into it */
    struct piece *pieces;
    g4_span_text *view;
    int n_pieces, cap_pieces;
};

static g4_span span_of(enum state s) {
    return s == IN_ANSWER ? G4_SPAN_ANSWER : s == IN_TOOL_CALL ? G4_SPAN_TOOL_CALL : G4_SPAN_THOUGHT;
}

static int emit(g4_spans *sp, g4_span span, const char *s, size_t n) {
    if (n == 0) return 0;
    size_t off = sp->out.n;
    if (g4_textbuf_append(&sp->out, s, n)) return -1;
    if (sp->n_pieces > 0 && sp->pieces[sp->n_pieces - 1].span == span) {
        sp->pieces[sp->n_pieces - 1].len += n;
        return 0;
    }
    if (sp->n_pieces == sp->cap_pieces) {
        int cap = sp->cap_pieces ? 2 * sp->cap_pieces : 8;
        struct piece *p = realloc(sp->pieces, sizeof *p * (size_t)cap);
        g4_span_text *v = realloc(sp->view, sizeof *v * (size_t)cap);
        if (p) sp->pieces = p;
        if (v) sp->view = v;
        if (!p || !v) return g4_fail("reply: out of memory");
        sp->cap_pieces = cap;
    }
    sp->pieces[sp->n_pieces++] = (struct piece){span, off, n};
    return 0;
}

/* 1: s starts with lit; -1: s is a proper prefix of lit (more text may complete it); 0: no. */
static int match_lit(const char *s, size_t n, const char *lit, size_t lit_n) {
    if (n >= lit_n) return memcmp(s, lit, lit_n) == 0;
    return memcmp(s, lit, n) == 0 ? -1 : 0;
}

/* Reads a marker (or a thought's header) at p: 1 when one was taken (*used bytes, 0 for a header
 * that is not there), 0 when p holds none, -1 when p may begin one and more text is needed. */
static int take_marker(g4_spans *sp, const char *p, size_t left, int final, size_t *used) {
    if (sp->state == IN_HEADER) {
        int m = match_lit(p, left, THOUGHT_HEADER, LIT_LEN(THOUGHT_HEADER));
        if (m < 0 && !final) return -1;
        sp->state = IN_THOUGHT;
        *used = m == 1 ? LIT_LEN(THOUGHT_HEADER) : 0;
        return 1;
    }
    int partial = 0;
    for (size_t i = 0; i < sizeof markers / sizeof *markers; i++) {
        const struct marker *mk = &markers[i];
        if (mk->from != sp->state || (mk->tools_only && !sp->tools)) continue;
        int m = match_lit(p, left, mk->text, mk->len);
        if (m < 0) partial = 1;
        if (m != 1) continue;
        if (mk->kept && emit(sp, G4_SPAN_TOOL_CALL, mk->text, mk->len)) return -2;
        sp->thoughts += mk->counts == COUNTS_THOUGHT;
        sp->calls += mk->counts == COUNTS_CALL;
        sp->state = mk->to;
        *used = mk->len;
        return 1;
    }
    return partial && !final ? -1 : 0;
}

/* Moves pending text to the pieces, keeping back a possible partial marker. */
static int run(g4_spans *sp, int final) {
    const char *d = sp->pending.p;
    size_t n = sp->pending.n, i = 0;
    while (i < n) {
        size_t used = 0;
        int r = take_marker(sp, d + i, n - i, final, &used);
        if (r == -2) return -1;
        if (r < 0) break;
        if (r > 0) {
            i += used;
            continue;
        }
        /* plain text up to the next possible marker start */
        const char *lt = memchr(d + i + 1, '<', n - i - 1);
        size_t len = lt ? (size_t)(lt - (d + i)) : n - i;
        if (emit(sp, span_of(sp->state), d + i, len)) return -1;
        i += len;
    }
    memmove(sp->pending.p, d + i, n - i);
    sp->pending.n = n - i;
    sp->pending.p[sp->pending.n] = 0;
    return 0;
}

static int deliver(g4_spans *sp, int final, const g4_span_text **pieces, int *n_pieces) {
    g4_textbuf_clear(&sp->out);
    sp->n_pieces = 0;
    if (run(sp, final)) return -1;
    for (int i = 0; i < sp->n_pieces; i++)
        sp->view[i] = (g4_span_text){sp->pieces[i].span, sp->out.p + sp->pieces[i].off, sp->pieces[i].len};
    *pieces = sp->view;
    *n_pieces = sp->n_pieces;
    return 0;
}

g4_spans *g4_spans_new(int starts_in_thought, int tool_calls) {
    g4_spans *sp = calloc(1, sizeof *sp);
    if (!sp || g4_textbuf_append(&sp->pending, "", 0) || g4_textbuf_append(&sp->out, "", 0)) {
        g4_spans_free(sp);
        g4_fail("reply: out of memory");
        return NULL;
    }
    sp->state = starts_in_thought ? IN_THOUGHT : IN_ANSWER;
    sp->thoughts = starts_in_thought ? 1 : 0;
    sp->tools = tool_calls;
    return sp;
}

void g4_spans_free(g4_spans *sp) {
    if (!sp) return;
    free(sp->pending.p), free(sp->out.p), free(sp->pieces), free(sp->view);
    free(sp);
}

int g4_spans_push(g4_spans *sp, const char *text, size_t len, const g4_span_text **pieces, int *n_pieces) {
    if (g4_textbuf_append(&sp->pending, text, len)) return -1;
    return deliver(sp, 0, pieces, n_pieces);
}

int g4_spans_finish(g4_spans *sp, const char *text, size_t len, const g4_span_text **pieces, int *n_pieces) {
    if (g4_textbuf_append(&sp->pending, text, len)) return -1;
    return deliver(sp, 1, pieces, n_pieces);
}

g4_span g4_spans_current(const g4_spans *sp) { return span_of(sp->state); }

int g4_spans_thoughts(const g4_spans *sp) { return sp->thoughts; }

int g4_spans_tool_calls(const g4_spans *sp) { return sp->calls; }

/* ---------------------------------------------------------------- the thought filter */

struct g4_thought_filter {
    g4_spans *sp;
    g4_textbuf answer, thought;
};

g4_thought_filter *g4_thought_filter_new(int starts_in_thought) {
    g4_thought_filter *f = calloc(1, sizeof *f);
    if (!f || !(f->sp = g4_spans_new(starts_in_thought, 0)) || g4_textbuf_append(&f->answer, "", 0) ||
        g4_textbuf_append(&f->thought, "", 0)) {
        g4_thought_filter_free(f);
        g4_fail("chat: out of memory");
        return NULL;
    }
    return f;
}

/* The pieces into the two outputs: without tool-call spans every piece is answer or thought. */
static int filter_collect(g4_thought_filter *f, const g4_span_text *pieces, int n, const char **answer, size_t *answer_len,
                          const char **thought, size_t *thought_len) {
    g4_textbuf_clear(&f->answer);
    g4_textbuf_clear(&f->thought);
    for (int i = 0; i < n; i++)
        if (g4_textbuf_append(pieces[i].span == G4_SPAN_THOUGHT ? &f->thought : &f->answer, pieces[i].text, pieces[i].len))
            return -1;
    if (answer) *answer = f->answer.p;
    if (answer_len) *answer_len = f->answer.n;
    if (thought) *thought = f->thought.p;
    if (thought_len) *thought_len = f->thought.n;
    return 0;
}

int g4_thought_filter_push(g4_thought_filter *f, const char *text, size_t len, const char **answer, size_t *answer_len,
                           const char **thought, size_t *thought_len) {
    const g4_span_text *pieces;
    int n;
    if (g4_spans_push(f->sp, text, len, &pieces, &n)) return -1;
    return filter_collect(f, pieces, n, answer, answer_len, thought, thought_len);
}

int g4_thought_filter_finish(g4_thought_filter *f, const char **answer, size_t *answer_len, const char **thought,
                             size_t *thought_len) {
    const g4_span_text *pieces;
    int n;
    if (g4_spans_finish(f->sp, "", 0, &pieces, &n)) return -1;
    return filter_collect(f, pieces, n, answer, answer_len, thought, thought_len);
}

int g4_thought_filter_in_thought(const g4_thought_filter *f) { return g4_spans_current(f->sp) == G4_SPAN_THOUGHT; }

int g4_thought_filter_blocks(const g4_thought_filter *f) { return g4_spans_thoughts(f->sp); }

void g4_thought_filter_free(g4_thought_filter *f) {
    if (!f) return;
    g4_spans_free(f->sp);
    free(f->answer.p), free(f->thought.p);
    free(f);
}

/* ---------------------------------------------------------------- whole replies */

static const char *find_lit(const char *s, size_t n, const char *lit, size_t lit_n) {
    for (size_t i = 0; i + lit_n <= n; i++)
        if (s[i] == lit[0] && memcmp(s + i, lit, lit_n) == 0) return s + i;
    return NULL;
}

static int take_trimmed(const char *s, size_t n, char **out, size_t *out_len) {
    size_t a, b;
    g4_chat_trim(s ? s : "", n, &a, &b);
    g4_textbuf t = {0};
    if (g4_textbuf_append(&t, s ? s + a : "", b - a) || g4_textbuf_take(&t, out, out_len)) {
        free(t.p);
        return -1;
    }
    return 0;
}

static int take_copy(const char *s, size_t n, char **out) {
    g4_textbuf t = {0};
    if (g4_textbuf_append(&t, s, n) || g4_textbuf_take(&t, out, NULL)) {
        free(t.p);
        return -1;
    }
    return 0;
}

/* One call's text between its markers, "call:NAME{ARGS}", into name and arguments; a body of
 * another shape keeps an empty name and the whole body as its arguments. */
static int parse_call(const char *body, size_t n, g4_tool_call *call) {
    static const char prefix[] = "call:";
    const char *name = "", *args = body;
    size_t name_n = 0, args_n = n;
    if (n >= LIT_LEN(prefix) && memcmp(body, prefix, LIT_LEN(prefix)) == 0) {
        name = body + LIT_LEN(prefix);
        const char *brace = memchr(name, '{', n - LIT_LEN(prefix));
        name_n = brace ? (size_t)(brace - name) : n - LIT_LEN(prefix);
        args = name + name_n;
        args_n = n - LIT_LEN(prefix) - name_n;
    }
    return take_copy(name, name_n, &call->name) || take_copy(args, args_n, &call->arguments) ? -1 : 0;
}

/* The tool-call spans, each "<|tool_call>BODY<tool_call|>" and one after another, into calls; a
 * last one never closed only sets the flag. */
static int parse_calls(const char *s, size_t n, g4_chat_reply *r) {
    size_t at = 0, cap = 0;
    while (at < n) {
        /* every tool-call span starts with its opener (the splitter keeps it) */
        if (n - at < LIT_LEN(OPEN_CALL) || memcmp(s + at, OPEN_CALL, LIT_LEN(OPEN_CALL)) != 0) return g4_fail("chat: tool-call span without its opener");
        const char *body = s + at + LIT_LEN(OPEN_CALL);
        const char *close = find_lit(body, n - at - LIT_LEN(OPEN_CALL), CLOSE_CALL, LIT_LEN(CLOSE_CALL));
        if (!close) {
            r->tool_call_unclosed = 1;
            break;
        }
        if ((size_t)r->n_tool_calls == cap) {
            cap = cap ? 2 * cap : 4;
            g4_tool_call *c = realloc(r->tool_calls, sizeof *c * cap);
            if (!c) return g4_fail("chat: out of memory");
            r->tool_calls = c;
        }
        g4_tool_call *call = &r->tool_calls[r->n_tool_calls];
        memset(call, 0, sizeof *call);
        r->n_tool_calls++;
        if (parse_call(body, (size_t)(close - body), call)) return -1;
        at = (size_t)(close - s) + LIT_LEN(CLOSE_CALL);
    }
    return 0;
}

int g4_chat_parse_reply(const char *text, size_t len, g4_chat_reply *r) {
    memset(r, 0, sizeof *r);
    const char *open = find_lit(text, len, OPEN_THOUGHT, LIT_LEN(OPEN_THOUGHT));
    const char *close = find_lit(text, len, CLOSE_THOUGHT, LIT_LEN(CLOSE_THOUGHT));
    /* A closer before any opener ends a thought the prompt opened. */
    g4_spans *sp = g4_spans_new(close && (!open || close < open), 1);
    if (!sp) return -1;
    g4_textbuf parts[3] = {{0}}; /* by g4_span */
    const g4_span_text *pieces;
    int n = 0, rc = 0;
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        rc = pass == 0 ? g4_spans_push(sp, text, len, &pieces, &n) : g4_spans_finish(sp, "", 0, &pieces, &n);
        for (int i = 0; rc == 0 && i < n; i++) rc = g4_textbuf_append(&parts[pieces[i].span], pieces[i].text, pieces[i].len);
    }
    if (rc == 0) {
        r->thought_blocks = g4_spans_thoughts(sp);
        r->thought_unclosed = g4_spans_current(sp) == G4_SPAN_THOUGHT;
        rc = take_trimmed(parts[G4_SPAN_ANSWER].p, parts[G4_SPAN_ANSWER].n, &r->answer, &r->answer_len) ||
             take_trimmed(parts[G4_SPAN_THOUGHT].p, parts[G4_SPAN_THOUGHT].n, &r->thinking, &r->thinking_len) ||
             parse_calls(parts[G4_SPAN_TOOL_CALL].p, parts[G4_SPAN_TOOL_CALL].n, r);
    }
    for (int i = 0; i < 3; i++) free(parts[i].p);
    g4_spans_free(sp);
    if (rc) g4_chat_reply_free(r);
    return rc ? -1 : 0;
}

void g4_chat_reply_free(g4_chat_reply *r) {
    if (!r) return;
    free(r->answer), free(r->thinking);
    for (int i = 0; i < r->n_tool_calls; i++) free(r->tool_calls[i].name), free(r->tool_calls[i].arguments);
    free(r->tool_calls);
    memset(r, 0, sizeof *r);
}
