#!/usr/bin/env python3
"""What e4m3 inputs cost attention in accuracy, before any FP8 kernel (issue 36, item 2).

Emulates, in float64 on the CPU, the FP8 forward FlashAttention-3 defines: Q, K, V quantized to
e4m3 with one float32 descale factor per (batch, kv head) (FA3's q_descale / k_descale /
v_descale, shape (batch, kv_heads)), S = Q K^T on the dequantized values, P = softmax(S)
quantized to e4m3 for the second matmul (P <= 1, so P x 448 uses e4m3's range and the product is
scaled back), O = P V. It compares the output with attention of the original float32 inputs
(RMSE, relative RMSE and max error) for

  bf16                 the inputs rounded to bf16 (today's 16-bit path, for scale)
  e4m3 naive           x.to(e4m3) with no scale at all (values past 448 saturate, small ones
                       lose their mantissa or flush)
  e4m3 per-tensor      one scale per tensor, amax / 448
  e4m3 descale         one scale per (batch, kv head), amax / 448 (FA3's API)
  e4m3 descale + P     the same with P quantized to e4m3 as the kernel's second matmul takes it
  + Hadamard on Q, K   the same after a random-sign Hadamard rotation of Q and K's head dim
                       (FA3's "incoherent processing": Q K^T is unchanged, outliers spread)

on normal(0, 1) inputs and on inputs with outliers (the same 4 channels of Q, K and V 20x
larger, as real activations' outlier features are). The emulated "descale + P" error is the FP8 path's own error: the pass
rule an FP8 kernel will be held to is at most twice that error (against float32 attention of the
dequantized inputs), plus e4m3's rounding of the output's scale, as the 16-bit kernels are held
to twice torch's same-precision error.

    python3 scripts/fp8_accuracy.py                      # the table (seconds on a CPU)
    python3 scripts/fp8_accuracy.py --seqlen 4096 --json fp8.json

With --kernel (an H100: flashlab's FP8 forward, fa3_wgmma_sm90) the table adds the kernel's own
output for the same inputs and quantizations (bf16 out): "kernel e4m3 naive" (every descale 1),
"kernel e4m3 per-tensor" (each tensor's one factor, passed as every (batch, kv head)'s),
"kernel e4m3 descale" (FA3's per-(batch, kv head) factors) and "kernel + Hadamard" (on Q, K).
"""
import argparse
import json
import math

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max  # 448


def quantize(x, scale):
    """x / scale rounded to e4m3 (saturating at +-448), dequantized: what the kernel computes with."""
    return (x / scale).to(E4M3).to(x.dtype) * scale


def per_tensor_scale(x):
    return x.abs().amax().clamp_min(1e-12) / E4M3_MAX


def per_kv_head_scale(x, kv_heads):
    """(batch, 1, heads, 1) scales: amax over each (batch, kv head)'s rows, heads and columns
    (a query head shares its kv head's factor, as FA3's q_descale (batch, kv_heads) does)."""
    batch, seqlen, heads, head_dim = x.shape
    grouped = x.abs().reshape(batch, seqlen, kv_heads, heads // kv_heads, head_dim)
    scale = grouped.amax(dim=(1, 3, 4)).clamp_min(1e-12) / E4M3_MAX  # (batch, kv_heads)
    return scale.repeat_interleave(heads // kv_heads, dim=1)[:, None, :, None]


def random_hadamard(head_dim, generator):
    """An orthogonal (head_dim, head_dim) matrix: Sylvester's Hadamard with random column signs,
    scaled by 1/sqrt(head_dim). Q H (H^T K)^T = Q K^T, so it changes nothing exact, but it spreads
    an outlier channel over all channels before quantization (FA3's incoherent processing)."""
    if head_dim & (head_dim - 1):
        raise ValueError(f"the Hadamard transform needs a power-of-two head_dim; got {head_dim}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < head_dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    signs = torch.randint(0, 2, (head_dim,), generator=generator).to(torch.float64) * 2 - 1
    return h * signs / math.sqrt(head_dim)


def attention(q, k, v, softmax_scale, quantize_p=False):
    """float64 attention of (batch, seqlen, heads, d) inputs, GQA by repeating kv heads; with
    quantize_p, P in e4m3 (scaled by 448) for P V."""
    heads, kv_heads = q.shape[2], k.shape[2]
    k = k.repeat_interleave(heads // kv_heads, dim=2)
    v = v.repeat_interleave(heads // kv_heads, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * softmax_scale
    p = torch.softmax(scores, dim=-1)
    if quantize_p:
        p = quantize(p, 1.0 / E4M3_MAX)
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


def problem(batch, seqlen, heads, kv_heads, head_dim, outliers, seed):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen, heads, head_dim, generator=generator, dtype=torch.float64)
    k = torch.randn(batch, seqlen, kv_heads, head_dim, generator=generator, dtype=torch.float64)
    v = torch.randn(batch, seqlen, kv_heads, head_dim, generator=generator, dtype=torch.float64)
    if outliers:  # the same few channels large in every tensor, as activations' outlier features are
        channels = torch.randperm(head_dim, generator=generator)[:4]
        for x in (q, k, v):
            x[..., channels] *= 20
    return q, k, v


def paths(q, k, v, kv_heads, generator):
    """name -> (q, k, v as the path computes with them, quantize P)."""
    rounded = lambda x: x.to(torch.bfloat16).to(torch.float64)  # noqa: E731
    descaled = lambda x: quantize(x, per_kv_head_scale(x, kv_heads))  # noqa: E731
    hadamard = random_hadamard(q.shape[-1], generator)
    return {
        "bf16": ((rounded(q), rounded(k), rounded(v)), False),
        "e4m3 naive": ((quantize(q, 1.0), quantize(k, 1.0), quantize(v, 1.0)), False),
        "e4m3 per-tensor": (tuple(quantize(x, per_tensor_scale(x)) for x in (q, k, v)), False),
        "e4m3 descale": ((quantize(q, per_kv_head_scale(q, kv_heads)), quantize(k, per_kv_head_scale(k, kv_heads)),
                          quantize(v, per_kv_head_scale(v, kv_heads))), False),
        "e4m3 descale + P": ((descaled(q), descaled(k), descaled(v)), True),
        "+ Hadamard on Q, K": ((descaled(q @ hadamard), descaled(k @ hadamard), descaled(v)), True),
    }


def kernel_paths(q, k, v, kv_heads, generator):
    """name -> the FP8 kernel's output (float64, on the CPU) for q, k, v quantized that way."""
    import flashlab  # noqa: F401  (the extension; --kernel only)
    from flashlab import flash_attn_func

    batch = q.shape[0]

    def factors(x, rule):
        if rule == "naive":
            return torch.ones(batch, kv_heads, dtype=torch.float64)
        if rule == "per-tensor":
            return per_tensor_scale(x).expand(batch, kv_heads).clone()
        return per_kv_head_scale(x, kv_heads)[:, 0, ::x.shape[2] // kv_heads, 0].clone()

    def run(tensors, rule):
        quantized, descales = [], []
        for x in tensors:
            descale = factors(x, rule)
            group = x.shape[2] // kv_heads
            expanded = descale.repeat_interleave(group, dim=1)[:, None, :, None]
            quantized.append((x / expanded).to("cuda", torch.float32).to(E4M3))
            descales.append(descale.to("cuda", torch.float32).contiguous())
        out = flash_attn_func(*quantized, q_descale=descales[0], k_descale=descales[1], v_descale=descales[2])
        return out.to(torch.float64).cpu()

    hadamard = random_hadamard(q.shape[-1], generator)
    return {
        "kernel e4m3 naive": run((q, k, v), "naive"),
        "kernel e4m3 per-tensor": run((q, k, v), "per-tensor"),
        "kernel e4m3 descale": run((q, k, v), "descale"),
        "kernel + Hadamard": run((q @ hadamard, k @ hadamard, v), "descale"),
    }


def measure(args):
    rows = []
    for outliers in (False, True):
        q, k, v = problem(args.batch, args.seqlen, args.heads, args.kv_heads, args.head_dim, outliers, args.seed)
        scale = 1.0 / math.sqrt(args.head_dim)
        exact = attention(q, k, v, scale)
        rms = exact.pow(2).mean().sqrt().item()
        generator = torch.Generator().manual_seed(args.seed + 1)
        for name, ((pq, pk, pv), quantize_p) in paths(q, k, v, args.kv_heads, generator).items():
            error = attention(pq, pk, pv, scale, quantize_p) - exact
            rmse = error.pow(2).mean().sqrt().item()
            rows.append({"inputs": "outliers" if outliers else "normal", "path": name, "rmse": rmse,
                         "relative_rmse": rmse / rms, "max_abs_err": error.abs().max().item(), "out_rms": rms})
        if args.kernel:
            generator = torch.Generator().manual_seed(args.seed + 1)  # the emulation's Hadamard
            for name, out in kernel_paths(q, k, v, args.kv_heads, generator).items():
                error = out - exact
                rmse = error.pow(2).mean().sqrt().item()
                rows.append({"inputs": "outliers" if outliers else "normal", "path": name, "rmse": rmse,
                             "relative_rmse": rmse / rms, "max_abs_err": error.abs().max().item(),
                             "out_rms": rms})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    parser.add_argument("--kernel", action="store_true",
                        help="add flashlab's FP8 kernel (CUDA, sm_90a) on the same inputs")
    args = parser.parse_args()
    if args.heads % args.kv_heads:
        parser.error(f"--heads {args.heads} must be a multiple of --kv-heads {args.kv_heads}")
    rows = measure(args)
    print(f"batch {args.batch}, seqlen {args.seqlen}, heads {args.heads}/{args.kv_heads}, head_dim {args.head_dim}, "
          f"seed {args.seed}; error of out against float64 attention of the original inputs")
    print(f"{'inputs':<9} {'path':<22} {'RMSE':>10} {'rel RMSE':>9} {'max |err|':>10}")
    for row in rows:
        print(f"{row['inputs']:<9} {row['path']:<22} {row['rmse']:10.3e} {row['relative_rmse']:9.4f} "
              f"{row['max_abs_err']:10.3e}")
    for inputs in ("normal", "outliers"):
        by_path = {r["path"]: r for r in rows if r["inputs"] == inputs}
        print(f"{inputs}: per-tensor / descale RMSE {by_path['e4m3 per-tensor']['rmse'] / by_path['e4m3 descale']['rmse']:.2f}x, "
              f"naive / descale {by_path['e4m3 naive']['rmse'] / by_path['e4m3 descale']['rmse']:.2f}x, "
              f"P in e4m3 adds {by_path['e4m3 descale + P']['rmse'] / by_path['e4m3 descale']['rmse']:.2f}x, "
              f"per-tensor / (descale + P + Hadamard) "
              f"{by_path['e4m3 per-tensor']['rmse'] / by_path['+ Hadamard on Q, K']['rmse']:.2f}x")
        if args.kernel:
            print(f"{inputs}: kernel: naive cast / descale RMSE "
                  f"{by_path['kernel e4m3 naive']['rmse'] / by_path['kernel e4m3 descale']['rmse']:.2f}x, "
                  f"per-tensor / Hadamard {by_path['kernel e4m3 per-tensor']['rmse'] / by_path['kernel + Hadamard']['rmse']:.2f}x, "
                  f"kernel descale / emulated descale + P "
                  f"{by_path['kernel e4m3 descale']['rmse'] / by_path['e4m3 descale + P']['rmse']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
