#define _POSIX_C_SOURCE 200809L
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"

int g4_map_file(const char *path, g4_mapped_file *out) {
    out->data = NULL;
    out->size = 0;
    out->fd = -1;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return g4_fail("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return g4_fail("%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return g4_fail("%s: cannot map: %s", path, strerror(errno));
        }
        out->data = p;
        out->size = (size_t)st.st_size;
        out->fd = fd;
        return 0;
    }
    close(fd);
    return 0;
}

int g4_pread_mapped(const g4_mapped_file *f, const void *p, size_t len, void *out) {
    uintptr_t a = (uintptr_t)p, base = (uintptr_t)f->data;
    if (f->fd < 0 || a < base || a - base > f->size || len > f->size - (a - base)) return -1;
    for (size_t done = 0; done < len;) {
        ssize_t r = pread(f->fd, (char *)out + done, len - done, (off_t)(a - base + done));
        if (r <= 0) {
            if (r < 0 && errno == EINTR) continue;
            return -1;
        }
        done += (size_t)r;
    }
    return 0;
}

void g4_unmap_file(g4_mapped_file *f) {
    if (f->data) munmap((void *)f->data, f->size);
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    f->data = NULL;
    f->size = 0;
}

/* "1 GiB", "64 MiB" for whole numbers of those, else the bytes. */
static void size_text(size_t bytes, char *buf, size_t cap) {
    if (bytes >= (1u << 30) && bytes % (1u << 30) == 0) snprintf(buf, cap, "%zu GiB", bytes >> 30);
    else if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) snprintf(buf, cap, "%zu MiB", bytes >> 20);
    else snprintf(buf, cap, "%zu bytes", bytes);
}

static int too_large(const char *path, size_t max) {
    char limit[48];
    size_text(max, limit, sizeof limit);
    return g4_fail("%s: larger than %s, the limit for this file", path, limit);
}

/* Reads fd to its end into *buf, growing it up to max + 1 bytes: one more than max means too
 * large. Returns the bytes read, or -1 with errno. */
static ssize_t read_all(int fd, size_t max, size_t cap, char **buf) {
    size_t len = 0;
    for (;;) {
        if (len == cap) {
            if (cap > max) return (ssize_t)len;
            size_t grow = cap > max / 2 ? max + 1 : cap * 2;
            char *bigger = realloc(*buf, grow + 1);
            if (!bigger) {
                errno = ENOMEM;
                return -1;
            }
            *buf = bigger;
            cap = grow;
        }
        ssize_t got = read(fd, *buf + len, cap - len);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return -1;
        if (got == 0) return (ssize_t)len;
        len += (size_t)got;
    }
}

int g4_read_file_bounded(const char *path, size_t max, unsigned flags, char **out, size_t *size) {
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return g4_fail("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0) rc = g4_fail("%s: cannot read: %s", path, strerror(errno));
    else if (S_ISDIR(st.st_mode)) rc = g4_fail("%s: is a folder, not a file", path);
    else if ((flags & G4_READ_REGULAR) && !S_ISREG(st.st_mode)) rc = g4_fail("%s: not a regular file", path);
    else if (S_ISREG(st.st_mode) && (uintmax_t)st.st_size > max) rc = too_large(path, max);
    if (rc != 0) {
        close(fd);
        return rc;
    }
    /* a regular file's size first (it may still grow), else pieces of 64 KiB upward */
    size_t cap = S_ISREG(st.st_mode) ? (size_t)st.st_size + 1 : (size_t)1 << 16;
    if (cap > max + 1) cap = max + 1;
    char *buf = malloc(cap + 1);
    ssize_t len = buf ? read_all(fd, max, cap, &buf) : (errno = ENOMEM, -1);
    int err = errno;
    close(fd);
    if (len < 0 || (size_t)len > max) {
        free(buf);
        if (len < 0 && err == ENOMEM) return g4_fail("%s: out of memory reading the file", path);
        if (len < 0) return g4_fail("%s: read error: %s", path, strerror(err));
        return too_large(path, max);
    }
    buf[len] = 0;
    *out = buf;
    if (size) *size = (size_t)len;
    return 0;
}

int g4_read_file(const char *path, char **out, size_t *size) {
    return g4_read_file_bounded(path, G4_READ_FILE_MAX, 0, out, size);
}

int g4_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int g4_path_join(char *buf, size_t cap, const char *dir, const char *name) {
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return g4_fail("%s/%s: path too long", dir, name);
    return 0;
}

int g4_copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb");
    if (!in) return g4_fail("%s: cannot open: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wb");
    if (!out) {
        fclose(in);
        return g4_fail("%s: cannot create: %s", dst, strerror(errno));
    }
    char buf[1 << 16];
    size_t n;
    int bad = 0;
    while (!bad && (n = fread(buf, 1, sizeof buf, in)) > 0) bad = fwrite(buf, 1, n, out) != n;
    int rbad = ferror(in);
    fclose(in);
    if (fclose(out) != 0) bad = 1;
    if (rbad) return g4_fail("%s: read error", src);
    if (bad) return g4_fail("%s: write failed", dst);
    return 0;
}

int g4_make_dirs(const char *dir) {
    size_t n = strlen(dir);
    if (!n) return g4_fail("empty output folder name");
    char *p = malloc(n + 1);
    if (!p) return g4_fail("%s: out of memory", dir);
    memcpy(p, dir, n + 1);
    int rc = 0;
    for (size_t i = 1; i <= n && rc == 0; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        char c = p[i];
        p[i] = 0;
        struct stat st;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) rc = g4_fail("%s: cannot create the folder: %s", p, strerror(errno));
        else if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) rc = g4_fail("%s: exists and is not a folder", p);
        p[i] = c;
    }
    free(p);
    return rc;
}

int g4_write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return g4_fail("%s: cannot create: %s", path, strerror(errno));
    size_t n = strlen(text);
    int bad = fwrite(text, 1, n, f) != n || fputc('\n', f) == EOF;
    if (fclose(f) != 0 || bad) return g4_fail("%s: write failed", path);
    return 0;
}
