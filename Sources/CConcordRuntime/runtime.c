#define _GNU_SOURCE
#include <pthread.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>
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

/* A sleep on a futex word (the sequencer's, in place of a condition
 * variable: glibc's pthread_cond_wait takes the mutex back marked
 * contended, so the unlock after every wake-up made a futex call that woke
 * nobody). The word is an epoch: a waker advances it before the wake, so a
 * sleeper that read it before going to sleep does not sleep through it. */
uint32_t concord_park_word(uint32_t *word) {
    return atomic_load_explicit((_Atomic uint32_t *)word, memory_order_acquire);
}

void concord_park(uint32_t *word, uint32_t expected, int64_t timeout_ns) {
    struct timespec ts, *t = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = timeout_ns / 1000000000;
        ts.tv_nsec = timeout_ns % 1000000000;
        t = &ts;
    }
    /* EAGAIN (the word moved), EINTR and ETIMEDOUT all return: the caller looks again. */
    (void)syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, t, NULL, 0);
}

void concord_unpark(uint32_t *word) {
    atomic_fetch_add_explicit((_Atomic uint32_t *)word, 1, memory_order_release);
    (void)syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
