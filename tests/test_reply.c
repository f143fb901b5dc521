/* The reply reader (g4_reply, include/g4.h): tokens in; text, spans, stop strings, tool calls and
 * the finish reason out. Worked examples derived by hand, token by token, on the built-in
 * model's tokenizer, whose byte tokens (<0xNN>) each add one known byte and whose special tokens
 * (<|channel>, <tool_call|>, <turn|>) add their literal text:
 *  - a stop string split across three tokens (held back, then cut), a false start released, a
 *    prefix held at the end released by the finish;
 *  - a stop string that is a prefix of another, and two that start at different places;
 *  - a multi-byte character split across byte tokens (held back by the detokenizer) with a stop
 *    string right after, and a stop string that begins with, or is, a multi-byte character;
 *  - tool calls completed: streamed, held whole, unparseable (answer text, which stop strings
 *    read), never closed, opened by the prompt (prefix);
 *  - a stop string inside a thought does not stop (stop strings read the answer only);
 *  - end ids, raw replies, finish reasons for every stop reason;
 *  - bad options and misuse: one-line errors;
 *  - the conversation's non-blocking form driven by a stepper of the test's own gives the tokens,
 *    text and message of the blocking g4_conversation_reply, and its stop strings cut the reply. */
#include "testutil.h"

#define TINY_MATH "models/gemma4-tiny-math"

static g4_tokenizer *tok;

static int one_line(const char *msg) { return msg && *msg && !strchr(msg, '\n'); }

/* A token by its spec: one byte is that byte's byte token, anything longer a piece (a special
 * token such as "<|tool_call>"). */
static int32_t tok_id(const char *spec) {
    char piece[16];
    if (strlen(spec) == 1) {
        snprintf(piece, sizeof piece, "<0x%02X>", (unsigned char)spec[0]);
        spec = piece;
    }
    int32_t id = g4_tokenizer_piece_to_id(tok, spec);
    CHECK(id >= 0, "the tokenizer has no token %s", spec);
    return id;
}

/* A delta written out: each span as A[..], T[..] (thought) or C[..] (tool call), each completed
 * call as call:NAME(JSON), then "stop=K" for a matched stop string, "end" for an end id. */
static void render(const g4_reply_delta *d, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < d->n_spans; i++) {
        char kind = d->spans[i].span == G4_SPAN_ANSWER ? 'A' : d->spans[i].span == G4_SPAN_THOUGHT ? 'T' : 'C';
        n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%c[%.*s]", kind, (int)d->spans[i].len, d->spans[i].text);
    }
    for (int k = 0; k < d->n_calls; k++)
        n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, " call:%s(%s)", d->calls[k].name, d->calls[k].arguments);
    if (d->stop_string >= 0) n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, " stop=%d", d->stop_string);
    else if (d->ended) n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, " end");
}

/* One step of a worked example: the token pushed, the delta's decoded text and its rendering,
 * the push's return; or (token NULL) the finish, rc the generation's g4_stop_reason. */
typedef struct {
    const char *token;
    const char *text, *want;
    int rc;
} step;

#define FINISH(why, want) {NULL, "", want, why}

static void run_steps(const char *what, const g4_reply_options *o, const step *steps, int n, g4_finish want_finish) {
    g4_reply *r = g4_reply_new(tok, o);
    CHECK(r != NULL, "%s: %s", what, g4_last_error());
    if (!r) return;
    for (int i = 0; i < n; i++) {
        g4_reply_delta d;
        char got[1024];
        if (!steps[i].token) {
            int rc = g4_reply_finish(r, (g4_stop_reason)steps[i].rc, &d);
            render(&d, got, sizeof got);
            CHECK(rc == 0 && d.token == -1, "%s: finish: %d, %s", what, rc, g4_last_error());
            CHECK(!strcmp(got, steps[i].want), "%s: finish gave '%s', want '%s'", what, got, steps[i].want);
            CHECK(d.finish == want_finish, "%s: finish reason %d, want %d", what, (int)d.finish, (int)want_finish);
            continue;
        }
        int32_t id = tok_id(steps[i].token);
        int rc = g4_reply_push_token(r, id, &d);
        render(&d, got, sizeof got);
        CHECK(rc == steps[i].rc && d.token == id, "%s: step %d (%s): returned %d, want %d", what, i, steps[i].token, rc, steps[i].rc);
        CHECK(d.len == strlen(steps[i].text) && !memcmp(d.text, steps[i].text, d.len), "%s: step %d (%s): text '%.*s', want '%s'", what, i,
              steps[i].token, (int)d.len, d.text, steps[i].text);
        CHECK(!strcmp(got, steps[i].want), "%s: step %d (%s): '%s', want '%s'", what, i, steps[i].token, got, steps[i].want);
        CHECK(d.finish == G4_FINISH_NONE, "%s: step %d: a finish reason before the finish", what, i);
    }
    g4_reply_free(r);
}

#define RUN(what, opts, want_finish, ...)                                                        \
    do {                                                                                         \
        static const step s_[] = {__VA_ARGS__};                                                  \
        run_steps(what, opts, s_, (int)(sizeof s_ / sizeof *s_), want_finish);                   \
    } while (0)

/* ---------------------------------------------------------------- stop strings */

static void test_stop_strings(void) {
    static const char *end[] = {"END"};
    g4_reply_options o = {.stop = end, .n_stop = 1, .calls = G4_CALLS_TEXT};
    /* "aENDb": "E" and "EN" may begin "END" (held), "D" completes it: the answer is "a", the
     * decoded text keeps every byte the sequence holds, nothing after the match is read */
    RUN("END split across E, N, D", &o, G4_FINISH_STOP,
        {"a", "a", "A[a]", 0}, {"E", "E", "", 0}, {"N", "N", "", 0}, {"D", "D", " stop=0", 1}, {"b", "", " stop=0", 1},
        FINISH(G4_STOP_USER, " stop=0"));
    /* "ENx": a false start, released whole when "x" rules it out */
    RUN("a false start", &o, G4_FINISH_STOP, {"E", "E", "", 0}, {"N", "N", "", 0}, {"x", "x", "A[ENx]", 0}, FINISH(G4_STOP_EOS, ""));
    /* "EE N D": the first "E" goes once the second cannot continue it but may begin one itself */
    RUN("a restart", &o, G4_FINISH_STOP, {"E", "E", "", 0}, {"E", "E", "A[E]", 0}, {"N", "N", "", 0}, {"D", "D", " stop=0", 1},
        FINISH(G4_STOP_EOS, " stop=0"));
    /* the budget runs out on "EN": the finish releases it, finish reason length */
    RUN("a prefix at the end", &o, G4_FINISH_LENGTH, {"a", "a", "A[a]", 0}, {"E", "E", "", 0}, {"N", "N", "", 0},
        FINISH(G4_STOP_BUDGET, "A[EN]"));

    /* "ab" is a prefix of "abc": "xab" stops at "ab" (it is complete first), whichever is listed first */
    static const char *abc_ab[] = {"abc", "ab"}, *ab_abc[] = {"ab", "abc"};
    g4_reply_options o2 = {.stop = abc_ab, .n_stop = 2, .calls = G4_CALLS_TEXT};
    RUN("ab inside abc's list", &o2, G4_FINISH_STOP, {"x", "x", "A[x]", 0}, {"a", "a", "", 0}, {"b", "b", " stop=1", 1},
        FINISH(G4_STOP_USER, " stop=1"));
    o2.stop = ab_abc;
    RUN("ab listed first", &o2, G4_FINISH_STOP, {"x", "x", "A[x]", 0}, {"a", "a", "", 0}, {"b", "b", " stop=0", 1},
        FINISH(G4_STOP_USER, " stop=0"));
    /* "zb" and "b" both match "azb": the one that starts first wins, the cut is before "zb" */
    static const char *b_zb[] = {"b", "zb"};
    g4_reply_options o3 = {.stop = b_zb, .n_stop = 2, .calls = G4_CALLS_TEXT};
    RUN("the first to start wins", &o3, G4_FINISH_STOP, {"a", "a", "A[a]", 0}, {"z", "z", "", 0}, {"b", "b", " stop=1", 1},
        FINISH(G4_STOP_USER, " stop=1"));
    static const char *zb_b[] = {"zb", "b"};
    o3.stop = zb_b;
    RUN("the first to start wins, listed first", &o3, G4_FINISH_STOP, {"a", "a", "A[a]", 0}, {"z", "z", "", 0}, {"b", "b", " stop=0", 1},
        FINISH(G4_STOP_USER, " stop=0"));
    /* no stop strings: every byte goes out at once */
    g4_reply_options none = {.calls = G4_CALLS_TEXT};
    RUN("no stop strings", &none, G4_FINISH_STOP, {"E", "E", "A[E]", 0}, {"N", "N", "A[N]", 0}, FINISH(G4_STOP_EOS, ""));
}

/* ---------------------------------------------------------------- UTF-8 */

static void test_utf8(void) {
    /* "é" is C3 A9: the first byte token releases nothing (the detokenizer holds it), the second
     * the whole character; "!" right after stops the reply */
    static const char *bang[] = {"!"};
    g4_reply_options o = {.stop = bang, .n_stop = 1, .calls = G4_CALLS_TEXT};
    RUN("é split, then a stop", &o, G4_FINISH_STOP, {"h", "h", "A[h]", 0}, {"\xC3", "", "", 0}, {"\xA9", "\xC3\xA9", "A[\xC3\xA9]", 0},
        {"!", "!", " stop=0", 1}, {"z", "", " stop=0", 1}, FINISH(G4_STOP_USER, " stop=0"));
    /* a stop string that begins with "é": the character is decoded but held as the answer */
    static const char *e_bang[] = {"\xC3\xA9!"};
    o.stop = e_bang;
    RUN("a stop string beginning with é", &o, G4_FINISH_STOP, {"h", "h", "A[h]", 0}, {"\xC3", "", "", 0}, {"\xA9", "\xC3\xA9", "", 0},
        {"!", "!", " stop=0", 1}, FINISH(G4_STOP_EOS, " stop=0"));
    /* "€" (E2 82 AC) as the stop string, over three byte tokens; and "€" not followed through */
    static const char *euro[] = {"\xE2\x82\xAC"};
    o.stop = euro;
    RUN("the stop string is one 3-byte character", &o, G4_FINISH_STOP, {"a", "a", "A[a]", 0}, {"\xE2", "", "", 0}, {"\x82", "", "", 0},
        {"\xAC", "\xE2\x82\xAC", " stop=0", 1}, FINISH(G4_STOP_EOS, " stop=0"));
    /* "₠" (E2 82 A0) shares the first two bytes: released whole at its last byte */
    RUN("a character that shares bytes with the stop string", &o, G4_FINISH_STOP, {"\xE2", "", "", 0}, {"\x82", "", "", 0},
        {"\xA0", "\xE2\x82\xA0", "A[\xE2\x82\xA0]", 0}, FINISH(G4_STOP_EOS, ""));
    /* a character cut off by the budget: the finish releases the detokenizer's replacement */
    g4_reply_options none = {.calls = G4_CALLS_TEXT};
    RUN("a lone lead byte at the end", &none, G4_FINISH_LENGTH, {"a", "a", "A[a]", 0}, {"\xC3", "", "", 0},
        FINISH(G4_STOP_BUDGET, "A[\xEF\xBF\xBD]"));
}

/* ---------------------------------------------------------------- tool calls */

static void test_tool_calls(void) {
    /* held whole: nothing of the call goes out until its closer; then the whole text as one
     * tool-call span and the call with JSON arguments; the reply that made it ends as tool_calls */
    g4_reply_options whole = {.calls = G4_CALLS_WHOLE};
    RUN("a call held whole", &whole, G4_FINISH_TOOL_CALLS, {"x", "x", "A[x]", 0}, {"<|tool_call>", "<|tool_call>", "", 0},
        {"c", "c", "", 0}, {"a", "a", "", 0}, {"l", "l", "", 0}, {"l", "l", "", 0}, {":", ":", "", 0}, {"f", "f", "", 0}, {"{", "{", "", 0},
        {"a", "a", "", 0}, {":", ":", "", 0}, {"1", "1", "", 0}, {"}", "}", "", 0},
        {"<tool_call|>", "<tool_call|>", "C[<|tool_call>call:f{a:1}<tool_call|>] call:f({\"a\":1})", 0}, {"y", "y", "A[y]", 0},
        FINISH(G4_STOP_EOS, ""));
    /* the same streamed: the call's text as it comes, the call at its closer */
    g4_reply_options stream = {.calls = G4_CALLS_STREAM};
    RUN("a call streamed", &stream, G4_FINISH_TOOL_CALLS, {"<|tool_call>", "<|tool_call>", "C[<|tool_call>]", 0}, {"c", "c", "C[c]", 0},
        {"a", "a", "C[a]", 0}, {"l", "l", "C[l]", 0}, {"l", "l", "C[l]", 0}, {":", ":", "C[:]", 0}, {"g", "g", "C[g]", 0}, {"{", "{", "C[{]", 0},
        {"}", "}", "C[}]", 0}, {"<tool_call|>", "<tool_call|>", "C[<tool_call|>] call:g({})", 0}, FINISH(G4_STOP_EOS, ""));
    /* the budget runs out inside a call: no call, finish reason length */
    RUN("a call cut by the budget", &stream, G4_FINISH_LENGTH, {"<|tool_call>", "<|tool_call>", "C[<|tool_call>]", 0}, {"c", "c", "C[c]", 0},
        FINISH(G4_STOP_BUDGET, ""));
    /* held whole but never closed: it is answer text after all */
    RUN("a held call never closed", &whole, G4_FINISH_STOP, {"<|tool_call>", "<|tool_call>", "", 0}, {"c", "c", "", 0},
        FINISH(G4_STOP_EOS, "A[<|tool_call>c]"));
    /* held whole and no call Gemma's syntax can say: answer text, which the stop strings read */
    RUN("an unparseable call", &whole, G4_FINISH_STOP, {"<|tool_call>", "<|tool_call>", "", 0}, {"o", "o", "", 0}, {"k", "k", "", 0},
        {"<tool_call|>", "<tool_call|>", "A[<|tool_call>ok<tool_call|>]", 0}, FINISH(G4_STOP_EOS, ""));
    static const char *ok[] = {"ok"};
    g4_reply_options whole_stop = {.stop = ok, .n_stop = 1, .calls = G4_CALLS_WHOLE};
    RUN("an unparseable call holding a stop string", &whole_stop, G4_FINISH_STOP, {"<|tool_call>", "<|tool_call>", "", 0}, {"o", "o", "", 0},
        {"k", "k", "", 0}, {"<tool_call|>", "<tool_call|>", "A[<|tool_call>] stop=0", 1}, FINISH(G4_STOP_EOS, " stop=0"));
    /* a stop string inside a call that parses does not stop it (stop strings read the answer) */
    static const char *f[] = {"f"};
    g4_reply_options whole_f = {.stop = f, .n_stop = 1, .calls = G4_CALLS_WHOLE};
    RUN("a stop string inside a call", &whole_f, G4_FINISH_TOOL_CALLS, {"<|tool_call>", "<|tool_call>", "", 0}, {"c", "c", "", 0},
        {"a", "a", "", 0}, {"l", "l", "", 0}, {"l", "l", "", 0}, {":", ":", "", 0}, {"f", "f", "", 0}, {"{", "{", "", 0}, {"}", "}", "", 0},
        {"<tool_call|>", "<tool_call|>", "C[<|tool_call>call:f{}<tool_call|>] call:f({})", 0}, FINISH(G4_STOP_EOS, ""));
    /* calls as text: the markers are answer text, which stop strings read: "l>x{" begins inside
     * "<|tool_call>", whose end "l>" is held back until "x{" completes it */
    static const char *call[] = {"l>x{"};
    g4_reply_options text = {.stop = call, .n_stop = 1, .calls = G4_CALLS_TEXT};
    RUN("calls as text", &text, G4_FINISH_STOP, {"<|tool_call>", "<|tool_call>", "A[<|tool_cal]", 0}, {"x", "x", "", 0},
        {"{", "{", " stop=0", 1}, FINISH(G4_STOP_EOS, " stop=0"));
    /* the prompt opened the call (a forced tool choice): the rest completes it; the span holds it whole */
    g4_reply_options forced = {.calls = G4_CALLS_WHOLE, .prefix = "<|tool_call>call:w{"};
    RUN("a call the prompt opened", &forced, G4_FINISH_TOOL_CALLS, {"x", "x", "", 0}, {":", ":", "", 0}, {"2", "2", "", 0}, {"}", "}", "", 0},
        {"<tool_call|>", "<tool_call|>", "C[<|tool_call>call:w{x:2}<tool_call|>] call:w({\"x\":2})", 0}, FINISH(G4_STOP_EOS, ""));
    /* max_calls 1 (OpenAI's parallel_tool_calls false): the reply ends at its first call's closer
     * (push returns 1, as at a stop string); a second call's tokens add nothing; the answer text a
     * stop string held back before the call is released at the finish; the finish is tool_calls */
    static const char *xy[] = {"xy"};
    g4_reply_options one = {.stop = xy, .n_stop = 1, .calls = G4_CALLS_WHOLE, .max_calls = 1};
    RUN("one call allowed", &one, G4_FINISH_TOOL_CALLS, {"x", "x", "", 0}, {"<|tool_call>", "<|tool_call>", "", 0}, {"c", "c", "", 0},
        {"a", "a", "", 0}, {"l", "l", "", 0}, {"l", "l", "", 0}, {":", ":", "", 0}, {"f", "f", "", 0}, {"{", "{", "", 0}, {"}", "}", "", 0},
        {"<tool_call|>", "<tool_call|>", "C[<|tool_call>call:f{}<tool_call|>] call:f({}) end", 1}, {"<|tool_call>", "", " end", 1},
        {"y", "", " end", 1}, FINISH(G4_STOP_EOS, "A[x] end"));
    /* max_calls 2, streamed: the first call goes on to the second, whose closer ends the reply */
    g4_reply_options two = {.calls = G4_CALLS_STREAM, .max_calls = 2};
    RUN("two calls allowed", &two, G4_FINISH_TOOL_CALLS, {"<|tool_call>", "<|tool_call>", "C[<|tool_call>]", 0}, {"c", "c", "C[c]", 0},
        {"a", "a", "C[a]", 0}, {"l", "l", "C[l]", 0}, {"l", "l", "C[l]", 0}, {":", ":", "C[:]", 0}, {"g", "g", "C[g]", 0}, {"{", "{", "C[{]", 0},
        {"}", "}", "C[}]", 0}, {"<tool_call|>", "<tool_call|>", "C[<tool_call|>] call:g({})", 0}, {"<|tool_call>", "<|tool_call>", "C[<|tool_call>]", 0},
        {"c", "c", "C[c]", 0}, {"a", "a", "C[a]", 0}, {"l", "l", "C[l]", 0}, {"l", "l", "C[l]", 0}, {":", ":", "C[:]", 0}, {"h", "h", "C[h]", 0},
        {"{", "{", "C[{]", 0}, {"}", "}", "C[}]", 0}, {"<tool_call|>", "<tool_call|>", "C[<tool_call|>] call:h({}) end", 1}, {"z", "", " end", 1},
        FINISH(G4_STOP_EOS, " end"));
    /* a call, then the budget: length wins over tool_calls (the reply did not stop by itself) */
    RUN("calls and the budget", &forced, G4_FINISH_LENGTH, {"}", "}", "", 0}, {"<tool_call|>", "<tool_call|>", "C[<|tool_call>call:w{}<tool_call|>] call:w({})", 0},
        FINISH(G4_STOP_CONTEXT, ""));
}

/* ---------------------------------------------------------------- thoughts, ends, raw */

static void test_thoughts_ends_raw(void) {
    /* "STOP" in a thought is thought text; in the answer it stops the reply */
    static const char *stop[] = {"S"};
    g4_reply_options o = {.stop = stop, .n_stop = 1, .calls = G4_CALLS_STREAM};
    RUN("a stop string in a thought", &o, G4_FINISH_STOP, {"<|channel>", "<|channel>", "", 0}, {"t", "t", "", 0}, {"h", "h", "", 0},
        {"o", "o", "", 0}, {"u", "u", "", 0}, {"g", "g", "", 0}, {"h", "h", "", 0}, {"t", "t", "", 0}, {"\n", "\n", "", 0}, {"S", "S", "T[S]", 0},
        {"<channel|>", "<channel|>", "", 0}, {"a", "a", "A[a]", 0}, {"S", "S", " stop=0", 1}, FINISH(G4_STOP_USER, " stop=0"));
    /* the prompt left a thought open: the reply starts in it */
    o.starts_in_thought = 1;
    RUN("a reply that starts in a thought", &o, G4_FINISH_STOP, {"S", "S", "T[S]", 0}, {"<channel|>", "<channel|>", "", 0}, {"S", "S", " stop=0", 1},
        FINISH(G4_STOP_EOS, " stop=0"));
    /* an end id adds no text; a generation told to ignore it goes on, and so does the reader */
    int32_t turn_end = tok_id("<turn|>");
    g4_reply_options ends = {.end_ids = &turn_end, .n_end_ids = 1, .calls = G4_CALLS_TEXT};
    RUN("an end id", &ends, G4_FINISH_STOP, {"a", "a", "A[a]", 0}, {"<turn|>", "", " end", 0}, {"b", "b", "A[b]", 0}, FINISH(G4_STOP_EOS, ""));
    /* without an end id the same token is its literal text */
    g4_reply_options plain = {.calls = G4_CALLS_TEXT};
    RUN("the same token, no end id", &plain, G4_FINISH_STOP, {"<turn|>", "<turn|>", "A[<turn|>]", 0}, FINISH(G4_STOP_EOS, ""));
    /* raw: no spans, the thought markers are answer text */
    g4_reply_options raw = {.raw = 1, .calls = G4_CALLS_TEXT};
    RUN("raw", &raw, G4_FINISH_STOP, {"<|channel>", "<|channel>", "A[<|channel>]", 0}, {"x", "x", "A[x]", 0}, FINISH(G4_STOP_USER, ""));
    /* the finish reasons of a reply with no call: error and user stop, context and budget length */
    RUN("G4_STOP_ERROR", &plain, G4_FINISH_STOP, FINISH(G4_STOP_ERROR, ""));
    RUN("G4_STOP_CONTEXT", &plain, G4_FINISH_LENGTH, FINISH(G4_STOP_CONTEXT, ""));
}

/* ---------------------------------------------------------------- bad options, misuse */

static void expect_refused(const g4_reply_options *o, const char *needle, const char *what) {
    g4_reply *r = g4_reply_new(tok, o);
    CHECK(r == NULL, "%s: accepted", what);
    CHECK(one_line(g4_last_error()) && strstr(g4_last_error(), needle), "%s: '%s' does not say '%s'", what, g4_last_error(), needle);
    g4_reply_free(r);
}

static void test_errors(void) {
    static const char *empty[] = {"ok", ""}, *bad_utf8[] = {"\xC3("}, *null[] = {NULL};
    expect_refused(&(g4_reply_options){.stop = empty, .n_stop = 2}, "stop string 1 is empty", "an empty stop string");
    expect_refused(&(g4_reply_options){.stop = bad_utf8, .n_stop = 1}, "stop string 0 is not valid UTF-8", "a stop string that is not UTF-8");
    expect_refused(&(g4_reply_options){.stop = null, .n_stop = 1}, "stop string 0 is NULL", "a NULL stop string");
    expect_refused(&(g4_reply_options){.n_stop = 2}, "n_stop is 2 but stop is NULL", "stop strings without the array");
    expect_refused(&(g4_reply_options){.n_end_ids = -1}, "n_end_ids is -1", "a negative count of end ids");
    expect_refused(&(g4_reply_options){.calls = (g4_calls_mode)7}, "calls is 7", "an unknown calls mode");
    expect_refused(&(g4_reply_options){.raw = 1, .calls = G4_CALLS_STREAM}, "raw reply has no spans", "raw with spans");
    expect_refused(&(g4_reply_options){.max_calls = -1}, "max_calls is -1", "a negative max_calls");
    CHECK(g4_reply_new(NULL, &(g4_reply_options){0}) == NULL && strstr(g4_last_error(), "tokenizer is NULL"), "a NULL tokenizer: %s", g4_last_error());
    g4_reply *r = g4_reply_new(tok, &(g4_reply_options){.calls = G4_CALLS_TEXT});
    g4_reply_delta d;
    CHECK(r && g4_reply_finish(r, G4_STOP_EOS, &d) == 0, "finish: %s", g4_last_error());
    CHECK(r && g4_reply_finish(r, G4_STOP_EOS, &d) == -1 && strstr(g4_last_error(), "called twice"), "a second finish: %s", g4_last_error());
    CHECK(r && g4_reply_push_token(r, tok_id("a"), &d) == -1 && strstr(g4_last_error(), "after g4_reply_finish"), "a push after the finish: %s",
          g4_last_error());
    g4_reply_free(r);
}

/* ---------------------------------------------------------------- the conversation, driven */

typedef struct {
    char text[8192], answer[8192];
    size_t len, answer_len;
    int deltas, last, stop_string;
} collected;

static void collect_delta(collected *c, const g4_reply_delta *d) {
    c->deltas++;
    c->last += d->token == -1;
    if (d->stop_string >= 0) c->stop_string = d->stop_string;
    if (c->len + d->len < sizeof c->text) memcpy(c->text + c->len, d->text, d->len), c->len += d->len;
    for (int i = 0; i < d->n_spans; i++)
        if (d->spans[i].span == G4_SPAN_ANSWER && c->answer_len + d->spans[i].len < sizeof c->answer)
            memcpy(c->answer + c->answer_len, d->spans[i].text, d->spans[i].len), c->answer_len += d->spans[i].len;
}

static int on_delta(void *user, const g4_reply_delta *d) {
    collect_delta(user, d);
    return 0;
}

/* The conversation's reply through a stepper of the test's own, as a server's engine would. */
static int driven_reply(g4_conversation *c, g4_session *s, const g4_conversation_options *co, collected *out, g4_generate_result *res) {
    const int32_t *ids;
    size_t n;
    const g4_embd_span *spans;
    int n_spans;
    if (g4_conversation_begin(c, &ids, &n, &spans, &n_spans)) return -1;
    g4_stepper *st = g4_stepper_new(s, 0);
    g4_step_token ev[64];
    int rc = st && g4_stepper_max_tokens(st) <= 64 ? g4_stepper_add_embd(st, co->seq, ids, (int)n, spans, n_spans, &co->gen) : -1;
    while (rc == 0 && g4_stepper_active(st) > 0) {
        int k = g4_stepper_step(st, ev);
        if (k < 0) rc = -1;
        for (int i = 0; i < k; i++) {
            g4_reply_delta d;
            int ended = g4_conversation_push(c, ev[i].token, &d);
            if (ended < 0) rc = -1;
            else collect_delta(out, &d);
            if (ended == 1) g4_stepper_cancel(st, co->seq);
        }
    }
    if (rc == 0) g4_stepper_result(st, co->seq, res);
    g4_stepper_free(st);
    g4_reply_delta last;
    int end = g4_conversation_end(c, rc == 0 ? res : NULL, &last);
    if (end == 0) collect_delta(out, &last);
    return end < 0 ? -1 : 0;
}

static void test_driven_conversation(void) {
    g4_model *m = g4_model_load(TINY_MATH);
    g4_options o;
    g4_options_default(&o);
    o.ctx = 512;
    g4_session *s = m ? g4_session_new(m, &o) : NULL;
    CHECK(s != NULL, "%s", g4_last_error());
    if (!s) goto done;
    g4_conversation_options co;
    CHECK(g4_conversation_default_options(s, &co) == 0, "%s", g4_last_error());
    co.gen.sampling.temperature = 0, co.gen.max_tokens = 40;
    static const char *question = "What is 12 plus 30?";
    collected blocking = {.stop_string = -1}, driven = {.stop_string = -1}, stopped = {.stop_string = -1};
    g4_generate_result rb, rd, rs;
    g4_conversation *a = g4_conversation_new(s, tok, &co);
    int rc = !a || g4_conversation_add(a, G4_CHAT_USER, question) || g4_conversation_reply(a, on_delta, &blocking, &rb);
    CHECK(rc == 0, "the blocking reply: %s", g4_last_error());
    int na = 0, nb = 0;
    const int32_t *ta = a ? g4_conversation_reply_tokens(a, &na) : NULL;
    int32_t want_tokens[64];
    if (na > 0 && na <= 64) memcpy(want_tokens, ta, sizeof *ta * (size_t)na);
    const g4_chat_message *msgs;
    size_t nm;
    char want_message[8192] = "";
    if (a) g4_conversation_messages(a, &msgs, &nm), snprintf(want_message, sizeof want_message, "%s", nm ? msgs[nm - 1].content : "");
    g4_conversation_free(a);

    g4_conversation *b = g4_conversation_new(s, tok, &co);
    rc = !b || g4_conversation_add(b, G4_CHAT_USER, question) || driven_reply(b, s, &co, &driven, &rd);
    CHECK(rc == 0, "the driven reply: %s", g4_last_error());
    const int32_t *tb = b ? g4_conversation_reply_tokens(b, &nb) : NULL;
    CHECK(na > 3 && na <= 64 && na == nb && tb && !memcmp(want_tokens, tb, sizeof *tb * (size_t)nb), "the driven reply's %d tokens are not the blocking one's %d",
          nb, na);
    CHECK(blocking.len == driven.len && !memcmp(blocking.text, driven.text, driven.len) && blocking.deltas == driven.deltas &&
              blocking.last == 1 && driven.last == 1,
          "the driven reply's deltas (%d, %zu bytes) differ from the blocking one's (%d, %zu bytes)", driven.deltas, driven.len, blocking.deltas,
          blocking.len);
    CHECK(rb.stop == rd.stop && rb.n_generated == rd.n_generated, "stop %d / %d, %d / %d tokens", rb.stop, rd.stop, rb.n_generated, rd.n_generated);
    if (b) g4_conversation_messages(b, &msgs, &nm);
    CHECK(b && nm == 2 && !strcmp(msgs[1].content, want_message), "the driven reply's message differs: '%s' vs '%s'", b && nm ? msgs[nm - 1].content : "",
          want_message);
    g4_conversation_free(b);
    printf("ok a conversation driven by the test's stepper: the blocking reply's %d tokens, %zu bytes\n", na, blocking.len);

    /* a stop string: its reply ends before it (the answer), at the token that completed it (the
     * tokens, the decoded text and the message: what the sequence holds) */
    const char *cut = NULL;
    for (size_t i = 1; !cut && i + 3 < blocking.answer_len; i++)
        if (blocking.answer[i] == ' ') cut = blocking.answer + i + 1;
    char stop_text[4] = {0};
    if (cut) memcpy(stop_text, cut, 3);
    const char *stops[] = {stop_text};
    co.stop = stops, co.n_stop = 1;
    g4_conversation *c = cut ? g4_conversation_new(s, tok, &co) : NULL;
    rc = !c || g4_conversation_add(c, G4_CHAT_USER, question) || driven_reply(c, s, &co, &stopped, &rs);
    CHECK(rc == 0, "the reply with a stop string '%s': %s", stop_text, g4_last_error());
    const char *first = cut ? strstr(blocking.answer, stop_text) : NULL;
    size_t want_answer = first ? (size_t)(first - blocking.answer) : 0;
    CHECK(first && stopped.answer_len == want_answer && !memcmp(stopped.answer, blocking.answer, want_answer) && stopped.stop_string == 0,
          "stop '%s': the answer '%.*s', want '%.*s'", stop_text, (int)stopped.answer_len, stopped.answer, (int)want_answer, blocking.answer);
    CHECK(rs.stop == G4_STOP_USER && rs.n_generated < na && stopped.len >= want_answer + 3 && !memcmp(stopped.text, blocking.text, stopped.len),
          "stop '%s': %d of %d tokens, stop reason %d, %zu bytes of text", stop_text, rs.n_generated, na, rs.stop, stopped.len);
    if (c) g4_conversation_messages(c, &msgs, &nm);
    CHECK(c && nm == 2 && strlen(msgs[1].content) == stopped.len && !memcmp(msgs[1].content, stopped.text, stopped.len),
          "the stopped reply's message is not its decoded text");
    g4_conversation_free(c);
    char shown[16] = "";
    for (size_t i = 0, k = 0; stop_text[i] && k + 3 < sizeof shown; i++) /* the stop string printable: \n as two characters */
        if (stop_text[i] == '\n') shown[k++] = '\\', shown[k++] = 'n';
        else shown[k++] = stop_text[i];
    printf("ok stop string '%s': the answer cut to %zu bytes after %d of %d tokens\n", shown, stopped.answer_len, rs.n_generated, na);

    /* bad stop strings are refused by name at g4_conversation_new; misuse of the driven form */
    static const char *bad[] = {""};
    co.stop = bad;
    CHECK(g4_conversation_new(s, tok, &co) == NULL && one_line(g4_last_error()) && strstr(g4_last_error(), "stop string 0 is empty"),
          "an empty stop string: %s", g4_last_error());
    co.stop = NULL, co.n_stop = 0;
    g4_conversation *e = g4_conversation_new(s, tok, &co);
    g4_reply_delta d;
    CHECK(e && g4_conversation_push(e, 1, &d) == -1 && strstr(g4_last_error(), "g4_conversation_begin first"), "a push before begin: %s",
          g4_last_error());
    CHECK(e && g4_conversation_end(e, &rb, &d) == -1 && strstr(g4_last_error(), "without g4_conversation_begin"), "an end before begin: %s",
          g4_last_error());
    g4_conversation_free(e);
done:
    g4_session_free(s);
    g4_model_free(m);
}

int main(void) {
    tok = g4_tokenizer_load_ex(TINY_MATH "/tokenizer.json", G4_TOKENIZER_NO_CACHE);
    CHECK(tok != NULL, "%s", g4_last_error());
    if (tok) {
        test_stop_strings();
        test_utf8();
        test_tool_calls();
        test_thoughts_ends_raw();
        test_errors();
        test_driven_conversation();
    }
    g4_tokenizer_free(tok);
    return check_report("reply");
}
