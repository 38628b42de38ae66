#define _GNU_SOURCE
#include <pthread.h>
#include "CConcordRuntime.h"

/* jemalloc reads this symbol once, at its first allocation. A background
 * thread returns dirty pages without stalling the loop or the workers. */
const char *malloc_conf = "background_thread:true,dirty_decay_ms:5000,muzzy_decay_ms:5000";

const char *concord_malloc_conf_in_effect(void) { return malloc_conf; }

/* Names the calling thread (Linux keeps 15 bytes) for top -H, perf and gdb. */
void concord_set_thread_name(const char *name) { (void)pthread_setname_np(pthread_self(), name); }
