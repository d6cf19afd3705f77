// The torch-facing entry points. Tensors are (batch, seqlen, heads, head_dim),
// like flash_attn_func; every input is validated before anything is launched.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "flashlab/kernel_registry.h"

namespace flashlab {

struct AttentionOptions {
  bool causal = false;
  std::optional<double> softmax_scale;  // default 1/sqrt(head_dim)
  std::string kernel = "auto";          // a registered kernel name, or "auto"
  int window_left = -1;                 // -1: unbounded
  int window_right = -1;                // -1: unbounded; causal forces 0
  TileTrace trace;                      // optional per-tile state recording
};

struct AttentionOutput {
  at::Tensor out;  // (batch, seqlen_q, heads, head_dim), input dtype
  at::Tensor lse;  // (batch, heads, seqlen_q), float32
};

AttentionOutput attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const AttentionOptions& options = {});

// Writes into caller-provided buffers (the tests poison them first).
void attention_forward_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& out, const at::Tensor& lse,
                            const AttentionOptions& options = {});

// The kernel that would run this problem: options.kernel when it is a known name
// that supports the problem, else (for "auto") the first registered kernel that
// does. Throws c10::Error with the reason otherwise.
const KernelVariant& select_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const AttentionOptions& options);

// The parameter block for these tensors (no launch, no device access).
AttentionParams make_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& out, const at::Tensor& lse,
                            const AttentionOptions& options);

}  // namespace flashlab
