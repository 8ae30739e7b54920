// Runs meshctl in-process for tests: RunMeshctl with captured output.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "cli/meshctl.h"

namespace mesh::cli {

struct Result {
  int code;
  std::string out;
  std::string err;
};

// `args` without the program name.
inline Result Meshctl(std::vector<std::string> args) {
  args.insert(args.begin(), "meshctl");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int code = RunMeshctl(static_cast<int>(argv.size()), argv.data(), out, err);
  return {code, out.str(), err.str()};
}

}  // namespace mesh::cli
