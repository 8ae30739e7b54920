// Configuration precedence for every Mesh binary:
//
//   command-line flag  >  environment (MESH_*)  >  config file  >  default
//
// Flags and environment come from CLI11 (each option declares its env name
// with ->envname()). CLI11 on its own would let a config file beat the
// environment, so the config file is applied here, after parsing, and only to
// options that neither a flag nor the environment has set.
//
// The config file is YAML: a flat map whose keys are the long option names,
// with '-' or '_' ("heartbeat-timeout" or "heartbeat_timeout"). Scalars
// give one value; sequences give several, for options that take several.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"

namespace mesh {

// Applies the YAML config file at `path` to the options of `app` that have
// no value yet from a flag or the environment, and runs their callbacks and
// validators. Call it after a successful app.parse().
//
// Possible errors: NOT_FOUND (no such file), INVALID_ARGUMENT (not YAML, not
// a flat map, a key that names no option, a value an option rejects). On
// error no option has been changed by the file.
absl::Status ApplyConfigFile(CLI::App& app, const std::string& path);

}  // namespace mesh
