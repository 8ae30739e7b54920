#include "common/flags.h"

#include <fstream>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace mesh {
namespace {

// The long name of `opt` without dashes, e.g. "heartbeat-timeout".
std::string LongName(const CLI::Option& opt) {
  const auto& names = opt.get_lnames();
  return names.empty() ? std::string() : names.front();
}

}  // namespace

absl::Status ApplyConfigFile(CLI::App& app, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config file '", path, "'"));

  YAML::Node root;
  try {
    root = YAML::Load(in);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file '", path, "' is not valid YAML: ", e.what()));
  }
  if (root.IsNull()) return absl::OkStatus();  // An empty file sets nothing.
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file '", path, "' must be a map of option: value"));
  }

  // First resolve every entry, so that a bad key leaves all options untouched.
  std::vector<std::pair<CLI::Option*, std::vector<std::string>>> pending;
  for (const auto& entry : root) {
    const std::string key = entry.first.as<std::string>();
    const std::string name = absl::StrReplaceAll(key, {{"_", "-"}});
    CLI::Option* opt = nullptr;
    for (CLI::Option* candidate : app.get_options()) {
      if (LongName(*candidate) == name) opt = candidate;
    }
    if (opt == nullptr || name == "help" || name == "config") {
      return absl::InvalidArgumentError(
          absl::StrCat("config file '", path, "': unknown option '", key, "'"));
    }
    std::vector<std::string> values;
    const YAML::Node& value = entry.second;
    if (value.IsScalar()) {
      values.push_back(value.as<std::string>());
    } else if (value.IsSequence()) {
      for (const auto& item : value) {
        if (!item.IsScalar()) {
          return absl::InvalidArgumentError(
              absl::StrCat("config file '", path, "': option '", key, "' must hold scalars"));
        }
        values.push_back(item.as<std::string>());
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("config file '", path, "': option '", key, "' must be a scalar or a list"));
    }
    if (opt->count() == 0) pending.emplace_back(opt, std::move(values));
  }

  for (auto& [opt, values] : pending) {
    try {
      for (const std::string& value : values) opt->add_result(value);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("config file '", path, "': option '", LongName(*opt), "': ", e.what()));
    }
  }
  return absl::OkStatus();
}

}  // namespace mesh
