// The GPU side of normal_from_bits.h: one thread per pair of values.
#include "flashlab/cuda_check.h"
#include "flashlab/harness/normal_from_bits.h"

namespace flashlab {
namespace {

__global__ void normal_from_bits_kernel(const uint32_t* bits, float* out, int64_t count) {
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (2 * pair >= count) return;
  float z0, z1;
  normal_pair_from_bits(bits[2 * pair], bits[2 * pair + 1], z0, z1);
  out[2 * pair] = z0;
  if (2 * pair + 1 < count) out[2 * pair + 1] = z1;
}

}  // namespace

void normal_from_bits_on_device(const uint32_t* bits, float* out, int64_t count, void* stream) {
  if (count == 0) return;
  const int threads = 256;
  const int64_t pairs = (count + 1) / 2;
  normal_from_bits_kernel<<<static_cast<unsigned>((pairs + threads - 1) / threads), threads, 0,
                            static_cast<cudaStream_t>(stream)>>>(bits, out, count);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw_cuda_error(status, "normal_from_bits_kernel launch", __FILE__, __LINE__);
}

}  // namespace flashlab
