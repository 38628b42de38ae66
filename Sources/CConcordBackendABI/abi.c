/* Header-only target: see include/concord_backend.h. */
