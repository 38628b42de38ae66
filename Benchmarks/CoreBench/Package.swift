// swift-tools-version:6.1
// Micro-benchmarks of the consistency core (no sockets, no threads):
// parse, apply, render, encode, subscribe, with malloc counts per operation,
// so a regression in allocations shows up as a number. A separate package so
// ordo-one/benchmark never reaches users of the root package.
//
//   cd Benchmarks/CoreBench && swift package --disable-sandbox benchmark
//   (or `make bench-core` from the root)
import PackageDescription

// SwiftPM names a path dependency after its folder (lowercased), so the root
// package's identity is the name of whatever folder the clone lives in.
let concordIdentity: String = {
    let parts = #filePath.split(separator: "/")
    return parts[parts.count - 4].lowercased()
}()

let package = Package(
    name: "CoreBench",
    dependencies: [
        .package(path: "../.."),
        .package(url: "https://github.com/ordo-one/benchmark", from: "1.38.1", traits: ["MallocInterposer"]),
    ],
    targets: [
        .executableTarget(
            name: "Core",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "_ConcordCore", package: concordIdentity),
                .product(name: "ConcordJSON", package: concordIdentity),
            ],
            path: "Benchmarks/Core",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
    ]
)
