// errno values as text for error messages.
#pragma once

#include <cstring>
#include <string>

namespace mesh {

// strerror(err), e.g. "No such file or directory". Not async-signal-safe:
// never call it between fork and exec.
inline std::string ErrnoText(int err) { return std::strerror(err); }

}  // namespace mesh
