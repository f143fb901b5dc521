/* Files: read-only memory maps and whole-file reads, with errors that name the path. */
#ifndef G4_UTIL_FILE_H
#define G4_UTIL_FILE_H

#include <stddef.h>

typedef struct {
    const unsigned char *data; /* NULL for an empty file */
    size_t size;
    int fd; /* the file, kept open for g4_pread_mapped while mapped; -1 when none */
} g4_mapped_file;

int g4_map_file(const char *path, g4_mapped_file *out);
void g4_unmap_file(g4_mapped_file *f);
/* Copies len bytes at p, which lies inside f's mapping, from the file instead of through the
 * mapping: the pages stay out of the process's resident set. 0 on success. */
int g4_pread_mapped(const g4_mapped_file *f, const void *p, size_t len, void *out);
/* Reads a whole file into a NUL-terminated malloc'd buffer. */
int g4_read_file(const char *path, char **out, size_t *size);
int g4_file_exists(const char *path);
/* Copies the file src to dst (created or replaced). */
int g4_copy_file(const char *src, const char *dst);
/* Writes text and a final newline to path (created or replaced); -1 with the reason on failure. */
int g4_write_text(const char *path, const char *text);
/* mkdir -p: creates dir and its missing parents; fails, naming the path, where one is not a folder. */
int g4_make_dirs(const char *dir);
/* dir + "/" + name into buf; fails if it does not fit. */
int g4_path_join(char *buf, size_t cap, const char *dir, const char *name);

#endif
