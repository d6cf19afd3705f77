#!/usr/bin/env python3
"""What a PyTorch user gets from flashlab's Python API: loops of calls timed the
way a model runs them, against torch SDPA's backends in the same loop.

  decode   flash_attn_with_kvcache, one query row a sequence, a cache of L keys
           (cache_seqlens an int32 tensor on the GPU), against
           F.scaled_dot_product_attention(q, k, v, enable_gqa=True) on (B, H, L, D)
           copies of the cache, SDPA's cuDNN and FLASH backends pinned in turn;
  tiny     flash_attn_func on a small causal problem (the per-call overhead),
           forward only and forward + backward, against SDPA the same way;
  train    (--train HEAD_DIMS) flash_attn_func forward + backward at training
           sizes (--train-tokens per batch, 2048 / head_dim heads, each of
           --train-seqlens, causal and not), against SDPA the same way, and its
           deterministic mode: the forward alone and forward + backward, so the
           backward alone is their difference (what issue 32's table reads).

Rows: flashlab (the public Python function), flashlab_op (torch.ops.flashlab.*
called directly: the C++ API behind torch's dispatcher), flashlab_graph (one
call captured in a CUDA graph and replayed: the launches without host code),
sdpa_cudnn, sdpa_flash. Each row: a warm-up, then --loops loops of --steps calls
timed with CUDA events around the whole loop (median of the loops, per step; the
rows' loops interleaved, round by round, so the clock's drift falls on all alike),
and the host's time per call (time.perf_counter around the same loop: where it
is close to the step time, the loop is bound by the host, not by the GPU).

Prints a table and, with --json FILE, writes every figure. Needs a CUDA GPU;
run from the repository root with the build tree's extension:
  PYTHONPATH=src/python FLASHLAB_OPS_LIBRARY=build/release/python/libflashlab_ops.so \\
      python3 scripts/bench_api.py [--batches 1,8,32] [--cache-lens 1024,8192] [--json api.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SDPA_BACKENDS = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}


def parse_ints(text):
    return [int(x) for x in text.split(",") if x]


def time_one_loop(call, steps):
    """(device us per step, host us per call) of one loop of `steps` calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for _ in range(steps):
        call()
    t1 = time.perf_counter()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / steps, (t1 - t0) * 1e6 / steps


def graph_of(call):
    """call captured in a CUDA graph (after a warm-up on a side stream); its replay,
    or the error text when capture fails."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            call()
    except Exception as error:  # noqa: BLE001 (reported, not hidden)
        torch.cuda.synchronize()
        return None, f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    return graph.replay, ""


def run_rows(rows, args, loop_timer=time_one_loop, synchronize=None):
    """rows: name -> callable (or an error string). Returns name -> result dict.

    Every row's warm-up, then args.loops rounds, each timing one loop of every row in
    turn, so that a stretch of lower clocks falls on every row alike (consecutive loops
    of one training step moved up to 12%, session 42); per row the median over the
    rounds. A row that raises is reported with its error and left out of later rounds."""
    synchronize = synchronize or torch.cuda.synchronize
    results, live = {}, {}
    for name, call in rows.items():
        if isinstance(call, str):
            results[name] = {"error": call}
            continue
        try:
            for _ in range(args.warmup):
                call()
            synchronize()
            live[name] = call
        except Exception as error:  # noqa: BLE001 (reported, not hidden)
            synchronize()
            results[name] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"}
    times = {name: [] for name in live}
    for _ in range(args.loops):
        for name in [n for n in live]:
            try:
                times[name].append(loop_timer(live[name], args.steps))
            except Exception as error:  # noqa: BLE001
                synchronize()
                results[name] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"}
                del live[name]
    for name in live:
        results[name] = {"step_us": statistics.median(t[0] for t in times[name]),
                         "host_us": statistics.median(t[1] for t in times[name])}
    return {name: results[name] for name in rows}


def decode_rows(flashlab, batch, cache_len, heads, kv_heads, head_dim, dtype):
    q = torch.randn(batch, 1, heads, head_dim, device="cuda", dtype=dtype)
    k_cache = torch.randn(batch, cache_len, kv_heads, head_dim, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    lengths = torch.full((batch,), cache_len, dtype=torch.int32, device="cuda")
    qt = q.transpose(1, 2).contiguous()
    kt, vt = (x.transpose(1, 2).contiguous() for x in (k_cache, v_cache))
    op = torch.ops.flashlab.fwd_kvcache

    def api():
        return flashlab.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths)

    def direct():
        return op(q, k_cache, v_cache, None, None, lengths, None, None, False, -1, -1, 0, "auto")

    rows = {"flashlab": api, "flashlab_op": direct}
    replay, error = graph_of(api)
    rows["flashlab_graph"] = replay or error
    for name, backend in SDPA_BACKENDS.items():
        def sdpa(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        rows[name] = sdpa
    # The answer first: every row computes the same attention.
    expected = F.scaled_dot_product_attention(qt.float(), kt.float(), vt.float(), enable_gqa=True)
    got = api().transpose(1, 2).float()
    error = (got - expected).abs().max().item()
    if not error < 2e-2:
        raise SystemExit(f"decode b{batch} L{cache_len}: flashlab differs from SDPA by {error}")
    return rows


class Problem:
    """Q, K, V and dO of flash_attn_func's (B, S, H, D) layout, and SDPA's (B, H, S, D): transposed
    views, or (copies=True) contiguous copies made once, as flashlab-bench's --torch-layout."""

    def __init__(self, batch, seqlen, heads, head_dim, dtype, backward, copies=False):
        self.backward = backward
        self.q, self.k, self.v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype,
                                              requires_grad=backward) for _ in range(3))
        self.dout = torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype)

        def bhsd(x):
            x = x.detach().transpose(1, 2)
            return x.contiguous() if copies else x
        self.qt, self.kt, self.vt = (bhsd(x).requires_grad_(backward) for x in (self.q, self.k, self.v))
        self.doutt = bhsd(self.dout)

    def finish(self, out, grad):
        """The backward of one call's output, when timed with it."""
        if self.backward:
            out.backward(grad)

    def sdpa_rows(self, causal):
        rows = {}
        for name, backend in SDPA_BACKENDS.items():
            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    self.finish(F.scaled_dot_product_attention(self.qt, self.kt, self.vt, is_causal=causal),
                                self.doutt)
            rows[name] = sdpa
        return rows


def tiny_rows(flashlab, batch, seqlen, heads, head_dim, dtype, backward):
    x = Problem(batch, seqlen, heads, head_dim, dtype, backward)
    op = torch.ops.flashlab.fwd

    def api():
        x.finish(flashlab.flash_attn_func(x.q, x.k, x.v, causal=True), x.dout)

    def direct():
        x.finish(op(x.q, x.k, x.v, None, True, -1, -1, False, "auto")[0], x.dout)

    rows = {"flashlab": api, "flashlab_op": direct}
    replay, error = graph_of(api) if not backward else (None, "not captured (backward: see tests)")
    rows["flashlab_graph"] = replay or error
    return {**rows, **x.sdpa_rows(causal=True)}


def train_rows(flashlab, batch, seqlen, heads, head_dim, dtype, causal, backward):
    x = Problem(batch, seqlen, heads, head_dim, dtype, backward, copies=True)

    def api(deterministic):
        return lambda: x.finish(flashlab.flash_attn_func(x.q, x.k, x.v, causal=causal,
                                                         deterministic=deterministic), x.dout)
    return {"flashlab": api(False), "flashlab_det": api(True), **x.sdpa_rows(causal)}


def print_train_table(cases):
    names = ["flashlab", "flashlab_det", "sdpa_cudnn", "sdpa_flash"]
    print("\nflash_attn_func at training sizes: ms per step (CUDA events around the loop); "
          "bwd = fwd+bwd - fwd")
    print(f"{'case':<22}" + "".join(f"{n + ' fwd+bwd':>22}" for n in names) +
          f"{'x cudnn':>9}{'x flash':>9}{'bwd x cudnn':>13}{'bwd x flash':>13}{'det/def':>9}")
    for case, results in cases.items():
        both, fwd = results["fwd+bwd"], results["fwd"]
        ms = {n: both[n]["step_us"] / 1000 for n in names if "step_us" in both.get(n, {})}
        bwd = {n: (both[n]["step_us"] - fwd[n]["step_us"]) / 1000 for n in names
               if "step_us" in both.get(n, {}) and "step_us" in fwd.get(n, {})}
        cells = "".join(f"{ms[n]:>22.3f}" if n in ms else f"{'fails':>22}" for n in names)

        def ratio(table, other, width):
            if "flashlab" in table and other in table:
                return f"{table[other] / table['flashlab']:>{width}.3f}"
            return f"{'-':>{width}}"
        det = (f"{ms['flashlab_det'] / ms['flashlab']:>9.3f}" if "flashlab" in ms and "flashlab_det" in ms
               else f"{'-':>9}")
        print(f"{case:<22}{cells}{ratio(ms, 'sdpa_cudnn', 9)}{ratio(ms, 'sdpa_flash', 9)}"
              f"{ratio(bwd, 'sdpa_cudnn', 13)}{ratio(bwd, 'sdpa_flash', 13)}{det}")
    for case, results in cases.items():
        for part, rows in results.items():
            for name, r in rows.items():
                if "error" in r:
                    print(f"  {case} {part} {name}: {r['error']}")


def print_table(title, cases):
    names = ["flashlab", "flashlab_op", "flashlab_graph", "sdpa_cudnn", "sdpa_flash"]
    print(f"\n{title}: us per step (CUDA events around the loop) / host us per call")
    print(f"{'case':<24}" + "".join(f"{n:>22}" for n in names) + f"{'x cudnn':>9}")
    for case, results in cases.items():
        cells = []
        for name in names:
            r = results.get(name, {})
            if "error" in r:
                cells.append(f"{'fails':>22}")
            elif r:
                cells.append(f"{r['step_us']:>13.1f} / {r['host_us']:>5.1f}")
            else:
                cells.append(f"{'-':>22}")
        ratio = ""
        if "step_us" in results.get("flashlab", {}) and "step_us" in results.get("sdpa_cudnn", {}):
            ratio = f"{results['sdpa_cudnn']['step_us'] / results['flashlab']['step_us']:>9.3f}"
        print(f"{case:<24}" + "".join(cells) + ratio)
    for case, results in cases.items():
        for name, r in results.items():
            if "error" in r:
                print(f"  {case} {name}: {r['error']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--cache-lens", default="1024,8192")
    parser.add_argument("--heads", default="32/8")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--tiny", default="4x128,4x512", help="BxS problems of flash_attn_func "
                        "(16 heads, head_dim 64, causal); empty: none")
    parser.add_argument("--train", default="", help="head dims of the training-size rows "
                        "(e.g. 64,128,256); empty: none")
    parser.add_argument("--train-seqlens", default="1024,4096,16384")
    parser.add_argument("--train-tokens", type=int, default=16384, help="batch x seqlen of each row")
    parser.add_argument("--train-steps", type=int, default=10, help="calls a loop (training rows)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--loops", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_api.py: no CUDA device; nothing to time", file=sys.stderr)
        return 3
    import flashlab

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    heads, kv_heads = (int(x) for x in args.heads.split("/"))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashlab from "
          f"{flashlab.library_path()}")
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "decode": {}, "tiny": {}, "train": {}}
    for batch in parse_ints(args.batches):
        for cache_len in parse_ints(args.cache_lens):
            case = f"b{batch} L{cache_len}"
            rows = decode_rows(flashlab, batch, cache_len, heads, kv_heads, args.head_dim, dtype)
            report["decode"][case] = run_rows(rows, args)
            torch.cuda.empty_cache()
    print_table(f"decode, {heads}/{kv_heads} heads, head_dim {args.head_dim}, {args.dtype}, "
                f"{args.steps} steps a loop", report["decode"])
    for spec in [s for s in args.tiny.split(",") if s]:
        batch, seqlen = (int(x) for x in spec.split("x"))
        for backward in (False, True):
            case = f"{batch}x{seqlen}x16x64 {'fwd+bwd' if backward else 'fwd'}"
            rows = tiny_rows(flashlab, batch, seqlen, 16, 64, dtype, backward)
            report["tiny"][case] = run_rows(rows, args)
    print_table(f"flash_attn_func, causal, {args.dtype}", report["tiny"])
    train_args = argparse.Namespace(**{**vars(args), "steps": args.train_steps,
                                       "warmup": max(2, args.train_steps // 2)})
    for head_dim in parse_ints(args.train):
        for seqlen in parse_ints(args.train_seqlens):
            for causal in (False, True):
                batch, heads = max(1, args.train_tokens // seqlen), max(1, 2048 // head_dim)
                case = f"d{head_dim} b{batch} s{seqlen} {'causal' if causal else 'full'}"
                report["train"][case] = {
                    part: run_rows(train_rows(flashlab, batch, seqlen, heads, head_dim, dtype, causal,
                                              part == "fwd+bwd"), train_args)
                    for part in ("fwd", "fwd+bwd")}
                torch.cuda.empty_cache()
    if report["train"]:
        print_train_table(report["train"])
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
