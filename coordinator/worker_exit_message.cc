#include "coordinator/worker_exit_message.h"

#include <csignal>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace mesh::coordinator {
namespace {

using Termination = mesh::v1::ReportWorkerExitRequest::TerminationCase;

constexpr absl::string_view kOom = "killed by the kernel: out of memory";

const char* SignalName(int signal) {
  switch (signal) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "";
  }
}

// `detail` as one line: each run of control characters (newlines, tabs)
// becomes one space, surrounding blanks go, and it is cut to
// kMaxExitDetailBytes. Proto strings are valid UTF-8, so cutting before a
// continuation byte keeps it so.
std::string OneLine(absl::string_view detail) {
  std::string line;
  line.reserve(detail.size());
  bool blank = false;
  for (char c : detail) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      blank = true;
      continue;
    }
    if (blank && !line.empty()) line.push_back(' ');
    blank = false;
    line.push_back(c);
  }
  line = std::string(absl::StripAsciiWhitespace(line));
  if (line.size() > kMaxExitDetailBytes) {
    size_t end = kMaxExitDetailBytes - 3;
    while (end > 0 && (static_cast<unsigned char>(line[end]) & 0xC0) == 0x80) --end;
    line.resize(end);
    line += "...";
  }
  return line;
}

// How the rank ended, without the detail.
std::string Ending(absl::string_view who, const mesh::v1::ReportWorkerExitRequest& request) {
  switch (request.termination_case()) {
    case Termination::kExitCode:
      return absl::StrCat(who, " exited with code ", request.exit_code());
    case Termination::kSignal:
      return absl::StrCat(who, " was killed by signal ", DescribeSignal(request.signal()));
    case Termination::kLaunchError:
      return absl::StrCat(who, " could not be started: ", request.launch_error());
    default:
      return absl::StrCat(who, " ended");
  }
}

}  // namespace

std::string DescribeSignal(int signal) {
  const char* name = SignalName(signal);
  return *name ? absl::StrCat(signal, " (", name, ")") : absl::StrCat(signal);
}

std::string WorkerExitMessage(absl::string_view who,
                              const mesh::v1::ReportWorkerExitRequest& request) {
  const std::string ending = Ending(who, request);
  std::string detail = OneLine(request.detail());
  if (request.oom_killed()) {
    // The agent says "killed by the kernel: out of memory (memory limit
    // 8 GiB)" for the rank itself and "a process it started was killed
    // ..." for a child; an older or other agent may say less.
    absl::string_view said = detail;
    absl::ConsumePrefix(&said, "was ");
    const bool rank_itself =
        request.termination_case() == Termination::kSignal && request.signal() == SIGKILL;
    if (rank_itself) {
      if (absl::StartsWith(said, "killed by")) return absl::StrCat(who, " was ", said);
      return said.empty() ? absl::StrCat(who, " was ", kOom)
                          : absl::StrCat(who, " was ", kOom, "; ", said);
    }
    if (said.empty()) return absl::StrCat(ending, ": a process it started was ", kOom);
    if (absl::StrContains(said, "out of memory")) return absl::StrCat(ending, ": ", said);
    return absl::StrCat(ending, ": a process it started was ", kOom, "; ", said);
  }
  if (detail.empty() || absl::StrContains(ending, detail)) return ending;
  return absl::StrCat(ending, ": ", detail);
}

}  // namespace mesh::coordinator
