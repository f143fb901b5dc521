/* g4 serve's token endpoints, apart from HTTP and the engine: POST /tokenize and /detokenize
 * (llama-server's shapes) answered from the tokenizer alone, and /v1/embeddings' request (its
 * inputs as token ids) and reply (OpenAI's list of embedding objects). Every refusal an
 * OpenAI-style error naming the field. */
#ifndef G4_SERVE_TOKENS_H
#define G4_SERVE_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "g4.h"
#include "serve/request.h"

/* {"content": TEXT, "add_special": false, "parse_special": true, "with_pieces": false} ->
 * {"tokens": [ID, ...]}, or with_pieces {"tokens": [{"id": ID, "piece": TEXT}, ...]} (a piece
 * that is not whole UTF-8 characters as its bytes' values). add_special puts BOS first. The
 * reply's JSON (malloc'd), or NULL with e filled. */
char *serve_tokenize(const char *body, size_t len, const g4_tokenizer *tok, serve_error *e);
/* {"tokens": [ID, ...]} -> {"content": TEXT}. */
char *serve_detokenize(const char *body, size_t len, const g4_tokenizer *tok, serve_error *e);

typedef enum { SERVE_POOL_MEAN = 0, SERVE_POOL_LAST = 1 } serve_pooling;

/* An embeddings request's inputs, each a sequence of token ids (a text: BOS and its tokens). */
typedef struct {
    int32_t **ids;
    int *n_ids;
    int n_inputs;
    int base64; /* encoding_format "base64": each vector as its float32 bytes (little-endian) in base64 */
} serve_embed_request;

/* Reads {"input": TEXT | [TEXT, ...] | [ID, ...] | [[ID, ...], ...], "model", "encoding_format"}.
 * Fails on an empty input or text, an id outside [0, vocab), an input longer than lim->ctx
 * (context_length_exceeded), more than SERVE_MAX_EMBED_INPUTS inputs. */
#define SERVE_MAX_EMBED_INPUTS 2048
int serve_parse_embeddings(const char *body, size_t len, const g4_tokenizer *tok, int vocab, const serve_limits *lim, serve_embed_request *r,
                           serve_error *e);
void serve_embed_request_free(serve_embed_request *r);
/* The reply: vecs holds n_inputs rows of dim finite floats. NULL when out of memory. */
char *serve_embeddings_json(const serve_embed_request *r, const float *vecs, int dim, const char *model_id);

/* The pooled vector of an input: its rows' final hidden states added up row by row, in order
 * (serve_pool_add; the last one kept for SERVE_POOL_LAST), then their mean or the last one
 * L2-normalised into out, as OpenAI's embeddings are (serve_pool_finish). */
void serve_pool_add(double *acc, const float *hidden, int dim, serve_pooling pooling);
void serve_pool_finish(const double *acc, int dim, int n_rows, serve_pooling pooling, float *out);

#endif
