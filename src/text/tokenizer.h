/* The tokenizer (tokenizer.json of the Gemma 3 / Gemma 4 kind) and the streaming detokenizer
 * are part of the public API: include/g4.h declares them, with their rules. */
#ifndef G4_TEXT_TOKENIZER_H
#define G4_TEXT_TOKENIZER_H

#include "g4.h"

/* The length of the longest prefix of s[0, n) that is valid UTF-8 (shortest forms, no
 * surrogates, at most U+10FFFF): n when all of it is. */
size_t g4_text_utf8_prefix(const char *s, size_t n);

#endif
