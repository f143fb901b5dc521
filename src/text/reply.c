/* The model's reply split into thought, answer and tool-call spans (spec chat-and-tokenizer.md
 * C.3): the streaming splitter (reply.h), the thought filter on top of it, and whole replies
 * (g4_chat_parse_reply) with their tool calls. */
#include "text/reply.h"

#include "text/chat.h"
#include "text/textbuf.h"
#include "g4.h"

static const char OPEN_THOUGHT[] = "<|channel>";
static const char CLOSE_THOUGHT[] = "<channel|>";
static const char THOUGHT_HEADER[] = "thought\n";
static const char OPEN_CALL[] = "<|tool_call>";
static const char CLOSE_CALL[] = "<tool_call|>";
#define LIT_LEN(s) (sizeof(s) - 1)

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

/* ---------------------------------------------------------------- pieces of text by span */

/* One call's output: text by span, consecutive text of one span joined (the splitter's and the
 * reader's). Pieces are offsets while text is added (the buffer may move), views once done. */
struct piece {
    g4_span span;
    size_t off, len; /* in out */
};

typedef struct {
    g4_textbuf out;
    struct piece *pieces;
    g4_span_text *view;
    int n, cap;
} piece_list;

static int pieces_add(piece_list *pl, g4_span span, const char *s, size_t n) {
    if (n == 0) return 0;
    size_t off = pl->out.n;
    if (g4_textbuf_append(&pl->out, s, n)) return -1;
    if (pl->n > 0 && pl->pieces[pl->n - 1].span == span) {
        pl->pieces[pl->n - 1].len += n;
        return 0;
    }
    if (pl->n == pl->cap) {
        int cap = pl->cap ? 2 * pl->cap : 8;
        struct piece *p = realloc(pl->pieces, sizeof *p * (size_t)cap);
        g4_span_text *v = realloc(pl->view, sizeof *v * (size_t)cap);
        if (p) pl->pieces = p;
        if (v) pl->view = v;
        if (!p || !v) return g4_fail("reply: out of memory");
        pl->cap = cap;
    }
    pl->pieces[pl->n++] = (struct piece){span, off, n};
    return 0;
}

static void pieces_clear(piece_list *pl) {
    g4_textbuf_clear(&pl->out);
    pl->n = 0;
}

/* The pieces as g4_span_text, valid until the list changes. */
static void pieces_view(piece_list *pl, const g4_span_text **pieces, int *n) {
    for (int i = 0; i < pl->n; i++) pl->view[i] = (g4_span_text){pl->pieces[i].span, pl->out.p + pl->pieces[i].off, pl->pieces[i].len};
    *pieces = pl->view;
    *n = pl->n;
}

static void pieces_free(piece_list *pl) { free(pl->out.p), free(pl->pieces), free(pl->view); }

/* ---------------------------------------------------------------- the splitter */

struct g4_spans {
    enum state state;
    int tools;
    int thoughts, calls;
    g4_textbuf pending; /* pushed text not yet final (a possible marker start) */
    piece_list pl;      /* this call's final text */
};

static g4_span span_of(enum state s) {
    return s == IN_ANSWER ? G4_SPAN_ANSWER : s == IN_TOOL_CALL ? G4_SPAN_TOOL_CALL : G4_SPAN_THOUGHT;
}

static int emit(g4_spans *sp, g4_span span, const char *s, size_t n) { return pieces_add(&sp->pl, span, s, n); }

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
    pieces_clear(&sp->pl);
    if (run(sp, final)) return -1;
    pieces_view(&sp->pl, pieces, n_pieces);
    return 0;
}

g4_spans *g4_spans_new(int starts_in_thought, int tool_calls) {
    g4_spans *sp = calloc(1, sizeof *sp);
    if (!sp || g4_textbuf_append(&sp->pending, "", 0) || g4_textbuf_append(&sp->pl.out, "", 0)) {
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
    free(sp->pending.p);
    pieces_free(&sp->pl);
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

/* ---------------------------------------------------------------- the reply reader */

struct g4_reply {
    g4_detokenizer *detok;
    g4_spans *spans; /* NULL for a raw reply */
    g4_calls_mode calls_mode;
    char **stop;
    int n_stop;
    int *end_ids, n_end_ids;
    g4_textbuf held;  /* answer text that may still begin a stop string */
    int stop_string;  /* the stop string matched, or -1 */
    int max_calls;    /* the reply ends at its max_calls-th call (0: no limit) */
    int finished;
    g4_textbuf call;  /* the tool call being read, markers included */
    g4_tool_call *calls;
    int n_calls, cap_calls, calls_seen; /* calls_seen: those of earlier deltas */
    piece_list pl;    /* this delta's spans */
};

/* The reply has ended before its generation: at a stop string, or at the last call it may make.
 * What comes after adds nothing. */
static int reply_ended(const g4_reply *r) { return r->stop_string >= 0 || (r->max_calls > 0 && r->n_calls >= r->max_calls); }

static int is_end_id(const g4_reply *r, int32_t token) {
    for (int i = 0; i < r->n_end_ids; i++)
        if (r->end_ids[i] == token) return 1;
    return 0;
}

/* The length of the longest end of s[0, n) that is a proper prefix of some stop string: text
 * that the next token may turn into one. */
static size_t stop_prefix_at_end(const g4_reply *r, const char *s, size_t n) {
    size_t best = 0;
    for (int k = 0; k < r->n_stop; k++) {
        size_t len = strlen(r->stop[k]);
        for (size_t take = len - 1 < n ? len - 1 : n; take > best; take--)
            if (!memcmp(s + n - take, r->stop[k], take)) {
                best = take;
                break;
            }
    }
    return best;
}

/* Where the first stop string in s[0, n) starts (n when none); *which gets its index. */
static size_t first_stop(const g4_reply *r, const char *s, size_t n, int *which) {
    size_t cut = n;
    for (int k = 0; k < r->n_stop; k++) {
        size_t sl = strlen(r->stop[k]);
        for (size_t i = 0; i + sl <= n && i < cut; i++)
            if (!memcmp(s + i, r->stop[k], sl)) {
                cut = i, *which = k;
                break;
            }
    }
    return cut;
}

/* Answer text through the stop strings, the one matcher: what can no longer begin one is
 * released as answer; at the first stop string what precedes it goes out and the reply ends. */
static int answer_text(g4_reply *r, const char *text, size_t len, int final) {
    if (r->stop_string >= 0) return 0;
    if (g4_textbuf_append(&r->held, text, len)) return -1;
    const char *h = r->held.p;
    size_t n = r->held.n, cut = first_stop(r, h, n, &r->stop_string);
    size_t out = r->stop_string >= 0 ? cut : final ? n : n - stop_prefix_at_end(r, h, n);
    if (pieces_add(&r->pl, G4_SPAN_ANSWER, h, out)) return -1;
    if (r->stop_string >= 0) {
        g4_textbuf_clear(&r->held);
        return 0;
    }
    memmove(r->held.p, h + out, n - out);
    r->held.n = n - out;
    r->held.p[r->held.n] = 0;
    return 0;
}

/* A whole call's text into the list of calls: 1 when it parsed, 0 when it is no call Gemma's
 * syntax can say, -1 when out of memory. */
static int complete_call(g4_reply *r, const char *text, size_t n) {
    char *name, *json;
    if (g4_tool_call_parse(text, n, &name, &json)) return 0;
    if (r->n_calls == r->cap_calls) {
        int cap = r->cap_calls ? 2 * r->cap_calls : 4;
        g4_tool_call *c = realloc(r->calls, sizeof *c * (size_t)cap);
        if (!c) {
            free(name), free(json);
            return g4_fail("reply: out of memory");
        }
        r->calls = c, r->cap_calls = cap;
    }
    r->calls[r->n_calls++] = (g4_tool_call){name, json};
    return 1;
}

/* The call read so far, once closed (or at the end): a call, or answer text after all when held
 * whole and it does not parse (or never closed). */
static int close_call(g4_reply *r, int closed, int final) {
    int ok = closed ? complete_call(r, r->call.p, r->call.n) : 0;
    int rc = ok < 0;
    if (!rc && r->calls_mode == G4_CALLS_WHOLE)
        rc = ok ? pieces_add(&r->pl, G4_SPAN_TOOL_CALL, r->call.p, r->call.n) != 0 : answer_text(r, r->call.p, r->call.n, final) != 0;
    g4_textbuf_clear(&r->call);
    return rc ? -1 : 0;
}

/* Tool-call text: streamed as it comes or held; each call completed at its closer (the splitter
 * hands a marker over whole, never split across pieces). */
static int call_text(g4_reply *r, const char *s, size_t n, int final) {
    if (r->calls_mode == G4_CALLS_STREAM && pieces_add(&r->pl, G4_SPAN_TOOL_CALL, s, n)) return -1;
    while (n > 0 && !reply_ended(r)) {
        const char *close = find_lit(s, n, CLOSE_CALL, LIT_LEN(CLOSE_CALL));
        size_t take = close ? (size_t)(close - s) + LIT_LEN(CLOSE_CALL) : n;
        if (g4_textbuf_append(&r->call, s, take) || (close && close_call(r, 1, final))) return -1;
        s += take, n -= take; /* what follows a closer is the next call's */
    }
    return 0;
}

/* The splitter's pieces into this delta: thoughts as they are, answers through the stop strings,
 * calls completed. Nothing after a stop string. */
static int take_pieces(g4_reply *r, const g4_span_text *p, int n, int final) {
    for (int i = 0; i < n && !reply_ended(r); i++) {
        int rc = p[i].span == G4_SPAN_THOUGHT ? pieces_add(&r->pl, G4_SPAN_THOUGHT, p[i].text, p[i].len)
                 : p[i].span == G4_SPAN_TOOL_CALL ? call_text(r, p[i].text, p[i].len, final)
                                                  : answer_text(r, p[i].text, p[i].len, final);
        if (rc) return -1;
    }
    return 0;
}

/* Decoded text into this delta's spans. */
static int take_text(g4_reply *r, const char *text, size_t len, int final) {
    if (!r->spans) return answer_text(r, text, len, final);
    const g4_span_text *p;
    int n;
    if ((final ? g4_spans_finish(r->spans, text, len, &p, &n) : g4_spans_push(r->spans, text, len, &p, &n))) return -1;
    return take_pieces(r, p, n, final);
}

static void delta_begin(g4_reply *r, int32_t token, g4_reply_delta *d) {
    pieces_clear(&r->pl);
    r->calls_seen = r->n_calls;
    *d = (g4_reply_delta){.token = token, .text = "", .stop_string = -1};
}

static void delta_end(g4_reply *r, g4_reply_delta *d) {
    pieces_view(&r->pl, &d->spans, &d->n_spans);
    d->calls = r->calls ? r->calls + r->calls_seen : NULL;   /* no offset on NULL (UB, clang's UBSan) */
    d->n_calls = r->n_calls - r->calls_seen;
    d->ended = reply_ended(r);
    d->stop_string = r->stop_string;
}

static int check_reply_options(const g4_reply_options *o) {
    if (o->n_stop < 0 || (o->n_stop && !o->stop)) return g4_fail("reply: n_stop is %d but stop is %s", o->n_stop, o->stop ? "set" : "NULL");
    if (o->n_end_ids < 0 || (o->n_end_ids && !o->end_ids))
        return g4_fail("reply: n_end_ids is %d but end_ids is %s", o->n_end_ids, o->end_ids ? "set" : "NULL");
    if (o->calls != G4_CALLS_STREAM && o->calls != G4_CALLS_WHOLE && o->calls != G4_CALLS_TEXT)
        return g4_fail("reply: calls is %d (G4_CALLS_STREAM, G4_CALLS_WHOLE or G4_CALLS_TEXT)", (int)o->calls);
    if (o->max_calls < 0) return g4_fail("reply: max_calls is %d (0 for no limit)", o->max_calls);
    if (o->raw && (o->calls != G4_CALLS_TEXT || o->prefix)) return g4_fail("reply: a raw reply has no spans: calls must be G4_CALLS_TEXT and no prefix");
    for (int k = 0; k < o->n_stop; k++) {
        const char *s = o->stop[k];
        if (!s || !*s) return g4_fail("reply: stop string %d is %s", k, s ? "empty" : "NULL");
        size_t n = strlen(s);
        if (g4_text_utf8_prefix(s, n) < n) return g4_fail("reply: stop string %d is not valid UTF-8 (byte %zu)", k, g4_text_utf8_prefix(s, n));
    }
    return 0;
}

/* The prompt's part of the reply: read (a call it opens goes on), released never. */
static int read_prefix(g4_reply *r, const char *prefix) {
    const g4_span_text *p;
    int n;
    if (g4_spans_push(r->spans, prefix, strlen(prefix), &p, &n)) return -1;
    for (int i = 0; i < n; i++)
        if (p[i].span == G4_SPAN_TOOL_CALL && g4_textbuf_append(&r->call, p[i].text, p[i].len)) return -1;
    return 0;
}

g4_reply *g4_reply_new(const g4_tokenizer *tok, const g4_reply_options *o) {
    if (!tok || !o) {
        g4_fail("reply: %s is NULL", tok ? "the options" : "the tokenizer");
        return NULL;
    }
    if (check_reply_options(o)) return NULL;
    g4_reply *r = calloc(1, sizeof *r);
    int rc = !r;
    if (!rc) {
        r->stop_string = -1;
        r->calls_mode = o->calls;
        r->max_calls = o->max_calls;
        r->stop = calloc((size_t)o->n_stop + 1, sizeof *r->stop);
        r->end_ids = malloc(sizeof *r->end_ids * ((size_t)o->n_end_ids + 1));
        rc = !r->stop || !r->end_ids;
    }
    for (int k = 0; !rc && k < o->n_stop; k++, r->n_stop++) rc = take_copy(o->stop[k], strlen(o->stop[k]), &r->stop[k]);
    if (!rc) {
        if (o->n_end_ids) memcpy(r->end_ids, o->end_ids, sizeof *r->end_ids * (size_t)o->n_end_ids);
        r->n_end_ids = o->n_end_ids;
        r->detok = g4_detokenizer_new(tok);
        r->spans = o->raw ? NULL : g4_spans_new(o->starts_in_thought, o->calls != G4_CALLS_TEXT);
        rc = !r->detok || (!o->raw && !r->spans) || g4_textbuf_append(&r->held, "", 0) || g4_textbuf_append(&r->call, "", 0) ||
             g4_textbuf_append(&r->pl.out, "", 0);
    }
    if (!rc && o->prefix) rc = read_prefix(r, o->prefix);
    if (rc) {
        g4_reply_free(r);
        g4_fail("reply: out of memory");
        return NULL;
    }
    return r;
}

void g4_reply_free(g4_reply *r) {
    if (!r) return;
    g4_detokenizer_free(r->detok);
    g4_spans_free(r->spans);
    for (int k = 0; k < r->n_stop; k++) free(r->stop[k]);
    free(r->stop), free(r->end_ids), free(r->held.p), free(r->call.p);
    for (int i = 0; i < r->n_calls; i++) free(r->calls[i].name), free(r->calls[i].arguments);
    free(r->calls);
    pieces_free(&r->pl);
    free(r);
}

int g4_reply_push_token(g4_reply *r, int32_t token, g4_reply_delta *d) {
    delta_begin(r, token, d);
    if (r->finished) return g4_fail("reply: a token pushed after g4_reply_finish");
    int end = is_end_id(r, token);
    if (!end && !reply_ended(r) && (g4_detokenizer_push(r->detok, token, &d->text, &d->len) || take_text(r, d->text, d->len, 0)))
        return -1;
    delta_end(r, d);
    d->ended |= end;
    return reply_ended(r);
}

int g4_reply_finish(g4_reply *r, g4_stop_reason why, g4_reply_delta *d) {
    delta_begin(r, -1, d);
    if (r->finished) return g4_fail("reply: g4_reply_finish called twice");
    r->finished = 1;
    if (r->stop_string < 0) {
        /* after the last call it may make, the reply takes no more text, but what the stop strings
         * held back before the call is answer text still */
        int rc = !reply_ended(r) && (g4_detokenizer_flush(r->detok, &d->text, &d->len) || take_text(r, d->text, d->len, 1));
        /* a call never closed; then what the stop strings hold (the last text may have been none of the answer) */
        if (!rc && r->call.n && !reply_ended(r)) rc = close_call(r, 0, 1);
        if (!rc) rc = answer_text(r, "", 0, 1);
        if (rc) return -1;
    }
    delta_end(r, d);
    d->finish = r->stop_string >= 0 ? G4_FINISH_STOP
                : why == G4_STOP_BUDGET || why == G4_STOP_CONTEXT ? G4_FINISH_LENGTH
                : r->n_calls ? G4_FINISH_TOOL_CALLS
                             : G4_FINISH_STOP;
    return 0;
}
