// Prints the compute-sanitizer cases, one line each: the case's name, a tab,
// and its flashlab-run options. The forward's by default (sanitizer_cases() in
// kernel_cases.h), the backward's with --backward (backward_sanitizer_cases():
// --backward, one --deterministic), the KV-cache path's with --kvcache
// (kvcache_sanitizer_cases() in kvcache_cases.h).
// Usage: flashlab_sanitizer_cases [--backward | --kvcache] [--compute-capability N]
//   (N: 90 for sm_90; only cases a device of that capability runs; default: every case)
#include <cstdlib>
#include <iostream>
#include <string>

#include "kernel_cases.h"
#include "kvcache_cases.h"

int main(int argc, char** argv) {
  int compute_capability = 0;
  std::string pass = "forward";
  for (int index = 1; index < argc; ++index) {
    const std::string flag = argv[index];
    if (flag == "--compute-capability" && index + 1 < argc) {
      compute_capability = std::atoi(argv[++index]);
    } else if ((flag == "--backward" || flag == "--kvcache") && pass == "forward") {
      pass = flag.substr(2);
    } else {
      std::cerr << "usage: flashlab_sanitizer_cases [--backward | --kvcache] [--compute-capability N]\n";
      return 2;
    }
  }
  namespace testing = flashlab::testing;
  if (pass == "kvcache") {
    for (const auto& kernel_case : testing::kvcache_sanitizer_cases(compute_capability))
      std::cout << kernel_case.name << "\t" << testing::kvcache_run_arguments(kernel_case.spec) << "\n";
    return 0;
  }
  const auto cases = pass == "backward" ? testing::backward_sanitizer_cases(compute_capability)
                                        : testing::sanitizer_cases(compute_capability);
  for (const auto& kernel_case : cases)
    std::cout << kernel_case.name << "\t" << testing::flashlab_run_arguments(kernel_case) << "\n";
  return 0;
}
