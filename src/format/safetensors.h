/* safetensors container: an 8-byte little-endian header length N, N bytes of JSON
 * {name: {dtype, shape, data_offsets: [begin, end)}}, then the data. Files are memory-mapped;
 * a checkpoint may be one file or shards listed by model.safetensors.index.json.
 * Every header is validated before any tensor is used (checkpoint.md §2). */
#ifndef G4_FORMAT_SAFETENSORS_H
#define G4_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "util/file.h"

typedef enum {
    G4_DT_BOOL, G4_DT_U8, G4_DT_I8, G4_DT_I16, G4_DT_U16, G4_DT_F16, G4_DT_BF16, G4_DT_I32,
    G4_DT_U32, G4_DT_F32, G4_DT_F64, G4_DT_I64, G4_DT_U64, G4_DT_F8_E4M3, G4_DT_F8_E5M2,
    G4_DT_COUNT
} g4_dtype;

const char *g4_dtype_name(g4_dtype dt);
size_t g4_dtype_size(g4_dtype dt);

#define G4_MAX_DIMS 8

typedef struct {
    char *name;
    g4_dtype dtype;
    int ndim;
    int64_t shape[G4_MAX_DIMS];
    int64_t numel;
    const uint8_t *data; /* inside the file's memory map; may be unaligned */
    size_t nbytes;
    int file;            /* index into g4_safetensors.paths */
} g4_tensor;

typedef struct {
    int n_files;
    char **paths;
    g4_mapped_file *maps;
    int n_tensors;
    g4_tensor *tensors; /* sorted by name */
} g4_safetensors;

/* Opens one .safetensors file. */
int g4_st_open_file(g4_safetensors *st, const char *path);
/* Opens a checkpoint folder: model.safetensors.index.json if present, else model.safetensors. */
int g4_st_open_dir(g4_safetensors *st, const char *dir);
void g4_st_close(g4_safetensors *st);
const g4_tensor *g4_st_find(const g4_safetensors *st, const char *name);
/* The file a tensor lives in (for error messages). */
const char *g4_st_path(const g4_safetensors *st, const g4_tensor *t);
/* "[a, b]" into buf. */
const char *g4_shape_str(const g4_tensor *t, char *buf, size_t cap);

/* Tells the kernel that a tensor is read at random rows (an embedding table): no readahead and
 * no fault-around, so gathering a row maps only its own pages. */
void g4_st_advise_random(const g4_safetensors *st, const g4_tensor *t);
/* Drops a read-only tensor's pages from this process (they stay in the page cache and come
 * back on the next read): used after validating a large table that is then read sparsely. */
void g4_st_release(const g4_safetensors *st, const g4_tensor *t);
/* The same for the pages that bytes [p, p + len) of one mapped file lie on; bytes outside every
 * mapping are ignored. */
void g4_st_release_bytes(const g4_safetensors *st, const void *p, size_t len);
/* Copies bytes [p, p + len) of a mapped file from the file (pread), leaving its pages out of the
 * process; -1 when they are not in one mapping or the read fails. */
int g4_st_pread(const g4_safetensors *st, const void *p, size_t len, void *out);

/* Little-endian loads that are safe on unaligned data. */
float g4_load_f32(const uint8_t *p);
float g4_bf16_to_f32(uint16_t bits);
float g4_f16_to_f32(uint16_t bits);
/* Element i of a float tensor (F32, BF16 or F16) as f32. */
float g4_tensor_float(const g4_tensor *t, int64_t i);

#endif
