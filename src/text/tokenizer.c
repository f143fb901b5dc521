/* BPE tokenizer for Hugging Face tokenizer.json (Gemma 3 / Gemma 4). See tokenizer.h.
 *
 * Layout: everything that defines the tokenizer (pieces, flags, merges) lives in one flat
 * "image" buffer whose format is also the on-disk cache format, so the cold path (JSON)
 * and the cache path share all validation and table building. Lookup tables (vocab hash,
 * merge hash, added-token trie, code point table) are derived from the image at load. */
#define _POSIX_C_SOURCE 200809L

#include "g4.h"

#include "util/err.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- constants and types */

enum {
    TOKF_MODEL = 1,   /* listed in model.vocab: may be produced by BPE */
    TOKF_ADDED = 2,   /* listed in added_tokens: matched on raw text */
    TOKF_SPECIAL = 4, /* added token with "special": true */
    TOKF_BYTE = 8,    /* piece is "<0xNN>" (derived at load, never trusted from the image) */
    /* Derived from the merges: most tokens (whole words) never start or end a merge, so
     * these bits rule out most hopeless pair lookups without touching the big table. */
    TOKF_MERGE_LEFT = 16,
    TOKF_MERGE_RIGHT = 32,
};

enum {
    METAF_BYTE_FALLBACK = 1,
    METAF_FUSE_UNK = 2,
    METAF_REPLACE_SPACE = 4, /* normalizer Replace(" " -> U+2581) present */
    METAF_IGNORE_MERGES = 8, /* whole word looked up in the vocab before merging */
};

#define NO_PIECE UINT32_MAX
#define CACHE_MAGIC "G4TOKC1\n"
#define CACHE_VERSION 1u
#define CACHE_SUFFIX ".g4cache"
/* Bounds that keep every size computation far from overflow and reject absurd files; they
 * also let a merge-table slot pack (left id, right id, rank) into 64 bits. */
#define VOCAB_BITS 21
#define RANK_BITS 22
#define MAX_VOCAB (1u << VOCAB_BITS)
#define MAX_MERGES ((1u << RANK_BITS) - 1)
#define EMPTY_SLOT UINT64_MAX
#define MAX_GLUE 16
#define MAX_PIECE_BYTES (1u << 12)

/* Header of the image / cache file. Fixed-width fields only, 8-byte aligned. */
struct cache_header {
    char magic[8];
    uint32_t version;
    uint32_t endian_mark; /* 0x01020304 as written by this machine */
    uint64_t src_size;
    int64_t src_mtime_sec;
    int64_t src_mtime_nsec;
    uint64_t src_hash;
    uint64_t payload_size;
    uint64_t payload_hash;
};

/* First record of the payload. */
struct cache_meta {
    uint32_t n_vocab;
    uint32_t n_merges;
    uint32_t blob_size;
    uint32_t flags; /* METAF_* */
    int32_t unk_id; /* -1: none */
    uint32_t reserved;
};

struct merge_rec {
    int32_t a, b, result; /* result = vocab[piece(a) + piece(b)]; rank = index */
};

struct vocab_slot {
    uint32_t hash;
    int32_t id; /* -1: empty */
};

struct trie_edge {
    uint32_t key; /* (node << 8 | byte) + 1; 0: empty */
    uint32_t child;
};

struct trie_node {
    int32_t id; /* added token ending here, or -1 */
};

struct g4_tokenizer {
    unsigned char *image; /* cache_header + payload, owned; read-only when mapped */
    size_t image_size;
    int image_mapped;
    uint32_t n_vocab, n_merges, blob_size, meta_flags;
    int32_t unk_id;
    const uint32_t *piece_off, *piece_len;
    const uint8_t *image_flags;
    const char *blob;
    struct merge_rec *merges; /* inside image (written in place by the JSON path) */

    uint8_t *flags; /* TOKF_*, recomputed */
    int32_t byte_id[256];
    int32_t space_id; /* id of U+2581, or -1 */
    int32_t *bmp_id;  /* code point < 0x10000 -> single-char model piece id, or -1 */
    struct vocab_slot *vocab_slots;
    uint32_t vocab_mask;
    uint64_t *merge_slots; /* left << 43 | right << 22 | rank; EMPTY_SLOT when free */
    uint32_t merge_mask;
    struct trie_node *trie_nodes;
    uint32_t n_trie_nodes;
    struct trie_edge *trie_edges;
    uint32_t trie_mask;
    uint8_t trie_first[256]; /* 1 when some added token starts with this byte */
    uint32_t glue[MAX_GLUE];  /* characters X such that a piece contains X + U+2581 */
    uint32_t n_glue;
    int split_words;
    int from_cache;
};

/* ---------------------------------------------------------------- small utilities */

static uint64_t fnv1a64(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/* Word-at-a-time content hash for cache validation: fast enough to run over the 14-33 MB
 * source on every cached load. Not cryptographic; it guards against stale caches. */
static uint64_t content_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = rotl64(h ^ (w * 0x87c37b91114253d5ull), 31) * 0x4cf5ad432745937full;
    }
    uint64_t tail = 0;
    for (size_t k = 0; i + k < n; k++) tail |= (uint64_t)s[i + k] << (8 * k);
    h ^= tail * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

/* Decodes one UTF-8 character at s[0..n). Returns its length (1-4) and stores the code
 * point, or returns 0 when s does not start with a valid, complete, shortest-form
 * sequence (surrogates and > U+10FFFF are invalid). */
static size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t len;
    uint32_t c, lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        len = 2, c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
        len = 3, c = b & 0x0F;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4, c = b & 0x07;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if (s[i] < lo || s[i] > hi) return 0;
        lo = 0x80, hi = 0xBF;
        c = (c << 6) | (s[i] & 0x3F);
    }
    *cp = c;
    return len;
}

static int utf8_valid(const unsigned char *s, size_t n) {
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_decode(s + i, n - i, &cp);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

size_t g4_text_utf8_prefix(const char *s, size_t n) {
    uint32_t cp;
    size_t i = 0, k;
    while (i < n && (k = utf8_decode((const unsigned char *)s + i, n - i, &cp)) > 0) i += k;
    return i;
}

/* Growable byte buffer. */
struct bytes {
    char *p;
    size_t n, cap;
};

static int bytes_reserve(struct bytes *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return g4_fail("tokenizer: out of memory");
    b->p = p, b->cap = cap;
    return 0;
}

static int bytes_append(struct bytes *b, const void *s, size_t n) {
    if (bytes_reserve(b, n)) return -1;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

/* Growable id vector. */
struct idvec {
    int32_t *v;
    size_t n, cap;
};

static int idvec_push(struct idvec *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->v, cap * sizeof *p);
        if (!p) return g4_fail("tokenizer: out of memory");
        v->v = p, v->cap = cap;
    }
    v->v[v->n++] = id;
    return 0;
}

static const char *piece_ptr(const g4_tokenizer *t, int32_t id) { return t->blob + t->piece_off[id]; }

static int id_has_piece(const g4_tokenizer *t, int64_t id) {
    return id >= 0 && id < (int64_t)t->n_vocab && t->piece_off[id] != NO_PIECE;
}

/* ---------------------------------------------------------------- vocab hash */

static uint32_t piece_hash(const void *s, size_t n) {
    uint64_t h = fnv1a64(s, n);
    return (uint32_t)(h ^ (h >> 32));
}

static int32_t vocab_find(const g4_tokenizer *t, const void *s, size_t n) {
    uint32_t h = piece_hash(s, n);
    for (uint32_t i = h & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        const struct vocab_slot *slot = &t->vocab_slots[i];
        if (slot->id < 0) return -1;
        if (slot->hash == h && t->piece_len[slot->id] == n && memcmp(piece_ptr(t, slot->id), s, n) == 0)
            return slot->id;
    }
}

/* Fails on a duplicate piece: two ids for one string would make encoding ambiguous. */
static int build_vocab_hash(g4_tokenizer *t, const char *what) {
    t->vocab_mask = pow2_at_least((uint64_t)t->n_vocab * 2) - 1;
    t->vocab_slots = malloc(((size_t)t->vocab_mask + 1) * sizeof *t->vocab_slots);
    if (!t->vocab_slots) return g4_fail("%s: out of memory", what);
    memset(t->vocab_slots, 0xFF, ((size_t)t->vocab_mask + 1) * sizeof *t->vocab_slots);
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        if (t->piece_off[id] == NO_PIECE) continue;
        const char *s = piece_ptr(t, (int32_t)id);
        uint32_t n = t->piece_len[id];
        uint32_t h = piece_hash(s, n), i = h & t->vocab_mask;
        for (; t->vocab_slots[i].id >= 0; i = (i + 1) & t->vocab_mask) {
            int32_t other = t->vocab_slots[i].id;
            if (t->vocab_slots[i].hash == h && t->piece_len[other] == n && memcmp(piece_ptr(t, other), s, n) == 0)
                return g4_fail("%s: piece \"%.40s\" appears twice (ids %d and %u)", what, s, other, id);
        }
        t->vocab_slots[i].hash = h;
        t->vocab_slots[i].id = (int32_t)id;
    }
    return 0;
}

/* ---------------------------------------------------------------- merge hash */

/* The table is the hot spot of encoding (memory latency bound), hence 8-byte slots. */
static uint64_t merge_key(uint32_t a, uint32_t b) { return (uint64_t)a << (VOCAB_BITS + RANK_BITS) | (uint64_t)b << RANK_BITS; }

static uint32_t merge_slot_index(uint64_t key, uint32_t mask) {
    return (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 40) & mask;
}

/* Rank of the merge (a, b), or -1. */
static int32_t merge_rank(const g4_tokenizer *t, int32_t a, int32_t b) {
    if (!(t->flags[a] & TOKF_MERGE_LEFT) || !(t->flags[b] & TOKF_MERGE_RIGHT)) return -1;
    const uint64_t key = merge_key((uint32_t)a, (uint32_t)b), rank_mask = (1ull << RANK_BITS) - 1;
    for (uint32_t i = merge_slot_index(key, t->merge_mask);; i = (i + 1) & t->merge_mask) {
        uint64_t slot = t->merge_slots[i];
        if (slot == EMPTY_SLOT) return -1;
        if ((slot & ~rank_mask) == key) return (int32_t)(slot & rank_mask);
    }
}

/* A pair listed twice keeps the later rank, as the Hugging Face loaders do. */
static int build_merge_hash(g4_tokenizer *t, const char *what) {
    t->merge_mask = pow2_at_least((uint64_t)t->n_merges * 2) - 1;
    size_t bytes = ((size_t)t->merge_mask + 1) * sizeof *t->merge_slots;
    t->merge_slots = malloc(bytes);
    if (!t->merge_slots) return g4_fail("%s: out of memory", what);
    memset(t->merge_slots, 0xFF, bytes);
    const uint64_t rank_mask = (1ull << RANK_BITS) - 1;
    for (uint32_t r = 0; r < t->n_merges; r++) {
        const struct merge_rec *m = &t->merges[r];
        /* Range checks keep a damaged cache from indexing out of bounds; unused ids are
         * harmless here (decode rejects them). */
        if ((uint32_t)m->a >= t->n_vocab || (uint32_t)m->b >= t->n_vocab || (uint32_t)m->result >= t->n_vocab)
            return g4_fail("%s: merge %u refers to an unknown token id", what, r);
        t->flags[m->a] |= TOKF_MERGE_LEFT;
        t->flags[m->b] |= TOKF_MERGE_RIGHT;
        uint64_t key = merge_key((uint32_t)m->a, (uint32_t)m->b);
        uint32_t i = merge_slot_index(key, t->merge_mask);
        while (t->merge_slots[i] != EMPTY_SLOT && (t->merge_slots[i] & ~rank_mask) != key) i = (i + 1) & t->merge_mask;
        t->merge_slots[i] = key | r;
    }
    return 0;
}

/* ---------------------------------------------------------------- added-token trie */

static uint32_t trie_slot(uint32_t key, uint32_t mask) { return (key * 0x9e3779b1u) >> 7 & mask; }

static int64_t trie_child(const g4_tokenizer *t, uint32_t node, unsigned char byte) {
    uint32_t key = (node << 8 | byte) + 1;
    for (uint32_t i = trie_slot(key, t->trie_mask);; i = (i + 1) & t->trie_mask) {
        if (t->trie_edges[i].key == key) return t->trie_edges[i].child;
        if (t->trie_edges[i].key == 0) return -1;
    }
}

static void trie_add_edge(g4_tokenizer *t, uint32_t node, unsigned char byte, uint32_t child) {
    uint32_t key = (node << 8 | byte) + 1, i = trie_slot(key, t->trie_mask);
    while (t->trie_edges[i].key) i = (i + 1) & t->trie_mask;
    t->trie_edges[i] = (struct trie_edge){key, child};
}

static int build_added_trie(g4_tokenizer *t, const char *what) {
    uint64_t total = 1;
    for (uint32_t id = 0; id < t->n_vocab; id++)
        if (t->flags[id] & TOKF_ADDED) total += t->piece_len[id];
    if (total >= (1u << 24)) return g4_fail("%s: added tokens too long in total", what);
    t->trie_nodes = malloc(total * sizeof *t->trie_nodes);
    t->trie_mask = pow2_at_least(total * 2) - 1;
    t->trie_edges = calloc((size_t)t->trie_mask + 1, sizeof *t->trie_edges);
    if (!t->trie_nodes || !t->trie_edges) return g4_fail("%s: out of memory", what);
    t->n_trie_nodes = 1;
    t->trie_nodes[0].id = -1;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        if (!(t->flags[id] & TOKF_ADDED) || t->piece_len[id] == 0) continue;
        const unsigned char *s = (const unsigned char *)piece_ptr(t, (int32_t)id);
        uint32_t node = 0;
        for (uint32_t k = 0; k < t->piece_len[id]; k++) {
            int64_t c = trie_child(t, node, s[k]);
            if (c < 0) {
                c = t->n_trie_nodes++;
                t->trie_nodes[c].id = -1;
                trie_add_edge(t, node, s[k], (uint32_t)c);
            }
            node = (uint32_t)c;
        }
        t->trie_nodes[node].id = (int32_t)id;
        t->trie_first[s[0]] = 1;
    }
    return 0;
}

/* Longest added token starting at s[0..n) that is allowed (special ones only when
 * parse_special). Returns its byte length, 0 if none. */
static size_t added_match(const g4_tokenizer *t, const unsigned char *s, size_t n, int parse_special, int32_t *id) {
    uint32_t node = 0;
    size_t best = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t c = trie_child(t, node, s[i]);
        if (c < 0) break;
        node = (uint32_t)c;
        int32_t tid = t->trie_nodes[node].id;
        if (tid >= 0 && (parse_special || !(t->flags[tid] & TOKF_SPECIAL))) best = i + 1, *id = tid;
    }
    return best;
}

/* ---------------------------------------------------------------- image: layout and derived tables */

struct image_layout {
    size_t off_piece_off, off_piece_len, off_flags, off_blob, off_merges, payload_size;
};

static struct image_layout image_layout_for(const struct cache_meta *m) {
    struct image_layout L;
    size_t p = align8(sizeof(struct cache_meta));
    L.off_piece_off = p, p += align8((size_t)m->n_vocab * 4);
    L.off_piece_len = p, p += align8((size_t)m->n_vocab * 4);
    L.off_flags = p, p += align8(m->n_vocab);
    L.off_blob = p, p += align8(m->blob_size);
    L.off_merges = p, p += align8((size_t)m->n_merges * sizeof(struct merge_rec));
    L.payload_size = p;
    return L;
}

/* Points the tokenizer's tables into its image after checking that every size and offset
 * stays inside it. */
static int attach_image(g4_tokenizer *t, const char *what) {
    const size_t hdr = sizeof(struct cache_header);
    if (t->image_size < hdr + sizeof(struct cache_meta)) return g4_fail("%s: image too small", what);
    struct cache_meta m;
    memcpy(&m, t->image + hdr, sizeof m);
    if (m.n_vocab == 0 || m.n_vocab > MAX_VOCAB || m.n_merges > MAX_MERGES || m.blob_size == 0)
        return g4_fail("%s: implausible sizes", what);
    struct image_layout L = image_layout_for(&m);
    if (hdr + L.payload_size != t->image_size) return g4_fail("%s: size does not match its contents", what);
    const unsigned char *p = t->image + hdr;
    t->n_vocab = m.n_vocab, t->n_merges = m.n_merges, t->blob_size = m.blob_size;
    t->meta_flags = m.flags, t->unk_id = m.unk_id;
    t->piece_off = (const uint32_t *)(const void *)(p + L.off_piece_off);
    t->piece_len = (const uint32_t *)(const void *)(p + L.off_piece_len);
    t->image_flags = p + L.off_flags;
    t->blob = (const char *)(p + L.off_blob);
    t->merges = (struct merge_rec *)(void *)(t->image + hdr + L.off_merges);
    if (t->blob[t->blob_size - 1] != 0) return g4_fail("%s: piece blob not terminated", what);
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        if (t->piece_off[id] == NO_PIECE) continue;
        uint64_t end = (uint64_t)t->piece_off[id] + t->piece_len[id];
        if (end >= t->blob_size || t->blob[end] != 0) return g4_fail("%s: piece %u out of bounds", what, id);
    }
    if (t->unk_id >= 0 && !id_has_piece(t, t->unk_id)) return g4_fail("%s: unk id %d has no piece", what, t->unk_id);
    return 0;
}

/* Parses "<0xNN>" (uppercase or lowercase hex); returns the byte or -1. */
static int byte_piece_value(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Flags, byte-token table and the table of single-code-point pieces. Pieces must be valid
 * UTF-8 so that decode output is too. */
static int derive_token_tables(g4_tokenizer *t, const char *what) {
    t->flags = malloc(t->n_vocab);
    t->bmp_id = malloc(0x10000 * sizeof *t->bmp_id);
    if (!t->flags || !t->bmp_id) return g4_fail("%s: out of memory", what);
    memset(t->bmp_id, 0xFF, 0x10000 * sizeof *t->bmp_id);
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        t->flags[id] = 0;
        if (t->piece_off[id] == NO_PIECE) continue;
        const char *s = piece_ptr(t, (int32_t)id);
        uint32_t n = t->piece_len[id];
        uint8_t f = t->image_flags[id] & (TOKF_MODEL | TOKF_ADDED | TOKF_SPECIAL);
        if (!utf8_valid((const unsigned char *)s, n)) return g4_fail("%s: piece of id %u is not valid UTF-8", what, id);
        int bv = byte_piece_value(s, n);
        if (bv >= 0 && (f & TOKF_MODEL)) {
            f |= TOKF_BYTE;
            if (t->byte_id[bv] < 0) t->byte_id[bv] = (int32_t)id;
        }
        uint32_t cp;
        if (n > 0 && (f & TOKF_MODEL) && utf8_decode((const unsigned char *)s, n, &cp) == n && cp < 0x10000)
            t->bmp_id[cp] = (int32_t)id;
        t->flags[id] = f;
    }
    return 0;
}

static int is_glue(const g4_tokenizer *t, uint32_t cp) {
    for (uint32_t i = 0; i < t->n_glue; i++)
        if (t->glue[i] == cp) return 1;
    return 0;
}

/* A segment may be cut into independent BPE words before a U+2581 that follows a
 * character X, unless some vocab piece contains "X" + U+2581: every merge result is a vocab
 * piece, so no merge can cross such a cut and the result is unchanged, while short words
 * make the merge loop much cheaper. Gemma has one such X ('>', from ">\xE2\x96\x81</"). */
static void find_glue_chars(g4_tokenizer *t) {
    t->n_glue = 0;
    t->split_words = t->space_id >= 0;
    for (uint32_t id = 0; id < t->n_vocab && t->split_words; id++) {
        if (!(t->flags[id] & TOKF_MODEL)) continue;
        const unsigned char *s = (const unsigned char *)piece_ptr(t, (int32_t)id);
        uint32_t n = t->piece_len[id], prev = 0x2581, cp;
        for (size_t i = 0, k; i < n && (k = utf8_decode(s + i, n - i, &cp)) > 0; i += k) {
            if (cp == 0x2581 && prev != 0x2581 && !is_glue(t, prev)) {
                if (t->n_glue == MAX_GLUE) t->split_words = 0;
                else t->glue[t->n_glue++] = prev;
            }
            prev = cp;
        }
    }
}

static int finalize_vocab(g4_tokenizer *t, const char *what) {
    if (derive_token_tables(t, what) || build_vocab_hash(t, what) || build_added_trie(t, what)) return -1;
    int32_t sp = vocab_find(t, "\xE2\x96\x81", 3);
    t->space_id = sp >= 0 && (t->flags[sp] & TOKF_MODEL) ? sp : -1;
    find_glue_chars(t);
    return 0;
}

/* ---------------------------------------------------------------- files */

/* A read-only view of a whole file. mmap avoids copying the 14-33 MB tokenizer.json and
 * the cache through read(). An empty file has no mapping (p == NULL). The cache stays
 * mapped while the tokenizer lives; caches are only ever replaced by rename, never
 * rewritten in place, so the mapped file does not change under us. */
struct file_view {
    unsigned char *p;
    size_t n;
    struct stat st;
};

static int map_file(const char *path, struct file_view *v) {
    memset(v, 0, sizeof *v);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return g4_fail("%s: cannot open: %s", path, strerror(errno));
    int rc = -1;
    if (fstat(fd, &v->st) != 0) {
        g4_fail("%s: cannot stat: %s", path, strerror(errno));
    } else if (!S_ISREG(v->st.st_mode)) {
        g4_fail("%s: not a regular file", path);
    } else if (v->st.st_size > 0) {
        void *m = mmap(NULL, (size_t)v->st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            g4_fail("%s: cannot map: %s", path, strerror(errno));
        } else {
            v->p = m, v->n = (size_t)v->st.st_size, rc = 0;
        }
    } else {
        rc = 0;
    }
    close(fd);
    return rc;
}

static void unmap_file(struct file_view *v) {
    if (v->p) munmap(v->p, v->n);
    v->p = NULL;
}

static char *cache_path_for(const char *path) {
    size_t n = strlen(path);
    char *p = malloc(n + sizeof CACHE_SUFFIX);
    if (p) memcpy(p, path, n), memcpy(p + n, CACHE_SUFFIX, sizeof CACHE_SUFFIX);
    return p;
}

static void stamp_header(g4_tokenizer *t, const struct stat *src, uint64_t src_hash) {
    struct cache_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CACHE_MAGIC, 8);
    h.version = CACHE_VERSION;
    h.endian_mark = 0x01020304u;
    h.src_size = (uint64_t)src->st_size;
    h.src_mtime_sec = (int64_t)src->st_mtim.tv_sec;
    h.src_mtime_nsec = (int64_t)src->st_mtim.tv_nsec;
    h.src_hash = src_hash;
    h.payload_size = t->image_size - sizeof h;
    h.payload_hash = content_hash(t->image + sizeof h, h.payload_size);
    memcpy(t->image, &h, sizeof h);
}

/* access() says yes to root for any directory, so a directory whose mode has no write bit
 * at all (read-only reference or model directories, r-x on purpose) is also left alone. */
static int dir_accepts_cache(const char *file) {
    const char *slash = strrchr(file, '/');
    size_t n = slash ? (size_t)(slash - file) : 1;
    char *dir = malloc(n + 2);
    if (!dir) return 0;
    if (!slash) memcpy(dir, ".", 2);
    else if (n == 0) memcpy(dir, "/", 2);
    else memcpy(dir, file, n), dir[n] = 0;
    struct stat st;
    int ok = stat(dir, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) && access(dir, W_OK) == 0;
    free(dir);
    return ok;
}

/* Best effort: a read-only directory or a full disk just means no cache. The file appears
 * atomically (rename) so a concurrent reader never sees a partial cache. */
static void write_cache(const g4_tokenizer *t, const char *path) {
    if (!dir_accepts_cache(path)) return;
    char *cpath = cache_path_for(path);
    if (!cpath) return;
    size_t n = strlen(cpath);
    char *tmp = malloc(n + 32);
    if (!tmp) {
        free(cpath);
        return;
    }
    snprintf(tmp, n + 32, "%s.tmp.%ld", cpath, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {
        size_t done = 0;
        while (done < t->image_size) {
            ssize_t w = write(fd, t->image + done, t->image_size - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) break;
            done += (size_t)w;
        }
        int ok = close(fd) == 0 && done == t->image_size;
        if (!ok || rename(tmp, cpath) != 0) unlink(tmp);
    }
    free(tmp);
    free(cpath);
}

/* Loads "<path>.g4cache" into t->image if it is intact and made from exactly this source.
 * Returns 0 on success, -1 (without touching the error message) otherwise. */
static int read_cache(g4_tokenizer *t, const char *path, const struct stat *src, uint64_t src_hash) {
    char *cpath = cache_path_for(path);
    if (!cpath) return -1;
    struct file_view v;
    int rc = map_file(cpath, &v);
    free(cpath);
    if (rc) return -1;
    struct cache_header h;
    int ok = v.n >= sizeof h;
    if (ok) memcpy(&h, v.p, sizeof h);
    ok = ok && memcmp(h.magic, CACHE_MAGIC, 8) == 0 && h.version == CACHE_VERSION && h.endian_mark == 0x01020304u &&
         h.src_size == (uint64_t)src->st_size && h.src_mtime_sec == (int64_t)src->st_mtim.tv_sec &&
         h.src_mtime_nsec == (int64_t)src->st_mtim.tv_nsec && h.src_hash == src_hash &&
         h.payload_size == v.n - sizeof h && h.payload_hash == content_hash(v.p + sizeof h, h.payload_size);
    if (!ok) {
        unmap_file(&v);
        return -1;
    }
    t->image = v.p, t->image_size = v.n, t->image_mapped = 1;
    return 0;
}

/* ---------------------------------------------------------------- JSON (cold path) */

/* What the JSON contributes before it is flattened into an image. Piece strings point into
 * the cJSON tree. */
struct json_vocab {
    uint32_t n_vocab;
    const char **piece;
    uint32_t *len;
    uint8_t *flags;
    uint32_t meta_flags;
    int32_t unk_id;
};

static int json_is_string_eq(const cJSON *obj, const char *key, const char *want) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) && strcmp(v->valuestring, want) == 0;
}

/* {"String": want} */
static int json_pattern_is(const cJSON *obj, const char *want) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(obj, "pattern");
    return cJSON_IsObject(p) && json_is_string_eq(p, "String", want);
}

static int json_is_space_replace(const cJSON *n) {
    return json_is_string_eq(n, "type", "Replace") && json_pattern_is(n, " ") && json_is_string_eq(n, "content", "\xE2\x96\x81");
}

static int check_normalizer(const cJSON *root, const char *path, uint32_t *meta_flags) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (!n || cJSON_IsNull(n)) return 0;
    if (!json_is_space_replace(n))
        return g4_fail("%s: normalizer: only Replace(\" \" -> \"\xE2\x96\x81\") is supported", path);
    *meta_flags |= METAF_REPLACE_SPACE;
    return 0;
}

static int check_pre_tokenizer(const cJSON *root, const char *path, uint32_t meta_flags) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (!p || cJSON_IsNull(p)) return 0;
    /* Splitting on " " is a no-op only because the normalizer already removed all spaces. */
    if (json_is_string_eq(p, "type", "Split") && json_pattern_is(p, " ") &&
        json_is_string_eq(p, "behavior", "MergedWithPrevious") && !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "invert")) &&
        (meta_flags & METAF_REPLACE_SPACE))
        return 0;
    return g4_fail("%s: pre_tokenizer: only Split(\" \", MergedWithPrevious) after the space normalizer is supported", path);
}

static int check_decoder(const cJSON *root, const char *path) {
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(d, "decoders");
    int ok = json_is_string_eq(d, "type", "Sequence") && cJSON_GetArraySize(list) == 3;
    if (ok) {
        const cJSON *r = cJSON_GetArrayItem(list, 0);
        ok = json_is_string_eq(r, "type", "Replace") && json_pattern_is(r, "\xE2\x96\x81") && json_is_string_eq(r, "content", " ") &&
             json_is_string_eq(cJSON_GetArrayItem(list, 1), "type", "ByteFallback") &&
             json_is_string_eq(cJSON_GetArrayItem(list, 2), "type", "Fuse");
    }
    if (!ok) return g4_fail("%s: decoder: only Sequence[Replace(\"\xE2\x96\x81\" -> \" \"), ByteFallback, Fuse] is supported", path);
    return 0;
}

static int json_null_or_empty(const cJSON *v) {
    return !v || cJSON_IsNull(v) || (cJSON_IsString(v) && v->valuestring[0] == 0);
}

static int check_model_options(const cJSON *model, const char *path, uint32_t *meta_flags) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "BPE") == 0))
        return g4_fail("%s: model.type: only BPE is supported", path);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0))
        return g4_fail("%s: model.dropout: BPE dropout is not supported", path);
    if (!json_null_or_empty(cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix")) ||
        !json_null_or_empty(cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix")))
        return g4_fail("%s: model: continuing_subword_prefix / end_of_word_suffix are not supported", path);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"))) *meta_flags |= METAF_BYTE_FALLBACK;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "fuse_unk"))) *meta_flags |= METAF_FUSE_UNK;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"))) *meta_flags |= METAF_IGNORE_MERGES;
    return 0;
}

/* Token ids in JSON are numbers; accept only exact integers in range. */
static int json_token_id(const cJSON *v, int64_t *id) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d < (double)MAX_VOCAB) || d != (double)(int64_t)d) return -1;
    *id = (int64_t)d;
    return 0;
}

static int scan_max_id(const cJSON *vocab, const cJSON *added, const char *path, uint32_t *n_vocab) {
    int64_t max_id = -1, id;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (json_token_id(e, &id)) return g4_fail("%s: model.vocab[\"%.40s\"]: id is not an integer in [0, %u)", path, e->string, MAX_VOCAB);
        if (id > max_id) max_id = id;
    }
    int i = 0;
    cJSON_ArrayForEach(e, added) {
        if (!cJSON_IsObject(e) || json_token_id(cJSON_GetObjectItemCaseSensitive(e, "id"), &id))
            return g4_fail("%s: added_tokens[%d]: missing or invalid id", path, i);
        if (id > max_id) max_id = id;
        i++;
    }
    if (max_id < 0) return g4_fail("%s: model.vocab is empty", path);
    *n_vocab = (uint32_t)max_id + 1;
    return 0;
}

static int set_piece(struct json_vocab *jv, int64_t id, const char *s, const char *path, const char *where) {
    size_t n = strlen(s);
    if (n >= MAX_PIECE_BYTES) return g4_fail("%s: %s: piece too long", path, where);
    if (jv->piece[id]) return g4_fail("%s: %s: id %lld used twice in model.vocab", path, where, (long long)id);
    jv->piece[id] = s, jv->len[id] = (uint32_t)n;
    return 0;
}

static int read_vocab_entries(const cJSON *vocab, const char *path, struct json_vocab *jv) {
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        int64_t id = (int64_t)e->valuedouble;
        if (set_piece(jv, id, e->string, path, "model.vocab")) return -1;
        jv->flags[id] |= TOKF_MODEL;
    }
    return 0;
}

static int read_added_tokens(const cJSON *added, const char *path, struct json_vocab *jv) {
    const cJSON *e;
    int i = 0;
    cJSON_ArrayForEach(e, added) {
        int64_t id = (int64_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsString(content) || !content->valuestring[0])
            return g4_fail("%s: added_tokens[%d]: missing or empty content", path, i);
        if (strlen(content->valuestring) >= MAX_PIECE_BYTES) return g4_fail("%s: added_tokens[%d]: content too long", path, i);
        static const char *const unsupported[] = {"lstrip", "rstrip", "single_word", "normalized"};
        for (size_t k = 0; k < sizeof unsupported / sizeof *unsupported; k++)
            if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, unsupported[k])))
                return g4_fail("%s: added_tokens[%d] (%.40s): %s=true is not supported", path, i, content->valuestring, unsupported[k]);
        if (jv->piece[id] && strcmp(jv->piece[id], content->valuestring) != 0)
            return g4_fail("%s: added_tokens[%d]: content \"%.40s\" differs from model.vocab piece \"%.40s\" of id %lld", path, i,
                           content->valuestring, jv->piece[id], (long long)id);
        if (!jv->piece[id]) jv->piece[id] = content->valuestring, jv->len[id] = (uint32_t)strlen(content->valuestring);
        jv->flags[id] |= TOKF_ADDED;
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"))) jv->flags[id] |= TOKF_SPECIAL;
        i++;
    }
    return 0;
}

static int read_unk(const cJSON *model, const char *path, struct json_vocab *jv) {
    jv->unk_id = -1;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (!unk || cJSON_IsNull(unk)) return 0;
    if (!cJSON_IsString(unk)) return g4_fail("%s: model.unk_token is not a string", path);
    for (uint32_t id = 0; id < jv->n_vocab; id++)
        if (jv->piece[id] && strcmp(jv->piece[id], unk->valuestring) == 0) jv->unk_id = (int32_t)id;
    if (jv->unk_id < 0) return g4_fail("%s: model.unk_token \"%.40s\" is not in the vocab", path, unk->valuestring);
    return 0;
}

/* Flattens pieces into a fresh image with room for n_merges merge records. */
static int build_image(g4_tokenizer *t, const struct json_vocab *jv, uint32_t n_merges, const char *path) {
    uint64_t blob = 1; /* leading NUL keeps offset 0 meaningful for empty strings */
    for (uint32_t id = 0; id < jv->n_vocab; id++)
        if (jv->piece[id]) blob += jv->len[id] + 1;
    if (blob >= UINT32_MAX) return g4_fail("%s: vocabulary too large", path);
    struct cache_meta m = {jv->n_vocab, n_merges, (uint32_t)blob, jv->meta_flags, jv->unk_id, 0};
    struct image_layout L = image_layout_for(&m);
    t->image_size = sizeof(struct cache_header) + L.payload_size;
    t->image = calloc(1, t->image_size);
    if (!t->image) return g4_fail("%s: out of memory", path);
    unsigned char *p = t->image + sizeof(struct cache_header);
    memcpy(p, &m, sizeof m);
    uint32_t *off = (uint32_t *)(void *)(p + L.off_piece_off), *len = (uint32_t *)(void *)(p + L.off_piece_len);
    char *b = (char *)(p + L.off_blob);
    uint32_t pos = 1;
    for (uint32_t id = 0; id < jv->n_vocab; id++) {
        p[L.off_flags + id] = jv->flags[id];
        if (!jv->piece[id]) {
            off[id] = NO_PIECE, len[id] = 0;
            continue;
        }
        off[id] = pos, len[id] = jv->len[id];
        memcpy(b + pos, jv->piece[id], jv->len[id]);
        pos += jv->len[id] + 1;
    }
    return attach_image(t, path);
}

/* One merge is ["a", "b"] (current format) or "a b" (older format). */
static int merge_parts(const cJSON *e, const char **a, size_t *na, const char **b, size_t *nb) {
    if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2) {
        const cJSON *x = cJSON_GetArrayItem(e, 0), *y = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsString(x) || !cJSON_IsString(y)) return -1;
        *a = x->valuestring, *na = strlen(x->valuestring), *b = y->valuestring, *nb = strlen(y->valuestring);
        return 0;
    }
    if (!cJSON_IsString(e)) return -1;
    const char *s = e->valuestring, *sp = strchr(s, ' ');
    if (!sp || strchr(sp + 1, ' ')) return -1;
    *a = s, *na = (size_t)(sp - s), *b = sp + 1, *nb = strlen(sp + 1);
    return 0;
}

static int resolve_merges(g4_tokenizer *t, const cJSON *merges, const char *path) {
    char buf[2 * MAX_PIECE_BYTES + 1];
    uint32_t r = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, merges) {
        const char *a, *b;
        size_t na, nb;
        if (merge_parts(e, &a, &na, &b, &nb)) return g4_fail("%s: model.merges[%u]: expected [\"a\", \"b\"] or \"a b\"", path, r);
        int32_t ia = vocab_find(t, a, na), ib = vocab_find(t, b, nb);
        if (ia < 0 || ib < 0)
            return g4_fail("%s: model.merges[%u]: \"%.40s\" or \"%.40s\" is not in the vocab", path, r, a, b);
        if (na + nb >= sizeof buf) return g4_fail("%s: model.merges[%u]: merged piece too long", path, r);
        memcpy(buf, a, na), memcpy(buf + na, b, nb);
        buf[na + nb] = 0;
        int32_t ir = vocab_find(t, buf, na + nb);
        if (ir < 0) return g4_fail("%s: model.merges[%u]: merged piece \"%.80s\" is not in the vocab", path, r, buf);
        t->merges[r++] = (struct merge_rec){ia, ib, ir};
    }
    return 0;
}

static void json_vocab_free(struct json_vocab *jv) {
    free(jv->piece);
    free(jv->len);
    free(jv->flags);
}

static int json_vocab_alloc(struct json_vocab *jv, const char *path) {
    jv->piece = calloc(jv->n_vocab, sizeof *jv->piece);
    jv->len = calloc(jv->n_vocab, sizeof *jv->len);
    jv->flags = calloc(jv->n_vocab, 1);
    if (!jv->piece || !jv->len || !jv->flags) return g4_fail("%s: out of memory", path);
    return 0;
}

static int load_from_tree(g4_tokenizer *t, const cJSON *root, const char *path) {
    struct json_vocab jv;
    memset(&jv, 0, sizeof jv);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(root)) return g4_fail("%s: top level is not a JSON object", path);
    if (!cJSON_IsObject(model)) return g4_fail("%s: missing \"model\" object", path);
    if (!cJSON_IsObject(vocab)) return g4_fail("%s: missing model.vocab object", path);
    if (!cJSON_IsArray(merges)) return g4_fail("%s: missing model.merges array", path);
    if (added && !cJSON_IsArray(added)) return g4_fail("%s: added_tokens is not an array", path);
    int n_merges = cJSON_GetArraySize(merges);
    if ((uint64_t)n_merges > MAX_MERGES) return g4_fail("%s: too many merges", path);
    int rc = check_model_options(model, path, &jv.meta_flags) || check_normalizer(root, path, &jv.meta_flags) ||
             check_pre_tokenizer(root, path, jv.meta_flags) || check_decoder(root, path) ||
             scan_max_id(vocab, added, path, &jv.n_vocab) || json_vocab_alloc(&jv, path) ||
             read_vocab_entries(vocab, path, &jv) || read_added_tokens(added, path, &jv) || read_unk(model, path, &jv) ||
             build_image(t, &jv, (uint32_t)n_merges, path) || finalize_vocab(t, path) || resolve_merges(t, merges, path);
    json_vocab_free(&jv);
    return rc ? -1 : 0;
}

static int load_from_json(g4_tokenizer *t, const unsigned char *src, size_t size, const char *path) {
    if (size == 0) return g4_fail("%s: empty file", path);
    cJSON *root = cJSON_ParseWithLength((const char *)src, size);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= (const char *)src && at <= (const char *)src + size ? (long)(at - (const char *)src) : -1;
        return g4_fail("%s: not valid JSON (error near byte %ld)", path, off);
    }
    int rc = load_from_tree(t, root, path);
    cJSON_Delete(root);
    return rc;
}

/* ---------------------------------------------------------------- public load / free */

static void release_tables(g4_tokenizer *t) {
    if (t->image_mapped)
        munmap(t->image, t->image_size);
    else
        free(t->image);
    free(t->flags), free(t->bmp_id), free(t->vocab_slots), free(t->merge_slots);
    free(t->trie_nodes), free(t->trie_edges);
    memset(t, 0, sizeof *t);
}

void g4_tokenizer_free(g4_tokenizer *t) {
    if (!t) return;
    release_tables(t);
    free(t);
}

/* A cache that passes its checksum but not the structural checks is ignored too. */
static int try_cache(g4_tokenizer *t, const char *path, const struct stat *st, uint64_t src_hash) {
    if (read_cache(t, path, st, src_hash)) return -1;
    if (attach_image(t, path) || finalize_vocab(t, path) || build_merge_hash(t, path)) {
        release_tables(t);
        return -1;
    }
    t->from_cache = 1;
    return 0;
}

g4_tokenizer *g4_tokenizer_load_ex(const char *path, unsigned flags) {
    g4_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        g4_fail("%s: out of memory", path);
        return NULL;
    }
    struct file_view src;
    if (map_file(path, &src)) {
        free(t);
        return NULL;
    }
    int use_cache = !(flags & G4_TOKENIZER_NO_CACHE);
    uint64_t src_hash = use_cache ? content_hash(src.p, src.n) : 0;
    if (use_cache && try_cache(t, path, &src.st, src_hash) == 0) {
        unmap_file(&src);
        return t;
    }
    int rc = load_from_json(t, src.p, src.n, path) || build_merge_hash(t, path);
    if (rc) {
        unmap_file(&src);
        g4_tokenizer_free(t);
        return NULL;
    }
    if (use_cache) {
        stamp_header(t, &src.st, src_hash);
        write_cache(t, path);
    }
    unmap_file(&src);
    return t;
}

/* G4_TOKENIZER_CACHE=off keeps every default load away from the cache, for a tokenizer.json in
 * a folder that is writable but must stay as it is (shared reference data, a model folder
 * several users read): the directory's mode cannot say so. */
static unsigned env_flags(void) {
    const char *v = getenv("G4_TOKENIZER_CACHE");
    if (!v || !*v || !strcmp(v, "on")) return 0;
    if (!strcmp(v, "off")) return G4_TOKENIZER_NO_CACHE;
    g4_warn("G4_TOKENIZER_CACHE=%s: expected on or off; the cache stays on", v);
    return 0;
}

g4_tokenizer *g4_tokenizer_load(const char *path) { return g4_tokenizer_load_ex(path, env_flags()); }

int g4_tokenizer_loaded_from_cache(const g4_tokenizer *t) { return t->from_cache; }

/* ---------------------------------------------------------------- encode: BPE on one segment */

struct heap_entry {
    uint64_t key; /* rank << 32 | left symbol index: lowest rank, then leftmost */
    int32_t left_id, right_id;
};

struct bpe_scratch {
    int32_t *id, *prev, *next;
    size_t n, cap;
    int32_t *word; /* start symbol of each independent word */
    size_t n_words, words_cap;
    struct heap_entry *heap;
    size_t heap_n, heap_cap;
};

static void scratch_free(struct bpe_scratch *s) {
    free(s->id), free(s->prev), free(s->next), free(s->word), free(s->heap);
}

static int grow_i32(int32_t **p, size_t cap) {
    int32_t *q = realloc(*p, cap * sizeof *q);
    if (!q) return -1;
    *p = q;
    return 0;
}

static int symbol_push(struct bpe_scratch *s, int32_t id) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        if (grow_i32(&s->id, cap) || grow_i32(&s->prev, cap) || grow_i32(&s->next, cap))
            return g4_fail("tokenizer: out of memory");
        s->cap = cap;
    }
    s->id[s->n++] = id;
    return 0;
}

static int word_push(struct bpe_scratch *s, int32_t start) {
    if (s->n_words == s->words_cap) {
        size_t cap = s->words_cap ? s->words_cap * 2 : 64;
        if (grow_i32(&s->word, cap)) return g4_fail("tokenizer: out of memory");
        s->words_cap = cap;
    }
    s->word[s->n_words++] = start;
    return 0;
}

static int heap_push(struct bpe_scratch *s, struct heap_entry e) {
    if (s->heap_n == s->heap_cap) {
        size_t cap = s->heap_cap ? s->heap_cap * 2 : 256;
        struct heap_entry *h = realloc(s->heap, cap * sizeof *h);
        if (!h) return g4_fail("tokenizer: out of memory");
        s->heap = h, s->heap_cap = cap;
    }
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (s->heap[parent].key <= e.key) break;
        s->heap[i] = s->heap[parent];
        i = parent;
    }
    s->heap[i] = e;
    return 0;
}

static struct heap_entry heap_pop(struct bpe_scratch *s) {
    struct heap_entry top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && s->heap[c + 1].key < s->heap[c].key) c++;
        if (last.key <= s->heap[c].key) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

/* Queues the pair starting at symbol i if the vocabulary has a merge for it. */
static int queue_pair(const g4_tokenizer *t, struct bpe_scratch *s, int32_t i) {
    if (i < 0 || s->next[i] < 0) return 0;
    int32_t a = s->id[i], b = s->id[s->next[i]];
    int32_t rank = merge_rank(t, a, b);
    if (rank < 0) return 0;
    return heap_push(s, (struct heap_entry){(uint64_t)(uint32_t)rank << 32 | (uint32_t)i, a, b});
}

/* A symbol for a character (or invalid byte) with no vocab entry: its bytes as <0xNN>
 * tokens, or one unk (consecutive unks fused when fuse_unk). */
static int push_fallback(const g4_tokenizer *t, struct bpe_scratch *s, const unsigned char *c, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if ((t->meta_flags & METAF_BYTE_FALLBACK) && t->byte_id[c[i]] >= 0) {
            if (symbol_push(s, t->byte_id[c[i]])) return -1;
            continue;
        }
        if (t->unk_id < 0) return g4_fail("tokenizer: byte 0x%02X has no token and there is no unk_token", c[i]);
        if ((t->meta_flags & METAF_FUSE_UNK) && s->n > 0 && s->id[s->n - 1] == t->unk_id) continue;
        if (symbol_push(s, t->unk_id)) return -1;
    }
    return 0;
}

static int32_t char_id(const g4_tokenizer *t, const unsigned char *c, size_t n, uint32_t cp) {
    if (cp < 0x10000) return t->bmp_id[cp];
    int32_t id = vocab_find(t, c, n);
    return id >= 0 && (t->flags[id] & TOKF_MODEL) ? id : -1;
}

/* Initial symbols: one per code point (space normalized to U+2581), fallback for the rest.
 * Also records where the segment may be cut into independent words (see find_glue_chars). */
static int split_symbols(const g4_tokenizer *t, struct bpe_scratch *s, const unsigned char *text, size_t n) {
    static const unsigned char space_mark[3] = {0xE2, 0x96, 0x81};
    uint32_t prev_cp = 0x2581;
    s->n = 0, s->n_words = 0;
    if (word_push(s, 0)) return -1;
    for (size_t i = 0; i < n;) {
        uint32_t cp = UINT32_MAX; /* stays so for an invalid byte: byte fallback on its own */
        size_t adv = utf8_decode(text + i, n - i, &cp);
        const unsigned char *c = text + i;
        size_t clen = adv;
        int32_t id = -1;
        if (adv == 0) {
            adv = clen = 1;
        } else {
            if (cp == ' ' && (t->meta_flags & METAF_REPLACE_SPACE)) cp = 0x2581, c = space_mark, clen = 3;
            id = char_id(t, c, clen, cp);
        }
        if (cp == 0x2581 && prev_cp != 0x2581 && t->split_words && !is_glue(t, prev_cp) && word_push(s, (int32_t)s->n))
            return -1;
        if (id >= 0 ? symbol_push(s, id) : push_fallback(t, s, c, clen)) return -1;
        prev_cp = cp;
        i += adv;
    }
    return 0;
}

/* Whole-word lookup used only when the file sets ignore_merges. */
static int32_t whole_word_id(const g4_tokenizer *t, const unsigned char *text, size_t n) {
    struct bytes b = {0};
    for (size_t i = 0; i < n; i++) {
        int sp = text[i] == ' ' && (t->meta_flags & METAF_REPLACE_SPACE);
        if (bytes_append(&b, sp ? "\xE2\x96\x81" : (const char *)text + i, sp ? 3 : 1)) {
            free(b.p);
            return -1;
        }
    }
    int32_t id = b.n ? vocab_find(t, b.p, b.n) : -1;
    free(b.p);
    return id >= 0 && (t->flags[id] & TOKF_MODEL) ? id : -1;
}

/* Words up to this many symbols use a plain scan for the best pair instead of the heap. */
#define SMALL_WORD 32

/* Lowest rank wins, the leftmost among equal ranks (strict <). */
static int bpe_small_word(const g4_tokenizer *t, const int32_t *ids, int32_t n, struct idvec *out) {
    int32_t id[SMALL_WORD], rank[SMALL_WORD];
    memcpy(id, ids, (size_t)n * sizeof *id);
    for (int32_t i = 0; i + 1 < n; i++) rank[i] = merge_rank(t, id[i], id[i + 1]);
    for (;;) {
        int32_t best = -1;
        for (int32_t i = 0; i + 1 < n; i++)
            if (rank[i] >= 0 && (best < 0 || rank[i] < rank[best])) best = i;
        if (best < 0) break;
        id[best] = t->merges[rank[best]].result;
        n--;
        if (best + 1 < n) {
            memmove(id + best + 1, id + best + 2, (size_t)(n - best - 1) * sizeof *id);
            memmove(rank + best + 1, rank + best + 2, (size_t)(n - best - 2) * sizeof *rank);
            rank[best] = merge_rank(t, id[best], id[best + 1]);
        }
        if (best > 0) rank[best - 1] = merge_rank(t, id[best - 1], id[best]);
    }
    for (int32_t i = 0; i < n; i++)
        if (idvec_push(out, id[i])) return -1;
    return 0;
}

/* Symbols [start, end) as a linked list merged through a heap: O(n log n) for long words
 * (CJK text, long runs without spaces). */
static int bpe_long_word(const g4_tokenizer *t, struct bpe_scratch *s, int32_t start, int32_t end, struct idvec *out) {
    s->heap_n = 0;
    for (int32_t i = start; i < end; i++) s->prev[i] = i - 1, s->next[i] = i + 1 < end ? i + 1 : -1;
    s->prev[start] = -1;
    for (int32_t i = start; i + 1 < end; i++)
        if (queue_pair(t, s, i)) return -1;
    while (s->heap_n) {
        struct heap_entry e = heap_pop(s);
        int32_t i = (int32_t)(uint32_t)e.key, j = s->next[i];
        /* Stale entry: a merged symbol always has a longer (so different) id, and a
         * symbol absorbed into its left neighbour is unlinked. */
        if (s->id[i] != e.left_id || j < 0 || s->id[j] != e.right_id) continue;
        s->id[i] = t->merges[e.key >> 32].result;
        s->id[j] = -1;
        s->next[i] = s->next[j];
        if (s->next[j] >= 0) s->prev[s->next[j]] = i;
        if (queue_pair(t, s, s->prev[i]) || queue_pair(t, s, i)) return -1;
    }
    for (int32_t i = start; i >= 0; i = s->next[i])
        if (idvec_push(out, s->id[i])) return -1;
    return 0;
}

static int encode_segment(const g4_tokenizer *t, const unsigned char *text, size_t n, struct bpe_scratch *s,
                          struct idvec *out) {
    if (n == 0) return 0;
    if (t->meta_flags & METAF_IGNORE_MERGES) {
        int32_t id = whole_word_id(t, text, n);
        if (id >= 0) return idvec_push(out, id);
    }
    if (split_symbols(t, s, text, n)) return -1;
    for (size_t w = 0; w < s->n_words; w++) {
        int32_t start = s->word[w], end = w + 1 < s->n_words ? s->word[w + 1] : (int32_t)s->n;
        if (end <= start) continue;
        int rc = end - start <= SMALL_WORD ? bpe_small_word(t, s->id + start, end - start, out)
                                           : bpe_long_word(t, s, start, end, out);
        if (rc) return -1;
    }
    return 0;
}

int g4_tokenizer_encode(const g4_tokenizer *t, const char *text, size_t len, int parse_special, int32_t **ids,
                        size_t *n_ids) {
    /* Symbol indices are int32 and one byte can become up to 3 symbols. */
    if (len > (size_t)INT32_MAX / 4) return g4_fail("tokenizer: text of %zu bytes is too long to encode at once", len);
    if (!text && len) return g4_fail("tokenizer: text is NULL");
    struct idvec out = {0};
    struct bpe_scratch s = {0};
    const unsigned char *u = (const unsigned char *)text;
    size_t seg = 0;
    int rc = idvec_push(&out, 0); /* guarantees a non-NULL result for empty text */
    out.n = 0;
    for (size_t i = 0; rc == 0 && i < len; i++) {
        int32_t id;
        size_t m = t->trie_first[u[i]] ? added_match(t, u + i, len - i, parse_special, &id) : 0;
        if (m == 0) continue;
        rc = encode_segment(t, u + seg, i - seg, &s, &out) || idvec_push(&out, id);
        i += m - 1;
        seg = i + 1;
    }
    if (rc == 0) rc = encode_segment(t, u + seg, len - seg, &s, &out);
    scratch_free(&s);
    if (rc) {
        free(out.v);
        return -1;
    }
    *ids = out.v, *n_ids = out.n;
    return 0;
}

/* ---------------------------------------------------------------- decode */

/* Incremental UTF-8 assembler for the bytes of <0xNN> tokens: emits complete characters,
 * and U+FFFD for each maximal invalid subsequence (WHATWG), holding an incomplete tail. */
struct utf8_asm {
    unsigned char buf[4];
    uint8_t have, need, lo, hi;
};

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

static void asm_reset(struct utf8_asm *a) { a->have = 0, a->need = 0, a->lo = 0x80, a->hi = 0xBF; }

static int asm_start(struct utf8_asm *a, unsigned char b, struct bytes *out) {
    if (b < 0x80) return bytes_append(out, &b, 1);
    if (b >= 0xC2 && b <= 0xDF) a->need = 1;
    else if (b >= 0xE0 && b <= 0xEF) a->need = 2, a->lo = b == 0xE0 ? 0xA0 : 0x80, a->hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4) a->need = 3, a->lo = b == 0xF0 ? 0x90 : 0x80, a->hi = b == 0xF4 ? 0x8F : 0xBF;
    else return bytes_append(out, REPLACEMENT, 3);
    a->buf[0] = b, a->have = 1;
    return 0;
}

static int asm_byte(struct utf8_asm *a, unsigned char b, struct bytes *out) {
    if (a->need == 0) return asm_start(a, b, out);
    if (b < a->lo || b > a->hi) {
        asm_reset(a);
        if (bytes_append(out, REPLACEMENT, 3)) return -1;
        return asm_start(a, b, out);
    }
    a->buf[a->have++] = b, a->lo = 0x80, a->hi = 0xBF;
    if (a->have < a->need + 1) return 0;
    int rc = bytes_append(out, a->buf, a->have);
    asm_reset(a);
    return rc;
}

/* End of a run of byte tokens: an incomplete character becomes one U+FFFD. */
static int asm_finish(struct utf8_asm *a, struct bytes *out) {
    if (a->need == 0) return 0;
    asm_reset(a);
    return bytes_append(out, REPLACEMENT, 3);
}

/* Piece text with U+2581 turned back into spaces. */
static int append_piece(const g4_tokenizer *t, int32_t id, struct bytes *out) {
    const char *s = piece_ptr(t, id);
    size_t n = t->piece_len[id];
    if (bytes_reserve(out, n)) return -1;
    for (size_t i = 0; i < n;) {
        if (i + 3 <= n && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
            out->p[out->n++] = ' ';
            i += 3;
        } else {
            out->p[out->n++] = s[i++];
        }
    }
    out->p[out->n] = 0;
    return 0;
}

static int decode_one(const g4_tokenizer *t, struct utf8_asm *a, int32_t id, struct bytes *out) {
    if (!id_has_piece(t, id)) return g4_fail("decode: token id %ld is not in the vocabulary (size %u)", (long)id, t->n_vocab);
    if (t->flags[id] & TOKF_BYTE) {
        int v = byte_piece_value(piece_ptr(t, id), t->piece_len[id]);
        return asm_byte(a, (unsigned char)v, out);
    }
    return asm_finish(a, out) || append_piece(t, id, out) ? -1 : 0;
}

int g4_tokenizer_decode(const g4_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *out_len) {
    struct bytes b = {0};
    struct utf8_asm a;
    asm_reset(&a);
    int rc = bytes_reserve(&b, n * 4);
    for (size_t i = 0; rc == 0 && i < n; i++) rc = decode_one(t, &a, ids[i], &b);
    if (rc == 0) rc = asm_finish(&a, &b);
    if (rc == 0) rc = bytes_reserve(&b, 1); /* room for the terminating NUL, even for no ids */
    if (rc) {
        free(b.p);
        return -1;
    }
    b.p[b.n] = 0;
    *out = b.p, *out_len = b.n;
    return 0;
}

struct g4_detokenizer {
    const g4_tokenizer *tok;
    struct utf8_asm a;
    struct bytes out;
};

g4_detokenizer *g4_detokenizer_new(const g4_tokenizer *tok) {
    g4_detokenizer *d = calloc(1, sizeof *d);
    if (!d || bytes_reserve(&d->out, 64)) {
        free(d);
        g4_fail("detokenizer: out of memory");
        return NULL;
    }
    d->tok = tok;
    asm_reset(&d->a);
    return d;
}

int g4_detokenizer_push(g4_detokenizer *d, int32_t id, const char **bytes, size_t *len) {
    d->out.n = 0;
    d->out.p[0] = 0;
    if (decode_one(d->tok, &d->a, id, &d->out)) return -1;
    *bytes = d->out.p, *len = d->out.n;
    return 0;
}

int g4_detokenizer_flush(g4_detokenizer *d, const char **bytes, size_t *len) {
    d->out.n = 0;
    d->out.p[0] = 0;
    if (asm_finish(&d->a, &d->out)) return -1;
    *bytes = d->out.p, *len = d->out.n;
    return 0;
}

void g4_detokenizer_reset(g4_detokenizer *d) { asm_reset(&d->a); }

void g4_detokenizer_free(g4_detokenizer *d) {
    if (!d) return;
    free(d->out.p);
    free(d);
}

/* ---------------------------------------------------------------- accessors */

size_t g4_tokenizer_vocab_size(const g4_tokenizer *t) { return t->n_vocab; }

int32_t g4_tokenizer_piece_to_id(const g4_tokenizer *t, const char *piece) { return vocab_find(t, piece, strlen(piece)); }

const char *g4_tokenizer_id_to_piece(const g4_tokenizer *t, int32_t id) { return id_has_piece(t, id) ? piece_ptr(t, id) : NULL; }

int g4_tokenizer_is_special(const g4_tokenizer *t, int32_t id) {
    return id_has_piece(t, id) && (t->flags[id] & TOKF_SPECIAL) ? 1 : 0;
}
