/* Gemma 4 chat prompt rendering and parsing of the model's reply (thought channel).
 *
 * Rendering follows the Gemma 4 chat templates (spec chat-and-tokenizer.md, section C):
 *
 *   <bos>[<|turn>system\n[<|think|>\n]{system text}<turn|>\n]
 *   <|turn>user\n{text}<turn|>\n
 *   <|turn>model\n{earlier answer, thought spans removed}<turn|>\n
 *   ...
 *   <|turn>model\n                          generation prompt
 *   [<|channel>thought\n<channel|>]          26B/31B form with thinking off only
 *
 * The system turn appears when thinking is on or the first message is a system message.
 * Every content is trimmed of leading/trailing whitespace (Unicode whitespace, like the
 * template's Python `trim`). Tools, images/audio and the `reasoning` re-insertion of the
 * newest templates are not supported; consecutive model messages are separate turns.
 *
 * The rendered string holds the control tokens as literals: encode it with
 * parse_special=1, and do not add another BOS. g4_chat_encode does both and also keeps
 * control-token strings typed by the user from becoming control tokens. */
#ifndef G4_TEXT_CHAT_H
#define G4_TEXT_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

typedef enum {
    G4_CHAT_SYSTEM,
    G4_CHAT_USER,
    G4_CHAT_MODEL,
} g4_chat_role;

typedef struct {
    g4_chat_role role;
    const char *content; /* UTF-8, NUL-terminated; NULL is treated as "" */
} g4_chat_message;

typedef enum {
    /* E2B / E4B template: thinking off renders the plain generation prompt "<|turn>model\n". */
    G4_CHAT_FORM_E2B,
    /* 26B-A4B / 31B template: thinking off appends an empty thought channel
     * "<|channel>thought\n<channel|>" to the generation prompt. */
    G4_CHAT_FORM_26B,
} g4_chat_form;

typedef struct {
    g4_chat_form form;
    int thinking;              /* put <|think|> at the top of the system turn */
    int add_generation_prompt; /* end with the open model turn */
    int add_bos;               /* start with the literal "<bos>" */
} g4_chat_options;

/* E2B form, thinking off, generation prompt and BOS on. */
g4_chat_options g4_chat_default_options(void);

/* "system"/"developer", "user", "model"/"assistant" -> role; -1 (with g4_fail) otherwise. */
int g4_chat_role_parse(const char *name, g4_chat_role *role);

/* Renders the prompt text into *out (malloc'd, NUL-terminated, caller frees). */
int g4_chat_render(const g4_chat_message *msgs, size_t n, const g4_chat_options *opt, char **out, size_t *out_len);

/* Renders and encodes in one go: template parts with parse_special=1, message contents
 * with parse_special=0 (untrusted), so "<|turn>" typed by a user stays plain text. For
 * contents without control-token strings the ids equal encoding g4_chat_render's text. */
int g4_chat_encode(const g4_tokenizer *tok, const g4_chat_message *msgs, size_t n, const g4_chat_options *opt,
                   int32_t **ids, size_t *n_ids);

/* The template's strip_thinking for earlier model turns: drops every
 * "<|channel>...<channel|>" span, then trims. *out is malloc'd. */
int g4_chat_strip_thinking(const char *text, size_t len, char **out, size_t *out_len);

/* A finished reply split into thought and answer (spec section C.3):
 *  - every "<|channel>...<channel|>" span is thinking (its "thought\n" channel header is
 *    dropped), the rest is the answer;
 *  - a "<channel|>" before any "<|channel>" closes a thought that began at the start of
 *    the output (a prompt that prefilled "<|channel>thought\n"): everything before it is
 *    thinking;
 *  - a "<|channel>" never closed leaves thought_unclosed set: the answer is missing
 *    ("truncated in thought"), what follows the marker is thinking.
 * answer and thinking are trimmed and malloc'd (free with g4_chat_reply_free). The text
 * must not include the stop token. */
typedef struct {
    char *answer;
    size_t answer_len;
    char *thinking;
    size_t thinking_len;
    int thought_blocks;   /* thought spans seen, including an unclosed one */
    int thought_unclosed; /* output ended inside a thought */
} g4_chat_reply;

int g4_chat_parse_reply(const char *text, size_t len, g4_chat_reply *reply);
void g4_chat_reply_free(g4_chat_reply *reply);

/* Streaming version for showing a reply while it is generated: push decoded text as it
 * comes (e.g. from g4_detokenizer), get back the bytes that are final, split into answer
 * and thought. A marker split across pushes is held back until it is complete. The
 * retroactive rule for a bare "<channel|>" cannot apply to text already shown, so say at
 * creation whether the prompt left a thought open (ended with "<|channel>thought\n");
 * a stray "<channel|>" is otherwise just dropped. Returned pointers are valid until the
 * next call on the same filter. */
typedef struct g4_thought_filter g4_thought_filter;
g4_thought_filter *g4_thought_filter_new(int starts_in_thought);
int g4_thought_filter_push(g4_thought_filter *f, const char *text, size_t len, const char **answer, size_t *answer_len,
                           const char **thought, size_t *thought_len);
/* Releases anything held back (an incomplete marker is plain text after all). */
int g4_thought_filter_finish(g4_thought_filter *f, const char **answer, size_t *answer_len, const char **thought,
                             size_t *thought_len);
int g4_thought_filter_in_thought(const g4_thought_filter *f);
int g4_thought_filter_blocks(const g4_thought_filter *f);
void g4_thought_filter_free(g4_thought_filter *f);

#endif
