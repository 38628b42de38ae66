#include "CConcordRedis.h"
#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include <hiredis/adapters/libuv.h>

int concord_redis_attach(void *ac, void *loop) {
    return redisLibuvAttach((redisAsyncContext *)ac, (uv_loop_t *)loop);
}
