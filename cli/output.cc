#include "cli/output.h"

#include <algorithm>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace mesh::cli {
namespace {

// Scalars print bare (strings without quotes); containers as compact JSON.
std::string Cell(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_null()) return "-";
  return value.dump();
}

YAML::Node ToYaml(const nlohmann::json& value) {
  YAML::Node node;
  switch (value.type()) {
    case nlohmann::json::value_t::object:
      node = YAML::Node(YAML::NodeType::Map);
      for (const auto& [key, item] : value.items()) node[key] = ToYaml(item);
      break;
    case nlohmann::json::value_t::array:
      node = YAML::Node(YAML::NodeType::Sequence);
      for (const auto& item : value) node.push_back(ToYaml(item));
      break;
    case nlohmann::json::value_t::string:
      node = value.get<std::string>();
      break;
    case nlohmann::json::value_t::boolean:
      node = value.get<bool>();
      break;
    case nlohmann::json::value_t::number_integer:
      node = value.get<int64_t>();
      break;
    case nlohmann::json::value_t::number_unsigned:
      node = value.get<uint64_t>();
      break;
    case nlohmann::json::value_t::number_float:
      node = value.get<double>();
      break;
    default:
      node = YAML::Node(YAML::NodeType::Null);
  }
  return node;
}

}  // namespace

void RenderRows(const std::vector<std::vector<std::string>>& rows, std::ostream& out) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "table") return OutputFormat::kTable;
  if (lower == "json") return OutputFormat::kJson;
  if (lower == "yaml") return OutputFormat::kYaml;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown output format '", text, "': expected table, json or yaml"));
}

void Render(const nlohmann::json& value, OutputFormat format, std::ostream& out) {
  switch (format) {
    case OutputFormat::kJson:
      out << value.dump(2) << "\n";
      return;
    case OutputFormat::kYaml: {
      YAML::Emitter emitter;
      emitter << ToYaml(value);
      out << emitter.c_str() << "\n";
      return;
    }
    case OutputFormat::kTable:
      break;
  }
  std::vector<std::vector<std::string>> rows;
  if (value.is_object()) {
    for (const auto& [key, item] : value.items()) rows.push_back({key, Cell(item)});
  } else if (value.is_array() && !value.empty() && value.front().is_object()) {
    std::vector<std::string> header;
    for (const auto& [key, item] : value.front().items()) header.push_back(key);
    std::vector<std::string> upper;
    for (const std::string& key : header) upper.push_back(absl::AsciiStrToUpper(key));
    rows.push_back(upper);
    for (const auto& element : value) {
      std::vector<std::string> row;
      for (const std::string& key : header) {
        row.push_back(element.contains(key) ? Cell(element[key]) : "-");
      }
      rows.push_back(row);
    }
  } else {
    out << Cell(value) << "\n";
    return;
  }
  RenderRows(rows, out);
}

}  // namespace mesh::cli
