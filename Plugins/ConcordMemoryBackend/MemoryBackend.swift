public import CConcordBackendABI
import ConcordBackendKit
import ConcordJSON

#if canImport(Glibc)
import Glibc
#endif

/// `memory`: an LRU map bounded by bytes, with an optional age limit.
///
/// Config: `{"max_bytes": 268435456, "ttl_ms": 0}` (0: no age limit).
/// Bytes counted are key + value + a fixed per-entry overhead, so the bound
/// holds for many small records too. Not persistent: a restart starts empty.
final class MemoryBackend {
    final class Entry {
        let key: [UInt8]
        var value: [UInt8]
        var written: Int64
        // `prev` is weak: two strong links would make every pair of
        // neighbours a cycle, and no entry would ever be freed.
        weak var prev: Entry?
        var next: Entry?
        init(key: [UInt8], value: [UInt8], written: Int64) {
            self.key = key
            self.value = value
            self.written = written
        }
        var size: Int { key.count + value.count + MemoryBackend.entryOverhead }
    }

    static let entryOverhead = 96

    let maxBytes: Int
    let ttlMillis: Int64
    var map: [[UInt8]: Entry] = [:]
    // Most recently used at head.
    var head: Entry?
    var tail: Entry?
    var bytes = 0
    var hits = 0
    var misses = 0
    var evictions = 0
    var expirations = 0

    init(maxBytes: Int, ttlMillis: Int64) {
        self.maxBytes = maxBytes
        self.ttlMillis = ttlMillis
    }

    func unlink(_ e: Entry) {
        if let p = e.prev { p.next = e.next } else { head = e.next }
        if let n = e.next { n.prev = e.prev } else { tail = e.prev }
        e.prev = nil
        e.next = nil
    }

    func pushFront(_ e: Entry) {
        e.next = head
        head?.prev = e
        head = e
        if tail == nil { tail = e }
    }

    func remove(_ e: Entry) {
        unlink(e)
        map[e.key] = nil
        bytes -= e.size
    }

    func get(_ key: [UInt8]) -> [UInt8]? {
        guard let e = map[key] else {
            misses += 1
            return nil
        }
        if ttlMillis > 0 && backendNowMillis() - e.written > ttlMillis {
            remove(e)
            expirations += 1
            misses += 1
            return nil
        }
        unlink(e)
        pushFront(e)
        hits += 1
        return e.value
    }

    func put(_ key: [UInt8], _ value: [UInt8]) -> Bool {
        let size = key.count + value.count + Self.entryOverhead
        if maxBytes > 0 && size > maxBytes { return false }
        if let e = map[key] {
            bytes -= e.size
            e.value = value
            e.written = backendNowMillis()
            bytes += e.size
            unlink(e)
            pushFront(e)
        } else {
            let e = Entry(key: key, value: value, written: backendNowMillis())
            map[key] = e
            pushFront(e)
            bytes += e.size
        }
        evictToFit()
        return true
    }

    func evictToFit() {
        guard maxBytes > 0 else { return }
        while bytes > maxBytes, let victim = tail {
            remove(victim)
            evictions += 1
        }
    }

    /// Live records whose key starts with `prefix` (expired ones are dropped on the way).
    func scan(_ prefix: [UInt8], _ each: ([UInt8], [UInt8]) -> Bool) {
        let now = backendNowMillis()
        var expired: [Entry] = []
        for (key, e) in map where key.starts(with: prefix) {
            if ttlMillis > 0 && now - e.written > ttlMillis {
                expired.append(e)
                continue
            }
            if !each(key, e.value) { break }
        }
        for e in expired {
            remove(e)
            expirations += 1
        }
    }

    func delete(_ key: [UInt8]) {
        if let e = map[key] { remove(e) }
    }

    func clear() {
        map = [:]
        head = nil
        tail = nil
        bytes = 0
    }

    var statsJSON: String {
        var o = JSONObject()
        o["backend"] = "memory"
        o["persistent"] = false
        o["bytes"] = .int(bytes)
        o["max_bytes"] = .int(maxBytes)
        o["items"] = .int(map.count)
        o["hits"] = .int(hits)
        o["misses"] = .int(misses)
        o["evictions"] = .int(evictions)
        o["expirations"] = .int(expirations)
        o["ttl_ms"] = .int(Int(ttlMillis))
        return JSON.object(o).compactString
    }
}

private func instance(_ p: OpaquePointer?) -> MemoryBackend {
    Unmanaged<MemoryBackend>.fromOpaque(UnsafeRawPointer(p!)).takeUnretainedValue()
}

private func bytes(_ p: UnsafePointer<UInt8>?, _ n: Int) -> [UInt8] {
    guard let p, n > 0 else { return [] }
    return Array(UnsafeBufferPointer(start: p, count: n))
}

nonisolated(unsafe) private let table: UnsafePointer<concord_backend_api> = BackendKit.makeTable(concord_backend_api(
    abi_version: CONCORD_BACKEND_ABI_VERSION,
    struct_size: UInt32(MemoryLayout<concord_backend_api>.size),
    name: UnsafePointer(strdup("memory")),
    open: { _, config, errorOut in
        do {
            let c = try BackendKit.config(config)
            let maxBytes = try BackendKit.int(c, "max_bytes", 256 << 20)
            let ttl = try BackendKit.int(c, "ttl_ms", 0)
            let b = MemoryBackend(maxBytes: maxBytes, ttlMillis: Int64(ttl))
            return OpaquePointer(Unmanaged.passRetained(b).toOpaque())
        } catch {
            BackendKit.setError(errorOut, "memory backend: \(error)")
            return nil
        }
    },
    get: { b, key, keyLen, value, valueLen, _ in
        guard let v = instance(b).get(bytes(key, keyLen)) else { return Int32(CONCORD_NOT_FOUND.rawValue) }
        let ok = v.withUnsafeBytes { BackendKit.copyOut($0, value, valueLen) }
        return ok ? Int32(CONCORD_OK.rawValue) : Int32(CONCORD_ERR_INTERNAL.rawValue)
    },
    put: { b, key, keyLen, value, valueLen, errorOut in
        if instance(b).put(bytes(key, keyLen), bytes(value, valueLen)) { return Int32(CONCORD_OK.rawValue) }
        BackendKit.setError(errorOut, "value larger than max_bytes")
        return Int32(CONCORD_ERR_FULL.rawValue)
    },
    del: { b, key, keyLen, _ in
        instance(b).delete(bytes(key, keyLen))
        return Int32(CONCORD_OK.rawValue)
    },
    write_batch: { b, writes, count, errorOut in
        let m = instance(b)
        // Atomic: check every put fits before applying anything.
        for i in 0..<count {
            let w = writes![i]
            if w.value != nil && m.maxBytes > 0 && w.key_len + w.value_len + MemoryBackend.entryOverhead > m.maxBytes {
                BackendKit.setError(errorOut, "writes[\(i)]: value larger than max_bytes")
                return Int32(CONCORD_ERR_FULL.rawValue)
            }
        }
        for i in 0..<count {
            let w = writes![i]
            if w.value != nil {
                _ = m.put(bytes(w.key, w.key_len), bytes(w.value, w.value_len))
            } else {
                m.delete(bytes(w.key, w.key_len))
            }
        }
        return Int32(CONCORD_OK.rawValue)
    },
    clear: { b, _ in
        instance(b).clear()
        return Int32(CONCORD_OK.rawValue)
    },
    stats: { b in BackendKit.cString(instance(b).statsJSON) },
    close: { b in Unmanaged<MemoryBackend>.fromOpaque(UnsafeRawPointer(b!)).release() },
    free_buffer: { p in BackendKit.freeBuffer(p) },
    scan: { b, prefix, prefixLen, each, ctx, _ in
        instance(b).scan(bytes(prefix, prefixLen)) { key, value in
            key.withUnsafeBufferPointer { k in
                value.withUnsafeBufferPointer { v in each!(ctx, k.baseAddress, k.count, v.baseAddress, v.count) == 0 }
            }
        }
        return Int32(CONCORD_OK.rawValue)
    }
))

@_cdecl("concord_backend_entry")
public func concordBackendEntry() -> UnsafePointer<concord_backend_api> { table }
