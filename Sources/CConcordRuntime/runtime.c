#include "CConcordRuntime.h"

/* jemalloc reads this symbol once, at its first allocation. A background
 * thread returns dirty pages without stalling the loop or the workers. */
const char *malloc_conf = "background_thread:true,dirty_decay_ms:5000,muzzy_decay_ms:5000";

const char *concord_malloc_conf_in_effect(void) { return malloc_conf; }
