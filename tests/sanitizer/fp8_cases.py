#!/usr/bin/env python3
"""The FP8 forward's sanitizer cases (run_fp8_sanitizer.sh runs this under compute-sanitizer):
small odd e4m3 problems through flash_attn_func, head_dim 64, 128 and 256, causal, window, GQA/MQA,
a one-row query, keys that end inside a 16-key group of the V transpose, and a variable-length
batch (empty sequences, queries without keys; V^T regions per sequence). Prints one line a
case and fails on a non-finite output; exit 77 (skipped) without a compute capability 9.0 GPU."""
import sys

import torch

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    print("SKIP: the FP8 forward needs compute capability 9.0")
    sys.exit(77)

from flashlab import flash_attn_func, flash_attn_varlen_func, fp8  # noqa: E402

# (head_dim, batch, seqlen_q, seqlen_k, heads, kv_heads, causal, window)
CASES = [
    (128, 2, 200, 333, 4, 2, True, (-1, -1)),
    (128, 1, 1, 7, 2, 2, False, (3, 0)),
    (256, 1, 77, 130, 2, 1, False, (-1, -1)),
    (64, 2, 300, 129, 4, 2, True, (-1, -1)),
    (256, 3, 129, 1000, 4, 4, True, (-1, -1)),
    (128, 1, 65, 2049, 2, 1, False, (-1, -1)),  # 2048+ keys: the 192-key tile, 129 keys in the last
    (128, 1, 65, 2113, 2, 1, False, (-1, -1)),  # 2113 = 11 x 192 + 1: one key in the last
]
generator = torch.Generator(device="cuda").manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
for head_dim, batch, seqlen_q, seqlen_k, heads, kv_heads, causal, window in CASES:
    tensors = [fp8.quantize(torch.randn(batch, rows, h, head_dim, device="cuda", generator=generator), kv_heads)
               for rows, h in ((seqlen_q, heads), (seqlen_k, kv_heads), (seqlen_k, kv_heads))]
    (q, qd), (k, kd), (v, vd) = tensors
    out = flash_attn_func(q, k, v, causal=causal, window_size=window, q_descale=qd, k_descale=kd, v_descale=vd)
    torch.cuda.synchronize()
    name = f"d{head_dim} b{batch} {seqlen_q}x{seqlen_k} h{heads}/{kv_heads} causal={causal} window={window}"
    if not torch.isfinite(out).all():
        print(f"FAIL {name}: non-finite output")
        sys.exit(1)
    print(f"ok {name}")

# Variable length, head_dim 128, causal, GQA: lengths off the 16-key groups and the 128-key tiles.
seqlens_q, seqlens_k, heads, kv_heads = [1, 0, 300, 7, 129], [200, 5, 0, 33, 1000], 4, 2
offsets = [torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32) for lengths in (seqlens_q, seqlens_k)]
(q, qd), (k, kd), (v, vd) = (fp8.quantize(torch.randn(sum(lengths), h, 128, device="cuda", generator=generator),
                                          kv_heads, cu)
                             for lengths, h, cu in ((seqlens_q, heads, offsets[0]), (seqlens_k, kv_heads, offsets[1]),
                                                    (seqlens_k, kv_heads, offsets[1])))
out = flash_attn_varlen_func(q, k, v, *offsets, max(seqlens_q), max(seqlens_k), causal=True, q_descale=qd,
                             k_descale=kd, v_descale=vd)
torch.cuda.synchronize()
if not torch.isfinite(out).all():
    print("FAIL varlen d128: non-finite output")
    sys.exit(1)
print(f"ok varlen d128 seqlens_q {seqlens_q} seqlens_k {seqlens_k} h{heads}/{kv_heads} causal=True")
