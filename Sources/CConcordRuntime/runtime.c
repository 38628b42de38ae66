#define _GNU_SOURCE
#include <pthread.h>
#include <sys/socket.h>
#include "CConcordRuntime.h"

/* jemalloc reads this symbol once, at its first allocation. A background
 * thread returns dirty pages without stalling the loop or the workers. */
const char *malloc_conf = "background_thread:true,dirty_decay_ms:5000,muzzy_decay_ms:5000";

const char *concord_malloc_conf_in_effect(void) { return malloc_conf; }

/* Names the calling thread (Linux keeps 15 bytes) for top -H, perf and gdb. */
void concord_set_thread_name(const char *name) { (void)pthread_setname_np(pthread_self(), name); }

/* The peer of a Unix socket: 0 on success, -1 (errno set) otherwise. */
int concord_peer_credentials(int fd, int *pid, unsigned *uid, unsigned *gid) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -1;
    *pid = cred.pid;
    *uid = cred.uid;
    *gid = cred.gid;
    return 0;
}
