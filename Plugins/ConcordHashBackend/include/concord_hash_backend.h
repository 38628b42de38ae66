/* The C backend exports only concord_backend_entry; see concord_hash_backend.c. */
