// swift-tools-version:6.1
// The load-test benchmarks: a separate package so the benchmark-only
// dependency (hdrhistogram-swift) never reaches users of the root package.
// It talks to concord-server and redis-server over their Unix sockets only;
// from the root package it takes just the Unix-socket helper (ConcordSocket).
import PackageDescription

// SwiftPM names a path dependency after its folder (lowercased), so the root
// package's identity is the name of whatever folder the clone lives in.
let concordIdentity: String = {
    let parts = #filePath.split(separator: "/")
    return parts[parts.count - 4].lowercased()
}()

let package = Package(
    name: "ConcordBench",
    dependencies: [
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift", from: "0.2.0"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(path: "../.."),
    ],
    targets: [
        .executableTarget(
            name: "concord-bench",
            dependencies: [
                .product(name: "Histogram", package: "hdrhistogram-swift"),
                .product(name: "ConcordSocket", package: concordIdentity),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Sources/ConcordBench"
        ),
    ]
)
