/* The model's reply split into spans (thought, answer, tool call) as it streams: the one place
 * where the reply's markers are read. g4_thought_filter, g4_chat_parse_reply and the conversation
 * (include/g4.h) are built on it. */
#ifndef G4_TEXT_REPLY_H
#define G4_TEXT_REPLY_H

#include "g4.h"

typedef struct g4_spans g4_spans;

/* starts_in_thought: the prompt ended inside a thought ("<|channel>thought\n"). tool_calls: read
 * "<|tool_call>...<tool_call|>" as tool-call spans (otherwise they are answer text). */
g4_spans *g4_spans_new(int starts_in_thought, int tool_calls);
void g4_spans_free(g4_spans *sp);
/* Pushes decoded text; *pieces (valid until the next call) get what became final, in order,
 * consecutive text of one span joined. A marker split across pushes is held back. */
int g4_spans_push(g4_spans *sp, const char *text, size_t len, const g4_span_text **pieces, int *n_pieces);
/* Pushes the last text (may be empty) and releases what is held back: an incomplete marker is
 * text after all. */
int g4_spans_finish(g4_spans *sp, const char *text, size_t len, const g4_span_text **pieces, int *n_pieces);
/* The span the next text would go to (a thought's header counts as the thought). */
g4_span g4_spans_current(const g4_spans *sp);
/* Thought spans begun (an open one included) and tool calls begun. */
int g4_spans_thoughts(const g4_spans *sp);
int g4_spans_tool_calls(const g4_spans *sp);

#endif
