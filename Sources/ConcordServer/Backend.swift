import CConcordBackendABI
public import ConcordJSON
public import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Why a backend could not be loaded or opened: one line for the operator.
public struct BackendError: Error, CustomStringConvertible {
    public let description: String
}

/// A backend failure during a call: the ABI status and the backend's message.
public struct BackendCallError: Error, CustomStringConvertible {
    public let status: Int32
    public let message: String
    public var description: String { "\(Backend.statusName(status)): \(message)" }
}

/// One opened cache backend behind the C ABI (`concord_backend.h`).
///
/// Not thread-safe by contract: the server calls it from its storage thread
/// only. The library is never unloaded (Swift plugins must not be dlclose'd).
public final class Backend: @unchecked Sendable {
    // Sendable: handed from the start-up thread to the storage thread, which
    // is then its only user.
    public let name: String
    public let path: String
    let api: UnsafePointer<concord_backend_api>
    let instance: OpaquePointer
    private let hostContext: HostContext
    private let host: UnsafeMutablePointer<concord_host>

    /// Receives the backend's log lines.
    final class HostContext {
        let logger: Logger
        let backendName: String
        init(logger: Logger, backendName: String) {
            self.logger = logger
            self.backendName = backendName
        }
    }

    /// `memory`, `sqlite`, `hash`, or a path to a shared library.
    public static func libraryPath(for spec: String) -> String {
        let builtIn = ["memory": "ConcordMemoryBackend", "sqlite": "ConcordSQLiteBackend", "hash": "ConcordHashBackend"]
        guard let product = builtIn[spec] else { return spec }
        let dir: String
        if let d = getenv("CONCORD_PLUGIN_DIR") {
            dir = String(cString: d)
        } else {
            var buf = [CChar](repeating: 0, count: 4096)
            let n = readlink("/proc/self/exe", &buf, buf.count - 1)
            let exe = n > 0 ? String(decoding: buf[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) : "."
            dir = exe.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        }
        return "\(dir)/lib\(product).so"
    }

    /// Loads the library, checks the ABI, opens an instance. Every failure is
    /// one clear `BackendError` (path, reason, `dlerror`); nothing is called
    /// before the version and table size are checked.
    public static func open(spec: String, configJSON: String, logger: Logger) throws(BackendError) -> Backend {
        let path = libraryPath(for: spec)
        guard access(path, F_OK) == 0 else {
            throw BackendError(description: "cache backend '\(spec)': no such file \(path)")
        }
        _ = dlerror()
        guard let handle = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) else {
            throw BackendError(description: "cache backend '\(spec)': cannot load \(path): \(lastDLError())")
        }
        guard let sym = dlsym(handle, CONCORD_BACKEND_ENTRY_SYMBOL) else {
            throw BackendError(description: "cache backend '\(spec)': \(path) has no symbol \(CONCORD_BACKEND_ENTRY_SYMBOL): \(lastDLError())")
        }
        let entry = unsafeBitCast(sym, to: concord_backend_entry_fn.self)
        guard let api = entry() else {
            throw BackendError(description: "cache backend '\(spec)': \(path): \(CONCORD_BACKEND_ENTRY_SYMBOL) returned NULL")
        }
        let version = api.pointee.abi_version
        guard version == CONCORD_BACKEND_ABI_VERSION else {
            throw BackendError(description: "cache backend '\(spec)': \(path) speaks ABI version \(version); this server needs \(CONCORD_BACKEND_ABI_VERSION)")
        }
        let size = Int(api.pointee.struct_size)
        // Entries added at the end (`scan`) are optional: the table must cover the original ones.
        let required = MemoryLayout<concord_backend_api>.offset(of: \.scan) ?? MemoryLayout<concord_backend_api>.size
        guard size >= required else {
            throw BackendError(description: "cache backend '\(spec)': \(path) has a method table of \(size) bytes; ABI \(version) needs at least \(required)")
        }
        // A copy of the table as this server knows it: entries past the
        // backend's `struct_size` (an older backend) read as absent.
        let table = UnsafeMutablePointer<concord_backend_api>.allocate(capacity: 1)
        table.initialize(to: concord_backend_api())
        UnsafeMutableRawPointer(table).copyMemory(from: UnsafeRawPointer(api), byteCount: min(size, MemoryLayout<concord_backend_api>.size))
        let t = table.pointee
        guard t.open != nil, t.get != nil, t.put != nil, t.del != nil, t.write_batch != nil, t.clear != nil,
              t.close != nil, t.free_buffer != nil
        else {
            table.deallocate()
            throw BackendError(description: "cache backend '\(spec)': \(path) leaves required entries of its method table empty")
        }
        let name = t.name.map { String(cString: $0) } ?? spec
        let context = HostContext(logger: logger, backendName: name)
        let host = UnsafeMutablePointer<concord_host>.allocate(capacity: 1)
        host.initialize(to: concord_host(
            struct_size: UInt32(MemoryLayout<concord_host>.size),
            context: Unmanaged.passUnretained(context).toOpaque(),
            log: { ctx, level, message in
                let c = Unmanaged<HostContext>.fromOpaque(ctx!).takeUnretainedValue()
                let text = message.map { String(cString: $0) } ?? ""
                let meta: Logger.Metadata = ["concord.backend.name": "\(c.backendName)"]
                switch level {
                case Int32(CONCORD_LOG_DEBUG): c.logger.debug("\(text)", metadata: meta)
                case Int32(CONCORD_LOG_INFO): c.logger.info("\(text)", metadata: meta)
                case Int32(CONCORD_LOG_WARNING): c.logger.warning("\(text)", metadata: meta)
                default: c.logger.error("\(text)", metadata: meta)
                }
            }))
        var err: UnsafeMutablePointer<CChar>?
        guard let instance = configJSON.withCString({ t.open!(host, $0, &err) }) else {
            let reason = err.map { String(cString: $0) } ?? "open failed without a message"
            if let err { t.free_buffer!(err) }
            host.deallocate()
            table.deallocate()
            throw BackendError(description: "cache backend '\(spec)' (\(path)): open failed: \(reason)")
        }
        return Backend(name: name, path: path, api: UnsafePointer(table), instance: instance, hostContext: context, host: host)
    }

    private init(name: String, path: String, api: UnsafePointer<concord_backend_api>, instance: OpaquePointer,
                 hostContext: HostContext, host: UnsafeMutablePointer<concord_host>) {
        self.name = name
        self.path = path
        self.api = api
        self.instance = instance
        self.hostContext = hostContext
        self.host = host
    }

    private static func lastDLError() -> String {
        dlerror().map { String(cString: $0) } ?? "unknown error"
    }

    static func statusName(_ s: Int32) -> String {
        switch s {
        case Int32(CONCORD_OK.rawValue): return "ok"
        case Int32(CONCORD_NOT_FOUND.rawValue): return "not_found"
        case Int32(CONCORD_ERR_INVALID.rawValue): return "invalid"
        case Int32(CONCORD_ERR_IO.rawValue): return "io"
        case Int32(CONCORD_ERR_CORRUPT.rawValue): return "corrupt"
        case Int32(CONCORD_ERR_FULL.rawValue): return "full"
        default: return "internal(\(s))"
        }
    }

    private func check(_ rc: Int32, _ err: UnsafeMutablePointer<CChar>?) throws(BackendCallError) {
        let message = err.map { String(cString: $0) } ?? ""
        if let err { api.pointee.free_buffer!(err) }
        if rc != Int32(CONCORD_OK.rawValue) { throw BackendCallError(status: rc, message: message) }
    }

    // MARK: Calls

    public func get(_ key: [UInt8]) throws(BackendCallError) -> [UInt8]? {
        var value: UnsafeMutablePointer<UInt8>?
        var length = 0
        var err: UnsafeMutablePointer<CChar>?
        let rc = key.withUnsafeBufferPointer { api.pointee.get!(instance, $0.baseAddress, $0.count, &value, &length, &err) }
        if rc == Int32(CONCORD_NOT_FOUND.rawValue) {
            if let err { api.pointee.free_buffer!(err) }
            return nil
        }
        try check(rc, err)
        guard let value else { return [] }
        defer { api.pointee.free_buffer!(value) }
        return Array(UnsafeBufferPointer(start: value, count: length))
    }

    public func put(_ key: [UInt8], _ value: [UInt8]) throws(BackendCallError) {
        var err: UnsafeMutablePointer<CChar>?
        let rc = key.withUnsafeBufferPointer { k in
            value.withUnsafeBufferPointer { v in api.pointee.put!(instance, k.baseAddress, k.count, v.baseAddress, v.count, &err) }
        }
        try check(rc, err)
    }

    public func delete(_ key: [UInt8]) throws(BackendCallError) {
        var err: UnsafeMutablePointer<CChar>?
        let rc = key.withUnsafeBufferPointer { api.pointee.del!(instance, $0.baseAddress, $0.count, &err) }
        try check(rc, err)
    }

    /// Applies puts (value non-nil) and deletes atomically.
    public func writeBatch(_ writes: [(key: [UInt8], value: [UInt8]?)]) throws(BackendCallError) {
        if writes.isEmpty { return }
        // Keep every buffer alive and at a stable address for the call.
        let keys = writes.map { OwnedBytes($0.key) }
        let values = writes.map { $0.value.map(OwnedBytes.init) }
        var table = [concord_write]()
        table.reserveCapacity(writes.count)
        for i in writes.indices {
            table.append(concord_write(
                key: keys[i].pointer, key_len: keys[i].count,
                value: values[i]?.pointer, value_len: values[i]?.count ?? 0))
        }
        var err: UnsafeMutablePointer<CChar>?
        let rc = table.withUnsafeBufferPointer { api.pointee.write_batch!(instance, $0.baseAddress, $0.count, &err) }
        withExtendedLifetime((keys, values)) {}
        try check(rc, err)
    }

    public func clear() throws(BackendCallError) {
        var err: UnsafeMutablePointer<CChar>?
        let rc = api.pointee.clear!(instance, &err)
        try check(rc, err)
    }

    /// The backend's figures as JSON (an empty object when it has none or they do not parse).
    /// Whether the backend can list records by key prefix (`scan`).
    public var canScan: Bool { api.pointee.scan != nil }

    /// Every record whose key starts with `prefix` (any order). Throws when
    /// the backend fails; nil when it has no `scan`.
    public func scan(prefix: [UInt8]) throws(BackendCallError) -> [(key: [UInt8], value: [UInt8])]? {
        guard let fn = api.pointee.scan else { return nil }
        final class Sink { var records: [(key: [UInt8], value: [UInt8])] = [] }
        let sink = Sink()
        var err: UnsafeMutablePointer<CChar>?
        let rc = prefix.withUnsafeBufferPointer { p in
            fn(instance, p.baseAddress, p.count, { ctx, key, keyLen, value, valueLen in
                let sink = Unmanaged<Sink>.fromOpaque(ctx!).takeUnretainedValue()
                sink.records.append((Array(UnsafeBufferPointer(start: key, count: keyLen)),
                                     Array(UnsafeBufferPointer(start: value, count: valueLen))))
                return 0
            }, Unmanaged.passUnretained(sink).toOpaque(), &err)
        }
        try check(rc, err)
        return sink.records
    }

    public func stats() -> JSON {
        guard let fn = api.pointee.stats, let s = fn(instance) else { return .object(JSONObject()) }
        defer { api.pointee.free_buffer!(s) }
        let bytes = Array(UnsafeBufferPointer(start: UnsafeRawPointer(s).assumingMemoryBound(to: UInt8.self), count: strlen(s)))
        return (try? JSONParser(maxDepth: 16).parse(bytes)) ?? .object(JSONObject())
    }

    /// Closes the instance and frees the host's copies (call once, last).
    public func close() {
        api.pointee.close!(instance)
        host.deallocate()
        UnsafeMutablePointer(mutating: api).deallocate()
    }
}

/// Bytes at a stable malloc'ed address (a non-empty buffer even for empty input).
final class OwnedBytes {
    let pointer: UnsafeMutablePointer<UInt8>
    let count: Int
    init(_ bytes: [UInt8]) {
        count = bytes.count
        pointer = .allocate(capacity: max(count, 1))
        bytes.withUnsafeBufferPointer { if let b = $0.baseAddress { pointer.initialize(from: b, count: count) } }
    }
    deinit { pointer.deallocate() }
}
