// meshctl: the Mesh command-line client, as a library so tests can run it
// in-process with captured output.
//
// Exit codes (docs/cli.md):
//   0  success
//   1  the command ran and failed (e.g. the server is NOT_SERVING)
//   2  usage error (bad flags or arguments)
//   3  the coordinator could not be reached (UNAVAILABLE, DEADLINE_EXCEEDED)
//   4  the coordinator refused the request (any other error status)
// Commands that wait for a job (submit, wait) exit with its result:
//   0  SUCCEEDED, 1 FAILED, 5 CANCELLED, 6 the wait timed out (wait --timeout)
// SIGINT (Ctrl-C) keeps its default action; the shell reports 130.
#pragma once

#include <ostream>

namespace mesh::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnreachable = 3;
inline constexpr int kExitRefused = 4;
inline constexpr int kExitJobCancelled = 5;
inline constexpr int kExitWaitTimeout = 6;

// Runs meshctl with `argv` (argv[0] is the program name). Results go to
// `out`, diagnostics to `err`. Reads MESH_COORDINATOR from the environment.
// Thread safety: safe to call concurrently; shares no state between calls.
int RunMeshctl(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace mesh::cli
