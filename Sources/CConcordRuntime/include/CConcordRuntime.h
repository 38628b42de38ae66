#ifndef CONCORD_RUNTIME_H
#define CONCORD_RUNTIME_H
/* The jemalloc options the server runs with (see docs/ARCHITECTURE.md, "Memory"). */
extern const char *concord_malloc_conf_in_effect(void);
/* Names the calling thread (at most 15 bytes are kept). */
extern void concord_set_thread_name(const char *name);
/* The peer of a Unix socket (SO_PEERCRED): 0 on success, -1 otherwise. */
extern int concord_peer_credentials(int fd, int *pid, unsigned *uid, unsigned *gid);
/* A futex word: `concord_park` sleeps while *word == expected (or until
 * timeout_ns, when >= 0, has passed); `concord_unpark` advances the word
 * and wakes one sleeper. No system call when the word already moved. */
#include <stdint.h>
extern uint32_t concord_park_word(uint32_t *word);
extern void concord_park(uint32_t *word, uint32_t expected, int64_t timeout_ns);
extern void concord_unpark(uint32_t *word);
#endif
