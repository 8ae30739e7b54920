// The corpus runner: a main() for a libFuzzer harness built without
// libFuzzer (gcc, `make test`). It runs LLVMFuzzerTestOneInput once on every
// regular file under each directory or file named on the command line, in
// name order, so the seed corpus and every reproducer kept in
// tests/fuzz/corpus/<target>/ replay as a regression test.
//
// Exit status: 0 when every input ran (a harness reports a broken invariant
// by aborting, which ends the process); 1 when no input was found (an empty
// corpus would make the test pass without testing anything) or an argument
// cannot be read.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// Regular files at `path` (itself, or everything below it), sorted.
bool CollectInputs(const std::filesystem::path& path, std::vector<std::filesystem::path>& out) {
  std::error_code error;
  if (std::filesystem::is_regular_file(path, error)) {
    out.push_back(path);
    return true;
  }
  if (!std::filesystem::is_directory(path, error)) {
    std::fprintf(stderr, "corpus: %s: not a file or directory\n", path.c_str());
    return false;
  }
  std::vector<std::filesystem::path> found;
  for (auto it = std::filesystem::recursive_directory_iterator(path, error);
       !error && it != std::filesystem::recursive_directory_iterator(); it.increment(error)) {
    if (it->is_regular_file()) found.push_back(it->path());
  }
  if (error) {
    std::fprintf(stderr, "corpus: %s: %s\n", path.c_str(), error.message().c_str());
    return false;
  }
  std::sort(found.begin(), found.end());
  out.insert(out.end(), found.begin(), found.end());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> inputs;
  for (int i = 1; i < argc; ++i) {
    if (!CollectInputs(argv[i], inputs)) return 1;
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "corpus: no inputs (usage: %s DIR_OR_FILE...)\n", argv[0]);
    return 1;
  }
  for (const std::filesystem::path& input : inputs) {
    std::ifstream in(input, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "corpus: %s: cannot read\n", input.c_str());
      return 1;
    }
    std::fprintf(stderr, "corpus: %s (%zu bytes)\n", input.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::fprintf(stderr, "corpus: %zu inputs ran\n", inputs.size());
  return 0;
}
