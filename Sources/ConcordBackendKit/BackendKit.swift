public import CConcordBackendABI
public import ConcordJSON

#if canImport(Glibc)
import Glibc
#endif

/// Helpers for writing a cache backend in Swift against the C ABI
/// (`concord_backend.h`). Stateless: each plugin links its own copy, and no
/// Swift type ever crosses the library boundary.
public enum BackendKit {
    /// A malloc'ed copy of `message` for an `char **error` out-parameter.
    public static func setError(_ error: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?, _ message: String) {
        guard let error else { return }
        error.pointee = strdup(message)
    }

    /// A malloc'ed NUL-terminated copy, for `stats`.
    public static func cString(_ s: String) -> UnsafeMutablePointer<CChar>? { strdup(s) }

    /// Copies bytes into a malloc'ed buffer for `get`'s out-parameters.
    public static func copyOut(
        _ bytes: UnsafeRawBufferPointer,
        _ value: UnsafeMutablePointer<UnsafeMutablePointer<UInt8>?>?,
        _ length: UnsafeMutablePointer<Int>?
    ) -> Bool {
        let p = malloc(max(bytes.count, 1))
        guard let p else { return false }
        if let base = bytes.baseAddress { memcpy(p, base, bytes.count) }
        value?.pointee = p.assumingMemoryBound(to: UInt8.self)
        length?.pointee = bytes.count
        return true
    }

    /// The `free_buffer` every Swift backend exports (everything it hands out is malloc'ed).
    public static func freeBuffer(_ p: UnsafeMutableRawPointer?) { free(p) }

    /// The configuration object given to `open` ("{}" when NULL or empty).
    public static func config(_ json: UnsafePointer<CChar>?) throws(BackendConfigError) -> JSONObject {
        guard let json, json.pointee != 0 else { return JSONObject() }
        let bytes = Array(UnsafeBufferPointer(start: UnsafeRawPointer(json).assumingMemoryBound(to: UInt8.self), count: strlen(json)))
        guard let v = try? JSONParser(maxDepth: 64).parse(bytes) else {
            throw BackendConfigError("the configuration is not valid JSON")
        }
        guard case .object(let o) = v else { throw BackendConfigError("the configuration must be a JSON object") }
        return o
    }

    /// A non-negative integer member, or `fallback` when absent.
    public static func int(_ o: JSONObject, _ key: String, _ fallback: Int) throws(BackendConfigError) -> Int {
        guard let v = o[key], !v.isNull else { return fallback }
        guard let i = v.numberValue?.intValue, i >= 0 else {
            throw BackendConfigError("'\(key)' must be a non-negative integer")
        }
        return i
    }

    public static func string(_ o: JSONObject, _ key: String) throws(BackendConfigError) -> String? {
        guard let v = o[key], !v.isNull else { return nil }
        guard let s = v.stringValue else { throw BackendConfigError("'\(key)' must be a string") }
        return s
    }

    /// Logs through the host's callback, if it gave one.
    public static func log(_ host: UnsafePointer<concord_host>?, _ level: Int32, _ message: String) {
        guard let host, host.pointee.struct_size >= UInt32(MemoryLayout<concord_host>.size), let fn = host.pointee.log else { return }
        message.withCString { fn(host.pointee.context, level, $0) }
    }

    /// Allocates the API table once, at a stable address.
    public static func makeTable(_ api: concord_backend_api) -> UnsafePointer<concord_backend_api> {
        let p = UnsafeMutablePointer<concord_backend_api>.allocate(capacity: 1)
        p.initialize(to: api)
        return UnsafePointer(p)
    }
}

public struct BackendConfigError: Error, CustomStringConvertible {
    public let description: String
    public init(_ d: String) { description = d }
}

/// Current time in milliseconds (monotonic), for TTLs.
public func backendNowMillis() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
}
