#include "agent/worker_env_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/errno_text.h"
#include "common/worker_env_policy.h"

namespace mesh::agent {
namespace {

// A worker environment is a few lines; the kernel caps a process's whole
// environment and argv at a few MiB anyway.
constexpr int64_t kMaxFileBytes = 1 << 20;

// [A-Za-z_][A-Za-z0-9_]*: what shells and most programs can read back.
bool IsPortableName(const std::string& name) {
  if (name.empty() || absl::ascii_isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<EnvEntries> ParseWorkerEnvFile(absl::string_view text, absl::string_view source) {
  EnvEntries entries;
  std::map<std::string, int> first_line;
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
    if (eq == absl::string_view::npos) {
      return fail("expected NAME=VALUE, a # comment or a blank line");
    }
    const std::string name(trimmed.substr(0, eq));
    const std::string value(trimmed.substr(eq + 1));
    if (absl::StartsWith(name, "export ") || absl::StartsWith(name, "export\t")) {
      return fail(
          "\"export\": the file is NAME=VALUE lines, not a shell script; remove the word export");
    }
    if (!IsPortableName(name)) {
      return fail(absl::StrCat("\"", absl::CHexEscape(name),
                               "\" is not a variable name (letters, digits and _, not starting "
                               "with a digit)"));
    }
    if (value.find('\0') != std::string::npos) return fail("the value contains a NUL byte");
    // The operator is trusted with denied names; reserved ones the agent
    // sets for each rank, so a value here would be silently overridden.
    if (IsAgentSetEnvName(name)) {
      return fail(
          absl::StrCat(name, ": ", WorkerEnvNameProblem(name), "; the operator cannot set it"));
    }
    if (auto [it, inserted] = first_line.emplace(name, number); !inserted) {
      return fail(absl::StrCat(name, " is set twice (first on line ", it->second, ")"));
    }
    entries.emplace_back(name, value);
  }
  return entries;
}

absl::StatusOr<EnvEntries> ReadWorkerEnvFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  auto error = [&](int err) {
    const std::string message = absl::StrCat("reading ", path, ": ", ErrnoText(err));
    if (err == ENOENT) return absl::NotFoundError(message);
    if (err == EACCES) return absl::PermissionDeniedError(message);
    return absl::FailedPreconditionError(message);
  };
  if (fd < 0) return error(errno);
  std::string text;
  struct stat st;
  absl::Status status;
  if (fstat(fd, &st) != 0) {
    status = error(errno);
  } else if (!S_ISREG(st.st_mode)) {
    status = absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  } else if (st.st_size > kMaxFileBytes) {
    status = absl::FailedPreconditionError(
        absl::StrCat(path, " has ", st.st_size, " bytes, over the limit of ", kMaxFileBytes));
  } else {
    char buffer[4096];
    while (text.size() <= static_cast<size_t>(kMaxFileBytes)) {
      const ssize_t n = read(fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        status = error(errno);
        break;
      }
      if (n == 0) break;
      text.append(buffer, static_cast<size_t>(n));
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return ParseWorkerEnvFile(text, path);
}

}  // namespace mesh::agent
