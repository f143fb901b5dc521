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
/* Bounds on what one whole-file read takes into memory, far above any real file of the kind, so
 * that only a wrong or endless one (/dev/zero, a pipe that never ends) reaches them. */
#define G4_READ_FILE_MAX ((size_t)64 << 20)     /* a checkpoint's JSON and text (tokenizer.json, the largest, is
                                                  * 33 MB), a prompt, an eval data set (GSM8K's test set: 0.7 MB) */
#define G4_RESULTS_FILE_MAX ((size_t)1 << 30)   /* a g4 eval results file (one reply of up to 4096 tokens a line) */
enum { G4_READ_REGULAR = 1u }; /* refuse what is not a regular file (a device, a pipe) */
/* Reads a whole file into a NUL-terminated malloc'd buffer, at most max bytes: a larger regular
 * file is refused before reading, anything else once it has given more; -1 with a message naming
 * the file and the limit. */
int g4_read_file_bounded(const char *path, size_t max, unsigned flags, char **out, size_t *size);
/* g4_read_file_bounded with G4_READ_FILE_MAX and no flags. */
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
