/* Text tokenizer for Hugging Face tokenizer.json files of the Gemma 3 / Gemma 4 kind.
 *
 * Supported pipeline (anything else in the file is rejected at load with a message naming
 * the field, rather than silently tokenizing differently):
 *   1. added_tokens matched on the raw text, leftmost-longest (lstrip/rstrip/single_word/
 *      normalized must be false);
 *   2. normalizer Replace(" " -> U+2581) or none;
 *   3. pre_tokenizer Split(" ", MergedWithPrevious) (a no-op after step 2) or none;
 *   4. BPE: merges by rank (lowest rank first, leftmost among equals), byte_fallback <0xNN>,
 *      unk_token/fuse_unk when there is no byte fallback;
 *   5. decoder Sequence[Replace(U+2581 -> " "), ByteFallback, Fuse].
 * No BOS is ever added: chat prompts carry a literal "<bos>" (encode with parse_special=1).
 *
 * Invalid UTF-8 in the input never fails: each byte that is not part of a valid UTF-8
 * sequence becomes its own byte token <0xNN> (or unk without byte fallback). Decoding runs
 * byte tokens through a UTF-8 decoder that replaces each maximal invalid subsequence with
 * U+FFFD (the WHATWG rule, same as the JavaScript reference), so decode output is always
 * valid UTF-8 and valid input round-trips exactly (except a literal U+2581, which decodes
 * to a space, as in Hugging Face).
 *
 * Loading parses the JSON with cJSON (slow for the 14-33 MB Gemma files) and then writes a
 * binary cache "<path>.g4cache" next to it when the directory is writable; later loads use
 * the cache if it matches the source's size, mtime and content hash and passes its own
 * checksum, otherwise it is ignored and rewritten. G4_TOKENIZER_CACHE=off in the environment
 * turns the cache off for g4_tokenizer_load (as G4_TOKENIZER_NO_CACHE does for _ex).
 *
 * A loaded tokenizer is immutable: encode/decode may run concurrently from many threads.
 * Errors go through g4_fail() (see util/err.h). */
#ifndef G4_TEXT_TOKENIZER_H
#define G4_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct g4_tokenizer g4_tokenizer;

/* Flags for g4_tokenizer_load_ex. */
enum {
    G4_TOKENIZER_NO_CACHE = 1u, /* neither read nor write "<path>.g4cache" */
};

/* Returns NULL on error; g4_last_error() names the file and what is wrong. g4_tokenizer_load
 * uses the cache unless $G4_TOKENIZER_CACHE is "off"; _ex does what its flags say. */
g4_tokenizer *g4_tokenizer_load(const char *path);
g4_tokenizer *g4_tokenizer_load_ex(const char *path, unsigned flags);
void g4_tokenizer_free(g4_tokenizer *tok);
/* 1 when the last load of this tokenizer came from a valid "<path>.g4cache". */
int g4_tokenizer_loaded_from_cache(const g4_tokenizer *tok);

/* Encodes len bytes of text (NULs allowed) into *ids (malloc'd, caller frees; never NULL
 * on success). No BOS/EOS is added.
 * parse_special=1: every added token (control tokens included) is matched in the text.
 * parse_special=0: tokens marked "special" (<bos>, <|turn>, <|channel>, ...) are NOT
 * matched and are tokenized as ordinary text, for untrusted input; non-special added tokens
 * (newline/tab runs, <unusedN>, HTML tags) are still matched because ordinary text
 * tokenization depends on them (same as Hugging Face split_special_tokens=True). */
int g4_tokenizer_encode(const g4_tokenizer *tok, const char *text, size_t len, int parse_special,
                        int32_t **ids, size_t *n_ids);

/* Decodes ids to UTF-8 text in *out (malloc'd, NUL-terminated, caller frees). Special
 * tokens are rendered as their literal text (callers filter with g4_tokenizer_is_special). */
int g4_tokenizer_decode(const g4_tokenizer *tok, const int32_t *ids, size_t n, char **out,
                        size_t *out_len);

/* One more than the largest token id (model vocab plus added tokens beyond it). */
size_t g4_tokenizer_vocab_size(const g4_tokenizer *tok);
/* -1 when the piece is not a token (lookup is exact, on the stored piece: "▁Hello"). */
int32_t g4_tokenizer_piece_to_id(const g4_tokenizer *tok, const char *piece);
/* NULL when id is out of range or unused. */
const char *g4_tokenizer_id_to_piece(const g4_tokenizer *tok, int32_t id);
/* 1 for added tokens marked "special" in tokenizer.json (<pad>, <eos>, <bos>, <|turn>...). */
int g4_tokenizer_is_special(const g4_tokenizer *tok, int32_t id);

/* Streaming decoder for generation: each push returns the bytes that became final, always
 * whole UTF-8 characters; an incomplete UTF-8 tail from byte tokens is held back until the
 * next push or flush. The concatenation of all pushes plus flush equals
 * g4_tokenizer_decode of the same ids. The returned pointer is valid until the next call on
 * the same decoder. */
typedef struct g4_detokenizer g4_detokenizer;
g4_detokenizer *g4_detokenizer_new(const g4_tokenizer *tok);
int g4_detokenizer_push(g4_detokenizer *d, int32_t id, const char **bytes, size_t *len);
int g4_detokenizer_flush(g4_detokenizer *d, const char **bytes, size_t *len);
void g4_detokenizer_reset(g4_detokenizer *d);
void g4_detokenizer_free(g4_detokenizer *d);

#endif
