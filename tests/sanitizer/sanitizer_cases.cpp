// Prints the compute-sanitizer cases (sanitizer_cases() in kernel_cases.h), one
// line each: the case's name, a tab, and its flashlab-run options.
// Usage: flashlab_sanitizer_cases [--compute-capability N]  (N: 90 for sm_90; only cases
// a device of that capability runs; default: every case)
#include <cstdlib>
#include <iostream>
#include <string>

#include "kernel_cases.h"

int main(int argc, char** argv) {
  int compute_capability = 0;
  for (int index = 1; index < argc; ++index) {
    const std::string flag = argv[index];
    if (flag == "--compute-capability" && index + 1 < argc) {
      compute_capability = std::atoi(argv[++index]);
    } else {
      std::cerr << "usage: flashlab_sanitizer_cases [--compute-capability N]\n";
      return 2;
    }
  }
  for (const auto& kernel_case : flashlab::testing::sanitizer_cases(compute_capability))
    std::cout << kernel_case.name << "\t" << flashlab::testing::flashlab_run_arguments(kernel_case.spec)
              << "\n";
  return 0;
}
