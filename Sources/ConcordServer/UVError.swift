import CLibUV

/// A failed libuv call: the negative return code, its name and the call.
public struct UVError: Error, CustomStringConvertible, Sendable {
    public let code: Int32
    public let name: String
    public let function: String

    public var description: String { "\(function): \(name) (\(code))" }
}

/// The one funnel for libuv calls: turns a negative return into a `UVError`.
@discardableResult
func uvCall(_ function: String, _ result: Int32) throws(UVError) -> Int32 {
    if result < 0 {
        let name = String(cString: uv_err_name(result))
        throw UVError(code: result, name: name, function: function)
    }
    return result
}

func uvErrorName(_ code: Int) -> String {
    String(cString: uv_err_name(Int32(truncatingIfNeeded: code)))
}
