#include "test_support.h"

#include <cstdlib>
#include <random>

namespace flashlab::testing {

uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* pinned = std::getenv("FLASHLAB_TEST_SEED")) return static_cast<uint64_t>(std::strtoull(pinned, nullptr, 10));
    return static_cast<uint64_t>(std::random_device{}() % 1000000);
  }();
  return seed;
}

}  // namespace flashlab::testing
