"""scripts/bench_distributed.py's smoke run on CPUs: torchrun with 2 processes on gloo,
the ring and Ulysses with plain torch math for the blocks (reference_block_ops), and
torch's context parallel, which has no CPU kernel (or, without numpy, cannot start):
the script must finish, and its JSON must hold one record per (seqlen, causal,
direction, scheme), the ring and Ulysses measured, torch's either measured or skipped
with its reason."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "bench_distributed.py"
SEQLENS = (64, 128)
SCHEMES = ("ring", "ulysses", "torch_cp_cudnn")


def _run_bench(json_path, seqlens=SEQLENS, schemes=SCHEMES, extra=()):
    env = dict(os.environ)
    # The package from the source tree (FLASHLAB_OPS_LIBRARY, when set, names the extension,
    # as for every test here); one thread a process: the two ranks share the machine.
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "src" / "python")] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT),
               "--device", "cpu", "--block-ops", "reference", "--dtype", "fp32",
               "--seqlens", ",".join(map(str, seqlens)), "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
               "--iters", "2", "--warmup", "1", "--schemes", ",".join(schemes), "--json", str(json_path), *extra]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_bench_distributed_runs_on_cpu_and_writes_one_record_per_case(tmp_path):
    json_path = tmp_path / "bench.json"
    result = _run_bench(json_path)
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-6000:]}"
    assert "TFLOP/s/GPU" in result.stdout  # rank 0's table

    report = json.loads(json_path.read_text())
    header, records = report["header"], report["records"]
    assert header["world_size"] == 2 and header["dtype"] == "fp32" and header["block_ops"] == "reference"
    assert (header["heads"], header["kv_heads"], header["head_dim"]) == (4, 2, 16)

    keys = [(r["seqlen"], r["causal"], r["direction"], r["scheme"]) for r in records]
    expected = {(seqlen, causal, direction, scheme) for seqlen in SEQLENS for causal in (True, False)
                for direction in ("fwd", "fwdbwd") for scheme in SCHEMES}
    assert len(keys) == len(set(keys)), f"repeated records: {keys}"
    assert set(keys) == expected

    finite_positive = lambda x: x is not None and math.isfinite(x) and x > 0  # noqa: E731
    for r in records:
        case = f"{r['scheme']} L={r['seqlen']} causal={r['causal']} {r['direction']}"
        assert r["single_gpu_status"] == "ok" and finite_positive(r["single_gpu_ms"]), case
        if r["scheme"] in ("ring", "ulysses") or r["status"] == "ok":
            assert r["status"] == "ok", f"{case}: {r['status']}: {r['reason']}"
            assert finite_positive(r["time_ms"]), case
            assert len(r["time_ms_per_rank"]) == 2 and r["time_ms"] == max(r["time_ms_per_rank"]), case
            for field in ("tokens_per_s", "tflops_per_gpu", "efficiency"):
                assert finite_positive(r[field]), f"{case}: {field} = {r[field]}"
            assert r["peak_mem_gib"] is None  # CPU: no allocator statistics
        else:  # torch's context parallel, where it cannot run: skipped with the reason
            assert r["status"] == "skipped" and r["reason"], f"{case}: {r['status']}: {r['reason']}"
            assert r["time_ms"] is None


def test_bench_distributed_profile_writes_a_trace_and_a_table_per_rank(tmp_path):
    profile_dir = tmp_path / "profile"
    result = _run_bench(tmp_path / "bench.json", seqlens=(64,), schemes=("ring",),
                        extra=("--causal", "yes", "--directions", "fwd", "--profile", str(profile_dir)))
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-6000:]}"
    for label in ("L64_causal_fwd_single", "L64_causal_fwd_ring"):
        for rank in (0, 1):
            trace = json.loads((profile_dir / f"{label}.rank{rank}.json").read_text())
            assert trace["traceEvents"], f"{label} rank {rank}: an empty trace"
            table = (profile_dir / f"{label}.rank{rank}.txt").read_text()
            assert "Self CPU" in table, table
    # The ring's step sent and received K/V (its trace holds every operator; the table only the top 25);
    # the single-GPU baseline communicated nothing.
    def names(label):
        trace = json.loads((profile_dir / f"{label}.rank0.json").read_text())
        return {str(event.get("name", "")) for event in trace["traceEvents"]}
    assert any("send" in name for name in names("L64_causal_fwd_ring")), sorted(names("L64_causal_fwd_ring"))
    assert not any("c10d::send" in name for name in names("L64_causal_fwd_single"))
