#ifndef CONCORD_CLIBUV_SHIM_H
#define CONCORD_CLIBUV_SHIM_H
#include <uv.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>

/* Swift cannot see uv_buf_init's struct return across all versions cleanly; keep one helper. */
static inline uv_buf_t CLibUV_buf(char *base, size_t len) { return uv_buf_init(base, (unsigned int)len); }
#endif
