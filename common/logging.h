// Process-wide logging setup for Mesh binaries (spdlog).
//
// Text logs are for people at a terminal; JSON logs (one object per line) are
// for log shippers. Both go to stderr, so stdout stays free for a command's
// actual output (meshctl's tables, the coordinator's "listening on" line).
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mesh {

enum class LogFormat { kText, kJson };

struct LogOptions {
  LogFormat format = LogFormat::kText;
  spdlog::level::level_enum level = spdlog::level::info;
  // Logger name, shown as "component" in JSON: "coordinator", "agent", ...
  std::string component = "mesh";
  // Host name recorded in JSON lines; empty means gethostname().
  std::string host;
};

// Parses "text" or "json". Possible errors: INVALID_ARGUMENT.
absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view text);

// Parses "trace", "debug", "info", "warn", "error", "critical" or "off".
// Possible errors: INVALID_ARGUMENT.
absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(absl::string_view text);

// Builds a logger writing to `sink` in the given format. Used by tests to
// capture output; binaries call InitLogging.
std::shared_ptr<spdlog::logger> MakeLogger(const LogOptions& options, spdlog::sink_ptr sink);

// Replaces spdlog's default logger with one that writes to stderr.
// Call once from main() before starting threads that log.
void InitLogging(const LogOptions& options);

}  // namespace mesh
