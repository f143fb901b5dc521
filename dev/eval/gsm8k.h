/* GSM8K scoring (shared/spec/gsm8k-protocol.md §2, §5): the zero-shot prompt text, the answer
 * extractor, number normalisation and the gold answer of a reference solution.
 *
 * Behaviour follows shared/fixtures/gsm8k/extractor_ref.py, the protocol's reference
 * implementation, character for character, so that saved outputs score the same whichever
 * implementation reads them. Text is UTF-8; invalid bytes are read as U+FFFD, as Python's
 * bytes.decode("utf-8", "replace") would give the reference. Known, deliberate differences
 * (all on inputs where the reference raises or never gets): see gsm8k.c. */
#ifndef G4_EVAL_GSM8K_H
#define G4_EVAL_GSM8K_H

#include <stddef.h>

/* How the extractor decided; g4_gsm8k_status_name gives the reference's status strings. */
typedef enum {
    G4_GSM8K_MARKER,           /* "marker": first number after the last answer marker */
    G4_GSM8K_LAST_NUMBER,      /* "last_number": no usable marker, last number of the reply */
    G4_GSM8K_NO_NUMBER,        /* "no_number": no number anywhere, no answer */
    G4_GSM8K_THOUGHT_UNCLOSED, /* "thought_unclosed": a <|channel> never closed, no answer */
} g4_gsm8k_status;

typedef struct {
    char *value; /* normalised number ("1200", "-3", "2.5"), malloc'd; NULL = no answer */
    g4_gsm8k_status status;
} g4_gsm8k_answer;

/* The compiled regexes. Compile once, share freely: g4_gsm8k_extract only reads it. */
typedef struct g4_gsm8k_extractor g4_gsm8k_extractor;

int g4_gsm8k_extractor_open(g4_gsm8k_extractor **out);
void g4_gsm8k_extractor_close(g4_gsm8k_extractor *ex);

/* Extracts the answer from a model reply (decoded with special tokens kept, stop token
 * excluded). text need not be NUL-terminated nor valid UTF-8. Returns 0, or -1 on allocation
 * or regex-engine failure (g4_last_error says which); on -1, out->value is NULL. */
int g4_gsm8k_extract(const g4_gsm8k_extractor *ex, const char *text, size_t len, g4_gsm8k_answer *out);
void g4_gsm8k_answer_free(g4_gsm8k_answer *a);
const char *g4_gsm8k_status_name(g4_gsm8k_status s);

/* Canonical form of a number: the reference's clean-up (U+2212 -> '-', '$' and '**' deleted),
 * commas deleted, then Python Decimal syntax (surrounding whitespace, '_', '+', exponent and
 * Unicode decimal digits allowed); printed as an integer when integral ("26.00", "$1,200",
 * "1200." -> "26", "1200", "1200"), otherwise as a minimal decimal ("2.50" -> "2.5",
 * ".5" -> "0.5"). Returns a malloc'd string, or NULL (g4_last_error says why) for text that is
 * not one number ("50%", "1/2", "nan", "") or on allocation failure. */
char *g4_gsm8k_normalize(const char *s);

/* Gold answer of a GSM8K reference solution: the text after the last "####", normalised as
 * by the reference's gold_of (no '$' clean-up). malloc'd, or NULL if that text is not a number. */
char *g4_gsm8k_gold(const char *solution);

/* 1 if pred (an extracted answer, NULL = none) has exactly the decimal value of gold, else 0.
 * Both are read as by g4_gsm8k_normalize but compared exactly, without rounding. */
int g4_gsm8k_is_correct(const char *pred, const char *gold);

/* User-message text of the zero-shot prompt (§2) for a question, byte-identical in every
 * runtime; the chat template is applied elsewhere. malloc'd, NULL on allocation failure. */
char *g4_gsm8k_prompt(const char *question);

#endif
