#include "flashlab/harness/random_inputs.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <curand.h>

#include "flashlab/harness/normal_from_bits.h"

#include <algorithm>
#include <list>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

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

// cuRAND's host MT19937 takes seconds to seed (curandGenerateSeeds on the
// first draw: about 4 s on this project's 2-core machine), which made every
// problem on the CPU (flashlab.testing without a GPU, its CPU tests) cost
// seconds. A seed's values are one fixed sequence and a shape takes a prefix of
// it, so the last few seeds' values are kept: a draw that fits in a kept
// prefix is a copy of it, bit for bit what the generator gives.
class HostValueCache {
 public:
  // The first `count` values of `seed`'s sequence, or an undefined tensor.
  at::Tensor find(uint64_t seed, int64_t count) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (auto entry = entries_.begin(); entry != entries_.end(); ++entry) {
      if (entry->first != seed || entry->second.numel() < count) continue;
      entries_.splice(entries_.begin(), entries_, entry);  // most recently used first
      return entries_.front().second.narrow(0, 0, count).clone();
    }
    return {};
  }
  void keep(uint64_t seed, const at::Tensor& values) {
    if (values.numel() > kMostValues) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    entries_.remove_if([&](const auto& entry) { return entry.first == seed; });
    entries_.emplace_front(seed, values.flatten().clone());
    if (entries_.size() > kEntries) entries_.pop_back();
  }

 private:
  static constexpr int64_t kMostValues = int64_t(1) << 24;  // 64 MiB of float32 an entry
  static constexpr size_t kEntries = 8;
  std::mutex mutex_;
  std::list<std::pair<uint64_t, at::Tensor>> entries_;
};

HostValueCache& host_value_cache() {
  static HostValueCache cache;
  return cache;
}

}  // namespace

at::Tensor mt19937_normal(at::IntArrayRef shape, uint64_t seed, at::Device device) {
  if (!device.is_cpu()) return mt19937_normal_in_calls(shape, seed, device, kMostMt19937BitsPerCall);
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  if (at::Tensor kept = host_value_cache().find(seed, count); kept.defined()) return kept.view(shape);
  at::Tensor values = mt19937_normal_in_calls(shape, seed, device, kMostMt19937BitsPerCall);
  host_value_cache().keep(seed, values);
  return values;
}

at::Tensor mt19937_normal_in_calls(at::IntArrayRef shape, uint64_t seed, at::Device device,
                                   int64_t most_bits_per_call) {
  TORCH_CHECK(most_bits_per_call >= 2 && most_bits_per_call % 2 == 0,
              "mt19937_normal_in_calls: the call size must be even and >= 2; got ", most_bits_per_call);
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  TORCH_CHECK(count >= 0, "mt19937_normal: negative shape ", shape);
  const bool on_host = device.is_cpu();
  TORCH_CHECK(on_host || device.is_cuda(), "mt19937_normal: device must be cpu or cuda, got ",
              device);
  std::optional<c10::cuda::CUDAGuard> guard;
  if (!on_host) guard.emplace(device);
  // Raw 32-bit MT19937 outputs are identical on host and device; the normal
  // transform is ours (normal_from_bits.h) so that it is identical too.
  const int64_t bit_count = std::max<int64_t>(count + (count % 2), 2);
  const auto options = at::TensorOptions().device(device);
  at::Tensor bits = at::empty({bit_count}, options.dtype(at::kInt));
  at::Tensor values = at::empty({count}, options.dtype(at::kFloat));
  Generator generator(on_host);
  FLASHLAB_CURAND_CHECK(curandSetPseudoRandomGeneratorSeed(generator.handle, seed));
  auto* bit_data = reinterpret_cast<uint32_t*>(bits.data_ptr<int32_t>());
  const auto generate_bits = [&] {
    for (int64_t first = 0; first < bit_count; first += most_bits_per_call)
      FLASHLAB_CURAND_CHECK(curandGenerate(generator.handle, bit_data + first,
                                           static_cast<size_t>(std::min(most_bits_per_call, bit_count - first))));
  };
  if (on_host) {
    generate_bits();
    float* out = values.data_ptr<float>();
    for (int64_t pair = 0; 2 * pair < count; ++pair) {
      float z0, z1;
      normal_pair_from_bits(bit_data[2 * pair], bit_data[2 * pair + 1], z0, z1);
      out[2 * pair] = z0;
      if (2 * pair + 1 < count) out[2 * pair + 1] = z1;
    }
  } else {
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    FLASHLAB_CURAND_CHECK(curandSetStream(generator.handle, stream));
    generate_bits();
    normal_from_bits_on_device(bit_data, values.data_ptr<float>(), count, stream);
  }
  return values.view(shape);
}

}  // namespace flashlab
