// The one list of registered kernel variants. Adding a kernel: write its folder
// under src/kernels/<family>/, declare its variant function here and put it in
// the list (fastest first). Developer kernels are listed in
// src/kernels/dev/dev_kernels.cpp instead.
#include <algorithm>
#include <string>
#include <utility>

#include "flashlab/kernel_registry.h"
#include "host_path.h"

namespace flashlab {

KernelVariant fa1_scalar_variant();    // flashlab_kernels_sm80
KernelVariant fa2_mma_sm80_variant();  // flashlab_kernels_sm80
KernelVariant fa3_wgmma_sm90_variant();  // flashlab_kernels_sm90a

const std::vector<KernelVariant>& registered_kernels() {
  // "auto" picks the first kernel that supports a problem and the device: fastest first.
  static const std::vector<KernelVariant> kernels = {
      fa3_wgmma_sm90_variant(),  // sm_90a only: other devices go on to fa2
      fa2_mma_sm80_variant(),
      fa1_scalar_variant(),
  };
  return kernels;
}

const KernelVariant* find_kernel(std::string_view name) {
  const auto& kernels = registered_kernels();
  const auto found = std::find_if(kernels.begin(), kernels.end(),
                                  [&](const KernelVariant& kernel) { return kernel.name == name; });
  return found == kernels.end() ? nullptr : &*found;
}

std::string registered_kernel_names() {
  std::string names;
  for (const auto& kernel : registered_kernels()) names += (names.empty() ? "" : ", ") + kernel.name;
  return names;
}

int padded_head_dim(const KernelVariant& kernel, int head_dim) {
  return kernel.padded_head_dim != nullptr ? kernel.padded_head_dim(head_dim) : head_dim;
}

std::string compute_capability_text(int compute_capability) {
  return std::to_string(compute_capability / 10) + "." + std::to_string(compute_capability % 10);
}

std::string architecture_reason(const KernelVariant& kernel, int compute_capability) {
  if (compute_capability == 0 || kernel.architectures.runs_on == nullptr ||
      kernel.architectures.runs_on(compute_capability))
    return {};
  return kernel.name + " runs on " + kernel.architectures.description + "; this device has " +
         compute_capability_text(compute_capability);
}

std::string score_modification_reason(const KernelVariant& kernel, const ScoreModificationParams& modification,
                                      KernelVariant::ScoreModifications KernelVariant::*mode,
                                      const char* mode_words) {
  using Support = KernelVariant::ScoreModifications;
  const std::pair<const char*, bool Support::*> asked[] = {
      {modification.softcap != 0.f ? "softcap" : nullptr, &Support::softcap},
      {modification.alibi_slopes != nullptr ? "alibi_slopes" : nullptr, &Support::alibi},
      {modification.sinks != nullptr ? "sinks" : nullptr, &Support::sinks}};
  std::string missing, having;
  for (const auto& [name, member] : asked) {
    if (name == nullptr || (kernel.*mode).*member) continue;
    missing += (missing.empty() ? "" : ", ") + std::string(name);
    for (const auto& other : registered_kernels())
      if ((other.*mode).*member && having.find(other.name) == std::string::npos)
        having += (having.empty() ? "" : ", ") + other.name;
  }
  if (missing.empty()) return "";
  const std::string whose = *mode_words == '\0' ? "kernels that do" : "kernels whose" + std::string(mode_words + 2) + " does";
  return kernel.name + mode_words + " does not apply " + missing + " (" + whose + ": " +
         (having.empty() ? "none" : having) + ")";
}

std::string cannot_run_reason(const KernelVariant& kernel, const AttentionParams& params) {
  return detail::mode_cannot_run_reason(kernel, params);
}
std::string cannot_run_reason(const KernelVariant& kernel, const AttentionBackwardParams& params) {
  return detail::mode_cannot_run_reason(kernel, params);
}
std::string cannot_run_reason(const KernelVariant& kernel, const KvCacheParams& params) {
  return detail::mode_cannot_run_reason(kernel, params);
}

}  // namespace flashlab
