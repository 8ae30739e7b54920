#include "agent/worker_env_file.h"

#include <cerrno>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/errno_text.h"
#include "common/worker_env_policy.h"

namespace mesh::agent {

absl::StatusOr<EnvEntries> ParseWorkerEnvFile(absl::string_view text, absl::string_view source) {
  EnvEntries entries;
  std::set<std::string> seen;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    absl::ConsumeSuffix(&line, "\r");
    const absl::string_view trimmed = absl::StripLeadingAsciiWhitespace(line);
    if (trimmed.empty() || absl::StartsWith(trimmed, "#")) continue;
    auto fail = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", number, ": ", why));
    };
    const size_t eq = trimmed.find('=');
    if (eq == absl::string_view::npos) return fail("expected NAME=VALUE");
    const std::string name(trimmed.substr(0, eq));
    const std::string value(trimmed.substr(eq + 1));
    if (name.empty() || name.find_first_of(" \t") != std::string::npos) {
      return fail(absl::StrCat("\"", name, "\" is not a variable name"));
    }
    if (value.find('\0') != std::string::npos) return fail("the value contains a NUL byte");
    if (std::string problem = WorkerEnvNameProblem(name); !problem.empty() && !IsDeniedEnvName(name)) {
      return fail(absl::StrCat(name, ": ", problem));
    }
    if (!seen.insert(name).second) return fail(absl::StrCat(name, " is set twice"));
    entries.emplace_back(name, value);
  }
  return entries;
}

absl::StatusOr<EnvEntries> ReadWorkerEnvFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string message = absl::StrCat("reading ", path, ": ", ErrnoText(err));
    if (err == ENOENT) return absl::NotFoundError(message);
    if (err == EACCES) return absl::PermissionDeniedError(message);
    return absl::FailedPreconditionError(message);
  }
  std::ostringstream text;
  text << in.rdbuf();
  return ParseWorkerEnvFile(text.str(), path);
}

}  // namespace mesh::agent
