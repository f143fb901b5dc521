/* Shared helpers for the libFuzzer targets in fuzz/ (see fuzz/README.md).
 *
 * Inputs that the library reads by path are handed over as memfd files ("/proc/self/fd/N"):
 * nothing touches the disk per input. Directories the library wants (checkpoint folders) are
 * made once per process under /tmp and hold symlinks to such memfds; they are removed at
 * exit. Every check failure aborts, which libFuzzer reports as a crash with the input. */
#ifndef G4_FUZZ_COMMON_H
#define G4_FUZZ_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "g4.h" /* g4_set_log: each target silences the library's warnings */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A property of the library did not hold: print and abort (libFuzzer saves the input). */
#define FZ_CHECK(cond, ...)                                                                 \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "\nFZ_CHECK failed at %s:%d: %s\n  ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fputc('\n', stderr);                                                            \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

/* Set-up failure (not a finding): the environment is broken, stop loudly. */
static inline void fz_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz set-up: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

/* Known, reported library bugs can be skipped while they are open, so that fuzzing gets past
 * them: G4_FUZZ_IGNORE="name1,name2" (names are listed in fuzz/README.md). Off by default:
 * an open bug makes the target fail at once, as it should. */
static inline int fz_ignored(const char *name) {
    const char *e = getenv("G4_FUZZ_IGNORE");
    size_t n = strlen(name);
    for (const char *p = e; p && *p;) {
        const char *c = strchr(p, ',');
        size_t k = c ? (size_t)(c - p) : strlen(p);
        if (k == n && memcmp(p, name, n) == 0) return 1;
        p = c ? c + 1 : NULL;
    }
    return 0;
}

typedef struct {
    int fd;
    char path[64]; /* "/proc/self/fd/N": opening it gives the memfd's contents */
} fz_memfile;

static inline void fz_memfile_open(fz_memfile *m, const char *name) {
    m->fd = memfd_create(name, MFD_CLOEXEC);
    if (m->fd < 0) fz_die("memfd_create(%s): %s", name, strerror(errno));
    snprintf(m->path, sizeof m->path, "/proc/self/fd/%d", m->fd);
}

/* Replaces the file's contents with data[0, n). */
static inline void fz_memfile_set(fz_memfile *m, const void *data, size_t n) {
    if (ftruncate(m->fd, 0) != 0) fz_die("ftruncate: %s", strerror(errno));
    const char *p = data;
    size_t done = 0;
    while (done < n) {
        ssize_t w = pwrite(m->fd, p + done, n - done, (off_t)done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) fz_die("pwrite: %s", strerror(errno));
        done += (size_t)w;
    }
}

/* ---------------------------------------------------------------- scratch dirs in /tmp */

#define FZ_MAX_LINKS 8
static char fz_dir_path[128];
static char fz_dir_links[FZ_MAX_LINKS][192];
static int fz_dir_n_links;
static char fz_dir_subdirs[FZ_MAX_LINKS][192];
static int fz_dir_n_subdirs;

static inline void fz_dir_cleanup(void) {
    for (int i = 0; i < fz_dir_n_links; i++) unlink(fz_dir_links[i]);
    for (int i = fz_dir_n_subdirs - 1; i >= 0; i--) rmdir(fz_dir_subdirs[i]);
    if (fz_dir_path[0]) rmdir(fz_dir_path);
}

/* Removes dir's entries (symlinks, files, and one level of subfolders) and dir itself. */
static inline void fz_rm_shallow(const char *dir, int depth) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0 && depth > 0) fz_rm_shallow(path, depth - 1);
    }
    closedir(d);
    rmdir(dir);
}

/* A process that crashed (abort, sanitizer report) leaves its folder behind: folders of
 * this tag whose process is gone are removed. */
static inline void fz_dir_reap(const char *tag) {
    char prefix[64];
    int pn = snprintf(prefix, sizeof prefix, "g4fuzz-%s-", tag);
    DIR *d = opendir("/tmp");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, (size_t)pn) != 0) continue;
        char *end;
        long pid = strtol(e->d_name + pn, &end, 10);
        if (*end || pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno == ESRCH)) {
            char path[300];
            snprintf(path, sizeof path, "/tmp/%s", e->d_name);
            if (pid > 0 && !*end) fz_rm_shallow(path, 1);
        }
    }
    closedir(d);
}

/* Makes /tmp/g4fuzz-<tag>-<pid> (once per process). */
static inline const char *fz_dir_make(const char *tag) {
    fz_dir_reap(tag);
    snprintf(fz_dir_path, sizeof fz_dir_path, "/tmp/g4fuzz-%s-%ld", tag, (long)getpid());
    if (mkdir(fz_dir_path, 0700) != 0 && errno != EEXIST) fz_die("mkdir %s: %s", fz_dir_path, strerror(errno));
    atexit(fz_dir_cleanup);
    return fz_dir_path;
}

/* Makes dir/name (removed at exit) and returns its path. */
static inline const char *fz_dir_subdir(const char *name) {
    if (fz_dir_n_subdirs == FZ_MAX_LINKS) fz_die("too many subdirs");
    char *d = fz_dir_subdirs[fz_dir_n_subdirs++];
    snprintf(d, sizeof fz_dir_subdirs[0], "%s/%s", fz_dir_path, name);
    if (mkdir(d, 0700) != 0 && errno != EEXIST) fz_die("mkdir %s: %s", d, strerror(errno));
    return d;
}

/* dir/name -> the memfile (a symlink, so the library opens the memfd's contents). */
static inline void fz_dir_link(const char *name, const fz_memfile *m) {
    if (fz_dir_n_links == FZ_MAX_LINKS) fz_die("too many links");
    char *link = fz_dir_links[fz_dir_n_links++];
    snprintf(link, sizeof fz_dir_links[0], "%s/%s", fz_dir_path, name);
    unlink(link);
    if (symlink(m->path, link) != 0) fz_die("symlink %s: %s", link, strerror(errno));
}

/* ---------------------------------------------------------------- shared/ data */

/* $G4_SHARED/rel, else ../shared/rel (repo root) or ../../shared/rel (fuzz/), the first that
 * exists. Aborts the run when none does: these targets need the real Gemma 4 tokenizer. */
static inline const char *fz_shared_file(const char *rel) {
    static char buf[4096];
    const char *env = getenv("G4_SHARED");
    const char *roots[3] = {env && *env ? env : NULL, "../shared", "../../shared"};
    for (int i = 0; i < 3; i++) {
        if (!roots[i]) continue;
        snprintf(buf, sizeof buf, "%s/%s", roots[i], rel);
        struct stat st;
        if (stat(buf, &st) == 0) return buf;
    }
    fz_die("cannot find shared/%s (set G4_SHARED to the shared directory)", rel);
    return NULL;
}

/* ---------------------------------------------------------------- the Gemma 4 tokenizer */

/* Loads shared/data/tokenizers/gemma4/tokenizer.json. Parsing its 14 MB of JSON takes ~5 s
 * under ASan, so by default it is opened through a symlink in /tmp/g4fuzz-tokcache-<uid>/,
 * where the library keeps its binary cache (shared/ is read-only, and nothing is written
 * outside /tmp); later runs map the cache. G4_FUZZ_NO_TOKCACHE=1 parses the JSON every time. */
static inline g4_tokenizer *fz_load_gemma_tokenizer(void) {
    const char *src = fz_shared_file("data/tokenizers/gemma4/tokenizer.json");
    const char *nc = getenv("G4_FUZZ_NO_TOKCACHE");
    if (nc && *nc && *nc != '0') {
        g4_tokenizer *t = g4_tokenizer_load_ex(src, G4_TOKENIZER_NO_CACHE);
        if (!t) fz_die("cannot load %s: %s", src, g4_last_error());
        return t;
    }
    char abs_src[4096], dir[128], link[256];
    if (!realpath(src, abs_src)) fz_die("realpath %s: %s", src, strerror(errno));
    snprintf(dir, sizeof dir, "/tmp/g4fuzz-tokcache-%ld", (long)getuid());
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) fz_die("mkdir %s: %s", dir, strerror(errno));
    snprintf(link, sizeof link, "%s/tokenizer.json", dir);
    char cur[4096];
    ssize_t k = readlink(link, cur, sizeof cur - 1);
    if (k < 0 || (size_t)k != strlen(abs_src) || memcmp(cur, abs_src, (size_t)k) != 0) {
        char tmp[300];
        snprintf(tmp, sizeof tmp, "%s.%ld", link, (long)getpid());
        unlink(tmp);
        if (symlink(abs_src, tmp) != 0 || rename(tmp, link) != 0) fz_die("symlink %s: %s", link, strerror(errno));
    }
    g4_tokenizer *t = g4_tokenizer_load(link);
    if (!t) fz_die("cannot load %s: %s", link, g4_last_error());
    return t;
}

/* ---------------------------------------------------------------- UTF-8 oracle */

/* Independent WHATWG UTF-8 decoder: a valid sequence is copied, each maximal invalid subpart
 * becomes U+FFFD. Returns a malloc'd buffer (NUL-terminated) and its length. */
static inline char *fz_utf8_replace(const uint8_t *s, size_t n, size_t *out_n) {
    char *out = malloc(3 * n + 1);
    if (!out) abort();
    size_t w = 0, i = 0;
    while (i < n) {
        uint8_t b = s[i];
        int need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b < 0x80) {
            out[w++] = (char)b;
            i++;
            continue;
        } else if (b >= 0xC2 && b <= 0xDF) {
            need = 1;
        } else if (b >= 0xE0 && b <= 0xEF) {
            need = 2;
            if (b == 0xE0) lo = 0xA0;
            if (b == 0xED) hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 3;
            if (b == 0xF0) lo = 0x90;
            if (b == 0xF4) hi = 0x8F;
        } else {
            memcpy(out + w, "\xEF\xBF\xBD", 3), w += 3, i++;
            continue;
        }
        size_t j = i + 1;
        int got = 0;
        while (got < need && j < n && s[j] >= lo && s[j] <= hi) j++, got++, lo = 0x80, hi = 0xBF;
        if (got == need) {
            memcpy(out + w, s + i, j - i), w += j - i;
        } else {
            memcpy(out + w, "\xEF\xBF\xBD", 3), w += 3;
        }
        i = j;
    }
    out[w] = 0;
    *out_n = w;
    return out;
}

static inline int fz_utf8_valid(const void *p, size_t n) {
    size_t m;
    char *r = fz_utf8_replace(p, n, &m);
    int same = m == n && memcmp(r, p, n) == 0;
    free(r);
    return same;
}

/* Splits data[0, size) at NUL bytes into at most max parts, each copied into a NUL-terminated
 * malloc'd string (the last part takes the rest, NULs included). Returns the count. */
static inline int fz_split_nul(const uint8_t *data, size_t size, char **parts, size_t *lens, int max) {
    int n = 0;
    size_t start = 0;
    while (n < max) {
        const uint8_t *z = n + 1 < max ? memchr(data + start, 0, size - start) : NULL;
        size_t end = z ? (size_t)(z - data) : size;
        parts[n] = malloc(end - start + 1);
        if (!parts[n]) abort();
        memcpy(parts[n], data + start, end - start);
        parts[n][end - start] = 0;
        lens[n] = end - start;
        n++;
        if (!z) break;
        start = end + 1;
    }
    return n;
}

#endif
