/*
 * concord_backend.h — the cache backend ABI of concord-server.
 *
 * A backend is a shared library exporting one symbol:
 *
 *     const concord_backend_api *concord_backend_entry(void);
 *
 * The table it returns starts with `abi_version` and `struct_size`; the
 * server checks both before calling anything else. Everything crossing the
 * boundary is plain C: byte strings, integers, NUL-terminated UTF-8, and
 * buffers the backend allocates and the server returns through `free_buffer`.
 *
 * Threading: the server calls one instance from one storage thread at a time
 * (never from its event loop), so calls may block on disk. `open` and `close`
 * are called once each.
 *
 * Keys are opaque byte strings (the server uses "e:<id>", "d:<key>",
 * "c:<name>", "s:schema"); values are opaque byte strings (the server stores
 * JSON). See docs/PLUGINS.md.
 */
#ifndef CONCORD_BACKEND_H
#define CONCORD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CONCORD_BACKEND_ABI_VERSION 1u

/* Results of every call but `open`, `stats`, `close`, `free_buffer`. */
typedef enum concord_status {
    CONCORD_OK = 0,
    CONCORD_NOT_FOUND = 1,     /* get: no such key (or expired, or evicted) */
    CONCORD_ERR_INVALID = 2,   /* bad arguments or configuration */
    CONCORD_ERR_IO = 3,        /* the medium failed */
    CONCORD_ERR_CORRUPT = 4,   /* stored data cannot be read */
    CONCORD_ERR_FULL = 5,      /* the value cannot fit even after eviction */
    CONCORD_ERR_INTERNAL = 6
} concord_status;

/* Log levels of the host's logger. */
enum {
    CONCORD_LOG_DEBUG = 0,
    CONCORD_LOG_INFO = 1,
    CONCORD_LOG_WARNING = 2,
    CONCORD_LOG_ERROR = 3
};

/* What the server gives a backend: a logger. Valid until `close` returns. */
typedef struct concord_host {
    uint32_t struct_size;
    void *context;
    void (*log)(void *context, int level, const char *message);
} concord_host;

/* Opaque backend instance. */
typedef struct concord_backend concord_backend;

/* Called by `scan` for each record; a non-zero return stops the scan. The
 * key and value are valid only during the call. */
typedef int (*concord_scan_fn)(void *context, const uint8_t *key, size_t key_len,
                               const uint8_t *value, size_t value_len);

/* One write of a batch: a put, or a delete when `value` is NULL. */
typedef struct concord_write {
    const uint8_t *key;
    size_t key_len;
    const uint8_t *value;
    size_t value_len;
} concord_write;

typedef struct concord_backend_api {
    /* CONCORD_BACKEND_ABI_VERSION the backend was built against. */
    uint32_t abi_version;
    /* sizeof(concord_backend_api) as the backend knows it. */
    uint32_t struct_size;
    /* Short name, e.g. "sqlite". Static storage. */
    const char *name;

    /* Opens an instance from a JSON object (NUL-terminated UTF-8; "{}" for
     * defaults). On failure returns NULL and sets *error to a message the
     * server frees with free_buffer. */
    concord_backend *(*open)(const concord_host *host, const char *config_json, char **error);

    /* Reads a value into a buffer the backend allocates (*value, *value_len);
     * the server frees it with free_buffer. CONCORD_NOT_FOUND when absent. */
    int (*get)(concord_backend *backend, const uint8_t *key, size_t key_len,
               uint8_t **value, size_t *value_len, char **error);

    int (*put)(concord_backend *backend, const uint8_t *key, size_t key_len,
               const uint8_t *value, size_t value_len, char **error);

    /* Deleting a missing key is CONCORD_OK. */
    int (*del)(concord_backend *backend, const uint8_t *key, size_t key_len, char **error);

    /* Applies every write, in order, atomically: all or none. */
    int (*write_batch)(concord_backend *backend, const concord_write *writes, size_t count, char **error);

    /* Removes every key. */
    int (*clear)(concord_backend *backend, char **error);

    /* A JSON object of figures (bytes, items, hits, misses, evictions, ...),
     * freed with free_buffer; NULL if none. */
    char *(*stats)(concord_backend *backend);

    /* Flushes and releases the instance. */
    void (*close)(concord_backend *backend);

    /* Frees a buffer or message the backend handed out. */
    void (*free_buffer)(void *buffer);

    /* Optional (added in ABI 1 at the end of the table: present when
     * `struct_size` covers it and it is not NULL). Calls `each` for every
     * live record whose key starts with `prefix`, in any order. The server
     * uses it to list the entities of a type ("e:Post:") the first time a
     * live query over that type is asked for. Without it, queries see only
     * what is in memory. */
    int (*scan)(concord_backend *backend, const uint8_t *prefix, size_t prefix_len,
                concord_scan_fn each, void *context, char **error);
} concord_backend_api;

/* The one exported symbol. */
typedef const concord_backend_api *(*concord_backend_entry_fn)(void);
#define CONCORD_BACKEND_ENTRY_SYMBOL "concord_backend_entry"

#ifdef __cplusplus
}
#endif
#endif
