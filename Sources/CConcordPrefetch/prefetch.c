/* The module is its header (a static inline function); SwiftPM wants a source file. */
#include "CConcordPrefetch.h"
