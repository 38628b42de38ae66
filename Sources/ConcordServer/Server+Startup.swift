import CLibUV
import ConcordProtocol
import ConcordSocket
import Logging

#if canImport(Glibc)
import Glibc
#endif

extension Server {
    // MARK: Start-up

    func prepareSocketPath() throws(StartupError) {
        let path = configuration.socketPath
        if path.utf8.count > 107 {
            throw StartupError(description: "socket path is \(path.utf8.count) bytes; Unix sockets allow at most 107: \(path)")
        }
        var st = stat()
        let dir = path.contains("/") ? String(path[..<path.lastIndex(of: "/")!]) : "."
        if !dir.isEmpty {
            try checkSocketDirectory(dir)
        }
        guard lstat(path, &st) == 0 else { return }
        guard (st.st_mode & S_IFMT) == S_IFSOCK else {
            throw StartupError(description: "\(path) exists and is not a socket; refusing to replace it")
        }
        if UnixSocket.someoneAnswers(path) {
            throw StartupError(description: "another server is already listening on \(path)")
        }
        if unlink(path) != 0 {
            throw StartupError(description: "cannot remove stale socket \(path): \(String(cString: strerror(errno)))")
        }
        logger.info("replaced a stale socket file", metadata: ["concord.socket": "\(path)"])
    }

    /// The socket's directory must exist and be writable by this user only:
    /// anyone else who can write it can bind the path first and receive every
    /// client's traffic. The default private directory is created (0700).
    func checkSocketDirectory(_ dir: String) throws(StartupError) {
        var ds = stat()
        if lstat(dir, &ds) != 0 {
            guard dir == DefaultSocket.privateDirectory else {
                throw StartupError(description: "the socket's directory \(dir) does not exist (create it, or choose another --socket)")
            }
            if mkdir(dir, 0o700) != 0 && errno != EEXIST {
                throw StartupError(description: "cannot create the socket directory \(dir): \(String(cString: strerror(errno)))")
            }
            logger.info("created the private socket directory", metadata: ["concord.dir": "\(dir)"])
            guard lstat(dir, &ds) == 0 else {
                throw StartupError(description: "cannot read the socket directory \(dir): \(String(cString: strerror(errno)))")
            }
        }
        if (ds.st_mode & S_IFMT) == S_IFLNK && dir == DefaultSocket.privateDirectory {
            throw StartupError(description: "the private socket directory \(dir) is a symbolic link; refusing it (another user may have planted it)")
        }
        if (ds.st_mode & S_IFMT) == S_IFLNK { _ = stat(dir, &ds) }
        if (ds.st_mode & S_IFMT) != S_IFDIR {
            throw StartupError(description: "\(dir) is not a directory; cannot create the socket in it")
        }
        if dir == DefaultSocket.privateDirectory && ds.st_uid != getuid() {
            throw StartupError(description: "the private socket directory \(dir) belongs to uid \(ds.st_uid), not to this user (\(getuid())); refusing it")
        }
        if ds.st_uid != getuid() && ds.st_uid != 0 {
            throw StartupError(description: "the socket's directory \(dir) belongs to uid \(ds.st_uid), not to this user (\(getuid())) or root: its owner could replace the socket and receive every client's traffic; use a directory of your own (the default is \(DefaultSocket.privateDirectory))")
        }
        if ds.st_mode & 0o022 != 0 {
            let mode = String(ds.st_mode & 0o7777, radix: 8)
            throw StartupError(description: "the socket's directory \(dir) is writable by other users (mode \(mode)): one of them could bind the socket first and receive every client's traffic; use a directory only you can write (the default is \(DefaultSocket.privateDirectory))")
        }
        if access(dir, W_OK | X_OK) != 0 {
            throw StartupError(description: "no permission to create the socket in \(dir): \(String(cString: strerror(errno)))")
        }
    }

    func listen() throws(StartupError) {
        let p = UnsafeMutablePointer<uv_pipe_t>.allocate(capacity: 1)
        uvMust("uv_pipe_init", uv_pipe_init(loop, p, 0))
        uv_handle_set_data(asHandle(p), Unmanaged.passUnretained(self).toOpaque())
        do {
            try uvCall("uv_pipe_bind", uv_pipe_bind(p, configuration.socketPath))
            if chmod(configuration.socketPath, mode_t(configuration.socketMode)) != 0 {
                throw StartupError(description: "cannot chmod \(configuration.socketPath): \(String(cString: strerror(errno)))")
            }
            try uvCall("uv_listen", uv_listen(asStream(p), 511) { server, status in
                Server.from(server).accept(status: status)
            })
        } catch let e as UVError {
            throw StartupError(description: "cannot listen on \(configuration.socketPath): \(e)")
        } catch let e as StartupError {
            throw e
        } catch {
            throw StartupError(description: "cannot listen on \(configuration.socketPath): \(error)")
        }
        listener = p
    }
}

/// Counting a directory's entries without Foundation.
enum FileManagerLite {
    static func countEntries(_ path: String) throws -> Int {
        guard let d = opendir(path) else { throw StartupError(description: "cannot open \(path)") }
        defer { closedir(d) }
        var n = 0
        while let e = readdir(d) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name != "." && name != ".." { n += 1 }
        }
        return n - 1  // the directory stream's own descriptor
    }
}
