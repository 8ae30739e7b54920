#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "backends/cuda/copy_2d.h"

namespace mesh::cuda {
namespace {

// Words each thread loads before it stores any: 64 bytes in flight per
// thread (16 words at most), enough to cover HBM latency with a modest grid.
template <typename Word>
constexpr int kWordsPerThread = sizeof(Word) >= 4 ? 64 / static_cast<int>(sizeof(Word)) : 16;
constexpr unsigned kThreads = 256;
// Blocks per launch, at most: enough to fill every SM of current parts
// several times over; the loops stride over anything larger.
constexpr unsigned kMaxBlocks = 4096;

// One block is (tx, ty) threads: ty rows at a time, tx threads along a row,
// each thread moving kWordsPerThread<Word> words tx apart. The grid strides over rows
// (y) and over row segments (x).
template <typename Word>
__global__ void Copy2DKernel(char* __restrict__ dst, size_t dst_pitch, const char* __restrict__ src,
                             size_t src_pitch, size_t words, size_t rows) {
  const size_t row_step = static_cast<size_t>(gridDim.y) * blockDim.y;
  constexpr int kUnroll = kWordsPerThread<Word>;
  const size_t seg = static_cast<size_t>(blockDim.x) * kUnroll;
  const size_t seg_step = static_cast<size_t>(gridDim.x) * seg;
  for (size_t row = static_cast<size_t>(blockIdx.y) * blockDim.y + threadIdx.y; row < rows;
       row += row_step) {
    const Word* s = reinterpret_cast<const Word*>(src + row * src_pitch);
    Word* d = reinterpret_cast<Word*>(dst + row * dst_pitch);
    for (size_t base = static_cast<size_t>(blockIdx.x) * seg + threadIdx.x; base < words;
         base += seg_step) {
      Word v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const size_t i = base + static_cast<size_t>(u) * blockDim.x;
        if (i < words) v[u] = s[i];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const size_t i = base + static_cast<size_t>(u) * blockDim.x;
        if (i < words) d[i] = v[u];
      }
    }
  }
}

template <typename Word>
cudaError_t Launch(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                   size_t rows, cudaStream_t stream) {
  constexpr size_t kPerThread = static_cast<size_t>(kWordsPerThread<Word>);
  const size_t words = width / sizeof(Word);
  // Threads along a row: enough for one pass over a row of kPerThread words
  // each, a power of two up to the whole block. Narrow rows leave the rest
  // of each warp to the next rows, so no lane idles.
  unsigned tx = 1;
  while (tx < kThreads && tx * kPerThread < words) tx *= 2;
  const unsigned ty = kThreads / tx;
  const size_t segs = (words + tx * kPerThread - 1) / (tx * kPerThread);
  const size_t row_blocks = (rows + ty - 1) / ty;
  const unsigned gx = static_cast<unsigned>(std::min<size_t>(segs, kMaxBlocks));
  const unsigned gy = static_cast<unsigned>(
      std::min<size_t>({row_blocks, std::max<size_t>(1, kMaxBlocks / gx), 65535}));
  Copy2DKernel<Word><<<dim3(gx, gy), dim3(tx, ty), 0, stream>>>(
      static_cast<char*>(dst), dst_pitch, static_cast<const char*>(src), src_pitch, words, rows);
  return cudaGetLastError();
}

}  // namespace

int Copy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                size_t rows, void* stream) {
  if (rows == 0 || width == 0) return cudaSuccess;
  // The widest word that every address of every row is aligned to.
  const uintptr_t bits = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) |
                         dst_pitch | src_pitch | width;
  auto* s = static_cast<cudaStream_t>(stream);
  if (bits % 16 == 0) return Launch<int4>(dst, dst_pitch, src, src_pitch, width, rows, s);
  if (bits % 8 == 0) return Launch<int2>(dst, dst_pitch, src, src_pitch, width, rows, s);
  if (bits % 4 == 0) return Launch<int>(dst, dst_pitch, src, src_pitch, width, rows, s);
  if (bits % 2 == 0) return Launch<short>(dst, dst_pitch, src, src_pitch, width, rows, s);
  return Launch<char>(dst, dst_pitch, src, src_pitch, width, rows, s);
}

}  // namespace mesh::cuda
