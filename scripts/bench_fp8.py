#!/usr/bin/env python3
"""The FP8 forward's speed (issue 36, item 4): flashlab's e4m3 forward (fa3_wgmma_sm90, through
flash_attn_func with q_descale / k_descale / v_descale) beside flashlab's bf16 forward and torch's
SDPA on cuDNN (bf16) in the same run, at the issue's shapes: tokens (batch x seqlen) fixed, model
dim 2048 (16 heads at head_dim 128, 8 at 256), causal and not.

Timing: CUDA events around --iters calls after --warmup calls, the median of --repeats such runs.
TFLOP/s count 4 x B x H x L^2 x D, halved for causal. The FP8 call includes its V transpose (the
op writes V^T into its workspace on every call). The matmul rates are measured in the same run:
bf16 (torch.mm) and e4m3 (torch._scaled_mm, where this torch has it) at 8192^3; "of mm" is a
row's TFLOP/s over its own dtype's rate. torch has no FP8 SDPA backend to compare: the cuDNN row
is bf16.

    python3 scripts/bench_fp8.py --json fp8_bench.json
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

E4M3 = torch.float8_e4m3fn


def time_ms(fn, warmup, iters, repeats):
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        runs.append(start.elapsed_time(end) / iters)
    return statistics.median(runs)


def matmul_rates(args):
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    bf16 = 2 * n ** 3 / time_ms(lambda: torch.mm(a, b), args.warmup, args.iters, args.repeats) / 1e9
    fp8 = None
    if hasattr(torch, "_scaled_mm"):
        a8, b8 = a.to(E4M3), b.to(E4M3).t().contiguous().t()  # B column-major, as _scaled_mm wants
        one = torch.ones((), device="cuda")
        try:
            fp8 = 2 * n ** 3 / time_ms(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16),
                                       args.warmup, args.iters, args.repeats) / 1e9
        except RuntimeError as error:  # no FP8 GEMM in this build
            print(f"torch._scaled_mm: {error}")
    return bf16, fp8


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", default="128,256")
    parser.add_argument("--seqlens", default="1024,4096,16384")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--model-dim", type=int, default=2048)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    from flashlab import flash_attn_func, fp8

    bf16_rate, fp8_rate = matmul_rates(args)
    fp8_text = "-" if fp8_rate is None else "%.1f" % fp8_rate
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; matmul 8192^3: bf16 {bf16_rate:.1f} TFLOP/s, "
          f"e4m3 {fp8_text} TFLOP/s")
    print(f"{'d':>4} {'seqlen':>6} {'causal':>6} | {'fp8 TFLOP/s':>11} {'of mm':>5} | {'fa3 bf16':>8} {'of mm':>5} | "
          f"{'cuDNN bf16':>10} | {'fp8/fa3':>7} {'fp8/cuDNN':>9}")
    rows = []
    for head_dim in (int(x) for x in args.head_dims.split(",")):
        heads = args.model_dim // head_dim
        for seqlen in (int(x) for x in args.seqlens.split(",")):
            batch = max(1, args.tokens // seqlen)
            generator = torch.Generator(device="cuda").manual_seed(seqlen + head_dim)
            q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", generator=generator)
                       for _ in range(3))
            quantized = [fp8.quantize(x) for x in (q, k, v)]  # kv_heads = heads
            fp8_inputs, descales = [x for x, _ in quantized], [d for _, d in quantized]
            bf16 = [x.to(torch.bfloat16) for x in (q, k, v)]
            bhsd = [x.transpose(1, 2) for x in bf16]
            for causal in (False, True):
                flops = 4 * batch * heads * seqlen ** 2 * head_dim / (2 if causal else 1)
                fp8_ms = time_ms(lambda: flash_attn_func(*fp8_inputs, causal=causal, q_descale=descales[0],
                                                         k_descale=descales[1], v_descale=descales[2]),
                                 args.warmup, args.iters, args.repeats)
                fa3_ms = time_ms(lambda: flash_attn_func(*bf16, causal=causal), args.warmup, args.iters,
                                 args.repeats)
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    cudnn_ms = time_ms(lambda: F.scaled_dot_product_attention(*bhsd, is_causal=causal),
                                       args.warmup, args.iters, args.repeats)
                tf = {name: flops / ms / 1e9 for name, ms in (("fp8", fp8_ms), ("fa3", fa3_ms), ("cudnn", cudnn_ms))}
                row = {"head_dim": head_dim, "seqlen": seqlen, "batch": batch, "heads": heads, "causal": causal,
                       "fp8_ms": fp8_ms, "fa3_bf16_ms": fa3_ms, "cudnn_bf16_ms": cudnn_ms,
                       "fp8_tflops": tf["fp8"], "fa3_bf16_tflops": tf["fa3"], "cudnn_bf16_tflops": tf["cudnn"],
                       "fp8_of_matmul": tf["fp8"] / fp8_rate if fp8_rate else None,
                       "fa3_of_matmul": tf["fa3"] / bf16_rate}
                rows.append(row)
                fp8_share = "-" if not fp8_rate else "%.2f" % (tf["fp8"] / fp8_rate)
                print(f"{head_dim:>4} {seqlen:>6} {str(causal):>6} | {tf['fp8']:>11.1f} "
                      f"{fp8_share:>5} | {tf['fa3']:>8.1f} "
                      f"{tf['fa3'] / bf16_rate:>5.2f} | {tf['cudnn']:>10.1f} | {tf['fp8'] / tf['fa3']:>7.2f} "
                      f"{tf['fp8'] / tf['cudnn']:>9.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "matmul_tflops": {"bf16": bf16_rate, "e4m3": fp8_rate}, "args": vars(args), "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
