/* The tokenizer (tokenizer.json of the Gemma 3 / Gemma 4 kind) and the streaming detokenizer
 * are part of the public API: include/g4.h declares them, with their rules (g4_text_utf8_prefix
 * too). */
#ifndef G4_TEXT_TOKENIZER_H
#define G4_TEXT_TOKENIZER_H

#include "g4.h"

#endif
