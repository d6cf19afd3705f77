#include "flashlab/random_inputs.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <curand.h>

#include <stdexcept>
#include <string>

namespace flashlab {
namespace {

void check_curand(curandStatus_t status, const char* expression) {
  if (status != CURAND_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuRAND error ") + std::to_string(status) + " from " +
                             expression);
}
#define FLASHLAB_CURAND_CHECK(expr) check_curand((expr), #expr)

// Owns a generator so that an exception cannot leak it.
struct Generator {
  curandGenerator_t handle = nullptr;
  explicit Generator(bool on_host) {
    if (on_host)
      FLASHLAB_CURAND_CHECK(curandCreateGeneratorHost(&handle, CURAND_RNG_PSEUDO_MT19937));
    else
      FLASHLAB_CURAND_CHECK(curandCreateGenerator(&handle, CURAND_RNG_PSEUDO_MT19937));
  }
  ~Generator() { curandDestroyGenerator(handle); }
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;
};

}  // namespace

at::Tensor mt19937_normal(at::IntArrayRef shape, uint64_t seed, at::Device device) {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  TORCH_CHECK(count >= 0, "mt19937_normal: negative shape ", shape);
  // Box-Muller makes values in pairs, so cuRAND wants an even count.
  const int64_t generated = count + (count % 2);
  const bool on_host = device.is_cpu();
  TORCH_CHECK(on_host || device.is_cuda(), "mt19937_normal: device must be cpu or cuda, got ",
              device);
  std::optional<c10::cuda::CUDAGuard> guard;
  if (!on_host) guard.emplace(device);
  at::Tensor values = at::empty({std::max<int64_t>(generated, 2)},
                                at::TensorOptions().dtype(at::kFloat).device(device));
  Generator generator(on_host);
  FLASHLAB_CURAND_CHECK(curandSetPseudoRandomGeneratorSeed(generator.handle, seed));
  if (!on_host)
    FLASHLAB_CURAND_CHECK(curandSetStream(
        generator.handle, c10::cuda::getCurrentCUDAStream(device.index()).stream()));
  FLASHLAB_CURAND_CHECK(
      curandGenerateNormal(generator.handle, values.data_ptr<float>(), values.numel(), 0.f, 1.f));
  return values.narrow(0, 0, count).view(shape);
}

}  // namespace flashlab
