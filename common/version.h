// Version and build features of this Mesh build.
#pragma once

#include <string>
#include <vector>

#include "mesh/config.h"

namespace mesh {

// Wire-protocol major version: the "v1" in proto package mesh.v1. Clients and
// servers with different protocol versions refuse to talk to each other.
inline constexpr int kProtocolVersion = 1;

// "0.1.0".
inline constexpr const char* kVersion = MESH_VERSION_STRING;

// Features compiled into this build, e.g. {"gloo", "cuda", "nccl"}.
std::vector<std::string> BuildFeatures();

}  // namespace mesh
