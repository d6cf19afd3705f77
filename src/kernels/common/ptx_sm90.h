// PTX wrappers for Hopper (sm_90a) kernels, written once: mbarriers, TMA tile
// loads, wgmma fences and shared-memory descriptors, setmaxnreg, named
// barriers. wgmma and setmaxnreg assemble only for sm_90a; include this from
// files of the sm_90a kernel library alone.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: nothing links libcuda)
#include <cuda_runtime.h>

#include <cstdint>

namespace flashlab::sm90 {

__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// ---------------------------------------------------------------------------
// mbarrier: a 64-bit shared-memory barrier that counts arrivals and, for TMA,
// transaction bytes. Waiters name the phase parity they wait to complete.

__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(barrier)),
               "r"(arrivals));
}

// Makes initialized barriers visible to the async (TMA) proxy.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   smem_address(barrier)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(barrier))
               : "memory");
}
// `count` arrivals at once (one thread standing for a warpgroup that synced before it).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(barrier)), "r"(count)
               : "memory");
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_address(barrier)),
      "r"(parity)
      : "memory");
}

// ---------------------------------------------------------------------------
// TMA: a box of a 4-D tensor (coordinates innermost first) into shared memory,
// completing `bytes` on the barrier. Out-of-range elements arrive as zeros and
// still count towards the transaction bytes.
__device__ __forceinline__ void tma_load_4d(void* smem_destination, const CUtensorMap* map,
                                            uint64_t* barrier, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(smem_address(smem_destination)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_address(barrier)), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3)
      : "memory");
}

// And a box from shared memory to the tensor (out-of-range elements are not
// written), tracked in this thread's bulk groups (bulk_commit_group below).
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* smem_source, int c0, int c1, int c2,
                                             int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_address(smem_source)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Bulk copies (TMA without a tensor map). `bytes` from global to shared
// memory, completing them on the barrier's transaction count; both addresses
// 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void bulk_load(void* shared, const void* global, uint32_t bytes, uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_address(shared)),
      "l"(global), "r"(bytes), "r"(smem_address(barrier))
      : "memory");
}
// And the other way: `bytes` of float32 from shared
// memory added element-wise to global memory (the reduction happens at L2);
// both addresses 16-byte aligned, bytes a multiple of 16. Completion is
// tracked per thread in bulk groups: commit, then wait until at most N groups
// are pending, either until their shared-memory source is read (.read: it may
// be overwritten) or until their writes are done.
__device__ __forceinline__ void bulk_reduce_add_f32(float* global, const void* shared, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(global),
               "r"(smem_address(shared)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
// Orders this thread's generic-proxy global accesses (a semaphore's acquire or
// release) with its async-proxy ones (bulk reductions).
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// ---------------------------------------------------------------------------
// wgmma: operand descriptors and the async-group protocol.

// Descriptor of a shared-memory operand laid out in 128-byte swizzled rows (as
// TMA's CU_TENSOR_MAP_SWIZZLE_128B writes them); the tile must start on a
// 1024-byte boundary. Offsets in bytes:
//   K-major (rows of 64 elements along K): leading unused, stride = 1024
//     (from one 8-row group to the next).
//   MN-major (rows of 64 elements along M/N): leading = distance between
//     64-element column panels, stride = 1024 (from one 8-row K group to the next).
__device__ __forceinline__ uint64_t make_smem_descriptor_sw128(uint32_t smem_byte_address,
                                                               uint32_t leading_bytes,
                                                               uint32_t stride_bytes) {
  uint64_t descriptor = (smem_byte_address & 0x3FFFF) >> 4;
  descriptor |= static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16;
  descriptor |= static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32;
  descriptor |= 1ull << 62;  // swizzle mode 1: 128-byte
  return descriptor;
}
// The same for rows of SwizzleBytes (128: mode 1; 64: mode 2, 8-row atoms of 512 bytes).
template <int SwizzleBytes>
__device__ __forceinline__ uint64_t make_smem_descriptor(uint32_t smem_byte_address, uint32_t leading_bytes,
                                                         uint32_t stride_bytes) {
  static_assert(SwizzleBytes == 128 || SwizzleBytes == 64, "128- or 64-byte swizzle");
  const uint64_t descriptor = make_smem_descriptor_sw128(smem_byte_address, leading_bytes, stride_bytes);
  return SwizzleBytes == 128 ? descriptor : (descriptor & ~(3ull << 62)) | (2ull << 62);
}

// Orders this warpgroup's register and shared-memory accesses before the
// wgmma operations that follow.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}
// Makes this thread's generic-proxy shared-memory writes (st.shared of a
// wgmma operand) visible to the async proxy that wgmma and TMA read through;
// a barrier among the writers and the readers must follow.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Four 8 x 8 16-bit tiles from mma fragments (register r: tile r, row lane /
// 4, columns 2 (lane % 4), +1) to shared memory transposed: row j of tile
// r's stored rows is its column j, at the address lane 8 r + j gives.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t address, const uint32_t (&tiles)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address),
               "r"(tiles[0]), "r"(tiles[1]), "r"(tiles[2]), "r"(tiles[3])
               : "memory");
}
// The same without the transpose: row j of tile r is its fragment row j.
__device__ __forceinline__ void stmatrix_x4(uint32_t address, const uint32_t (&tiles)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(tiles[0]),
               "r"(tiles[1]), "r"(tiles[2]), "r"(tiles[3])
               : "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across a
// wgmma wait (the registers change behind its back until then).
template <int N>
__device__ __forceinline__ void fence_registers(float (&registers)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(registers[i])::"memory");
}

// ---------------------------------------------------------------------------
// Warp specialization.

template <int Registers>
__device__ __forceinline__ void setmaxnreg_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Registers));
}
template <int Registers>
__device__ __forceinline__ void setmaxnreg_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Registers));
}

// Named barriers 1..15 (0 is __syncthreads): `threads` must be a multiple of 32.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---------------------------------------------------------------------------
// Semaphores in global memory (ordering CTAs' additions: the deterministic
// backward's dQ). The releaser's warpgroup syncs first, so its threads' earlier
// writes are ordered before the release (cumulativity).
__device__ __forceinline__ int load_acquire_gpu(const int* address) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(value) : "l"(address) : "memory");
  return value;
}
__device__ __forceinline__ void add_release_gpu(int* address, int value) {
  asm volatile("fence.acq_rel.gpu;\nred.relaxed.gpu.global.add.s32 [%0], %1;\n" ::"l"(address), "r"(value)
               : "memory");
}

}  // namespace flashlab::sm90
