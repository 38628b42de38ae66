// hiredis (Debian libhiredis-dev 0.14): the async API the cluster link uses.
#include <hiredis/hiredis.h>
#include <hiredis/async.h>
