#ifndef CCONCORD_REDIS_H
#define CCONCORD_REDIS_H

/// Attaches an async hiredis context (`redisAsyncContext *`) to a libuv
/// loop (`uv_loop_t *`) with hiredis's own libuv adapter, whose functions
/// are static in its header: compiled here, once. Returns 0 (REDIS_OK) or
/// -1 (REDIS_ERR). Untyped so that Swift sees hiredis's and libuv's types
/// only through their own modules.
int concord_redis_attach(void *ac, void *loop);

#endif
