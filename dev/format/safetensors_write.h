/* Streaming safetensors writer: the caller declares every tensor (name, dtype, shape) first,
 * the writer computes the header and offsets, then asks a callback for each tensor's bytes
 * in bounded chunks, so a multi-gigabyte file is written with a few MiB of memory.
 *
 * Layout, as the Python `safetensors` package writes it: tensors sorted by dtype size (largest
 * first), then by name, so every F32 / BF16 tensor lands on a multiple of its element size
 * once the header is padded (with spaces) to a multiple of 8. An "__metadata__" entry
 * {"format": "pt"} comes first. The file appears under its name only when complete (it is
 * written as PATH.partial and renamed), so an interrupted run never leaves a file that looks
 * valid. */
#ifndef G4_FORMAT_SAFETENSORS_WRITE_H
#define G4_FORMAT_SAFETENSORS_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "format/safetensors.h"

/* Bytes per fill call (except a tensor's last one). A multiple of every element size, so a
 * chunk never splits an element. */
#define G4_STW_CHUNK ((size_t)4 << 20)

typedef struct {
    char *name;
    g4_dtype dtype;
    int ndim;
    int64_t shape[G4_MAX_DIMS];
    uint64_t nbytes;
    uint64_t offset; /* within the data section; set by g4_stw_write */
} g4_stw_tensor;

typedef struct {
    int n, cap;
    g4_stw_tensor *t; /* in the order added; indices given to the fill callback refer to it */
} g4_stw;

/* Produces bytes [off, off + n) of tensor `index` (as added) into buf. off is a multiple of
 * G4_STW_CHUNK and calls for one tensor come in increasing order. Returns 0, or -1 after
 * g4_fail. */
typedef int (*g4_stw_fill_fn)(void *user, int index, const g4_stw_tensor *t, uint64_t off, uint8_t *buf, size_t n);

void g4_stw_init(g4_stw *w);
void g4_stw_free(g4_stw *w);
/* Declares a tensor. Only allocation can fail here; names and shapes are checked by
 * g4_stw_write so that its messages can name the file. */
int g4_stw_add(g4_stw *w, const char *name, g4_dtype dtype, int ndim, const int64_t *shape);
/* Writes the whole file. Returns 0, or -1 with a message naming `path` (nothing is left at
 * `path` or PATH.partial on failure). `bytes_written`, when not NULL, receives the file size. */
int g4_stw_write(g4_stw *w, const char *path, g4_stw_fill_fn fill, void *user, uint64_t *bytes_written);

#endif
