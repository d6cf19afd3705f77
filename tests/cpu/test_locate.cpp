// flashlab-run --locate: every kernel's KernelVariant::locate against the
// kernel's own layout formulas, on the host (no GPU). Each (row, col) of a
// query block must map to one (thread, register slot) of one block, distinct
// from every other element's; the slot's indices must give back the row and
// column through the formulas the kernels index their accumulators with; the
// row's m and l must sit in the out element's quad; the key tiles must follow
// the variant's visiting order; the persistent fa3 grid's CTA must be the one
// its work-tile order hands the tile to; the cuda-gdb markers must be in the
// sources.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/harness/dev_kernels.h"
#include "flashlab/harness/locate.h"
#include "flashlab/kernel_registry.h"
#include "sm90/fa3_wgmma_sm90/fa3_wgmma_sm90.h"
#include "common/mma_accumulator_layout.h"
#include "sm90/fa3_wgmma_sm90/fa3_wgmma_sm90_locate.h"

namespace flashlab {
namespace {

const KernelVariant& kernel_named(const std::string& name) {
  const KernelVariant* kernel = find_any_kernel(name);
  EXPECT_NE(kernel, nullptr) << name;
  return *kernel;
}

std::vector<int> head_dims_of(const std::string& name) {
  if (name == "fa1_scalar") return {32, 64, 100, 128};
  if (name == "fa2_mma_sm80") return {32, 64, 96, 128, 256};
  return {64, 128, 256};
}

ProblemSpec spec_for(const std::string& kernel, int head_dim) {
  ProblemSpec spec;
  spec.kernel = kernel;
  spec.batch = 2;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.seqlen_q = 200;  // not a multiple of any block_q: a partial last tile
  spec.seqlen_k = 300;
  spec.head_dim = head_dim;
  spec.dtype = kernel == "fa1_scalar" ? at::kFloat : at::kHalf;
  spec.seed = 1;
  return spec;
}

// The parameter block on the host, with the tensors its pointers (cu_seqlens) point into.
struct HostParams {
  ProblemInputs inputs;
  AttentionParams params;
};
HostParams host_params(const ProblemSpec& spec) {
  HostParams host;
  with_host_shape_params(
      spec,
      [&](const ProblemSpec& shape_only, const ProblemInputs& inputs) {
        host.inputs = inputs;  // tensors are shared: host.params' pointers stay valid
        return forward_params(shape_only, inputs);
      },
      [&](const AttentionParams& params) {
        host.params = params;
        return 0;
      });
  return host;
}

// The (row in block, col) an out slot holds, by the kernel's own indexing:
//   fa1_scalar   thread threadIdx.x owns row threadIdx.x, accumulator[c] column c;
//   fa2_mma_sm80 acc_o[mt][n][h * 2 + e]: row warp * kRowsPerWarp + mt * 16 + group + 8 h,
//                column 8 n + 2 thread_in_group + e (fa2_forward_kernel's output staging);
//   fa3_wgmma_sm90 acc_o[n * 4 + h * 2 + e]: row (warpgroup - 1) * 64 + warp * 16 + group + 8 h,
//                column 8 n + 2 thread_in_group + e (fa3_forward_kernel's epilogue).
std::pair<int, int> element_of(const std::string& kernel, const RegisterSlot& slot, int block_q,
                               int threads) {
  const int t = slot.thread[0], lane = t % 32, group = lane / 4, thread_in_group = lane % 4;
  if (kernel == "fa1_scalar" || kernel == "fa1_scalar_planted_bug") return {t, slot.index.at(0)};
  if (kernel == "fa2_mma_sm80") {
    const int rows_per_warp = block_q / (threads / 32);
    const int mt = slot.index.at(0), n = slot.index.at(1), i = slot.index.at(2);
    return {(t / 32) * rows_per_warp + mt * 16 + group + (i / 2) * 8,
            n * 8 + thread_in_group * 2 + i % 2};
  }
  const int warpgroup = t / 128, warp = (t % 128) / 32, i = slot.index.at(0);
  return {(warpgroup - 1) * 64 + warp * 16 + group + ((i % 4) / 2) * 8,
          (i / 4) * 8 + thread_in_group * 2 + i % 2};
}

void check_layout(const std::string& name, const ProblemSpec& spec) {
  SCOPED_TRACE(name + ": " + spec.describe());
  const KernelVariant& kernel = kernel_named(name);
  ASSERT_NE(kernel.locate, nullptr);
  const HostParams host = host_params(spec);
  const AttentionParams& params = host.params;
  const TileShape tiles = kernel.tile_shape(params);
  const int batches = spec.is_varlen() ? static_cast<int>(spec.seqlens_q.size()) : spec.batch;
  // (block, work tile, thread, slot) -> element (a persistent CTA holds one
  // work tile at a time); blocks of (batch, head, query tile).
  std::map<std::tuple<int, int, int, int, int, int, int, std::string>, std::tuple<int, int, int, int>> owner;
  std::map<std::tuple<int, int, int>, std::tuple<int, int, int>> block_of_tile;
  for (int batch = 0; batch < batches; ++batch) {
    const int seqlen_q = spec.is_varlen() ? spec.seqlens_q[batch] : spec.seqlen_q;
    for (int head = 0; head < spec.heads; head += (spec.heads > 2 ? spec.heads - 1 : 1)) {
      for (int row = 0; row < seqlen_q; ++row) {
        for (int col = 0; col < spec.head_dim; ++col) {
          const ElementLocation at = kernel.locate(params, batch, head, row, col);
          ASSERT_TRUE(at.unavailable.empty()) << at.unavailable;
          ASSERT_EQ(at.out.size(), 1u);
          const RegisterSlot& out = at.out[0];
          // Inside the launch.
          for (int axis = 0; axis < 3; ++axis) {
            ASSERT_GE(at.block[axis], 0);
            ASSERT_LT(at.block[axis], at.grid[axis]);
            ASSERT_GE(out.thread[axis], 0);
            ASSERT_LT(out.thread[axis], at.block_threads[axis]);
          }
          ASSERT_EQ(out.warp, out.thread[0] / 32);
          ASSERT_EQ(out.lane, out.thread[0] % 32);
          // The query tile is the variant's block_q, the key tiles its block_k.
          ASSERT_EQ(at.query_block, row / tiles.block_q);
          ASSERT_EQ(at.row_in_block, row % tiles.block_q);
          ASSERT_EQ(at.block_k, tiles.block_k);
          // The slot's indices give the element back by the kernel's formulas.
          const auto [row_in_block, column] = element_of(name, out, tiles.block_q, at.block_threads[0]);
          ASSERT_EQ(row_in_block, at.row_in_block) << out.name;
          ASSERT_EQ(column, col) << out.name;
          // One element per (block, thread, slot).
          const auto key = std::make_tuple(at.block[0], at.block[1], at.block[2], batch, head,
                                           at.query_block, out.thread[0], out.name);
          const auto element = std::make_tuple(batch, head, row, col);
          const auto [it, added] = owner.emplace(key, element);
          ASSERT_TRUE(added) << out.name << " of thread " << out.thread[0] << " holds two elements";
          // One block per (batch, head, query tile), and never two tiles in one block
          // (a persistent CTA takes several work tiles: fa3 is checked apart).
          const auto tile = std::make_tuple(batch, head, at.query_block);
          const auto block = std::make_tuple(at.block[0], at.block[1], at.block[2]);
          const auto [tile_it, tile_added] = block_of_tile.emplace(tile, block);
          ASSERT_EQ(tile_it->second, block);
          // m and l: the out element's thread is among their holders, all in one
          // quad of one warp (fa1: the thread itself).
          ASSERT_EQ(at.row_max.size(), at.row_sum.size());
          bool holds_own_state = false;
          for (size_t index = 0; index < at.row_max.size(); ++index) {
            const RegisterSlot& m = at.row_max[index];
            ASSERT_EQ(m.thread[0], at.row_sum[index].thread[0]);
            ASSERT_EQ(m.warp, out.warp);
            ASSERT_EQ(m.lane / 4, out.lane / 4);
            holds_own_state |= m.thread[0] == out.thread[0];
          }
          ASSERT_TRUE(holds_own_state);
          // Key tiles in the variant's order, consecutive; the row's within them.
          for (size_t index = 1; index < at.key_tiles.size(); ++index)
            ASSERT_EQ(at.key_tiles[index], at.key_tiles[index - 1] + (kernel.key_tiles_descending ? -1 : 1));
          if (at.row_last_tile >= at.row_first_tile) {
            ASSERT_FALSE(at.key_tiles.empty());
            const auto [low, high] = std::minmax(at.key_tiles.front(), at.key_tiles.back());
            ASSERT_GE(at.row_first_tile, low);
            ASSERT_LE(at.row_last_tile, high);
          }
        }
        if (row > 2 * tiles.block_q) row += 7;  // rows past the first two tiles: a sample
      }
    }
  }
  // Fixed-length kernels with a block per query tile: distinct tiles, distinct blocks.
  if (name != "fa3_wgmma_sm90") {
    std::set<std::tuple<int, int, int>> blocks;
    for (const auto& [tile, block] : block_of_tile) ASSERT_TRUE(blocks.insert(block).second);
  }
}

const char* const kKernels[] = {"fa1_scalar", "fa2_mma_sm80", "fa3_wgmma_sm90"};

TEST(Locate, EveryRegisteredKernelDescribesItsLayout) {
  for (const auto& kernel : registered_kernels())
    EXPECT_NE(kernel.locate, nullptr) << kernel.name << " has no locate hook";
}

TEST(Locate, EachElementHasOneThreadAndSlotByTheKernelsFormulas) {
  for (const char* name : kKernels)
    for (const int head_dim : head_dims_of(name)) {
      ProblemSpec spec = spec_for(name, head_dim);
      check_layout(name, spec);
      spec.causal = true;
      check_layout(name, spec);
    }
  check_layout("fa1_scalar_planted_bug", spec_for("fa1_scalar", 64));
}

TEST(Locate, VariableLengthGqa) {
  for (const char* name : kKernels) {
    ProblemSpec spec = spec_for(name, std::string(name) == "fa3_wgmma_sm90" ? 128 : 64);
    spec.seqlens_q = {130, 0, 257};
    spec.seqlens_k = {300, 5, 64};
    spec.heads = 6;
    spec.kv_heads = 2;
    spec.causal = true;
    check_layout(name, spec);
    // A row past its sequence is refused.
    const HostParams host = host_params(spec);
    const AttentionParams& params = host.params;
    EXPECT_NE(kernel_named(name).locate(params, 1, 0, 0, 0).unavailable, "");
    EXPECT_NE(kernel_named(name).locate(params, 0, 0, 130, 0).unavailable, "");
    EXPECT_EQ(kernel_named(name).locate(params, 0, 0, 129, 0).unavailable, "");
  }
}

// The visited key tiles are those of the rows of the row's query tile, as the
// kernels compute them: a causal block of rows 128..199 with 300 keys.
TEST(Locate, KeyTilesOfACausalBlock) {
  ProblemSpec spec = spec_for("fa2_mma_sm80", 64);  // block_q 128, block_k 128
  spec.causal = true;
  const ElementLocation at = locate_element(kernel_named("fa2_mma_sm80"), spec, 0, 0, 150, 0);
  // Row r sees keys 0..r + 100; rows 128..199 see up to key 299: tiles 0, 1, 2.
  EXPECT_EQ(at.key_tiles, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(at.row_first_tile, 0);
  EXPECT_EQ(at.row_last_tile, 250 / 128);
  EXPECT_EQ(at.block[0], 0);  // query tile 1 of 2 launches first: blockIdx.x 0
  EXPECT_EQ(chosen_key_tile(at), 1);
  const ElementLocation fa3 = locate_element(kernel_named("fa3_wgmma_sm90"), spec, 0, 0, 150, 0);
  // fa3 at head_dim 64: 192-row blocks, 128-key tiles, from the last down; rows
  // 0..191 see keys up to 291, row 150 up to 250: the second tile it sees is 0.
  EXPECT_EQ(fa3.key_tiles, (std::vector<int>{2, 1, 0}));
  EXPECT_EQ(fa3.query_block, 0);
  EXPECT_EQ(fa3.row_in_block, 150);
  EXPECT_EQ(chosen_key_tile(fa3), 0);
}

// fa3's CTA: CTA i takes work tiles i, i + grid, ... in work_tile_at's order
// (the kernel's own function); the hook must name that CTA for every tile, on
// H100's limits and on a smaller device's.
TEST(Locate, Fa3CtaIsTheOneTheWorkTileOrderGivesTheTile) {
  const KernelVariant& kernel = kernel_named("fa3_wgmma_sm90");
  for (const bool causal : {false, true})
    for (const auto& [sms, l2] : {std::pair{132, 50 << 20}, std::pair{7, 1 << 20}}) {
      ProblemSpec spec = spec_for("fa3_wgmma_sm90", 128);
      spec.batch = 3;
      spec.heads = 6;
      spec.kv_heads = 3;
      spec.seqlen_q = 1000;
      spec.seqlen_k = 4000;
      spec.causal = causal;
      const HostParams host = host_params(spec);
      const AttentionParams& params = host.params;
      const TileShape tiles = kernel.tile_shape(params);
      const fa3_wgmma_sm90::Schedule plan = fa3_wgmma_sm90::schedule(params, tiles.block_q, 2, sms, l2);
      ASSERT_GT(plan.num_work_tiles, plan.grid);  // several tiles per CTA
      std::set<std::tuple<int, int, int>> seen;
      for (int index = 0; index < plan.num_work_tiles; ++index) {
        const fa3_wgmma_sm90::WorkTile work = fa3_wgmma_sm90::work_tile_at(
            index, plan.num_q_blocks, plan.section_heads, params.heads, params.batch);
        ASSERT_TRUE(seen.emplace(work.q_block, work.head, work.batch).second);
        const ElementLocation at = fa3_wgmma_sm90::locate_on(
            params, work.batch, work.head, work.q_block * tiles.block_q + 5, 3, sms, l2);
        ASSERT_EQ(at.block[0], index % plan.grid) << "work tile " << index;
        ASSERT_EQ(at.grid[0], plan.grid);
      }
      ASSERT_EQ(static_cast<int>(seen.size()), plan.num_work_tiles);
    }
}

// The backward's CTA order (KeyBlockOrder): every CTA takes one (key block,
// pair) and the inverse names it back; one pair a section is the grid's own
// order; under a causal mask the sections hold about two grids' worth of
// CTAs, as equal as they divide, a section's key blocks first to last, and
// the L2 caps a section's pairs.
TEST(Locate, Fa3BackwardKeyBlockOrderIsABijection) {
  namespace fa3 = fa3_wgmma_sm90;
  for (const int key_blocks : {1, 3, 32, 33})
    for (const int pairs : {1, 2, 7, 64})
      for (int sections = 1; sections <= pairs; ++sections) {
        const fa3::KeyBlockOrder order{key_blocks, pairs, sections};
        std::set<std::pair<int, int>> seen;
        for (int index = 0; index < key_blocks * pairs; ++index) {
          const fa3::KeyBlockCta cta = fa3::key_block_cta_at(index, order);
          ASSERT_TRUE(cta.key_block >= 0 && cta.key_block < key_blocks && cta.pair >= 0 && cta.pair < pairs);
          ASSERT_TRUE(seen.emplace(cta.key_block, cta.pair).second) << index;
          ASSERT_EQ(fa3::key_block_cta_index(cta.key_block, cta.pair, order), index);
          if (sections == pairs) ASSERT_EQ(index, cta.pair * key_blocks + cta.key_block);  // the grid's own
        }
      }
  // 4k causal at head_dim 128 (32 key blocks of 128, 4 x 16 pairs, 4 MB of Q, dO and dQ sums a pair):
  // 2 x 132 CTAs a section -> 9 pairs -> 7 sections of 9-10 pairs; in section 0, CTA 10 is key block 1.
  const fa3::KeyBlockOrder causal = fa3::key_block_order(32, 64, true, int64_t{4} << 20, 132, 50 << 20);
  EXPECT_EQ(causal.sections, 7);
  EXPECT_EQ(fa3::key_block_cta_at(10, causal).key_block, 1);
  EXPECT_EQ(fa3::key_block_cta_at(10, causal).pair, 0);
  // Not shortening walks (no mask, or the deterministic mode's waits): the grid's own order.
  EXPECT_EQ(fa3::key_block_order(32, 64, false, int64_t{4} << 20, 132, 50 << 20).sections, 64);
  // 32 MB a pair: the L2 holds one pair a section.
  EXPECT_EQ(fa3::key_block_order(32, 64, true, int64_t{32} << 20, 132, 50 << 20).sections, 64);
  // Short walks (1k at head_dim 128: 8 key blocks) keep the grid's order; 16 key blocks take sections.
  EXPECT_EQ(fa3::key_block_order(8, 256, true, int64_t{1} << 20, 132, 50 << 20).sections, 256);
  EXPECT_LT(fa3::key_block_order(fa3::kSectionedKeyBlocks, 128, true, int64_t{2} << 20, 132, 50 << 20).sections,
            128);
}

// e4m3 (FP8): the FP8 tiling's rows and key tiles (128 x 128, also at head_dim
// 256, where the 16-bit tiles are 128 x 80), its schedule (1-byte elements), no
// traced stop, and notes in its units; at head_dim 64 the same tiling, at 96 none.
TEST(Locate, Fa3E4m3UsesTheFp8Tiling) {
  const auto e4m3 = [](at::IntArrayRef shape) { return at::zeros(shape, at::kFloat8_e4m3fn); };
  const at::Tensor q = e4m3({2, 300, 4, 256}), kv = e4m3({2, 500, 2, 256});
  const AttentionParams params = make_params(q, kv, kv, at::Tensor(), at::Tensor(), {});
  const ElementLocation at = fa3_wgmma_sm90::locate_on(params, 1, 3, 200, 5, 132, 50 << 20);
  ASSERT_TRUE(at.unavailable.empty()) << at.unavailable;
  EXPECT_EQ(at.query_block, 1);
  EXPECT_EQ(at.row_in_block, 72);
  EXPECT_EQ(at.key_tiles, (std::vector<int>{3, 2, 1, 0}));  // 500 keys in tiles of 128, last first
  EXPECT_EQ(at.grid[0], fa3_wgmma_sm90::schedule(params, 128, 1, 132, 50 << 20).grid);
  ASSERT_EQ(at.stops.size(), 1u);
  EXPECT_FALSE(at.stops[0].needs_trace);
  EXPECT_NE(at.state_note.find("fp8.qk"), std::string::npos) << at.state_note;
  EXPECT_NE(at.out_note.find("v_descale"), std::string::npos) << at.out_note;
  // head_dim 64: the same 128 x 128 tiling (64-byte rows); 96 has none.
  const at::Tensor q64 = e4m3({1, 300, 2, 64}), kv64 = e4m3({1, 10, 2, 64});
  const ElementLocation d64 =
      fa3_wgmma_sm90::locate_on(make_params(q64, kv64, kv64, at::Tensor(), at::Tensor(), {}), 0, 0, 200, 1, 132, 50 << 20);
  ASSERT_TRUE(d64.unavailable.empty()) << d64.unavailable;
  EXPECT_EQ(d64.query_block, 1);
  EXPECT_EQ(d64.key_tiles, (std::vector<int>{0}));
  // head_dim 128: 128 x 128 below 2048 keys, 128 x 192 from 2048 on (2049 keys: 11 tiles, 129 keys in the last).
  const at::Tensor q128 = e4m3({1, 300, 2, 128});
  const auto d128_tiles = [&](int64_t keys) {
    const at::Tensor kv128 = e4m3({1, keys, 2, 128});
    const ElementLocation d128 = fa3_wgmma_sm90::locate_on(
        make_params(q128, kv128, kv128, at::Tensor(), at::Tensor(), {}), 0, 1, 200, 1, 132, 50 << 20);
    EXPECT_TRUE(d128.unavailable.empty()) << d128.unavailable;
    return d128.key_tiles.size();
  };
  EXPECT_EQ(d128_tiles(2047), 16u);
  EXPECT_EQ(d128_tiles(2049), 11u);
  const at::Tensor q96 = e4m3({1, 10, 2, 96}), kv96 = e4m3({1, 10, 2, 96});
  const ElementLocation none =
      fa3_wgmma_sm90::locate_on(make_params(q96, kv96, kv96, at::Tensor(), at::Tensor(), {}), 0, 0, 1, 1, 132, 50 << 20);
  EXPECT_NE(none.unavailable.find("takes e4m3 at head_dim 64, 128, 256; got 96"), std::string::npos) << none.unavailable;
}

// The cuda-gdb stops name lines that exist: every marker of a stop that does
// not depend on a traced build still in the kernel sources is found (fa1's and
// fa3's state lines too); the commands name that line.
TEST(Locate, CudaGdbMarkersAreInTheSources) {
  for (const char* name : kKernels) {
    const ProblemSpec spec = spec_for(name, 64);
    const ElementLocation at = locate_element(kernel_named(name), spec, 1, 3, 77, 5);
    ASSERT_FALSE(at.stops.empty()) << name;
    for (const CudaGdbStop& stop : at.stops) {
      const int line = marker_line(at.source, stop.marker, stop.line_offset);
      if (!stop.needs_trace || std::string(name) != "fa2_mma_sm80")
        EXPECT_GT(line, 0) << name << ": no '" << stop.marker << "' in " << at.source;
    }
    const std::string text = format_location(kernel_named(name), spec, 1, 3, 77, 5);
    const std::string file = at.source.substr(at.source.rfind('/') + 1);
    const int line = marker_line(at.source, at.stops.back().marker, at.stops.back().line_offset);
    EXPECT_NE(text.find("break " + file + ":" + std::to_string(line) + " if "), std::string::npos) << text;
    EXPECT_NE(text.find("cuda block ("), std::string::npos) << text;
  }
  EXPECT_EQ(marker_line("/nonexistent/file.cuh", "anything"), 0);
}

TEST(Locate, Fa1ScalarNamesThreadRowAndAccumulator) {
  ProblemSpec spec = spec_for("fa1_scalar", 32);
  spec.batch = 1;
  spec.heads = 2;
  spec.kv_heads = 1;
  spec.seqlen_q = 70;
  spec.seqlen_k = 45;
  const ElementLocation at = locate_element(kernel_named("fa1_scalar"), spec, 0, 1, 67, 9);
  EXPECT_EQ(at.block[0], 1);
  EXPECT_EQ(at.block[1], 1);
  EXPECT_EQ(at.block[2], 0);
  EXPECT_EQ(at.out[0].thread[0], 3);
  EXPECT_EQ(at.out[0].name, "accumulator[9]");
  EXPECT_EQ(at.row_max[0].name, "row_max");
  EXPECT_EQ(at.stops[0].condition,
            "key_tile == {tile} && threadIdx.x == 3 && blockIdx.x == 1 && blockIdx.y == 1 && blockIdx.z == 0");
}

TEST(Locate, RunOptionsReproduceTheProblem) {
  ProblemSpec spec = spec_for("fa2_mma_sm80", 64);
  spec.causal = true;
  EXPECT_EQ(run_options(spec),
            "--kernel fa2_mma_sm80 --batch 2 --seqlen-q 200 --seqlen-k 300 --heads 4 --kv-heads 2 "
            "--head-dim 64 --dtype fp16 --causal --seed 1");
  spec.seqlens_q = {3, 4};
  spec.seqlens_k = {5, 6};
  EXPECT_NE(run_options(spec).find("--seqlens 3,4 --seqlens-k 5,6 --heads"), std::string::npos);
}

// The backward (flashlab-run --backward --locate): fa3_wgmma_sm90's answer for
// every (row, col) of a problem against the formulas its kernel indexes with.
// dK/dV: one (thread, acc index) per element of a key block, the slot giving
// back row and column by the accumulator pattern; dQ: the fragment group and
// lane the thread's register lands in decode, through the convert kernel's own
// SlabDqOrder, to the same row and column, and the element offset is that
// group's slot; the adding key blocks are those whose keys the query block
// sees, last first in deterministic mode under a causal mask.
ProblemSpec fa3_backward_spec(int batch, int heads, int kv_heads, int seqlen_q, int seqlen_k, int head_dim) {
  ProblemSpec spec;
  spec.kernel = "fa3_wgmma_sm90";
  spec.batch = batch;
  spec.heads = heads;
  spec.kv_heads = kv_heads;
  spec.seqlen_q = seqlen_q;
  spec.seqlen_k = seqlen_k;
  spec.head_dim = head_dim;
  spec.dtype = at::kBFloat16;
  return spec;
}

// The (key index, pair) the kernel gives a location's tile (backward_cta:
// KeyBlockOrder over the tile's index; sections in the default mode under a
// causal mask; these problems' Q and dO are far below the L2), and the CTA
// that walks it: tile % grid.
fa3_wgmma_sm90::KeyBlockCta kernel_cta(const ProblemSpec& spec, const BackwardElementLocation& at, bool causal,
                                       bool deterministic) {
  const fa3_wgmma_sm90::KeyBlockOrder order = fa3_wgmma_sm90::key_block_order(
      (spec.seqlen_k + at.block_k - 1) / at.block_k, spec.kv_heads * spec.batch, causal && !deterministic, 0,
      fa3_wgmma_sm90::kLocateMultiprocessors, fa3_wgmma_sm90::kLocateL2Bytes);
  EXPECT_EQ(at.key_block_cta[0], at.key_block_tile % at.grid[0]);
  EXPECT_EQ(at.grid[1] * at.grid[2], 1);
  return fa3_wgmma_sm90::key_block_cta_at(at.key_block_tile, order);
}

template <class Tr>
void check_backward_layout_with(bool causal, bool deterministic) {
  constexpr int HeadDim = Tr::kHeadDim;
  ProblemSpec spec = fa3_backward_spec(2, 4, 2, 300, 257, HeadDim);
  spec.causal = causal;
  const KernelVariant& kernel = kernel_named("fa3_wgmma_sm90");
  std::set<std::pair<int, int>> key_slots, query_slots;
  for (int row = 0; row < Tr::kBlockN; ++row)
    for (int col = 0; col < HeadDim; ++col) {
      const BackwardElementLocation at = locate_backward_element(kernel, spec, deterministic, 1, 3, row, col);
      ASSERT_TRUE(at.keys_unavailable.empty()) << at.keys_unavailable;
      EXPECT_EQ(kernel_cta(spec, at, causal, deterministic).pair, 1 * 2 + 1);  // batch 1, kv head 1 (head 3)
      ASSERT_EQ(at.dk.index.size(), 1u);
      EXPECT_TRUE(key_slots.insert({at.dk.thread[0], at.dk.index[0]}).second) << row << "," << col;
      // Back through the kernel's acc_dk[n * 4 + h * 2 + e] pattern.
      const int consumer = at.dk.thread[0] / 128 - 1, warp = at.dk.thread[0] % 128 / 32, lane = at.dk.lane;
      const int n = at.dk.index[0] / 4, h = at.dk.index[0] % 4 / 2, e = at.dk.index[0] % 2;
      // Keys split: a consumer's 64 keys; head dim split: its columns.
      const int first_key = Tr::kSplitsHeadDim ? 0 : consumer * 64;
      const int first_column = Tr::kSplitsHeadDim ? consumer * Tr::kKeyGradColumns : 0;
      EXPECT_EQ(first_key + warp * 16 + lane / 4 + 8 * h, row);
      EXPECT_EQ(first_column + n * 8 + lane % 4 * 2 + e, col);
      EXPECT_LT(at.dk.index[0], Tr::kKeyGradColumns / 2);
      EXPECT_EQ(at.dv.thread[0], at.dk.thread[0]);
      if (row >= Tr::kBlockM) continue;
      ASSERT_TRUE(at.queries_unavailable.empty());
      // The consumer's thread and register; the slab (of its kDqSlabs, in the
      // same registers) from the accumulator element.
      const int dq_consumer = at.dq.thread[0] / 128 - 1, dq_warp = at.dq.thread[0] % 128 / 32;
      const int dq_n = at.dq.index[0] / 4, slot = at.dq.index[0] % 4;
      const int group = static_cast<int>(at.dq_accum_element / 4 / 32);
      EXPECT_TRUE(query_slots.insert({group, at.dq.index[0] * 32 + at.dq.lane}).second) << row << "," << col;
      using Order = fa3_wgmma_sm90::SlabDqOrder<Tr>;
      EXPECT_EQ(group / Order::kGroups / Tr::kDqSlabs, dq_consumer);
      EXPECT_EQ(group % Order::kGroups, dq_n * 4 + dq_warp);
      const FragmentOrigin origin = Order::origin(group, at.dq.lane);
      // Value `slot` of the lane (transposed slabs: dQ^T's, row and column swapped).
      EXPECT_EQ(origin.row + (Order::kTransposed ? slot % 2 : 8 * (slot / 2)), row);
      EXPECT_EQ(origin.col + (Order::kTransposed ? 8 * (slot / 2) : slot % 2), col);
      EXPECT_EQ(at.block_q, Tr::kBlockM);
      EXPECT_EQ(at.dq_accum_element, (group * 32 + at.dq.lane) * 4 + slot);
    }
  EXPECT_EQ(static_cast<int>(key_slots.size()), Tr::kBlockN * HeadDim);
  EXPECT_EQ(static_cast<int>(query_slots.size()), Tr::kBlockM * HeadDim);
  // The adding key blocks of query row 200's block.
  const BackwardElementLocation at = locate_backward_element(kernel, spec, deterministic, 0, 2, 200, 1);
  const int m0 = 200 / Tr::kBlockM * Tr::kBlockM;
  const int last_key = causal ? std::min(spec.seqlen_k - 1, std::min(m0 + Tr::kBlockM, 300) - 1 + 257 - 300)
                              : spec.seqlen_k - 1;
  std::vector<int> expected;
  for (int n = 0; n <= last_key / Tr::kBlockN; ++n) expected.push_back(n);
  if (deterministic && causal) std::reverse(expected.begin(), expected.end());
  if (deterministic && !causal) {
    // Rotated walks (3 key blocks, no more than the query blocks): in the
    // order the key blocks reach the query block, key block n walking from
    // query block n.
    const int query_blocks = (spec.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM, m = m0 / Tr::kBlockM;
    std::stable_sort(expected.begin(), expected.end(), [&](int a, int b) {
      return (m - a + query_blocks) % query_blocks < (m - b + query_blocks) % query_blocks;
    });
    EXPECT_NE(expected.front(), 0);  // not the ascending order
  }
  EXPECT_EQ(at.adding_key_blocks, expected);
  EXPECT_EQ(at.dq_ordered, deterministic);
  // Deterministic under a causal mask the grid runs from the last key block down.
  const BackwardElementLocation key = locate_backward_element(kernel, spec, deterministic, 0, 2, 5, 1);
  const int key_blocks = (spec.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN;
  EXPECT_EQ(kernel_cta(spec, key, causal, deterministic).key_block, deterministic && causal ? key_blocks - 1 : 0);
  EXPECT_EQ(kernel_cta(spec, key, causal, deterministic).pair, 1);  // batch 0, kv head 1 (head 2)
  // Fewer than kSectionedKeyBlocks key blocks: the tiles' own order, key index + key blocks x pair; fewer
  // tiles than SMs: a CTA a tile.
  EXPECT_EQ(key.key_block_tile, (deterministic && causal ? key_blocks - 1 : 0) + key_blocks * 1);
  EXPECT_EQ(key.key_block_cta[0], key.key_block_tile);
  // 17 or more key blocks under the mask in the default mode: one section of the 4 pairs, key block 0 of
  // pair 1 is CTA 1.
  spec.seqlen_k = 2100;
  const BackwardElementLocation long_key = locate_backward_element(kernel, spec, deterministic, 0, 2, 5, 1);
  const int long_key_blocks = (spec.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN;
  ASSERT_GE(long_key_blocks, fa3_wgmma_sm90::kSectionedKeyBlocks);
  EXPECT_EQ(kernel_cta(spec, long_key, causal, deterministic).key_block,
            deterministic && causal ? long_key_blocks - 1 : 0);
  EXPECT_EQ(kernel_cta(spec, long_key, causal, deterministic).pair, 1);
  EXPECT_EQ(long_key.key_block_tile, causal && !deterministic ? 1
                                     : (deterministic && causal ? long_key_blocks - 1 : 0) + long_key_blocks * 1);
}

// The tiling the kernel runs: 80-row blocks (dQ transposed) at head_dim 128
// without a mask in the default mode, else the default.
template <int HeadDim>
void check_backward_layout(bool causal, bool deterministic) {
  if constexpr (HeadDim == 128) {
    if (!causal) {
      using Wide = fa3_wgmma_sm90::BwdTraits<128, fa3_wgmma_sm90::kWideBackwardBlockM>;
      static_assert(Wide::kTransposedDq && Wide::kBlockM == 80);
      return check_backward_layout_with<Wide>(causal, deterministic);
    }
  }
  check_backward_layout_with<typename fa3_wgmma_sm90::DefaultBwdTraits<HeadDim>::type>(causal, deterministic);
}

TEST(LocateBackward, Fa3ElementsMapBackThroughTheKernelsFormulas) {
  for (const bool causal : {false, true})
    for (const bool deterministic : {false, true}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "full") + (deterministic ? ", deterministic" : ""));
      check_backward_layout<64>(causal, deterministic);
      check_backward_layout<128>(causal, deterministic);
      check_backward_layout<256>(causal, deterministic);  // the head dim split
    }
}

// More tiles than SMs without a mask: the persistent grid, one CTA an SM, CTA
// c walking tiles c, c + 132, ...; the key row's cuda-gdb stop then names the
// tile. The deterministic mode keeps a CTA a tile.
TEST(LocateBackward, Fa3PersistentGridWalksEveryGridSizethTile) {
  const ProblemSpec spec = fa3_backward_spec(8, 4, 2, 300, 2100, 128);  // 17 key blocks x 2 kv heads x 8
  const KernelVariant& kernel = kernel_named("fa3_wgmma_sm90");
  const int tiles = 17 * 2 * 8;
  const int tile = 16 + 17 * (1 + 2 * 7);  // key row 2050 (key block 16) of batch 7, head 3 (kv head 1)
  const BackwardElementLocation persistent = locate_backward_element(kernel, spec, false, 7, 3, 2050, 5);
  EXPECT_EQ(persistent.grid[0], fa3_wgmma_sm90::kLocateMultiprocessors);
  EXPECT_EQ(persistent.key_block_tile, tile);
  EXPECT_EQ(persistent.key_block_cta[0], tile % fa3_wgmma_sm90::kLocateMultiprocessors);
  ASSERT_FALSE(persistent.stops.empty());
  EXPECT_NE(persistent.stops[0].condition.find("tile == " + std::to_string(tile)), std::string::npos);
  const BackwardElementLocation deterministic = locate_backward_element(kernel, spec, true, 7, 3, 2050, 5);
  EXPECT_EQ(deterministic.grid[0], tiles);
  EXPECT_EQ(deterministic.key_block_cta[0], tile);
  ASSERT_FALSE(deterministic.stops.empty());
  EXPECT_EQ(deterministic.stops[0].condition.find("tile =="), std::string::npos);
}

// More tiles than SMs under a causal mask: the persistent grid takes each
// CTA's next tile from a counter, so no blockIdx walks a given tile past the
// grid's first; the key row's stop names the tile alone. The deterministic
// mode keeps a CTA a tile.
TEST(LocateBackward, Fa3DynamicGridNamesTheTileNotTheCta) {
  ProblemSpec spec = fa3_backward_spec(8, 4, 2, 300, 2100, 128);  // 17 key blocks x 2 kv heads x 8
  spec.causal = true;
  const KernelVariant& kernel = kernel_named("fa3_wgmma_sm90");
  const int tiles = 17 * 2 * 8;
  const BackwardElementLocation dynamic = locate_backward_element(kernel, spec, false, 7, 3, 2050, 5);
  EXPECT_EQ(dynamic.grid[0], fa3_wgmma_sm90::kLocateMultiprocessors);
  EXPECT_EQ(dynamic.key_block_cta[0], -1);
  ASSERT_GE(dynamic.key_block_tile, fa3_wgmma_sm90::kLocateMultiprocessors);  // past the grid's first tiles
  ASSERT_LT(dynamic.key_block_tile, tiles);
  ASSERT_FALSE(dynamic.stops.empty());
  EXPECT_NE(dynamic.stops[0].condition.find("tile == " + std::to_string(dynamic.key_block_tile)), std::string::npos);
  EXPECT_EQ(dynamic.stops[0].condition.find("blockIdx"), std::string::npos);
  // The grid's first tiles are each CTA's first: tile 0 (key block 0 of batch 0, kv head 0) is CTA 0's.
  const BackwardElementLocation first = locate_backward_element(kernel, spec, false, 0, 0, 5, 5);
  EXPECT_EQ(first.key_block_tile, 0);
  EXPECT_EQ(first.key_block_cta[0], 0);
  ASSERT_FALSE(first.stops.empty());
  EXPECT_NE(first.stops[0].condition.find("blockIdx.x == 0 && tile == 0"), std::string::npos);
  const BackwardElementLocation deterministic = locate_backward_element(kernel, spec, true, 7, 3, 2050, 5);
  EXPECT_EQ(deterministic.grid[0], tiles);
  EXPECT_EQ(deterministic.key_block_cta[0], deterministic.key_block_tile);
  ASSERT_FALSE(deterministic.stops.empty());
  EXPECT_NE(deterministic.stops[0].condition.find("blockIdx.x == " + std::to_string(deterministic.key_block_tile)),
            std::string::npos);
}

TEST(LocateBackward, Fa3WithoutQueryRowsNamesTheStaticCta) {
  // No query rows: no workspace, so no tile counter; the persistent grid walks the static stride.
  ProblemSpec spec = fa3_backward_spec(8, 4, 2, 0, 2100, 128);  // 17 key blocks x 2 kv heads x 8
  spec.causal = true;
  const BackwardElementLocation location =
      locate_backward_element(kernel_named("fa3_wgmma_sm90"), spec, false, 7, 3, 2050, 5);
  EXPECT_EQ(location.grid[0], fa3_wgmma_sm90::kLocateMultiprocessors);
  ASSERT_GE(location.key_block_tile, fa3_wgmma_sm90::kLocateMultiprocessors);
  EXPECT_EQ(location.key_block_cta[0], location.key_block_tile % location.grid[0]);
}

TEST(LocateBackward, RowsPastTheirSequenceAndMarkers) {
  const ProblemSpec spec = fa3_backward_spec(1, 2, 2, 113, 203, 128);
  const KernelVariant& kernel = kernel_named("fa3_wgmma_sm90");
  const BackwardElementLocation past_queries = locate_backward_element(kernel, spec, false, 0, 1, 150, 3);
  EXPECT_TRUE(past_queries.keys_unavailable.empty());
  EXPECT_NE(past_queries.queries_unavailable.find("past batch entry 0's 113 query rows"), std::string::npos);
  // The key row's stop stays (the backward cuda-gdb test stops at a key row past the query rows).
  ASSERT_EQ(past_queries.stops.size(), 1u);
  EXPECT_NE(past_queries.stops[0].condition.find("key == 150"), std::string::npos);
  const BackwardElementLocation past_keys = locate_backward_element(kernel, spec, false, 0, 1, 250, 3);
  EXPECT_NE(past_keys.keys_unavailable.find("past batch entry 0's 203 keys"), std::string::npos);
  // Both stops' markers are in the kernel source, and the text names their lines.
  const BackwardElementLocation at = locate_backward_element(kernel, spec, true, 0, 1, 100, 3);
  ASSERT_EQ(at.stops.size(), 2u);
  const std::string text = format_backward_location(kernel, spec, true, 0, 1, 100, 3);
  for (const CudaGdbStop& stop : at.stops) {
    const int line = marker_line(at.source, stop.marker, stop.line_offset);
    EXPECT_GT(line, 0) << stop.marker;
    EXPECT_NE(text.find("fa3_wgmma_sm90_bwd_kernel.cuh:" + std::to_string(line) + " if "), std::string::npos)
        << text;
  }
  EXPECT_NE(text.find("--backward --deterministic --repeat 0"), std::string::npos) << text;
  // A kernel without the hook says so.
  EXPECT_THROW(locate_backward_element(kernel_named("fa2_mma_sm80"), spec, false, 0, 0, 0, 0), c10::Error);
}

}  // namespace
}  // namespace flashlab
