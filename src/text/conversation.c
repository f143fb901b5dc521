/* The conversation (g4.h): chat messages over one session sequence, each reply feeding only what
 * the sequence lacks and streaming its text and spans. The template is chat.c's (rendered from
 * where the last reply stopped), the generation g4_generate's (or the caller's stepper: begin /
 * push / end), the reply's text, spans and stop strings the reply reader's (reply.c): this file
 * only keeps the state between turns. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "g4.h"
#include "generate/generate.h"
#include "text/chat.h"
#include "text/textbuf.h"
#include "util/err.h"

/* What a thought the generation prompt opened looks like in the model's message. */
static const char OPENED_THOUGHT[] = "<|channel>thought\n";

typedef struct {
    int32_t *p;
    size_t n, cap;
} ids_t;

static int ids_append(ids_t *a, const int32_t *ids, size_t n) {
    if (a->n + n > a->cap) {
        size_t cap = a->cap ? a->cap : 256;
        while (cap < a->n + n) cap *= 2;
        int32_t *p = realloc(a->p, sizeof *p * cap);
        if (!p) return g4_fail("conversation: out of memory");
        a->p = p, a->cap = cap;
    }
    if (n) memcpy(a->p + a->n, ids, sizeof *ids * n);
    a->n += n;
    return 0;
}

struct g4_conversation {
    g4_session *s;
    const g4_tokenizer *tok;
    g4_conversation_options o;
    int *stop_ids; /* the reply's stop ids (o.gen.stop_ids points here), or NULL for the model's */
    const int *model_stops;
    int n_model_stops;
    char **stop;   /* the stop strings (o.stop points here) */

    g4_chat_message *msgs; /* contents owned */
    size_t n_msgs, cap_msgs;
    size_t resume;        /* 0: nothing fed; else msgs[resume - 1] is the last reply, fed but for its closing */
    int raw;              /* a conversation of raw tokens */
    int broken;           /* a reply failed after feeding: the sequence no longer matches the messages */
    ids_t raw_pending;    /* raw tokens not fed yet */
    ids_t fed;            /* what the sequence holds */
    int has_unfed;        /* the last reply's last token, never fed back */
    int32_t unfed;

    ids_t prompt;         /* g4_conversation_prompt's, valid while prompt_ready */
    int prompt_ready, prompt_opens_thought;

    ids_t reply;          /* the last reply's tokens */
    g4_textbuf reply_text;
    int reply_opened_thought;
    g4_reply *reader;     /* the reply being read, between begin and end */
    int replying, begin_pos;
    g4_reply_fn on_delta; /* g4_conversation_reply's */
    void *user;
    int failed; /* the reply's own work failed (not the caller's stop): g4_last_error says why */

    /* media parts (g4_conversation_add_media): part k belongs to message media[k].msg, or waits
     * for the next user message (NO_MESSAGE); its soft tokens at embd[k] */
    g4_chat_media *media;
    float **embd;
    size_t n_media, cap_media;
    g4_embd_span *embd_spans; /* the prompt's, while prompt_ready */
    int n_spans;
};

#define NO_MESSAGE ((size_t)-1)

/* Drops the media parts of messages from `from` on, and those waiting for a message. */
static void drop_media(g4_conversation *c, size_t from) {
    size_t k = 0;
    for (size_t i = 0; i < c->n_media; i++) {
        if (c->media[i].msg >= from) {
            free(c->embd[i]);
            continue;
        }
        c->media[k] = c->media[i], c->embd[k] = c->embd[i];
        k++;
    }
    c->n_media = k;
}

static int media_waiting(const g4_conversation *c) { return c->n_media > 0 && c->media[c->n_media - 1].msg == NO_MESSAGE; }

static void free_messages(g4_conversation *c, size_t from) {
    for (size_t i = from; i < c->n_msgs; i++) free((char *)c->msgs[i].content);
    c->n_msgs = from;
}

static int check_chat_options(const g4_chat_options *chat) { return g4_chat_check(NULL, 0, chat); }

/* The conversation's own template settings: a BOS at the start, a generation prompt at the end. */
static void own_chat_options(g4_chat_options *chat) {
    chat->add_bos = 1;
    chat->add_generation_prompt = 1;
}

int g4_conversation_default_options(const g4_session *s, g4_conversation_options *o) {
    memset(o, 0, sizeof *o);
    const g4_model *m = g4_session_model(s);
    o->chat = g4_chat_default_options();
    if (g4_model_chat_form(m, &o->chat.form)) return -1;
    g4_model_sampling_defaults(m, &o->gen.sampling);
    o->gen.max_tokens = g4_session_ctx(s);
    return 0;
}

/* The reader of the next reply: the conversation's stop strings and calls mode, every stop id
 * (the model's and the options') an end that adds no text. */
static g4_reply *new_reader(const g4_conversation *c, int starts_in_thought) {
    int n = c->n_model_stops + (c->o.gen.stop_ids ? c->o.gen.n_stop_ids : 0);
    int *ends = malloc(sizeof *ends * (size_t)(n ? n : 1));
    if (!ends) {
        g4_fail("conversation: out of memory");
        return NULL;
    }
    if (c->n_model_stops) memcpy(ends, c->model_stops, sizeof *ends * (size_t)c->n_model_stops);
    if (n > c->n_model_stops) memcpy(ends + c->n_model_stops, c->o.gen.stop_ids, sizeof *ends * (size_t)(n - c->n_model_stops));
    g4_reply_options ro = {.stop = c->o.stop, .n_stop = c->o.n_stop, .end_ids = ends, .n_end_ids = n,
                           .starts_in_thought = starts_in_thought, .calls = c->o.calls};
    g4_reply *r = g4_reply_new(c->tok, &ro);
    free(ends);
    return r;
}

/* The options' stop strings into the conversation (checked by a first reader). */
static int copy_stop_strings(g4_conversation *c, const g4_conversation_options *o) {
    c->o.stop = NULL, c->o.n_stop = 0;
    if (o->n_stop < 0 || (o->n_stop && !o->stop)) return g4_fail("conversation: n_stop is %d but stop is %s", o->n_stop, o->stop ? "set" : "NULL");
    if (!(c->stop = calloc((size_t)o->n_stop + 1, sizeof *c->stop))) return g4_fail("conversation: out of memory");
    for (int k = 0; k < o->n_stop; k++) {
        if (!o->stop[k]) return g4_fail("conversation: stop string %d is NULL", k);
        size_t n = strlen(o->stop[k]);
        if (!(c->stop[k] = malloc(n + 1))) return g4_fail("conversation: out of memory");
        memcpy(c->stop[k], o->stop[k], n + 1);
    }
    c->o.stop = (const char *const *)c->stop, c->o.n_stop = o->n_stop;
    g4_reply *probe = new_reader(c, 0);
    if (!probe) return -1;
    g4_reply_free(probe);
    return 0;
}

g4_conversation *g4_conversation_new(g4_session *s, const g4_tokenizer *tok, const g4_conversation_options *o) {
    if (!s || !tok || !o) {
        g4_fail("conversation: %s is NULL", !s ? "the session" : !tok ? "the tokenizer" : "the options");
        return NULL;
    }
    if (o->seq < 0 || o->seq >= g4_session_n_seq(s)) {
        g4_fail("conversation: seq %d does not exist (the session has %d sequences)", o->seq, g4_session_n_seq(s));
        return NULL;
    }
    if (check_chat_options(&o->chat)) return NULL;
    if (o->gen.n_stop_ids < 0 || (o->gen.n_stop_ids && !o->gen.stop_ids)) {
        g4_fail("conversation: gen.n_stop_ids is %d but gen.stop_ids is %s", o->gen.n_stop_ids, o->gen.stop_ids ? "set" : "NULL");
        return NULL;
    }
    g4_conversation *c = calloc(1, sizeof *c);
    if (!c) {
        g4_fail("conversation: out of memory");
        return NULL;
    }
    c->s = s, c->tok = tok, c->o = *o;
    own_chat_options(&c->o.chat);
    if (o->gen.stop_ids) {
        c->stop_ids = malloc(sizeof *c->stop_ids * (size_t)(o->gen.n_stop_ids ? o->gen.n_stop_ids : 1));
        if (c->stop_ids) memcpy(c->stop_ids, o->gen.stop_ids, sizeof *c->stop_ids * (size_t)o->gen.n_stop_ids);
        c->o.gen.stop_ids = c->stop_ids;
    }
    c->n_model_stops = g4_model_stop_ids(g4_session_model(s), &c->model_stops);
    if ((o->gen.stop_ids && !c->stop_ids) || copy_stop_strings(c, o) || g4_conversation_reset(c, NULL)) {
        if (o->gen.stop_ids && !c->stop_ids) g4_fail("conversation: out of memory");
        g4_conversation_free(c);
        return NULL;
    }
    return c;
}

void g4_conversation_free(g4_conversation *c) {
    if (!c) return;
    free_messages(c, 0);
    free(c->msgs);
    drop_media(c, 0);
    free(c->media), free(c->embd), free(c->embd_spans);
    free(c->stop_ids);
    for (int k = 0; c->stop && c->stop[k]; k++) free(c->stop[k]);
    free(c->stop);
    free(c->raw_pending.p), free(c->fed.p), free(c->prompt.p), free(c->reply.p), free(c->reply_text.p);
    g4_reply_free(c->reader);
    free(c);
}

int g4_conversation_reset(g4_conversation *c, const g4_chat_options *chat) {
    if (chat) {
        if (check_chat_options(chat)) return -1;
        c->o.chat = *chat;
        own_chat_options(&c->o.chat);
    }
    g4_session_reset_seq(c->s, c->o.seq);
    free_messages(c, 0);
    drop_media(c, 0);
    c->resume = 0;
    c->raw = c->broken = c->has_unfed = c->replying = 0;
    c->raw_pending.n = c->fed.n = c->reply.n = 0;
    c->prompt_ready = 0;
    g4_textbuf_clear(&c->reply_text);
    return 0;
}

/* ---------------------------------------------------------------- adding */

static const char *role_label(g4_chat_role role) {
    switch (role) {
    case G4_CHAT_SYSTEM: return "system";
    case G4_CHAT_USER: return "user";
    case G4_CHAT_MODEL: return "model";
    case G4_CHAT_TOOL: return "tool";
    }
    return NULL;
}

static int append_message(g4_conversation *c, g4_chat_role role, const char *content, size_t len) {
    if (c->n_msgs == c->cap_msgs) {
        size_t cap = c->cap_msgs ? 2 * c->cap_msgs : 16;
        g4_chat_message *m = realloc(c->msgs, sizeof *m * cap);
        if (!m) return g4_fail("conversation: out of memory");
        c->msgs = m, c->cap_msgs = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy) return g4_fail("conversation: out of memory");
    memcpy(copy, content, len);
    copy[len] = 0;
    c->msgs[c->n_msgs++] = (g4_chat_message){role, copy};
    c->prompt_ready = 0;
    return 0;
}

int g4_conversation_add(g4_conversation *c, g4_chat_role role, const char *content) {
    const char *label = role_label(role);
    if (!label) return g4_fail("conversation: message %zu has an unknown role (%d)", c->n_msgs, (int)role);
    if (c->raw) return g4_fail("conversation: one of raw tokens takes no messages (g4_conversation_reset starts over)");
    const char *text = content ? content : "";
    size_t len = strlen(text), bad = g4_text_utf8_prefix(text, len);
    if (bad < len) return g4_fail("conversation: message %zu (%s) is not valid UTF-8 (byte %zu)", c->n_msgs, label, bad);
    if (media_waiting(c) && role != G4_CHAT_USER)
        return g4_fail("conversation: media parts wait for a user message; message %zu is a %s message", c->n_msgs, label);
    if (append_message(c, role, text, len)) return -1;
    if (g4_chat_check(c->msgs, c->n_msgs, &c->o.chat)) {
        free_messages(c, c->n_msgs - 1);
        return -1;
    }
    for (size_t k = 0; k < c->n_media; k++)
        if (c->media[k].msg == NO_MESSAGE) c->media[k].msg = c->n_msgs - 1;
    return 0;
}

int g4_conversation_add_media(g4_conversation *c, g4_media_kind kind, const float *embd, int n) {
    int32_t markers[3];
    if (c->raw) return g4_fail("conversation: one of raw tokens takes no media (g4_conversation_reset starts over)");
    if (g4_media_marker_ids(c->tok, kind, markers)) return -1;
    if (n < 1 || !embd) return g4_fail("conversation: a media part of %d soft tokens%s", n, embd ? "" : " and no embeddings");
    size_t len = (size_t)n * (size_t)g4_model_hidden_size(g4_session_model(c->s));
    for (size_t i = 0; i < len; i++)
        if (!isfinite(embd[i])) return g4_fail("conversation: media part %zu: soft token %zu holds a value that is not finite", c->n_media, i * (size_t)n / len);
    if (c->n_media == c->cap_media) {
        size_t cap = c->cap_media ? 2 * c->cap_media : 8;
        g4_chat_media *m = realloc(c->media, sizeof *m * cap);
        if (m) c->media = m;
        float **e = m ? realloc(c->embd, sizeof *e * cap) : NULL;
        if (e) c->embd = e;
        if (!m || !e) return g4_fail("conversation: out of memory");
        c->cap_media = cap;
    }
    float *copy = malloc(sizeof *copy * len);
    if (!copy) return g4_fail("conversation: out of memory for %d soft tokens", n);
    memcpy(copy, embd, sizeof *copy * len);
    c->media[c->n_media] = (g4_chat_media){.msg = NO_MESSAGE, .kind = kind, .n = n};
    c->embd[c->n_media++] = copy;
    c->prompt_ready = 0;
    return 0;
}

int g4_conversation_add_tokens(g4_conversation *c, const int32_t *ids, size_t n) {
    if (c->n_msgs) return g4_fail("conversation: one with messages takes no raw tokens (g4_conversation_reset starts over)");
    if (n && !ids) return g4_fail("conversation: %zu tokens but the array is NULL", n);
    if (ids_append(&c->raw_pending, ids, n)) return -1;
    c->raw = 1;
    c->prompt_ready = 0;
    return 0;
}

void g4_conversation_discard(g4_conversation *c) {
    free_messages(c, c->resume);
    drop_media(c, c->resume);
    c->raw_pending.n = 0;
    c->prompt_ready = 0;
}

/* ---------------------------------------------------------------- the prompt */

/* The last reply's last token goes first; when the rendered continuation starts with it (the
 * turn's closing "<turn|>" the model stopped at) it is not repeated. */
static int build_prompt(g4_conversation *c, const int32_t *rest, size_t n_rest) {
    c->prompt.n = 0;
    if (c->has_unfed && ids_append(&c->prompt, &c->unfed, 1)) return -1;
    if (c->has_unfed && n_rest && rest[0] == c->unfed) rest++, n_rest--;
    return ids_append(&c->prompt, rest, n_rest);
}

/* The embedding spans of the prompt: the placeholders of each media part the prompt renders (those
 * of messages from resume on), in order. Message contents cannot hold the markers (they are
 * encoded without control tokens), so each part is where its begin marker is followed by its
 * placeholders. */
static int find_spans(g4_conversation *c) {
    c->n_spans = 0;
    size_t at = 0, parts = 0;
    for (size_t k = 0; k < c->n_media; k++) parts += c->media[k].msg >= c->resume && c->media[k].msg != NO_MESSAGE;
    free(c->embd_spans);
    c->embd_spans = malloc(sizeof *c->embd_spans * (parts ? parts : 1));
    if (!c->embd_spans) return g4_fail("conversation: out of memory");
    for (size_t k = 0; k < c->n_media; k++) {
        const g4_chat_media *md = &c->media[k];
        if (md->msg < c->resume || md->msg == NO_MESSAGE) continue;
        int32_t mk[3];
        if (g4_media_marker_ids(c->tok, md->kind, mk)) return -1;
        size_t n = (size_t)md->n;
        while (at + n + 1 < c->prompt.n && !(c->prompt.p[at] == mk[0] && c->prompt.p[at + 1] == mk[1] && c->prompt.p[at + n + 1] == mk[2])) at++;
        if (at + n + 1 >= c->prompt.n) return g4_fail("conversation: media part %zu is not in the rendered prompt", k);
        c->embd_spans[c->n_spans++] = (g4_embd_span){.at = (int)(at + 1), .n = md->n, .embd = c->embd[k]};
        at += n + 2;
    }
    return 0;
}

static int render_prompt(g4_conversation *c) {
    if (c->broken) return g4_fail("conversation: a reply failed after feeding part of its prompt; g4_conversation_reset starts over");
    c->prompt_opens_thought = 0;
    c->n_spans = 0;
    if (c->raw) return build_prompt(c, c->raw_pending.p, c->raw_pending.n);
    if (c->n_msgs == c->resume) return build_prompt(c, NULL, 0);
    int32_t *ids;
    size_t n, n_media = c->n_media; /* without those waiting for a message: the last ones */
    while (n_media > 0 && c->media[n_media - 1].msg == NO_MESSAGE) n_media--;
    if (g4_chat_encode_media(c->tok, c->msgs, c->n_msgs, c->resume, &c->o.chat, c->media, n_media, &ids, &n, &c->prompt_opens_thought))
        return -1;
    int rc = build_prompt(c, ids, n);
    free(ids);
    return rc ? rc : find_spans(c);
}

int g4_conversation_prompt_spans(g4_conversation *c, const g4_embd_span **spans, int *n) {
    const int32_t *ids;
    size_t n_ids;
    if (g4_conversation_prompt(c, &ids, &n_ids)) return -1;
    *spans = c->embd_spans, *n = c->n_spans;
    return 0;
}

int g4_conversation_prompt(g4_conversation *c, const int32_t **ids, size_t *n) {
    if (!c->prompt_ready) {
        if (render_prompt(c)) return -1;
        c->prompt_ready = 1;
    }
    *ids = c->prompt.p;
    *n = c->prompt.n;
    return 0;
}

/* ---------------------------------------------------------------- the reply */

/* The sequence now holds the prompt and every reply token but the last; the reply becomes the
 * model's message (after the thought its prompt opened, as the template would see it). */
static int commit_reply(g4_conversation *c) {
    if (ids_append(&c->fed, c->prompt.p, c->prompt.n)) return -1;
    c->has_unfed = c->reply.n > 0;
    if (c->has_unfed) {
        c->unfed = c->reply.p[c->reply.n - 1];
        if (ids_append(&c->fed, c->reply.p, c->reply.n)) return -1;
        c->fed.n--; /* the last one stays in its slot, for g4_conversation_tokens, until the next prompt */
    }
    c->raw_pending.n = 0;
    c->prompt_ready = 0;
    c->reply_opened_thought = c->prompt_opens_thought;
    if (c->raw) return 0;
    g4_textbuf content = {0};
    int rc = (c->prompt_opens_thought && g4_textbuf_appends(&content, OPENED_THOUGHT)) ||
             g4_textbuf_append(&content, c->reply_text.p ? c->reply_text.p : "", c->reply_text.n) ||
             append_message(c, G4_CHAT_MODEL, content.p ? content.p : "", content.n);
    free(content.p);
    if (rc) return -1;
    c->resume = c->n_msgs;
    return 0;
}

int g4_conversation_begin(g4_conversation *c, const int32_t **ids, size_t *n, const g4_embd_span **spans, int *n_spans) {
    if (g4_conversation_prompt(c, ids, n)) return -1;
    if (*n == 0) return g4_fail("conversation: nothing to reply to (add a message first)");
    g4_reply_free(c->reader);
    if (!(c->reader = new_reader(c, c->prompt_opens_thought))) return -1;
    c->reply.n = 0;
    g4_textbuf_clear(&c->reply_text);
    c->begin_pos = g4_session_seq_pos(c->s, c->o.seq);
    c->replying = 1;
    if (spans) *spans = c->embd_spans;
    if (n_spans) *n_spans = c->n_spans;
    return 0;
}

int g4_conversation_push(g4_conversation *c, int32_t token, g4_reply_delta *d) {
    if (!c->replying) return g4_fail("conversation: a token pushed outside a reply (g4_conversation_begin first)");
    if (ids_append(&c->reply, &token, 1)) return -1;
    int rc = g4_reply_push_token(c->reader, token, d);
    if (rc < 0 || g4_textbuf_append(&c->reply_text, d->text, d->len)) return -1;
    return rc;
}

int g4_conversation_end(g4_conversation *c, const g4_generate_result *res, g4_reply_delta *d) {
    *d = (g4_reply_delta){.token = -1, .text = "", .stop_string = -1};
    if (!c->replying) return g4_fail("conversation: g4_conversation_end without g4_conversation_begin");
    c->replying = 0;
    int rc = -1;
    if (res && res->stop == G4_STOP_USER && res->n_generated == 0) {
        /* cancelled before its first token (during the prompt): the cache gives back the chunks it
         * took and the conversation stays as it was, its prompt still to come */
        rc = g4_session_truncate_seq(c->s, c->o.seq, c->begin_pos) ? -1 : 1;
    } else if (res) {
        rc = g4_reply_finish(c->reader, res->stop, d) || g4_textbuf_append(&c->reply_text, d->text, d->len) || commit_reply(c) ? -1 : 0;
    }
    /* a failure before the prompt went in leaves the conversation as it was */
    if (rc < 0 && g4_session_seq_pos(c->s, c->o.seq) != c->begin_pos) c->broken = 1;
    return rc;
}

/* Stops the generation for a failure of the conversation's own (out of memory). */
static int fail_reply(g4_conversation *c) {
    c->failed = 1;
    return 1;
}

/* g4_conversation_reply's tokens: each through the reader to the caller; a stop string ends
 * the generation. */
static int on_token(void *user, int32_t id) {
    g4_conversation *c = user;
    g4_reply_delta d;
    int ended = g4_conversation_push(c, id, &d);
    if (ended < 0) return fail_reply(c);
    int stop = c->on_delta ? c->on_delta(c->user, &d) : 0;
    return ended || stop;
}

int g4_conversation_reply(g4_conversation *c, g4_reply_fn on_delta, void *user, g4_generate_result *res) {
    const int32_t *ids;
    size_t n;
    const g4_embd_span *spans;
    int n_spans;
    g4_generate_result local;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    if (g4_conversation_begin(c, &ids, &n, &spans, &n_spans)) return -1;
    c->on_delta = on_delta, c->user = user;
    c->failed = 0;
    int rc = g4_generate_seq_embd(c->s, c->o.seq, ids, (int)n, spans, n_spans, &c->o.gen, on_token, c, res);
    g4_reply_delta last;
    int ended = g4_conversation_end(c, rc == 0 && !c->failed ? res : NULL, &last);
    if (ended == 0 && on_delta) on_delta(user, &last);
    c->on_delta = NULL, c->user = NULL;
    return ended < 0 ? -1 : 0;
}

const int32_t *g4_conversation_reply_tokens(const g4_conversation *c, int *n) {
    *n = (int)c->reply.n;
    return c->reply.p;
}

const char *g4_conversation_reply_text(const g4_conversation *c, size_t *len) {
    if (len) *len = c->reply_text.n;
    return c->reply_text.p ? c->reply_text.p : "";
}

int g4_conversation_reply_parse(const g4_conversation *c, g4_chat_reply *r) {
    g4_textbuf t = {0};
    int rc = (c->reply_opened_thought && g4_textbuf_appends(&t, OPENED_THOUGHT)) ||
             g4_textbuf_append(&t, c->reply_text.p ? c->reply_text.p : "", c->reply_text.n);
    if (rc == 0) rc = g4_chat_parse_reply(t.p, t.n, r);
    else memset(r, 0, sizeof *r);
    free(t.p);
    return rc ? -1 : 0;
}

void g4_conversation_messages(const g4_conversation *c, const g4_chat_message **msgs, size_t *n) {
    *msgs = c->msgs;
    *n = c->n_msgs;
}

const int32_t *g4_conversation_tokens(const g4_conversation *c, size_t *n) {
    *n = c->fed.n + (size_t)c->has_unfed; /* the unfed token waits in the slot after what was fed */
    return c->fed.p;
}
