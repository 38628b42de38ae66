import CLibUV

// Every libuv call of the server goes through one of the two funnels below
// (swift-nio's System.swift is the model): a call that can fail at run time
// (bind, listen, accept, read, write) returns its error as a `UVError` that
// names the call; a call that fails only on a programming error (initialising
// a handle on a live loop, starting a timer, stopping a read) stops the
// process with the call's name instead of going on with a handle in an
// unknown state. A call whose failure is deliberately ignored says so with
// `try? uvCall(...)` at the call site.

/// A failed libuv call: the negative return code, its name and the call.
public struct UVError: Error, CustomStringConvertible, Sendable {
    public let code: Int32
    public let name: String
    public let function: String

    public var description: String { "\(function): \(name) (\(code))" }
}

/// The funnel for calls that can fail at run time: a negative return becomes a `UVError`.
@discardableResult
@inline(__always)
func uvCall(_ function: StaticString, _ result: Int32) throws(UVError) -> Int32 {
    if result < 0 { throw UVError(code: result, name: uvErrorName(Int(result)), function: "\(function)") }
    return result
}

/// The funnel for calls that fail only when the server itself is wrong.
@inline(__always)
func uvMust(_ function: StaticString, _ result: Int32, file: StaticString = #fileID, line: UInt = #line) {
    if result < 0 {
        preconditionFailure("\(function) failed: \(uvErrorName(Int(result))) (\(result))", file: file, line: line)
    }
}

func uvErrorName(_ code: Int) -> String {
    String(cString: uv_err_name(Int32(truncatingIfNeeded: code)))
}

@inline(__always)
func asHandle<T>(_ p: UnsafeMutablePointer<T>) -> UnsafeMutablePointer<uv_handle_t> {
    UnsafeMutableRawPointer(p).assumingMemoryBound(to: uv_handle_t.self)
}

@inline(__always)
func asStream<T>(_ p: UnsafeMutablePointer<T>) -> UnsafeMutablePointer<uv_stream_t> {
    UnsafeMutableRawPointer(p).assumingMemoryBound(to: uv_stream_t.self)
}
