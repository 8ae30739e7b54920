// A 2-D copy kernel on one CUDA device: `rows` runs of `width` bytes from
// `src` (rows `src_pitch` bytes apart) to `dst` (rows `dst_pitch` bytes
// apart). It does what cudaMemcpy2DAsync does between two buffers of the
// same device, at the device's copy bandwidth: the copy engine behind
// cudaMemcpy2D moves narrow rows (a few KiB, the shape of a DTensor shard
// block) at about half of it. Private to libmesh; sharding::CopyStrided
// uses it to pack and unpack shards.
//
// Each thread moves the widest word (16, 8, 4, 2 or 1 bytes) that divides
// both base addresses, both pitches and the width, several words in flight
// at a time.
//
// The header is CUDA-free (the stream is a void*, the result an int holding
// a cudaError_t), so host code compiled without nvcc can call it; the
// definition is compiled by nvcc, and exists only when MESH_HAVE_CUDA.
//
// Preconditions: both buffers live on the current device (or are peer
// accessible from it), rows do not overlap, and pitches are at least
// `width`. An empty copy (rows or width 0) launches nothing.
// Errors: the cudaError_t of the launch (cudaSuccess = 0); the copy itself
// runs asynchronously on `stream` (nullptr is the legacy default stream).
// Thread safety: as a kernel launch: safe from any thread.
#pragma once

#include <cstddef>

namespace mesh::cuda {

int Copy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                size_t rows, void* stream);

}  // namespace mesh::cuda
