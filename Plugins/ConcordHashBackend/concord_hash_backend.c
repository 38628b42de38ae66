/*
 * hash: an unbounded in-memory hash table written in plain C against
 * concord_backend.h — the proof that the ABI is language-neutral.
 * Not persistent. Config: {} (no options).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "concord_backend.h"

typedef struct entry {
    struct entry *next;
    uint64_t hash;
    size_t key_len, value_len;
    uint8_t *key, *value;
} entry;

struct concord_backend {
    entry **buckets;
    size_t nbuckets, count, bytes;
    uint64_t hits, misses;
};

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ull; }
    return h;
}

static char *dup_message(const char *m) {
    size_t n = strlen(m) + 1;
    char *s = malloc(n);
    if (s) memcpy(s, m, n);
    return s;
}

static concord_backend *hb_open(const concord_host *host, const char *config, char **error) {
    (void)host; (void)config;
    concord_backend *b = calloc(1, sizeof *b);
    if (!b) { if (error) *error = dup_message("out of memory"); return NULL; }
    b->nbuckets = 1024;
    b->buckets = calloc(b->nbuckets, sizeof(entry *));
    if (!b->buckets) { free(b); if (error) *error = dup_message("out of memory"); return NULL; }
    return b;
}

static entry **find(concord_backend *b, const uint8_t *key, size_t n, uint64_t h) {
    entry **p = &b->buckets[h & (b->nbuckets - 1)];
    while (*p && !((*p)->hash == h && (*p)->key_len == n && memcmp((*p)->key, key, n) == 0)) p = &(*p)->next;
    return p;
}

static void grow(concord_backend *b) {
    size_t nb = b->nbuckets * 2;
    entry **buckets = calloc(nb, sizeof(entry *));
    if (!buckets) return; /* keep the old table; lookups still work */
    for (size_t i = 0; i < b->nbuckets; i++) {
        entry *e = b->buckets[i];
        while (e) {
            entry *next = e->next;
            e->next = buckets[e->hash & (nb - 1)];
            buckets[e->hash & (nb - 1)] = e;
            e = next;
        }
    }
    free(b->buckets);
    b->buckets = buckets;
    b->nbuckets = nb;
}

static int hb_get(concord_backend *b, const uint8_t *key, size_t n, uint8_t **value, size_t *len, char **error) {
    entry *e = *find(b, key, n, fnv1a(key, n));
    if (!e) { b->misses++; return CONCORD_NOT_FOUND; }
    uint8_t *copy = malloc(e->value_len ? e->value_len : 1);
    if (!copy) { if (error) *error = dup_message("out of memory"); return CONCORD_ERR_INTERNAL; }
    memcpy(copy, e->value, e->value_len);
    *value = copy;
    *len = e->value_len;
    b->hits++;
    return CONCORD_OK;
}

static int hb_put(concord_backend *b, const uint8_t *key, size_t n, const uint8_t *value, size_t len, char **error) {
    uint64_t h = fnv1a(key, n);
    entry **p = find(b, key, n, h);
    uint8_t *v = malloc(len ? len : 1);
    if (!v) { if (error) *error = dup_message("out of memory"); return CONCORD_ERR_INTERNAL; }
    memcpy(v, value, len);
    if (*p) {
        b->bytes -= (*p)->value_len;
        free((*p)->value);
        (*p)->value = v;
        (*p)->value_len = len;
        b->bytes += len;
        return CONCORD_OK;
    }
    entry *e = malloc(sizeof *e);
    uint8_t *k = malloc(n ? n : 1);
    if (!e || !k) { free(e); free(k); free(v); if (error) *error = dup_message("out of memory"); return CONCORD_ERR_INTERNAL; }
    memcpy(k, key, n);
    *e = (entry){ .next = NULL, .hash = h, .key_len = n, .value_len = len, .key = k, .value = v };
    *p = e;
    b->count++;
    b->bytes += n + len;
    if (b->count > b->nbuckets * 3 / 4) grow(b);
    return CONCORD_OK;
}

static int hb_del(concord_backend *b, const uint8_t *key, size_t n, char **error) {
    (void)error;
    entry **p = find(b, key, n, fnv1a(key, n));
    entry *e = *p;
    if (!e) return CONCORD_OK;
    *p = e->next;
    b->count--;
    b->bytes -= e->key_len + e->value_len;
    free(e->key); free(e->value); free(e);
    return CONCORD_OK;
}

/* Writes as it goes. Puts fail only when memory runs out, and then the batch
 * is NOT all-or-none as the ABI asks: the earlier writes stay. The host keeps
 * a failed batch pending and retries it whole, and every write in it is the
 * latest value of its key, so a replay converges; still a known deviation. */
static int hb_write_batch(concord_backend *b, const concord_write *w, size_t count, char **error) {
    for (size_t i = 0; i < count; i++) {
        int rc = w[i].value ? hb_put(b, w[i].key, w[i].key_len, w[i].value, w[i].value_len, error)
                            : hb_del(b, w[i].key, w[i].key_len, error);
        if (rc != CONCORD_OK) return rc; /* only on out-of-memory, when nothing can be promised */
    }
    return CONCORD_OK;
}

static int hb_clear(concord_backend *b, char **error) {
    (void)error;
    for (size_t i = 0; i < b->nbuckets; i++) {
        entry *e = b->buckets[i];
        while (e) { entry *next = e->next; free(e->key); free(e->value); free(e); e = next; }
        b->buckets[i] = NULL;
    }
    b->count = 0;
    b->bytes = 0;
    return CONCORD_OK;
}

static char *hb_stats(concord_backend *b) {
    char buf[256];
    snprintf(buf, sizeof buf, "{\"backend\":\"hash\",\"persistent\":false,\"items\":%zu,\"bytes\":%zu,\"hits\":%llu,\"misses\":%llu,\"evictions\":0}",
             b->count, b->bytes, (unsigned long long)b->hits, (unsigned long long)b->misses);
    return dup_message(buf);
}

static void hb_close(concord_backend *b) {
    hb_clear(b, NULL);
    free(b->buckets);
    free(b);
}

static void hb_free(void *p) { free(p); }

/* Every entry whose key starts with `prefix`: a walk of the whole table. */
static int hb_scan(concord_backend *b, const uint8_t *prefix, size_t prefix_len,
                   concord_scan_fn each, void *context, char **error) {
    (void)error;
    for (size_t i = 0; i < b->nbuckets; i++) {
        for (entry *e = b->buckets[i]; e; e = e->next) {
            if (e->key_len < prefix_len || (prefix_len && memcmp(e->key, prefix, prefix_len) != 0)) continue;
            if (each(context, e->key, e->key_len, e->value, e->value_len) != 0) return CONCORD_OK;
        }
    }
    return CONCORD_OK;
}

static const concord_backend_api api = {
    .abi_version = CONCORD_BACKEND_ABI_VERSION,
    .struct_size = sizeof(concord_backend_api),
    .name = "hash",
    .open = hb_open,
    .get = hb_get,
    .put = hb_put,
    .del = hb_del,
    .write_batch = hb_write_batch,
    .clear = hb_clear,
    .stats = hb_stats,
    .close = hb_close,
    .free_buffer = hb_free,
    .scan = hb_scan,
};

const concord_backend_api *concord_backend_entry(void) { return &api; }
