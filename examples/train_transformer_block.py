#!/usr/bin/env python3
"""Trains a small transformer block a few steps with flashlab's flash_attn_func inside
torch.compile(fullgraph=True), next to the same block (same initial weights, same
batches) whose attention is torch's scaled_dot_product_attention, and prints both
losses at every step.

Exit codes: 0 the two losses stayed within the tolerance at every step, 1 they
diverged (the step and both losses are printed), 3 no CUDA device.

    python examples/train_transformer_block.py                      # bf16, GQA, causal, 30 steps
    python examples/train_transformer_block.py --kernel fa2_mma_sm80 --head-dim 80 --window 128

The tolerance is relative, |loss_flashlab - loss_sdpa| <= tolerance * |loss_sdpa|
(default 2e-2): both blocks compute in bfloat16 under autocast, so their losses
differ by rounding that grows with training, not by a systematic amount.
"""
import argparse
import copy
import math
import sys

import torch
import torch.nn.functional as F

import flashlab


def sdpa_attention(q, k, v, causal, window):
    """torch's SDPA on flash-attn's layout (batch, seqlen, heads, head_dim), GQA by
    repeating k and v, the sliding window as an explicit mask (aligned bottom-right;
    the block's seqlen_q == seqlen_k, so top-left is the same)."""
    groups = q.shape[2] // k.shape[2]
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if window < 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2)
    rows = torch.arange(q.shape[2], device=q.device)[:, None]
    cols = torch.arange(k.shape[2], device=q.device)[None, :]
    mask = (cols >= rows - window) & ((cols <= rows) if causal else (cols <= rows + window))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)


class Block(torch.nn.Module):
    """Pre-norm transformer block: GQA self-attention and a GELU MLP, both residual."""

    def __init__(self, dim, heads, kv_heads, head_dim, attention):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.attention = attention
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * head_dim, bias=False)
        self.proj = torch.nn.Linear(heads * head_dim, dim, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        batch, seqlen, _ = x.shape
        qkv = self.qkv(self.norm1(x)).view(batch, seqlen, self.heads + 2 * self.kv_heads,
                                           self.head_dim)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2)
        attended = self.attention(q, k, v).reshape(batch, seqlen, self.heads * self.head_dim)
        x = x + self.proj(attended)
        return x + self.mlp(self.norm2(x))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--window", type=int, default=-1, help="sliding window (left; -1: none)")
    parser.add_argument("--no-causal", action="store_true")
    parser.add_argument("--kernel", default="auto", help="a flashlab kernel (flashlab.kernels())")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--tolerance", type=float, default=2e-2,
                        help="largest relative loss difference allowed at any step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        print("train_transformer_block: no CUDA device (torch.cuda.is_available() is False)")
        return 3
    causal = not args.no_causal
    window = args.window

    def flash(q, k, v):
        size = (window, 0 if causal else window) if window >= 0 else (-1, -1)
        return flashlab.flash_attn_func(q, k, v, causal=causal, window_size=size, kernel=args.kernel)

    torch.manual_seed(args.seed)
    block = Block(args.dim, args.heads, args.kv_heads, args.head_dim, flash).cuda()
    reference = copy.deepcopy(block)
    reference.attention = lambda q, k, v: sdpa_attention(q, k, v, causal, window)
    models = {"flashlab": torch.compile(block, fullgraph=True),
              "sdpa": torch.compile(reference, fullgraph=True)}
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=args.lr)
                  for name, model in models.items()}
    # A fixed regression task: map random inputs to a fixed random linear image of them.
    data = torch.Generator(device="cuda").manual_seed(args.seed + 1)
    target_map = torch.randn(args.dim, args.dim, device="cuda", generator=data) / math.sqrt(args.dim)

    print(f"flashlab {flashlab.library_path()}; kernel {args.kernel}; batch {args.batch}, seqlen "
          f"{args.seqlen}, heads {args.heads}/{args.kv_heads}, head_dim {args.head_dim}, "
          f"{'causal' if causal else 'full'}, window {window}; bf16 autocast; "
          f"tolerance {args.tolerance:g} relative")
    print(f"{'step':>4}  {'flashlab':>12}  {'sdpa':>12}  {'rel diff':>9}")
    for step in range(args.steps):
        x = torch.randn(args.batch, args.seqlen, args.dim, device="cuda", generator=data)
        y = x @ target_map
        losses = {}
        for name, model in models.items():
            optimizers[name].zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.mse_loss(model(x).float(), y)
            loss.backward()
            optimizers[name].step()
            losses[name] = loss.item()
        difference = abs(losses["flashlab"] - losses["sdpa"]) / max(abs(losses["sdpa"]), 1e-12)
        print(f"{step:>4}  {losses['flashlab']:>12.6f}  {losses['sdpa']:>12.6f}  {difference:>9.2e}")
        if not math.isfinite(losses["flashlab"]) or difference > args.tolerance:
            print(f"diverged at step {step}: relative difference {difference:.3e} > "
                  f"{args.tolerance:g}")
            return 1
    print(f"passed: the losses agree within {args.tolerance:g} (relative) for {args.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
