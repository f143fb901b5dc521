/* NumPy .npy (format 1.0) writer for float32 and int32 arrays, so outside tools can compare. */
#ifndef G4_UTIL_NPY_H
#define G4_UTIL_NPY_H

#include <stdint.h>

int g4_npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape);

#endif
