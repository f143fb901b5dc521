/* g4_generate for any sequence of the session (the conversation lives in one of its choice). */
#ifndef G4_GENERATE_GENERATE_H
#define G4_GENERATE_GENERATE_H

#include "g4.h"

/* g4_generate in sequence seq: the same loop, the same results. */
int g4_generate_seq(g4_session *s, int seq, const int32_t *prompt, int n_prompt, const g4_generate_params *params,
                    g4_token_fn on_token, void *user, g4_generate_result *result);
/* The same with embedding spans in the prompt (g4_stepper_add_embd). */
int g4_generate_seq_embd(g4_session *s, int seq, const int32_t *prompt, int n_prompt, const g4_embd_span *spans, int n_spans,
                         const g4_generate_params *params, g4_token_fn on_token, void *user, g4_generate_result *result);

#endif
