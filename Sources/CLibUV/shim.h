#ifndef CONCORD_CLIBUV_SHIM_H
#define CONCORD_CLIBUV_SHIM_H
#include <uv.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/eventfd.h>

/* Swift cannot see uv_buf_init's struct return across all versions cleanly; keep one helper. */
static inline uv_buf_t CLibUV_buf(char *base, size_t len) { return uv_buf_init(base, (unsigned int)len); }

/* The sequencer's wake-ups of the loop (LoopWakeup.swift): Swift's Glibc module has no eventfd. */
static inline int CLibUV_eventfd(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }
#endif
