/* Chat prompt rendering (the Gemma 4 chat templates) and parsing of the model's reply are part of
 * the public API: include/g4.h declares them, with their rules. */
#ifndef G4_TEXT_CHAT_H
#define G4_TEXT_CHAT_H

#include "g4.h"

#endif
