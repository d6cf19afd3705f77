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

at::Tensor cpu_tensor(at::IntArrayRef shape, at::ScalarType dtype) {
  return at::zeros(shape, at::TensorOptions().dtype(dtype));
}

void expect_rejected(const std::function<void()>& call, std::initializer_list<std::string> fragments) {
  try {
    call();
  } catch (const c10::Error& error) {
    const std::string message = error.what_without_backtrace();
    for (const auto& fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message lacks '" << fragment << "':\n" << message;
    return;
  }
  ADD_FAILURE() << "expected a c10::Error";
}

}  // namespace flashlab::testing
