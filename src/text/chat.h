/* Chat prompt rendering (the Gemma 4 chat templates) and parsing of the model's reply are part of
 * the public API: include/g4.h declares them, with their rules (g4_chat_check, g4_chat_trim and
 * g4_chat_encode_media too). Below: what the rest of src/text shares with the renderer. */
#ifndef G4_TEXT_CHAT_H
#define G4_TEXT_CHAT_H

#include "g4.h"

/* Jinja's dictsort order (the template's order of a mapping's keys): key a before key b, compared
 * case-insensitively (src/text/tools.c; the tool-call grammar writes keys in it too). */
int g4_chat_key_before(const char *a, const char *b);

/* g4_chat_render / g4_chat_encode of msgs[0, n) from where a generated reply stopped: msgs[resume - 1]
 * is a model message whose turn opening and text the sequence already holds (the model wrote them),
 * so what comes out starts with that message's closing (its tool responses, "<turn|>\n") and goes on
 * with the messages after it and the generation prompt. resume 0: everything. *opens_thought (may be
 * NULL): the generation prompt ends inside a thought ("<|channel>thought\n"). */
int g4_chat_render_from(const g4_chat_message *msgs, size_t n, size_t resume, const g4_chat_options *opt, char **out,
                        size_t *out_len, int *opens_thought);
int g4_chat_encode_from(const g4_tokenizer *tok, const g4_chat_message *msgs, size_t n, size_t resume, const g4_chat_options *opt,
                        int32_t **ids, size_t *n_ids, int *opens_thought);

#endif
