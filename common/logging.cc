#include "common/logging.h"

#include <unistd.h>

#include <array>
#include <ctime>
#include <string>
#include <utility>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace mesh {
namespace {

std::string LocalHostName() {
  std::array<char, 256> buf{};
  if (gethostname(buf.data(), buf.size() - 1) != 0) return "unknown";
  return std::string(buf.data());
}

// One JSON object per line. Built with nlohmann::json so that any message
// text, including quotes and control characters, stays valid JSON.
class JsonFormatter final : public spdlog::formatter {
 public:
  explicit JsonFormatter(std::string host) : host_(std::move(host)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    nlohmann::json line;
    line["ts"] =
        absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromChrono(msg.time), absl::UTCTimeZone());
    const auto level = spdlog::level::to_string_view(msg.level);
    line["level"] = std::string(level.data(), level.size());
    line["component"] = std::string(msg.logger_name.data(), msg.logger_name.size());
    line["host"] = host_;
    line["pid"] = static_cast<int64_t>(getpid());
    line["thread"] = static_cast<int64_t>(msg.thread_id);
    line["msg"] = std::string(msg.payload.data(), msg.payload.size());
    // Invalid UTF-8 in a message is replaced rather than thrown on.
    const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    dest.append(text.data(), text.data() + text.size());
    dest.push_back('\n');
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>(host_);
  }

 private:
  const std::string host_;
};

}  // namespace

absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "text") return LogFormat::kText;
  if (lower == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log format '", text, "': expected text or json"));
}

absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  // spdlog maps unknown names to "off"; reject them instead.
  static constexpr std::array<std::pair<const char*, spdlog::level::level_enum>, 8> kLevels = {
      {{"trace", spdlog::level::trace},
       {"debug", spdlog::level::debug},
       {"info", spdlog::level::info},
       {"warn", spdlog::level::warn},
       {"warning", spdlog::level::warn},
       {"error", spdlog::level::err},
       {"critical", spdlog::level::critical},
       {"off", spdlog::level::off}}};
  for (const auto& [name, level] : kLevels) {
    if (lower == name) return level;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown log level '", text, "': expected trace, debug, info, warn, error, critical or off"));
}

std::shared_ptr<spdlog::logger> MakeLogger(const LogOptions& options, spdlog::sink_ptr sink) {
  auto logger = std::make_shared<spdlog::logger>(options.component, std::move(sink));
  if (options.format == LogFormat::kJson) {
    logger->set_formatter(
        std::make_unique<JsonFormatter>(options.host.empty() ? LocalHostName() : options.host));
  } else {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n: %v");
  }
  logger->set_level(options.level);
  logger->flush_on(spdlog::level::warn);
  return logger;
}

void InitLogging(const LogOptions& options) {
  spdlog::set_default_logger(
      MakeLogger(options, std::make_shared<spdlog::sinks::stderr_sink_mt>()));
}

}  // namespace mesh
