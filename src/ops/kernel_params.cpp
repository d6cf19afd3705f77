#include <sstream>

#include "flashlab/kernel_params.h"

namespace flashlab {

const char* data_type_name(DataType dtype) {
  switch (dtype) {
    case DataType::float32: return "fp32";
    case DataType::float16: return "fp16";
    case DataType::bfloat16: return "bf16";
    case DataType::e4m3: return "e4m3";
  }
  return "unknown";
}

std::string describe_problem(const AttentionParams& params) {
  std::ostringstream text;
  text << (params.is_varlen() ? "varlen batch " : "batch ") << params.batch << ", heads "
       << params.heads << "/" << params.kv_heads << ", seqlen " << params.seqlen_q << "x"
       << params.seqlen_k << ", head_dim " << params.head_dim << ", "
       << data_type_name(params.dtype);
  if (params.causal() && params.window_left < 0)
    text << ", causal";
  else if (params.window_left >= 0 || params.window_right >= 0)
    text << ", window (" << params.window_left << ", " << params.window_right << ")";
  return text.str();
}

std::string describe_kvcache_problem(const KvCacheParams& params) {
  std::ostringstream text;
  text << describe_problem(params) << ", kv cache ";
  if (params.is_paged())
    text << "paged " << params.block_table_width << " x " << params.page_size << " rows";
  else
    text << "contiguous " << params.seqlen_k << " rows";
  if (params.seqlen_new > 0) text << ", append " << params.seqlen_new;
  return text.str();
}

}  // namespace flashlab
