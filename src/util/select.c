#include "util/select.h"

#include <string.h>

static void swap_bytes(unsigned char *a, unsigned char *b, size_t size) {
    for (size_t i = 0; i < size; i++) {
        unsigned char t = a[i];
        a[i] = b[i];
        b[i] = t;
    }
}

/* Hoare's partition, its scans kept inside [lo, hi] and each round made to shrink the range: with
 * a comparator that is not a total order (NaN keys) the scans would otherwise run off the array
 * and the loop might never end. Such an input then gets some order, never a bad access. */
void g4_select_first(void *base, size_t n, size_t size, size_t k, int (*cmp)(const void *, const void *)) {
    unsigned char *v = base, pivot[64];
    if (n < 2 || k < 1 || k > n || size > sizeof pivot) return;
    long lo = 0, hi = (long)n - 1, want = (long)k - 1;
    while (lo < hi) {
        memcpy(pivot, v + (size_t)(lo + (hi - lo) / 2) * size, size);
        long i = lo, j = hi;
        while (i <= j) {
            while (i < hi && cmp(v + (size_t)i * size, pivot) < 0) i++;
            while (j > lo && cmp(v + (size_t)j * size, pivot) > 0) j--;
            if (i <= j) swap_bytes(v + (size_t)i++ * size, v + (size_t)j-- * size, size);
            else break;
        }
        if (want <= j && j < hi) hi = j;
        else if (want >= i && i > lo) lo = i;
        else break;
    }
}
