#ifndef CONCORD_CJEMALLOC_SHIM_H
#define CONCORD_CJEMALLOC_SHIM_H
#include <stddef.h>
#include <stdint.h>
#include <jemalloc/jemalloc.h>

/* Reads a size_t statistic ("stats.allocated", ...) after refreshing the epoch when asked. */
static inline int CJemalloc_read_size(const char *name, size_t *out) {
    size_t len = sizeof(size_t);
    return mallctl(name, out, &len, NULL, 0);
}
static inline int CJemalloc_refresh(void) {
    uint64_t epoch = 1;
    size_t len = sizeof(epoch);
    return mallctl("epoch", &epoch, &len, &epoch, len);
}
static inline int CJemalloc_read_unsigned(const char *name, unsigned *out) {
    size_t len = sizeof(unsigned);
    return mallctl(name, out, &len, NULL, 0);
}
static inline int CJemalloc_read_bool(const char *name, _Bool *out) {
    size_t len = sizeof(_Bool);
    return mallctl(name, out, &len, NULL, 0);
}
#endif
