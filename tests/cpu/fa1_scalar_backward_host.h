// fa1_scalar's backward run on the host: the kernels' per-thread functions
// (preprocess_thread, dk_dv_thread, dq_thread) called for every block and
// thread of the grids backward_launch would launch, in launch order, with
// std::vector scratch in place of shared memory. No torch, no GPU: the CPU
// test checks the kernel's arithmetic, masks, GQA and varlen offsets against
// the autograd reference without a device.
#pragma once

#include "flashlab/kernel_params.h"

namespace flashlab::testing {

// params as run_backward_kernel hands them to backward_launch, with host
// pointers (CPU tensors) and params.workspace of backward_workspace_bytes.
void fa1_scalar_backward_on_host(const AttentionBackwardParams& params);

}  // namespace flashlab::testing
