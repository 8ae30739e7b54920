// meshctl: see cli/meshctl.h and docs/cli.md.
#include <iostream>

#include "cli/meshctl.h"

int main(int argc, char** argv) { return mesh::cli::RunMeshctl(argc, argv, std::cout, std::cerr); }
