#include "common/version.h"

namespace mesh {

std::vector<std::string> BuildFeatures() {
  std::vector<std::string> features;
  if (MESH_HAVE_GLOO) features.push_back("gloo");
  if (MESH_HAVE_CUDA) features.push_back("cuda");
  if (MESH_HAVE_NCCL) features.push_back("nccl");
  return features;
}

}  // namespace mesh
