#!/usr/bin/env python3
"""Context parallelism benchmark (issue 34, item 4): flashlab.distributed's ring and
Ulysses attention against torch's own context parallel over SDPA, with the scaling
efficiency of each against one GPU's attention of the per-GPU length.

What it measures. For each total sequence length L (--seqlens), causal and not, forward
("fwd") and forward + backward ("fwdbwd"), every rank of the job holds its shard of the
sequence and the schemes run one after another in the same process group:

  ring            flashlab.distributed.ring_flash_attn_func on q (B, L/world, H, D) and
                  k, v (B, L/world, KV, D); causal runs on zigzag shards (each rank holds
                  chunks r and 2 x world - 1 - r of 2 x world), non-causal on contiguous ones;
  ulysses         flashlab.distributed.ulysses_flash_attn_func on contiguous shards (two
                  all-to-alls turn them into head shards; H must divide by the world size);
  torch_cp_cudnn  torch.distributed.tensor.experimental.context_parallel over a 1-D
  torch_cp_flash  DeviceMesh: full-length SDPA buffers q (B, H, L, D), k, v (B, KV, L, D)
                  sharded by the context manager along dim 2 (for causal, torch's own load
                  balancer reorders them first), F.scaled_dot_product_attention(is_causal=
                  causal, enable_gqa=KV != H) inside sdpa_kernel(CUDNN_ATTENTION) or
                  sdpa_kernel(FLASH_ATTENTION). The rotate method (torch's "allgather"
                  default or --torch-cp-rotate alltoall) is printed and recorded. If torch's
                  API is missing or fails (on CPU it has no kernel), the scheme is recorded
                  as skipped with the reason; if enable_gqa fails, it is retried with k, v
                  repeated to H heads (recorded in "notes").

and, on every rank with no communication, the single-GPU baseline: flashlab's block
operation (--block-ops: block_ops.forward / block_ops.backward) on q, k, v of
(B, T, H|KV, D) with T = L / world, causal as the case.

Timing: --warmup untimed iterations, then --iters timed ones, each after
torch.cuda.synchronize() and dist.barrier(), between two CUDA events (time.perf_counter
on --device cpu); a rank's figure is the median of its iterations, the case's figure the
maximum over ranks (the slowest rank finishes the step). Peak memory is
torch.cuda.max_memory_allocated, reset before each case (inputs included), the maximum
over ranks; null on CPU. A case that runs out of memory is recorded as "oom" and the run
goes on (an out-of-memory error on one rank only, in the middle of a collective, can
leave the others waiting: --timeout-min bounds that wait).

Launch (one node; the extension from the build tree, or an installed flashlab):
    PYTHONPATH=src/python FLASHLAB_OPS_LIBRARY=build/release/python/libflashlab_ops.so \\
        torchrun --nproc-per-node 4 scripts/bench_distributed.py \\
        --seqlens 32768,65536,131072,262144,524288 --json cp_w4.json
several nodes (the same command on each, R = 0 .. N-1):
    torchrun --nnodes N --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        --nproc-per-node G scripts/bench_distributed.py ...
CPU smoke run (gloo, plain torch math for the blocks):
    torchrun --standalone --nproc-per-node 2 scripts/bench_distributed.py --device cpu \\
        --block-ops reference --dtype fp32 --seqlens 64,128 --heads 4 --kv-heads 2 --head-dim 16
scripts/plot_distributed.py draws TFLOP/s per GPU against L from one or more --json files
(e.g. one per world size).

Fields (one record per (seqlen, causal, direction, scheme) in --json, rows of the table):
  time_ms          the maximum over ranks of each rank's median time of one step;
                   time_ms_per_rank lists each rank's median;
  tokens_per_s     B x L / time (the whole sequence's tokens);
  tflops_per_gpu   the attention FLOPs of the whole sequence / world / time: the forward
                   counts 4 x B x H x L^2 x D, halved for causal; fwdbwd counts 3.5x the
                   forward (flashlab-bench's convention, scripts/plot_bench.py);
  single_gpu_*     the baseline at T = L / world (its tflops count T, not L);
  efficiency       tflops_per_gpu / single_gpu_tflops: 1.0 is a GPU of the group doing
                   attention as fast as a lone GPU does at the length it holds;
  peak_mem_gib     the maximum over ranks of the peak allocated memory (torch CP's
                   includes the full-length input buffers: resize_ keeps their storage);
  status           ok | oom | skipped (shapes the scheme cannot take, torch's API missing
                   or failing) | error (ring/ulysses raised), with "reason".
The JSON is {"header": {world size, device, torch version, dtype, shapes, git commit, ...},
"records": [...]}.

--profile DIR: after each measurement, one more step under torch.profiler on every rank
(CPU and, on GPUs, CUDA activity: every kernel on every stream, NCCL's included), written as
DIR/<case>_<scheme>.rank<R>.json (a Chrome trace: chrome://tracing or ui.perfetto.dev) and
DIR/<case>_<scheme>.rank<R>.txt (the operators and kernels by self time, top 25). The single-GPU
baseline's are <case>_single. For finding where a scheme loses against the baseline.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parent.parent


def import_flashlab_distributed():
    """flashlab.distributed (after the options parse: --help needs no extension)."""
    try:
        import flashlab.distributed as module
    except ModuleNotFoundError:  # a source checkout run without PYTHONPATH: use its package
        sys.path.insert(0, str(REPO_ROOT / "src" / "python"))
        import flashlab.distributed as module
    return module


SCHEMES = ("ring", "ulysses", "torch_cp_cudnn", "torch_cp_flash")
DIRECTIONS = ("fwd", "fwdbwd")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GIB = float(1 << 30)
cp = None  # flashlab.distributed, imported by run()


# ---------------------------------------------------------------------------
# Options.


def parse_seqlens(text):
    """'32768,64k' -> [32768, 65536]."""
    lengths = []
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            continue
        try:
            value = int(item[:-1]) * 1024 if item.endswith("k") else int(item)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not a length (expected e.g. 32768 or 32k)")
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{value} is not a positive length")
        lengths.append(value)
    if not lengths:
        raise argparse.ArgumentTypeError(f"no length in {text!r}")
    return lengths


def parse_choices(allowed):
    def parse(text):
        chosen = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in chosen if item not in allowed]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(f"got {text!r}; expected a comma list of {', '.join(allowed)}")
        return list(dict.fromkeys(chosen))  # keep order, drop repeats
    return parse


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Launch with torchrun; see the module docstring for the fields.")
    parser.add_argument("--seqlens", type=parse_seqlens, default=parse_seqlens("32768,65536,131072,262144,524288"),
                        help="total sequence lengths L, comma separated (a k suffix means x1024); "
                             "default 32768..524288")
    parser.add_argument("--batch", type=int, default=1, help="batch size B (default 1)")
    parser.add_argument("--heads", type=int, default=32, help="query heads H (default 32)")
    parser.add_argument("--kv-heads", type=int, default=8, help="key/value heads KV; H must divide by it "
                                                                "(default 8: GQA)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dimension D (default 128)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="element type (default bf16)")
    parser.add_argument("--causal", choices=("both", "yes", "no"), default="both",
                        help="causal cases, non-causal ones, or both (default)")
    parser.add_argument("--directions", type=parse_choices(DIRECTIONS), default=list(DIRECTIONS),
                        help="fwd (forward) and/or fwdbwd (forward + backward); default both")
    parser.add_argument("--schemes", type=parse_choices(SCHEMES), default=list(SCHEMES),
                        help=f"comma list of {', '.join(SCHEMES)} (default all)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations before each measurement (default 3)")
    parser.add_argument("--iters", type=int, default=10, help="timed iterations; the median counts (default 10)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (NCCL, one GPU a rank: LOCAL_RANK) or cpu (gloo); default cuda")
    parser.add_argument("--block-ops", choices=("flashlab", "reference"), default="flashlab",
                        help="the block operation of the ring, Ulysses and the single-GPU baseline: flashlab's "
                             "kernels (default) or plain torch math (reference_block_ops, for CPU runs)")
    parser.add_argument("--torch-cp-rotate", choices=("allgather", "alltoall"), default=None,
                        help="torch context parallel's K/V rotate method (set_rotate_method); default: torch's "
                             "own default (allgather), left untouched")
    parser.add_argument("--ring-sm-margin", type=int, default=None, metavar="N",
                        help="SMs the ring's forward blocks leave to NCCL's transfer kernels "
                             "(ring_flash_attn_func's sm_margin; default: the ring's own, "
                             "flashlab.distributed.DEFAULT_RING_SM_MARGIN with flashlab's block ops)")
    parser.add_argument("--seed", type=int, default=0, help="random inputs' seed (rank added)")
    parser.add_argument("--timeout-min", type=float, default=10.0,
                        help="process group timeout in minutes: a rank left waiting (e.g. after a lone "
                             "out-of-memory error) fails after it instead of hanging (default 10)")
    parser.add_argument("--json", metavar="OUT", default=None, help="write the header and every record to OUT")
    parser.add_argument("--profile", metavar="DIR", default=None,
                        help="also profile one step of each measurement (torch.profiler) into DIR: a Chrome "
                             "trace and a table of the kernels by self time, per rank")
    return parser


def check_options(parser, args):
    for name in ("batch", "heads", "kv_heads", "head_dim", "iters"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive; got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be 0 or more; got {args.warmup}")
    if args.heads % args.kv_heads != 0:
        parser.error(f"--heads ({args.heads}) must be a multiple of --kv-heads ({args.kv_heads})")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False (use --device cpu --block-ops reference)")


# ---------------------------------------------------------------------------
# The process group and what every rank shares.


@dataclass
class Env:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    is_cuda: bool


def init_distributed(args):
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if "MASTER_ADDR" not in os.environ:  # run without torchrun: a world of one
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
    timeout = datetime.timedelta(minutes=args.timeout_min)
    if args.device == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise SystemExit(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs are visible: "
                             "--nproc-per-node must not exceed the GPUs of a node")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, timeout=timeout)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    return Env(rank, world, local_rank, device, args.device == "cuda")


def barrier(env):
    if env.is_cuda:
        torch.cuda.synchronize()
        dist.barrier(device_ids=[env.local_rank])
    else:
        dist.barrier()


def log(env, message):
    if env.rank == 0:
        print(message, flush=True)


def git_commit():
    try:
        commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def nccl_version():
    version = torch.cuda.nccl.version()  # a tuple in recent torch, an int in older ones
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def device_name(env):
    if env.is_cuda:
        return torch.cuda.get_device_name(env.device)
    return f"cpu ({platform.processor() or platform.machine()})"


# ---------------------------------------------------------------------------
# torch's context parallel: what this torch has of it.


class TorchCP:
    """torch.distributed.tensor.experimental.context_parallel and what goes with it, or
    `missing`: why it cannot run. _cp_options (enable_load_balance, rotate_method) and
    set_rotate_method are private: read from torch.distributed.tensor.experimental._attention
    (in torch 2.14 a re-export of _context_parallel._attention) where this torch has them."""

    def __init__(self, env, rotate_method):
        self.missing = None
        self.options = None
        self.rotate_note = ""
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor.experimental import context_parallel
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError as error:
            self.missing = f"torch {torch.__version__} has no context parallel API: {error}"
            return
        self.context_parallel, self.sdpa_kernel = context_parallel, sdpa_kernel
        self.backends = {"torch_cp_cudnn": SDPBackend.CUDNN_ATTENTION, "torch_cp_flash": SDPBackend.FLASH_ATTENTION}
        try:
            from torch.distributed.tensor.experimental import _attention as cp_attention
            self.options = getattr(cp_attention, "_cp_options", None)
            set_rotate = getattr(cp_attention, "set_rotate_method", None)
        except ImportError:
            set_rotate = None
        if rotate_method is not None:
            if set_rotate is None:
                self.rotate_note = f" (--torch-cp-rotate {rotate_method} ignored: no set_rotate_method in this torch)"
            else:
                set_rotate(rotate_method)
        try:
            self.mesh = init_device_mesh(env.device.type, (env.world,), mesh_dim_names=("cp",))
        except Exception as error:  # noqa: BLE001 (the scheme is skipped with the reason)
            self.missing = f"init_device_mesh({env.device.type!r}, ({env.world},)) failed: {one_line(error)}"

    def rotate_method(self):
        method = getattr(self.options, "rotate_method", None)
        if method is None:
            return "unknown (no _cp_options.rotate_method)" + self.rotate_note
        return {"ALL_GATHER": "allgather", "ALL_TO_ALL": "alltoall"}.get(method.name, method.name) + self.rotate_note


# ---------------------------------------------------------------------------
# Cases, FLOPs, skips.


@dataclass(frozen=True)
class Case:
    seqlen: int
    causal: bool
    direction: str


def attention_flops(batch, heads, seqlen, head_dim, causal, direction):
    """flashlab-bench's count (src/harness/flops.cpp), through flashlab.testing's operator."""
    arguments = ["--batch", str(batch), "--heads", str(heads), "--seqlen-q", str(seqlen), "--head-dim",
                 str(head_dim), "--seed", "0"] + (["--causal"] if causal else [])
    return torch.ops.flashlab.testing_flops(arguments, direction)


def skip_reason(scheme, case, args, world):
    """Why `scheme` cannot take this case's shapes, or None."""
    if case.seqlen % world != 0:
        return f"seqlen {case.seqlen} is not divisible by the world size {world}"
    if scheme == "ring" and case.causal and case.seqlen % (2 * world) != 0:
        return (f"the causal ring takes zigzag shards: seqlen {case.seqlen} must be a multiple of "
                f"2 x world = {2 * world}")
    if scheme == "ulysses" and args.heads % world != 0:
        return f"Ulysses needs heads divisible by the world size: heads {args.heads}, world {world}"
    if scheme.startswith("torch_cp") and case.causal and case.seqlen % (2 * world) != 0:
        return (f"torch's causal load balancer needs seqlen {case.seqlen} to be a multiple of "
                f"2 x world = {2 * world}")
    return None


def one_line(error):
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"


def is_out_of_memory(error):
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


# ---------------------------------------------------------------------------
# The runs. Each prepare_* allocates its inputs (contexts go into `stack`, which stays
# open while the step is timed) and returns (step, layout, notes).


def random_tensor(shape, args, env, generator):
    return torch.randn(*shape, generator=generator, device=env.device, dtype=DTYPES[args.dtype])


def prepare_single(stack, case, args, env, block_ops, generator):
    rows = case.seqlen // env.world
    scale = 1.0 / math.sqrt(args.head_dim)
    q = random_tensor((args.batch, rows, args.heads, args.head_dim), args, env, generator)
    k, v = (random_tensor((args.batch, rows, args.kv_heads, args.head_dim), args, env, generator) for _ in range(2))
    if case.direction == "fwd":
        def step():
            block_ops.forward(q, k, v, case.causal, scale)
    else:
        dout = torch.randn_like(q)

        def step():
            out, lse = block_ops.forward(q, k, v, case.causal, scale)
            block_ops.backward(dout, q, k, v, out, lse, case.causal, scale)
    return step, "one GPU, no communication", ""


def prepare_flashlab_scheme(stack, scheme, case, args, env, block_ops, generator):
    rows = case.seqlen // env.world
    # The data is random, so a rank's random shard stands for its zigzag or contiguous
    # shard of one sequence: only the rows' positions differ, and the scheme knows them.
    q = random_tensor((args.batch, rows, args.heads, args.head_dim), args, env, generator)
    k, v = (random_tensor((args.batch, rows, args.kv_heads, args.head_dim), args, env, generator) for _ in range(2))
    if scheme == "ring":
        attend = lambda q_, k_, v_: cp.ring_flash_attn_func(q_, k_, v_, causal=case.causal,  # noqa: E731
                                                             block_ops=block_ops, sm_margin=args.ring_sm_margin)
        layout = "zigzag shards" if case.causal else "contiguous shards"
    else:
        attend = lambda q_, k_, v_: cp.ulysses_flash_attn_func(q_, k_, v_, causal=case.causal,  # noqa: E731
                                                                block_ops=block_ops)
        layout = "contiguous shards, all-to-all to head shards"
    if case.direction == "fwd":
        def step():
            with torch.no_grad():
                attend(q, k, v)
    else:
        for tensor in (q, k, v):
            tensor.requires_grad_()
        dout = torch.randn_like(q)

        def step():
            out = attend(q, k, v)
            torch.autograd.grad(out, (q, k, v), dout)
    return step, layout, ""


def prepare_torch_cp(stack, scheme, case, args, env, torch_cp, expand_kv, generator):
    if torch_cp.missing:
        raise RuntimeError(torch_cp.missing)
    kv_heads = args.heads if expand_kv else args.kv_heads
    gqa = kv_heads != args.heads
    shape = lambda heads: (args.batch, heads, case.seqlen, args.head_dim)  # noqa: E731  SDPA's (B, H, L, D)
    q = random_tensor(shape(args.heads), args, env, generator)
    k, v = (random_tensor(shape(kv_heads), args, env, generator) for _ in range(2))
    options = torch_cp.options
    if options is not None:
        # torch balances causal attention with its own reordering and refuses load
        # balancing without a causal mask; torch 2.14's context_parallel sets the flag
        # from the balancer, older ones read it as it is: set it for both, put it back after.
        previous = options.enable_load_balance
        stack.callback(setattr, options, "enable_load_balance", previous)
        options.enable_load_balance = case.causal
    original_sdpa = F.scaled_dot_product_attention
    # Runs after the context's exit: older torch leaves SDPA patched when the body raises.
    stack.callback(lambda: setattr(F, "scaled_dot_product_attention", original_sdpa)
                   if F.scaled_dot_product_attention is not original_sdpa else None)
    # The buffers are not restored (no copy of the full length kept); they become this
    # rank's shards (B, H, L / world, D) in place.
    stack.enter_context(torch_cp.context_parallel(torch_cp.mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2],
                                                  no_restore_buffers={q, k, v}))
    stack.enter_context(torch_cp.sdpa_kernel(torch_cp.backends[scheme]))
    balanced = getattr(options, "enable_load_balance", None)
    balance_note = {True: "torch's causal load balancer", False: "contiguous shards", None: "unknown"}[balanced]
    notes = (f"rotate={torch_cp.rotate_method()}; load balance: {balance_note}; "
             + ("k/v repeated to H heads (enable_gqa failed)" if expand_kv and args.kv_heads != args.heads
                else "enable_gqa" if gqa else "MHA"))
    extra = {"enable_gqa": True} if gqa else {}
    if case.direction == "fwd":
        def step():
            with torch.no_grad():
                # Looked up at each call: the context manager patches F's attribute.
                F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, **extra)
    else:
        for tensor in (q, k, v):
            tensor.requires_grad_()
        dout = torch.randn_like(q)

        def step():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, **extra)
            torch.autograd.grad(out, (q, k, v), dout)
    return step, f"torch context_parallel ({balance_note})", notes


def median_step_ms(step, args, env):
    """This rank's median time of one step, each timed iteration after a barrier."""
    for _ in range(args.warmup):
        barrier(env)
        step()
    times = []
    if env.is_cuda:
        events = []
        for _ in range(args.iters):
            barrier(env)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        times = [start.elapsed_time(end) for start, end in events]
    else:
        for _ in range(args.iters):
            barrier(env)
            begin = time.perf_counter()
            step()
            times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


def free_memory(env):
    """Gives the last case's memory back, so that each case's peak is its own."""
    if env.is_cuda:
        gc.collect()
        torch.cuda.empty_cache()


def profile_step(step, args, env, label):
    """One more step under torch.profiler (after a barrier): the Chrome trace and the
    self-time table to args.profile/<label>.rank<R>.{json,txt}."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if env.is_cuda else [])
    barrier(env)
    with profile(activities=activities) as profiler:
        step()
        if env.is_cuda:
            torch.cuda.synchronize()
    base = Path(args.profile) / f"{label}.rank{env.rank}"
    profiler.export_chrome_trace(str(base) + ".json")
    sort_by = "self_cuda_time_total" if env.is_cuda else "self_cpu_time_total"
    Path(str(base) + ".txt").write_text(profiler.key_averages().table(sort_by=sort_by, row_limit=25) + "\n")


def run_measurement(prepare, args, env, failure_status, label=None):
    """Runs prepare's step on every rank; every rank returns the same outcome:
    {"status", "reason", "time_ms" (max over ranks), "time_ms_per_rank", "peak_mem_gib",
    "layout", "notes"}. A failure that is not out-of-memory gets `failure_status`.
    With --profile, one more step is profiled under `label` (profile_step)."""
    free_memory(env)
    if env.is_cuda:
        torch.cuda.reset_peak_memory_stats(env.device)
    local = {"status": "ok", "reason": None, "time_ms": None, "layout": None, "notes": ""}
    try:
        with contextlib.ExitStack() as stack:
            step, local["layout"], local["notes"] = prepare(stack)
            local["time_ms"] = median_step_ms(step, args, env)
            if args.profile and label:
                profile_step(step, args, env, label)
    except Exception as error:  # noqa: BLE001 (recorded; the benchmark goes on)
        local["status"] = "oom" if is_out_of_memory(error) else failure_status
        local["reason"] = one_line(error)
    local["peak_bytes"] = torch.cuda.max_memory_allocated(env.device) if env.is_cuda else None
    free_memory(env)  # after the exception (and its frames) are gone
    gathered = [None] * env.world
    dist.all_gather_object(gathered, local)
    worst = next((g for g in gathered if g["status"] == "oom"), None) or \
        next((g for g in gathered if g["status"] != "ok"), None)
    peaks = [g["peak_bytes"] for g in gathered if g["peak_bytes"] is not None]
    outcome = {"layout": gathered[0]["layout"], "notes": gathered[0]["notes"],
               "peak_mem_gib": max(peaks) / GIB if peaks else None}
    if worst is not None:
        failed_ranks = [rank for rank, g in enumerate(gathered) if g["status"] != "ok"]
        reason = worst["reason"] if worst["reason"] else "failed"
        if len(failed_ranks) < env.world:
            reason += f" (on ranks {failed_ranks})"
        outcome.update(status=worst["status"], reason=reason, time_ms=None, time_ms_per_rank=None)
    else:
        per_rank = [g["time_ms"] for g in gathered]
        outcome.update(status="ok", reason=None, time_ms=max(per_rank), time_ms_per_rank=per_rank)
    return outcome


# ---------------------------------------------------------------------------
# Reporting.


def fmt(value, spec, missing="-"):
    return missing if value is None else format(value, spec)


def fmt_tflops(value):
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def result_text(record, reasons):
    """The progress line's result; a failure's reason in full the first time it comes
    (numbered in `reasons`, the table's index), by its number after that."""
    if record["status"] != "ok":
        if record["reason"] in reasons:
            return f"{record['status']} (reason [{reasons[record['reason']]}] above)"
        reasons[record["reason"]] = len(reasons) + 1
        return f"{record['status']} [{reasons[record['reason']]}]: {record['reason']}"
    return (f"{record['time_ms']:.3f} ms, {record['tokens_per_s']:.3e} tok/s, "
            f"{fmt_tflops(record['tflops_per_gpu'])} TFLOP/s/GPU, "
            f"efficiency {fmt(record['efficiency'], '.2f')}, peak {fmt(record['peak_mem_gib'], '.2f', 'n/a')} GiB")


def single_text(single, tflops, rows):
    if single["status"] != "ok":
        return f"1 GPU @ {rows}: {single['status']}: {single['reason']}"
    return f"1 GPU @ {rows}: {single['time_ms']:.3f} ms, {fmt_tflops(tflops)} TFLOP/s"


def print_table(env, records, reasons):
    columns = [("L", 8), ("causal", 6), ("dir", 6), ("scheme", 14), ("ms", 10), ("tokens/s", 10),
               ("TFLOP/s/GPU", 11), ("1GPU@L/w", 9), ("eff", 5), ("peak GiB", 8), ("status", 0)]
    lines = ["  ".join(f"{name:>{width}}" if width else name for name, width in columns)]
    for r in records:
        ok = r["status"] == "ok"
        cells = [str(r["seqlen"]), "yes" if r["causal"] else "no", r["direction"], r["scheme"],
                 fmt(r["time_ms"], ".3f") if ok else "-", fmt(r["tokens_per_s"], ".3e") if ok else "-",
                 fmt_tflops(r["tflops_per_gpu"]) if ok else "-", fmt_tflops(r["single_gpu_tflops"]),
                 fmt(r["efficiency"], ".2f"), fmt(r["peak_mem_gib"], ".2f"),
                 r["status"] if ok else f"{r['status']} [{reasons[r['reason']]}]"]
        lines.append("  ".join(f"{cell:>{width}}" if width else cell for cell, (_, width) in zip(cells, columns)))
    lines += [f"[{number}] {reason}" for reason, number in reasons.items()]
    log(env, "\n".join(lines))


# ---------------------------------------------------------------------------


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    check_options(parser, args)
    env = init_distributed(args)
    try:
        run(args, env)
    finally:
        dist.destroy_process_group()


def run(args, env):
    global cp
    cp = import_flashlab_distributed()
    block_ops = cp.flashlab_block_ops if args.block_ops == "flashlab" else cp.reference_block_ops
    generator = torch.Generator(device=env.device).manual_seed(args.seed + env.rank)
    causal_values = {"both": [True, False], "yes": [True], "no": [False]}[args.causal]
    cases = [Case(seqlen, causal, direction) for seqlen in args.seqlens for causal in causal_values
             for direction in args.directions]
    torch_cp = TorchCP(env, args.torch_cp_rotate) if any(s.startswith("torch_cp") for s in args.schemes) else None

    header = {
        "benchmark": "bench_distributed", "world_size": env.world,
        "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", env.world)),
        "device": args.device, "device_name": device_name(env), "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda, "nccl_version": nccl_version() if env.is_cuda else None,
        "backend": dist.get_backend(), "dtype": args.dtype, "batch": args.batch, "heads": args.heads,
        "kv_heads": args.kv_heads, "head_dim": args.head_dim, "seqlens": args.seqlens,
        "causal": causal_values, "directions": args.directions, "schemes": args.schemes,
        "warmup": args.warmup, "iters": args.iters, "block_ops": args.block_ops,
        "ring_sm_margin": args.ring_sm_margin,
        "timing": ("CUDA events" if env.is_cuda else "time.perf_counter") +
                  ", median of iters per rank, max over ranks; a barrier before each iteration",
        "flops": "forward 4*B*H*L^2*D, halved for causal; fwdbwd 3.5x the forward; per GPU = / world",
        "torch_cp_rotate_method": torch_cp.rotate_method() if torch_cp and not torch_cp.missing else None,
        "torch_cp_missing": torch_cp.missing if torch_cp else None,
        "git_commit": git_commit() if env.rank == 0 else None,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv,
    }
    log(env, f"bench_distributed: world {env.world} ({header['local_world_size']} a node), {header['device_name']}, "
             f"torch {torch.__version__}, {header['backend']}; block ops {args.block_ops}; {args.dtype}, B={args.batch} "
             f"H={args.heads} KV={args.kv_heads} D={args.head_dim}; warmup {args.warmup}, iters {args.iters}; "
             f"ring sm_margin {'default' if args.ring_sm_margin is None else args.ring_sm_margin}")
    if torch_cp is not None:
        log(env, "torch context parallel: " + (f"unavailable: {torch_cp.missing}" if torch_cp.missing else
                                               f"rotate method {torch_cp.rotate_method()}"))

    records, reasons = [], {}  # reasons: failure text -> its number
    total = len(cases) * len(args.schemes)
    done = 0
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    for case in cases:
        rows = case.seqlen // env.world
        case_label = f"L{case.seqlen}_{'causal' if case.causal else 'full'}_{case.direction}"
        single = {"status": "skipped", "reason": f"seqlen {case.seqlen} is not divisible by the world size "
                                                 f"{env.world}", "time_ms": None}
        single_tflops = None
        if case.seqlen % env.world == 0:
            single = run_measurement(lambda stack: prepare_single(stack, case, args, env, block_ops, generator),
                                     args, env, failure_status="error", label=f"{case_label}_single")
            if single["status"] == "ok":
                single_tflops = attention_flops(args.batch, args.heads, rows, args.head_dim, case.causal,
                                                case.direction) / (single["time_ms"] * 1e-3) / 1e12
        flops = attention_flops(args.batch, args.heads, case.seqlen, args.head_dim, case.causal, case.direction)
        for scheme in args.schemes:
            done += 1
            reason = skip_reason(scheme, case, args, env.world)
            if reason is not None:
                outcome = {"status": "skipped", "reason": reason, "time_ms": None, "time_ms_per_rank": None,
                           "peak_mem_gib": None, "layout": None, "notes": ""}
            elif scheme.startswith("torch_cp"):
                outcome = run_torch_cp(scheme, case, args, env, torch_cp, generator, f"{case_label}_{scheme}")
            else:
                outcome = run_measurement(
                    lambda stack: prepare_flashlab_scheme(stack, scheme, case, args, env, block_ops, generator),
                    args, env, failure_status="error", label=f"{case_label}_{scheme}")
            record = {"seqlen": case.seqlen, "causal": case.causal, "direction": case.direction, "scheme": scheme,
                      "world_size": env.world, "batch": args.batch, "heads": args.heads, "kv_heads": args.kv_heads,
                      "head_dim": args.head_dim, "dtype": args.dtype, "shard_seqlen": rows, "flops": flops,
                      **outcome, "tokens_per_s": None, "tflops_per_gpu": None,
                      "single_gpu_seqlen": rows, "single_gpu_status": single["status"],
                      "single_gpu_ms": single["time_ms"], "single_gpu_tflops": single_tflops, "efficiency": None}
            if outcome["status"] == "ok":
                seconds = outcome["time_ms"] * 1e-3
                record["tokens_per_s"] = args.batch * case.seqlen / seconds
                record["tflops_per_gpu"] = flops / env.world / seconds / 1e12
                if single_tflops:
                    record["efficiency"] = record["tflops_per_gpu"] / single_tflops
            records.append(record)
            log(env, f"[{done}/{total}] L={case.seqlen} {'causal' if case.causal else 'full'} {case.direction} "
                     f"{scheme}: {result_text(record, reasons)}"
                     + (f" | {single_text(single, single_tflops, rows)}" if scheme == args.schemes[0] else "")
                     + (f" | {record['notes']}" if record["notes"] and record["status"] == "ok" else ""))

    log(env, "")
    print_table(env, records, reasons)
    if env.rank == 0 and args.json:
        with open(args.json, "w") as out:
            json.dump({"header": header, "records": records}, out, indent=1, default=str)
        print(f"wrote {args.json}", flush=True)


def run_torch_cp(scheme, case, args, env, torch_cp, generator, label=None):
    """torch's context parallel: a failure is a skip with its reason; when enable_gqa
    fails, once more with k, v repeated to H heads."""
    prepare = lambda expand: (lambda stack: prepare_torch_cp(stack, scheme, case, args, env,  # noqa: E731
                                                             torch_cp, expand, generator))
    outcome = run_measurement(prepare(False), args, env, failure_status="skipped", label=label)
    if outcome["status"] == "skipped" and args.kv_heads != args.heads and not torch_cp.missing:
        retry = run_measurement(prepare(True), args, env, failure_status="skipped", label=label)
        if retry["status"] != "skipped":
            return retry
        outcome["reason"] += f"; with k, v repeated to H heads: {retry['reason']}"
    return outcome


if __name__ == "__main__":
    main()
    # Everything is written and the process group destroyed: leave without the
    # interpreter's teardown, where a rank once died in std::terminate (a gloo thread
    # still joinable at static destruction, SIGABRT; the session-24 CI run on 2 CPUs).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
