// Rendering of meshctl results: one JSON value, shown as a table, JSON or
// YAML. The JSON form is the stable, documented schema (docs/cli.md); table
// and YAML are views of the same value.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mesh::cli {

enum class OutputFormat { kTable, kJson, kYaml };

// Possible errors: INVALID_ARGUMENT for anything but table, json or yaml.
absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text);

// Writes `value` to `out`:
//  - table: an object as "key  value" rows (nested values as compact JSON);
//    an array of objects as a header row plus one row per element.
//  - json:  pretty-printed JSON.
//  - yaml:  block-style YAML.
void Render(const nlohmann::json& value, OutputFormat format, std::ostream& out);

// Rows as aligned columns, two spaces apart; the last column is not padded.
void RenderRows(const std::vector<std::vector<std::string>>& rows, std::ostream& out);

}  // namespace mesh::cli
