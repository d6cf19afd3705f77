// FLASHLAB_SYNC_LAUNCH=1: a kernel that faults is reported at its own launch,
// with the kernel's name and the problem, instead of at some later CUDA call.
#include <gtest/gtest.h>

#include <cstdlib>

#include "flashlab/cuda_check.h"
#include "flashlab/kernel_registry.h"
#include "test_support.h"

namespace flashlab {
namespace {

TEST(SynchronousLaunchChecks, FaultNamesKernelAndProblem) {
  FLASHLAB_REQUIRE_GPU();
  // Each CTest test is its own process, so the switch and the sticky fault stay here.
  setenv("FLASHLAB_SYNC_LAUNCH", "1", 1);
  ASSERT_TRUE(synchronous_launch_checks());
  const KernelVariant* kernel = find_kernel("fa1_scalar");
  ASSERT_NE(kernel, nullptr);
  AttentionParams params;  // null tensors: the kernel's first load faults
  params.batch = 1, params.heads = 2, params.kv_heads = 1;
  params.seqlen_q = 7, params.seqlen_k = 9, params.head_dim = 32;
  params.q_row_stride = params.k_row_stride = params.v_row_stride = params.out_row_stride = 64;
  params.q_head_stride = params.k_head_stride = params.v_head_stride = params.out_head_stride = 32;
  params.dtype = DataType::float16;
  params.q = params.k = params.v = reinterpret_cast<const void*>(0x10);
  try {
    kernel->launch(params);
    FAIL() << "the faulting launch was not reported";
  } catch (const std::runtime_error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("FLASHLAB_SYNC_LAUNCH=1"), std::string::npos) << message;
    EXPECT_NE(message.find("kernel fa1_scalar"), std::string::npos) << message;
    EXPECT_NE(message.find("heads 2/1, seqlen 7x9, head_dim 32, fp16"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace flashlab
