// Where one batch entry's rows live, written once for fixed-length and
// variable-length (cu_seqlens) batches: its lengths and the element offsets of
// its first row in q, k, v, out, and its first LSE row. Host and device.
#pragma once

#include <cstdint>

#include "flashlab/kernel_params.h"

namespace flashlab {

struct SequenceView {
  int seqlen_q = 0, seqlen_k = 0;
  int64_t q_offset = 0, k_offset = 0, v_offset = 0, out_offset = 0;
  int64_t lse_row0 = 0;  // add to b * lse_batch_stride + h * lse_head_stride
  // First row of this sequence in the packed q and k/v (0 for fixed length).
  int q_row0 = 0, k_row0 = 0;
};

FLASHLAB_HOST_DEVICE inline SequenceView sequence_view(const AttentionParams& p, int batch) {
  SequenceView view;
  if (p.cu_seqlens_q != nullptr) {
    const int start = p.cu_seqlens_q[batch];
    view.seqlen_q = p.cu_seqlens_q[batch + 1] - start;
    view.q_offset = start * p.q_row_stride;
    view.out_offset = start * p.out_row_stride;
    view.lse_row0 = start;
    view.q_row0 = start;
  } else {
    view.seqlen_q = p.seqlen_q;
    view.q_offset = batch * p.q_batch_stride;
    view.out_offset = batch * p.out_batch_stride;
  }
  if (p.cu_seqlens_k != nullptr) {
    const int start = p.cu_seqlens_k[batch];
    view.seqlen_k = p.cu_seqlens_k[batch + 1] - start;
    view.k_offset = start * p.k_row_stride;
    view.v_offset = start * p.v_row_stride;
    view.k_row0 = start;
  } else {
    view.seqlen_k = p.seqlen_k;
    view.k_offset = batch * p.k_batch_stride;
    view.v_offset = batch * p.v_batch_stride;
  }
  return view;
}

// Where sequence `batch` (first packed row first_row) starts when every
// sequence is laid out from a multiple of `block` on (FA3's rule for its padded
// statistics): floor((first_row + batch * block) / block) * block. Each sequence's
// rows, rounded up to whole blocks, end at or before the next one's start, and
// `batch` sequences of `total` rows fit in total + batch * block.
FLASHLAB_HOST_DEVICE inline int64_t padded_sequence_start(int64_t first_row, int batch, int block) {
  return (first_row + static_cast<int64_t>(batch) * block) / block * block;
}

// The backward pass's tensors follow the same rule: dout and dq rows like q
// (cu_seqlens_q), dk and dv rows like k (cu_seqlens_k), the float32 dq
// accumulator like q with its own strides; softmax_d like the LSE (lse_row0).
struct BackwardSequenceView : SequenceView {
  int64_t dout_offset = 0, dq_offset = 0, dk_offset = 0, dv_offset = 0, dq_accum_offset = 0;
};

FLASHLAB_HOST_DEVICE inline BackwardSequenceView backward_sequence_view(
    const AttentionBackwardParams& p, int batch) {
  BackwardSequenceView view;
  static_cast<SequenceView&>(view) = sequence_view(p, batch);
  if (p.cu_seqlens_q != nullptr) {
    view.dout_offset = view.q_row0 * p.dout_row_stride;
    view.dq_offset = view.q_row0 * p.dq_row_stride;
    // The accumulator pads every sequence by dq_accum_batch_stride elements.
    view.dq_accum_offset = view.q_row0 * p.dq_accum_row_stride + batch * p.dq_accum_batch_stride;
  } else {
    view.dout_offset = batch * p.dout_batch_stride;
    view.dq_offset = batch * p.dq_batch_stride;
    view.dq_accum_offset = batch * p.dq_accum_batch_stride;
  }
  if (p.cu_seqlens_k != nullptr) {
    view.dk_offset = view.k_row0 * p.dk_row_stride;
    view.dv_offset = view.k_row0 * p.dv_row_stride;
  } else {
    view.dk_offset = batch * p.dk_batch_stride;
    view.dv_offset = batch * p.dv_batch_stride;
  }
  return view;
}

}  // namespace flashlab
