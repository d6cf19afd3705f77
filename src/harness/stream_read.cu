// enqueue_stream_read (event_timer.h): a read-only streaming kernel, what
// reading the same bytes alone costs (a reference for memory-bound kernels).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "flashlab/cuda_check.h"
#include "flashlab/harness/event_timer.h"

namespace flashlab {
namespace {

__device__ int stream_read_sink;  // written only if the XOR of every word is the marker: never in practice

// Grid-stride over the 16-byte words of a then b, kUnroll loads in flight a
// thread before any is used; streaming loads (evict-first in L1 and L2).
template <int kUnroll>
__global__ void __launch_bounds__(256) stream_read_kernel(const int4* a, size_t a_words, const int4* b,
                                                          size_t b_words) {
  const size_t total = a_words + b_words;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const auto load = [&](size_t word) { return word < a_words ? __ldcs(a + word) : __ldcs(b + (word - a_words)); };
  int acc = 0;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < total; i += kUnroll * stride) {
    int4 words[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) words[u] = load(i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= words[u].x ^ words[u].y ^ words[u].z ^ words[u].w;
  }
  for (; i < total; i += stride) {
    const int4 word = load(i);
    acc ^= word.x ^ word.y ^ word.z ^ word.w;
  }
  if (acc == 0x7fffffff) stream_read_sink = acc;
}

}  // namespace

void enqueue_stream_read(const void* a, size_t a_bytes, const void* b, size_t b_bytes, int blocks_per_sm,
                         cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(a) % 16 != 0 || reinterpret_cast<uintptr_t>(b) % 16 != 0 || a_bytes % 16 != 0 ||
      b_bytes % 16 != 0 || blocks_per_sm < 1)
    throw std::invalid_argument("enqueue_stream_read reads 16-byte words: buffers 16-byte aligned, sizes multiples "
                                "of 16 bytes, at least one block an SM; got sizes " + std::to_string(a_bytes) +
                                " and " + std::to_string(b_bytes) + ", " + std::to_string(blocks_per_sm) +
                                " blocks an SM");
  int device = 0, sms = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&device));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  stream_read_kernel<4><<<sms * blocks_per_sm, 256, 0, stream>>>(static_cast<const int4*>(a), a_bytes / 16,
                                                                   static_cast<const int4*>(b), b_bytes / 16);
  FLASHLAB_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashlab
