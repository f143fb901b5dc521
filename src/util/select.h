/* Partial quickselect over an array of any element type (the sampler's top-k and the lm_head
 * shortcut's k-th largest bound). */
#ifndef G4_UTIL_SELECT_H
#define G4_UTIL_SELECT_H

#include <stddef.h>

/* Reorders base[0, n) (elements of `size` bytes, at most 64) so that its first k (1 <= k <= n)
 * are the k first in cmp's order, not sorted among themselves, with the k-th at index k - 1.
 * cmp should be a total order on the elements; any other comparator (NaN keys) gives some
 * order, but never an access outside base[0, n) nor an endless loop. */
void g4_select_first(void *base, size_t n, size_t size, size_t k, int (*cmp)(const void *, const void *));

#endif
