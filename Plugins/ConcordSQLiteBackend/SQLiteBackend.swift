public import CConcordBackendABI
import CSQLite
import ConcordBackendKit
import ConcordJSON

#if canImport(Glibc)
import Glibc
#endif

/// `sqlite`: one file, WAL, prepared statements, bounded by bytes with LRU
/// eviction, optional age limit.
///
/// Config: `{"path": "concord.sqlite", "max_bytes": 52428800, "ttl_ms": 0}`.
/// A committed write survives kill -9 (WAL with synchronous=NORMAL loses
/// nothing on a process crash; only an OS crash may lose the last commits).
/// A file that is not a database or is corrupt is moved aside
/// (`<path>.corrupt-<unix time>`) and a fresh one is started, with one log line.
final class SQLiteBackend {
    static let rowOverhead = 64

    let path: String
    let maxBytes: Int
    let ttlMillis: Int64
    let host: UnsafePointer<concord_host>?
    var db: OpaquePointer?
    var statements: [String: OpaquePointer] = [:]
    var totalBytes = 0
    var items = 0
    var hits = 0
    var misses = 0
    var evictions = 0

    struct SQLError: Error, CustomStringConvertible {
        let code: Int32
        let message: String
        var description: String { message }
        var isCorruption: Bool { code == SQLITE_CORRUPT || code == SQLITE_NOTADB }
    }

    /// Testing aid (`"fault_file"` in the configuration): while this file
    /// exists every write fails with an I/O error, as on a full disk.
    var faultFile: String?

    func checkFault() throws(SQLError) {
        if let f = faultFile, access(f, F_OK) == 0 {
            throw SQLError(code: SQLITE_IOERR, message: "fault injected (\(f) exists)")
        }
    }

    init(path: String, maxBytes: Int, ttlMillis: Int64, host: UnsafePointer<concord_host>?) {
        self.path = path
        self.maxBytes = maxBytes
        self.ttlMillis = ttlMillis
        self.host = host
    }

    func open() throws(SQLError) {
        do {
            try openAndPrepare()
        } catch let e where e.isCorruption {
            closeDB()
            let aside = "\(path).corrupt-\(time(nil))"
            rename(path, aside)
            unlink(path + "-wal")
            unlink(path + "-shm")
            BackendKit.log(host, Int32(CONCORD_LOG_WARNING), "sqlite cache \(path) is unreadable (\(e.message)); moved it to \(aside) and started an empty cache")
            try openAndPrepare()
        }
    }

    private func openAndPrepare() throws(SQLError) {
        var handle: OpaquePointer?
        let rc = sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nil)
        db = handle
        guard rc == SQLITE_OK else { throw error(rc, "cannot open \(path)") }
        sqlite3_busy_timeout(db, 5000)
        try exec("PRAGMA journal_mode=WAL")
        try exec("PRAGMA synchronous=NORMAL")
        try exec("""
            CREATE TABLE IF NOT EXISTS records(
                key BLOB PRIMARY KEY, value BLOB NOT NULL,
                size INTEGER NOT NULL, atime INTEGER NOT NULL, wtime INTEGER NOT NULL) WITHOUT ROWID
            """)
        try exec("CREATE INDEX IF NOT EXISTS records_atime ON records(atime)")
        let check = try prepare("PRAGMA quick_check")
        var rc2 = sqlite3_step(check)
        if rc2 == SQLITE_ROW, let text = sqlite3_column_text(check, 0), String(cString: text) != "ok" {
            let msg = String(cString: text)
            sqlite3_reset(check)
            throw SQLError(code: SQLITE_CORRUPT, message: "integrity check failed: \(msg)")
        }
        sqlite3_reset(check)
        let sum = try prepare("SELECT COALESCE(SUM(size),0), COUNT(*) FROM records")
        rc2 = sqlite3_step(sum)
        guard rc2 == SQLITE_ROW else { throw error(rc2, "cannot read sizes") }
        totalBytes = Int(sqlite3_column_int64(sum, 0))
        items = Int(sqlite3_column_int64(sum, 1))
        sqlite3_reset(sum)
    }

    func closeDB() {
        for s in statements.values { sqlite3_finalize(s) }
        statements = [:]
        if let db { sqlite3_close_v2(db) }
        db = nil
    }

    func error(_ rc: Int32, _ what: String) -> SQLError {
        let msg = db.flatMap { sqlite3_errmsg($0) }.map { String(cString: $0) } ?? String(cString: sqlite3_errstr(rc))
        return SQLError(code: rc, message: "\(what): \(msg)")
    }

    func exec(_ sql: String) throws(SQLError) {
        let rc = sqlite3_exec(db, sql, nil, nil, nil)
        guard rc == SQLITE_OK else { throw error(rc, "sqlite") }
    }

    func prepare(_ sql: String) throws(SQLError) -> OpaquePointer {
        if let s = statements[sql] { return s }
        var s: OpaquePointer?
        let rc = sqlite3_prepare_v3(db, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &s, nil)
        guard rc == SQLITE_OK, let s else { throw error(rc, "prepare") }
        statements[sql] = s
        return s
    }

    func now() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
    }

    func bindKey(_ s: OpaquePointer, _ index: Int32, _ key: UnsafeRawBufferPointer) {
        sqlite3_bind_blob(s, index, key.baseAddress, Int32(key.count), CSQLite_transient())
    }

    /// The value, or nil when absent or expired.
    func get(_ key: UnsafeRawBufferPointer, _ body: (UnsafeRawBufferPointer) -> Void) throws(SQLError) -> Bool {
        let s = try prepare("SELECT value, wtime, atime FROM records WHERE key = ?1")
        defer { sqlite3_reset(s) }
        bindKey(s, 1, key)
        let rc = sqlite3_step(s)
        if rc == SQLITE_DONE {
            misses += 1
            return false
        }
        guard rc == SQLITE_ROW else { throw error(rc, "get") }
        let t = now()
        if ttlMillis > 0 && t - sqlite3_column_int64(s, 1) > ttlMillis {
            sqlite3_reset(s)
            try delete(key)
            misses += 1
            return false
        }
        let n = Int(sqlite3_column_bytes(s, 0))
        body(UnsafeRawBufferPointer(start: sqlite3_column_blob(s, 0), count: n))
        let atime = sqlite3_column_int64(s, 2)
        sqlite3_reset(s)
        hits += 1
        // Recency for LRU, at most once a second per record.
        if maxBytes > 0 && t - atime > 1000 {
            let u = try prepare("UPDATE records SET atime = ?2 WHERE key = ?1")
            bindKey(u, 1, key)
            sqlite3_bind_int64(u, 2, t)
            let urc = sqlite3_step(u)
            sqlite3_reset(u)
            guard urc == SQLITE_DONE else { throw error(urc, "touch") }
        }
        return true
    }

    /// Live records whose key starts with `prefix`, in key order (a range scan
    /// of the primary key: keys compare as bytes). Expired ones are skipped.
    func scan(_ prefix: UnsafeRawBufferPointer, _ each: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) -> Bool) throws(SQLError) {
        // The first key after every key with this prefix: the prefix with its last byte raised.
        var upper = Array(prefix)
        while let last = upper.last, last == 0xFF { upper.removeLast() }
        if !upper.isEmpty { upper[upper.count - 1] += 1 }
        let s = try prepare(upper.isEmpty ? "SELECT key, value, wtime FROM records WHERE key >= ?1"
                                          : "SELECT key, value, wtime FROM records WHERE key >= ?1 AND key < ?2")
        defer { sqlite3_reset(s) }
        bindKey(s, 1, prefix)
        if !upper.isEmpty { upper.withUnsafeBytes { bindKey(s, 2, $0) } }
        let t = now()
        while true {
            let rc = sqlite3_step(s)
            if rc == SQLITE_DONE { return }
            guard rc == SQLITE_ROW else { throw error(rc, "scan") }
            if ttlMillis > 0 && t - sqlite3_column_int64(s, 2) > ttlMillis { continue }
            let key = UnsafeRawBufferPointer(start: sqlite3_column_blob(s, 0), count: Int(sqlite3_column_bytes(s, 0)))
            let value = UnsafeRawBufferPointer(start: sqlite3_column_blob(s, 1), count: Int(sqlite3_column_bytes(s, 1)))
            if !each(key, value) { return }
        }
    }

    private func sizeOf(_ key: UnsafeRawBufferPointer) throws(SQLError) -> Int? {
        let s = try prepare("SELECT size FROM records WHERE key = ?1")
        defer { sqlite3_reset(s) }
        bindKey(s, 1, key)
        let rc = sqlite3_step(s)
        if rc == SQLITE_DONE { return nil }
        guard rc == SQLITE_ROW else { throw error(rc, "size") }
        return Int(sqlite3_column_int64(s, 0))
    }

    /// One put inside the caller's transaction.
    func putRow(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) throws(SQLError) {
        let size = key.count + value.count + Self.rowOverhead
        let old = try sizeOf(key)
        let s = try prepare("INSERT OR REPLACE INTO records(key, value, size, atime, wtime) VALUES (?1, ?2, ?3, ?4, ?4)")
        defer { sqlite3_reset(s) }
        bindKey(s, 1, key)
        sqlite3_bind_blob(s, 2, value.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32(value.count), CSQLite_transient())
        sqlite3_bind_int64(s, 3, Int64(size))
        sqlite3_bind_int64(s, 4, now())
        let rc = sqlite3_step(s)
        guard rc == SQLITE_DONE else { throw error(rc, "put") }
        totalBytes += size - (old ?? 0)
        if old == nil { items += 1 }
    }

    func deleteRow(_ key: UnsafeRawBufferPointer) throws(SQLError) {
        guard let old = try sizeOf(key) else { return }
        let s = try prepare("DELETE FROM records WHERE key = ?1")
        defer { sqlite3_reset(s) }
        bindKey(s, 1, key)
        let rc = sqlite3_step(s)
        guard rc == SQLITE_DONE else { throw error(rc, "delete") }
        totalBytes -= old
        items -= 1
    }

    /// Drops least recently used rows until the file's records fit.
    func evict() throws(SQLError) {
        guard maxBytes > 0 else { return }
        let s = try prepare("DELETE FROM records WHERE key IN (SELECT key FROM records ORDER BY atime LIMIT 256) RETURNING size")
        while totalBytes > maxBytes && items > 0 {
            var freed = 0
            var rc = sqlite3_step(s)
            while rc == SQLITE_ROW {
                totalBytes -= Int(sqlite3_column_int64(s, 0))
                items -= 1
                evictions += 1
                freed += 1
                rc = sqlite3_step(s)
            }
            sqlite3_reset(s)
            guard rc == SQLITE_DONE else { throw error(rc, "evict") }
            if freed == 0 { break }
        }
    }

    func transaction(_ body: () throws(SQLError) -> Void) throws(SQLError) {
        try exec("BEGIN IMMEDIATE")
        do {
            try body()
            try evict()
            try exec("COMMIT")
        } catch {
            _ = sqlite3_exec(db, "ROLLBACK", nil, nil, nil)
            recount()
            throw error
        }
    }

    func recount() {
        if let s = try? prepare("SELECT COALESCE(SUM(size),0), COUNT(*) FROM records"), sqlite3_step(s) == SQLITE_ROW {
            totalBytes = Int(sqlite3_column_int64(s, 0))
            items = Int(sqlite3_column_int64(s, 1))
            sqlite3_reset(s)
        }
    }

    func delete(_ key: UnsafeRawBufferPointer) throws(SQLError) {
        try transaction { () throws(SQLError) in try deleteRow(key) }
    }

    func clear() throws(SQLError) {
        try exec("DELETE FROM records")
        totalBytes = 0
        items = 0
    }

    var statsJSON: String {
        var o = JSONObject()
        o["backend"] = "sqlite"
        o["persistent"] = true
        o["path"] = .string(path)
        o["bytes"] = .int(totalBytes)
        o["max_bytes"] = .int(maxBytes)
        o["items"] = .int(items)
        o["hits"] = .int(hits)
        o["misses"] = .int(misses)
        o["evictions"] = .int(evictions)
        var st = stat()
        if stat(path, &st) == 0 { o["file_bytes"] = .int(Int(st.st_size)) }
        var wal = stat()
        if stat(path + "-wal", &wal) == 0 { o["wal_bytes"] = .int(Int(wal.st_size)) }
        return JSON.object(o).compactString
    }
}

private func instance(_ p: OpaquePointer?) -> SQLiteBackend {
    Unmanaged<SQLiteBackend>.fromOpaque(UnsafeRawPointer(p!)).takeUnretainedValue()
}

private func raw(_ p: UnsafePointer<UInt8>?, _ n: Int) -> UnsafeRawBufferPointer {
    UnsafeRawBufferPointer(start: p, count: p == nil ? 0 : n)
}

private func fail(_ error: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?, _ e: SQLiteBackend.SQLError) -> Int32 {
    BackendKit.setError(error, e.message)
    if e.isCorruption { return Int32(CONCORD_ERR_CORRUPT.rawValue) }
    if e.code == SQLITE_FULL { return Int32(CONCORD_ERR_FULL.rawValue) }
    return Int32(CONCORD_ERR_IO.rawValue)
}

nonisolated(unsafe) private let table: UnsafePointer<concord_backend_api> = BackendKit.makeTable(concord_backend_api(
    abi_version: CONCORD_BACKEND_ABI_VERSION,
    struct_size: UInt32(MemoryLayout<concord_backend_api>.size),
    name: UnsafePointer(strdup("sqlite")),
    open: { host, config, errorOut in
        let b: SQLiteBackend
        do {
            let c = try BackendKit.config(config)
            b = SQLiteBackend(
                path: try BackendKit.string(c, "path") ?? "concord.sqlite",
                maxBytes: try BackendKit.int(c, "max_bytes", 50 << 20),
                ttlMillis: Int64(try BackendKit.int(c, "ttl_ms", 0)),
                host: host)
            b.faultFile = try BackendKit.string(c, "fault_file")
        } catch {
            BackendKit.setError(errorOut, "sqlite backend: \(error)")
            return nil
        }
        do throws(SQLiteBackend.SQLError) {
            try b.open()
        } catch let e {
            b.closeDB()
            BackendKit.setError(errorOut, "sqlite backend: \(e.message)")
            return nil
        }
        return OpaquePointer(Unmanaged.passRetained(b).toOpaque())
    },
    get: { b, key, keyLen, value, valueLen, errorOut in
        do throws(SQLiteBackend.SQLError) {
            var ok = true
            let found = try instance(b).get(raw(key, keyLen)) { ok = BackendKit.copyOut($0, value, valueLen) }
            if !found { return Int32(CONCORD_NOT_FOUND.rawValue) }
            return ok ? Int32(CONCORD_OK.rawValue) : Int32(CONCORD_ERR_INTERNAL.rawValue)
        } catch let e {
            return fail(errorOut, e)
        }
    },
    put: { b, key, keyLen, value, valueLen, errorOut in
        let s = instance(b)
        do throws(SQLiteBackend.SQLError) {
            try s.checkFault()
            try s.transaction { () throws(SQLiteBackend.SQLError) in try s.putRow(raw(key, keyLen), raw(value, valueLen)) }
            return Int32(CONCORD_OK.rawValue)
        } catch let e {
            return fail(errorOut, e)
        }
    },
    del: { b, key, keyLen, errorOut in
        do throws(SQLiteBackend.SQLError) {
            try instance(b).checkFault()
            try instance(b).delete(raw(key, keyLen))
            return Int32(CONCORD_OK.rawValue)
        } catch let e {
            return fail(errorOut, e)
        }
    },
    write_batch: { b, writes, count, errorOut in
        let s = instance(b)
        do throws(SQLiteBackend.SQLError) {
            try s.checkFault()
            try s.transaction { () throws(SQLiteBackend.SQLError) in
                for i in 0..<count {
                    let w = writes![i]
                    if w.value != nil {
                        try s.putRow(raw(w.key, w.key_len), raw(w.value, w.value_len))
                    } else {
                        try s.deleteRow(raw(w.key, w.key_len))
                    }
                }
            }
            return Int32(CONCORD_OK.rawValue)
        } catch let e {
            return fail(errorOut, e)
        }
    },
    clear: { b, errorOut in
        do throws(SQLiteBackend.SQLError) {
            try instance(b).checkFault()
            try instance(b).clear()
            return Int32(CONCORD_OK.rawValue)
        } catch let e {
            return fail(errorOut, e)
        }
    },
    stats: { b in BackendKit.cString(instance(b).statsJSON) },
    close: { b in
        let s = Unmanaged<SQLiteBackend>.fromOpaque(UnsafeRawPointer(b!)).takeRetainedValue()
        _ = sqlite3_exec(s.db, "PRAGMA wal_checkpoint(TRUNCATE)", nil, nil, nil)
        s.closeDB()
    },
    free_buffer: { p in BackendKit.freeBuffer(p) },
    scan: { b, prefix, prefixLen, each, ctx, errorOut in
        do throws(SQLiteBackend.SQLError) {
            try instance(b).scan(raw(prefix, prefixLen)) { k, v in
                each!(ctx, k.baseAddress?.assumingMemoryBound(to: UInt8.self), k.count,
                      v.baseAddress?.assumingMemoryBound(to: UInt8.self), v.count) == 0
            }
            return Int32(CONCORD_OK.rawValue)
        } catch let e {
            return fail(errorOut, e)
        }
    }
))

@_cdecl("concord_backend_entry")
public func concordBackendEntry() -> UnsafePointer<concord_backend_api> { table }
