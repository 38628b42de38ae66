#ifndef CONCORD_RUNTIME_H
#define CONCORD_RUNTIME_H
/* The jemalloc options the server runs with (see docs/ARCHITECTURE.md, "Memory"). */
extern const char *concord_malloc_conf_in_effect(void);
/* Names the calling thread (at most 15 bytes are kept). */
extern void concord_set_thread_name(const char *name);
/* The peer of a Unix socket (SO_PEERCRED): 0 on success, -1 otherwise. */
extern int concord_peer_credentials(int fd, int *pid, unsigned *uid, unsigned *gid);
#endif
