#include "npy.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "util/err.h"

int g4_npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape) {
    char dict[256], shp[160] = "";
    size_t len = 0;
    int64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        len += (size_t)snprintf(shp + len, sizeof shp - len, "%lld,%s", (long long)shape[i], ndim > 1 && i < ndim - 1 ? " " : "");
        count *= shape[i];
    }
    if (ndim > 1) shp[strlen(shp) - 1] = 0; /* "(a, b)" has no trailing comma; "(a,)" keeps it */
    int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", shp);
    /* magic(6) + version(2) + header length(2) + dict padded with spaces to a multiple of 64, ending in \n */
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    uint16_t hlen = (uint16_t)(n + 1 + pad);
    FILE *f = fopen(path, "wb");
    if (!f) return g4_fail("%s: cannot create: %s", path, strerror(errno));
    unsigned char head[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 255), (unsigned char)(hlen >> 8)};
    fwrite(head, 1, 10, f);
    fwrite(dict, 1, (size_t)n, f);
    for (size_t i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    fwrite(data, sizeof(float), (size_t)count, f); /* little-endian hosts only (x86-64, aarch64) */
    if (fclose(f) != 0) return g4_fail("%s: write error", path);
    return 0;
}
