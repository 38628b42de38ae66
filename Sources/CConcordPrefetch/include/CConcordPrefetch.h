#ifndef CONCORD_PREFETCH_H
#define CONCORD_PREFETCH_H
/* A hint to bring the cache line holding `p` closer (read, keep in all
 * levels). It never faults: any address may be given. Used by the store's
 * loops over many records (propagation's referrers), whose objects are
 * scattered over the heap: the next ones' lines are asked for while the
 * current one is worked on. */
static inline void concord_prefetch(const void *p) { __builtin_prefetch(p, 0, 3); }
#endif
