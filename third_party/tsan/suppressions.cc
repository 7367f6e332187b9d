// ThreadSanitizer suppressions, compiled into the TSan test binaries
// (TSan reads __tsan_default_suppressions at start; no file to find from a
// Bazel sandbox). They name third-party libraries only, never a frame of
// ours: Debian's gRPC, its support library and Abseil are built without
// -fsanitize=thread, so TSan sees their threads' memory accesses (through
// its memcpy/recvmsg interceptors) but none of their synchronisation, and
// reports races inside gRPC's own buffers.
//   called_from_lib: interceptors called from these libraries are ignored;
//   race: a report with a frame in these libraries is dropped (so a race
//         between our code and gRPC touching one buffer would be hidden
//         too: the gRPC tests' own checks are the guard there).
// Empty outside --config=tsan.
#if defined(__SANITIZE_THREAD__)
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libgrpc.so.29\n"
         "called_from_lib:libgpr.so.29\n"
         "called_from_lib:libgrpc++.so.1.51\n"
         "race:libgrpc.so.29\n"
         "race:libgpr.so.29\n"
         "race:libgrpc++.so.1.51\n"
         // Debian's OpenSSL (libssl, libcrypto), uninstrumented too: with TLS on, gRPC's
         // decrypted bytes are written by libssl's memcpy on one thread and
         // parsed (a stream's frames, on a reader thread) on another, with
         // gRPC's handover invisible to TSan.
         "called_from_lib:libssl.so.3\n"
         "race:libssl.so.3\n"
         "called_from_lib:libcrypto.so.3\n"
         "race:libcrypto.so.3\n"
         // Abseil's Status and string copies made on gRPC's threads (frames
         // without symbols in the libraries below) are ordered by gRPC's
         // completion queues, which TSan does not see.
         // (one library per line: a called_from_lib pattern may match one only)
         "called_from_lib:libabsl_status.so.20220623\n"
         "called_from_lib:libabsl_statusor.so.20220623\n"
         "called_from_lib:libabsl_strings.so.20220623\n"
         "called_from_lib:libabsl_strings_internal.so.20220623\n"
         "called_from_lib:libabsl_str_format_internal.so.20220623\n"
         "called_from_lib:libabsl_cord.so.20220623\n"
         "called_from_lib:libabsl_cord_internal.so.20220623\n"
         "called_from_lib:libabsl_random_internal_pool_urbg.so.20220623\n"
         "race:libabsl_*\n";
}
#endif
