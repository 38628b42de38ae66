#if canImport(Glibc)
import Glibc
#endif

func getenvString(_ name: String) -> String? {
    guard let p = getenv(name) else { return nil }
    return String(cString: p)
}

func sysconfNProcessors() -> Int { Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))) }
