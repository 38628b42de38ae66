#if canImport(Glibc)
import Glibc
#endif

func sysconfNProcessors() -> Int { Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))) }
