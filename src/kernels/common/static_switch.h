// One list of head dims per kernel, and the static switch over it (flash-attn's
// static_switch.h idea). The list drives the kernel's support check, its
// messages, its tile shape and its launch dispatch; CMake reads the line
//   using HeadDims = HeadDimList<32, 64, ...>;
// of <kernel folder>/<kernel>.h to generate one .cu per head dim from the
// folder's *.cu.in template (cmake/FlashlabKernels.cmake). Adding a head dim is
// one edit of that line.
#pragma once

#include <string>
#include <type_traits>

namespace flashlab {

template <int... Values>
struct HeadDimList {
  static_assert(sizeof...(Values) > 0, "an empty head-dim list");
  static constexpr int kMax = [] {
    int largest = 0;
    ((largest = Values > largest ? Values : largest), ...);
    return largest;
  }();

  static constexpr bool contains(int value) { return ((value == Values) || ...); }

  // "32, 64, 96" (or with another separator: "32/64/96").
  static std::string text(const char* separator = ", ") {
    std::string joined;
    ((joined += (joined.empty() ? "" : separator) + std::to_string(Values)), ...);
    return joined;
  }

  // The smallest entry >= value, 0 when every entry is smaller: the head dim
  // a kernel with this list runs `value` at when the op layer zero-pads
  // (KernelVariant::padded_head_dim).
  static constexpr int round_up(int value) {
    int found = 0;
    ((found = (Values >= value && (found == 0 || Values < found)) ? Values : found), ...);
    return found;
  }

  // Calls body(std::integral_constant<int, V>{}) for the entry V equal to
  // value; false when there is none.
  template <class Body>
  static bool dispatch(int value, Body&& body) {
    return ((value == Values ? (body(std::integral_constant<int, Values>{}), true) : false) || ...);
  }

  // The same for the first entry >= value (lists in increasing order: a kernel
  // that pads head_dim up to its instantiations).
  template <class Body>
  static bool dispatch_round_up(int value, Body&& body) {
    return ((value <= Values ? (body(std::integral_constant<int, Values>{}), true) : false) || ...);
  }
};

}  // namespace flashlab

// FLASHLAB_HEAD_DIM_SWITCH(List, value, kHeadDim, [&] { run<kHeadDim>(params); })
// runs the lambda with kHeadDim a constant equal to value; evaluates to false
// when the list does not hold value. FLASHLAB_HEAD_DIM_ROUND_UP_SWITCH: with
// kHeadDim the first entry >= value.
#define FLASHLAB_HEAD_DIM_SWITCH(LIST, VALUE, CONST_NAME, ...)          \
  (LIST::dispatch((VALUE), [&](auto flashlab_head_dim_) {               \
    constexpr int CONST_NAME = decltype(flashlab_head_dim_)::value;     \
    (__VA_ARGS__)();                                                    \
  }))
#define FLASHLAB_HEAD_DIM_ROUND_UP_SWITCH(LIST, VALUE, CONST_NAME, ...) \
  (LIST::dispatch_round_up((VALUE), [&](auto flashlab_head_dim_) {      \
    constexpr int CONST_NAME = decltype(flashlab_head_dim_)::value;     \
    (__VA_ARGS__)();                                                    \
  }))

// FLASHLAB_FP16_BF16_SWITCH(params.dtype, Element, [&] { launch<Tr, Element>(params); })
// runs the lambda with Element = __nv_bfloat16 for DataType::bfloat16 and __half
// otherwise (for kernels that take the two 16-bit types; their unsupported_reason
// rules out float32). The caller includes cuda_fp16.h and cuda_bf16.h.
#define FLASHLAB_FP16_BF16_SWITCH(DTYPE, TYPE_NAME, ...)     \
  [&] {                                                      \
    if ((DTYPE) == ::flashlab::DataType::bfloat16) {         \
      using TYPE_NAME = __nv_bfloat16;                       \
      return (__VA_ARGS__)();                                \
    } else {                                                 \
      using TYPE_NAME = __half;                              \
      return (__VA_ARGS__)();                                \
    }                                                        \
  }()
