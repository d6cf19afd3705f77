#!/usr/bin/env python3
"""Plot flashlab-bench results: TFLOP/s against sequence length.

Reads the Google Benchmark JSON that
    flashlab-bench --benchmark_out=bench.json --benchmark_out_format=json
writes and draws one subplot per (direction, head_dim, causal/full), seqlen on a log2
axis, one line per implementation (registered kernels, their deterministic
backward "<kernel>(det)", and sdpa_* backends).

    python3 scripts/plot_bench.py bench.json -o bench.png

Benchmark names look like d64/s4096/b8/h32/causal/fa2_mma_sm80/min_time:0.300/manual_time
(forward) or bwd/d64/.../causal/fa2_mma_sm80(det)/... and fwdbwd/... (flashlab-bench
--direction=bwd,fwdbwd; their TFLOP/s count 2.5x and 3.5x the forward's FLOPs);
entries with error_occurred are skipped, aggregates (mean/median/stddev of
repetitions) are ignored, and repetitions of one case are reduced to their median.

A JSON from flashlab-bench --decode (names decode/d128/b8/h32/kv8/L16384/IMPL/...)
gets the decode plot instead: GB/s of K/V read against the cache length, one
panel per (batch, query/kv heads), one line per implementation (kernels solid,
their paged rows dotted, sdpa_* dashed, plain_read black dash-dotted), with the copy bandwidth measured in the
same run and 85% of it as horizontal lines.
Tooling only: needs matplotlib, never runs in the test loop (tests/scripts checks
it on a synthetic JSON when matplotlib is there).
"""
import argparse
import json
import re
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_table import COPY_TARGET, PLAIN_READ, load_decode  # noqa: E402  (flashlab-bench --decode's names, one parser)

MASKS = ("full", "causal")
DIRECTIONS = ("fwd", "bwd", "fwdbwd")
DIRECTION_TITLES = {"fwd": "forward", "bwd": "backward", "fwdbwd": "forward + backward"}
# Context keys that may name the GPU (flashlab-bench adds custom context entries).
GPU_CONTEXT_KEYS = ("gpu", "gpu_name", "device", "device_name", "cuda_device")


def parse_name(name):
    """(direction, head_dim, seqlen, mask, implementation) from a benchmark name, or None.

    Names without a leading direction are forward ones (as every forward name is)."""
    parts = name.split("/")
    direction = "fwd"
    if parts and parts[0] in DIRECTIONS:
        direction, parts = parts[0], parts[1:]
    head_dim = seqlen = None
    for index, part in enumerate(parts):
        if re.fullmatch(r"d\d+", part):
            head_dim = int(part[1:])
        elif re.fullmatch(r"s\d+", part):
            seqlen = int(part[1:])
        elif part in MASKS and index + 1 < len(parts):
            if head_dim is None or seqlen is None:
                return None
            return direction, head_dim, seqlen, part, parts[index + 1]
    return None


def load_results(path):
    """{(direction, head_dim, mask): {implementation: {seqlen: TFLOP/s}}} and the JSON context."""
    with open(path) as file:
        document = json.load(file)
    samples = defaultdict(list)
    skipped = 0
    for entry in document.get("benchmarks", []):
        if entry.get("run_type") == "aggregate":
            continue
        if entry.get("error_occurred"):
            skipped += 1
            continue
        parsed = parse_name(entry.get("run_name") or entry.get("name", ""))
        if parsed is None or "TFLOPS" not in entry:
            continue
        samples[parsed].append(float(entry["TFLOPS"]))
    results = defaultdict(lambda: defaultdict(dict))
    for (direction, head_dim, seqlen, mask, implementation), values in samples.items():
        results[(direction, head_dim, mask)][implementation][seqlen] = statistics.median(values)
    if skipped:
        print(f"plot_bench: skipped {skipped} entries with errors", file=sys.stderr)
    return results, document.get("context", {})


def gpu_name(context):
    for key in GPU_CONTEXT_KEYS:
        if context.get(key):
            return str(context[key])
    return None


def title_for(context, directions):
    title = "flashlab-bench: " + ", ".join(DIRECTION_TITLES[d] for d in directions) + " TFLOP/s"
    gpu = gpu_name(context)
    if gpu:
        title += f" on {gpu}"
    details = [f"{key} {context[key]}" for key in ("torch_version", "date") if context.get(key)]
    return title + ("\n" + ", ".join(details) if details else "")


def line_style(name):
    """torch backends dashed, deterministic backward dash-dotted, kernels solid."""
    if name.startswith("sdpa_"):
        return "--"
    return "-." if name.endswith("(det)") else "-"


def plot(results, context, output):
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    directions = [d for d in DIRECTIONS if any(key[0] == d for key in results)]
    rows = sorted({(DIRECTIONS.index(d), head_dim) for d, head_dim, _ in results})
    rows = [(DIRECTIONS[index], head_dim) for index, head_dim in rows]
    masks = [mask for mask in MASKS if any(key[2] == mask for key in results)]
    implementations = sorted({name for lines in results.values() for name in lines},
                             key=lambda name: (name.startswith("sdpa_"), name))
    # A kernel's deterministic backward shares its colour (dash-dotted).
    base = lambda name: name[: -len("(det)")] if name.endswith("(det)") else name
    bases = list(dict.fromkeys(base(name) for name in implementations))
    colors = plt.get_cmap("tab10")
    color_of = {name: colors(bases.index(base(name)) % 10) for name in implementations}
    peak = float(context.get("matmul_peak_tflops", 0) or 0)

    figure, axes = plt.subplots(len(rows), len(masks), squeeze=False, sharey=True,
                                figsize=(5.5 * len(masks), 3.8 * len(rows)))
    for row, (direction, head_dim) in enumerate(rows):
        for col, mask in enumerate(masks):
            axis = axes[row][col]
            lines = results.get((direction, head_dim, mask), {})
            seqlens = sorted({seqlen for points in lines.values() for seqlen in points})
            for name in implementations:
                points = lines.get(name)
                if not points:
                    continue
                xs = sorted(points)
                axis.plot(xs, [points[x] for x in xs], marker="o", markersize=3, label=name,
                          color=color_of[name], linestyle=line_style(name))
            if peak > 0:
                axis.axhline(peak, color="grey", linestyle=":", linewidth=1)
            axis.set_xscale("log", base=2)
            if seqlens:
                axis.set_xticks(seqlens)
                axis.set_xticklabels([str(seqlen) for seqlen in seqlens], rotation=45)
            axis.set_title(f"{DIRECTION_TITLES[direction]}, head_dim {head_dim}, {mask}"
                           if len(directions) > 1 or direction != "fwd"
                           else f"head_dim {head_dim}, {mask}")
            axis.set_xlabel("seqlen")
            if col == 0:
                axis.set_ylabel("TFLOP/s")
            axis.grid(True, which="major", alpha=0.3)
    handles = [plt.Line2D([], [], color=color_of[name], linestyle=line_style(name), marker="o",
                          markersize=3, label=name) for name in implementations]
    if peak > 0:
        handles.append(plt.Line2D([], [], color="grey", linestyle=":",
                                  label=f"matmul peak {peak:.0f}"))
    figure.suptitle(title_for(context, directions))
    # tight_layout leaves room for the two-line title on short figures; on tall
    # ones (several directions) keep about 0.4 inch for it explicitly.
    if len(rows) > 2:
        figure.tight_layout(rect=(0, 0, 1, 1 - 0.4 / figure.get_figheight()))
    else:
        figure.tight_layout()
    # Below the subplots; bbox_inches="tight" grows the image to fit it.
    figure.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0), frameon=False,
                  ncol=min(len(handles), 3 * len(masks)))
    figure.savefig(output, dpi=120, bbox_inches="tight")
    plt.close(figure)


def decode_line_style(name):
    """torch backends dashed, paged-cache rows dotted, the plain read dash-dotted, kernels on the
    contiguous cache solid."""
    if name.startswith("sdpa_"):
        return "--"
    if name == PLAIN_READ:
        return "-."
    return ":" if "(paged" in name else "-"


def length_label(length):
    return f"{length // 1024}k" if length % 1024 == 0 else str(length)


def plot_decode(cases, copy, context, output):
    """GB/s against cache length, a panel per (batch, heads); cases from bench_table.load_decode."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    head_rows = sorted({(d, h, kv) for d, b, h, kv, length in cases})
    batches = sorted({b for d, b, h, kv, length in cases})
    implementations = sorted({impl for rows in cases.values() for impl, row in rows.items() if "error" not in row},
                             key=lambda name: (name.startswith("sdpa_"), name))
    base = lambda name: name.split("(paged")[0]  # a kernel's paged rows share its colour
    bases = list(dict.fromkeys(base(name) for name in implementations))
    colors = plt.get_cmap("tab10")
    color_of = {name: colors(bases.index(base(name)) % 10) for name in implementations}
    if PLAIN_READ in color_of:
        color_of[PLAIN_READ] = "black"  # a reference, not an implementation

    figure, axes = plt.subplots(len(head_rows), len(batches), squeeze=False, sharey=True,
                                figsize=(4.6 * len(batches), 3.6 * len(head_rows)))
    for row, (d, h, kv) in enumerate(head_rows):
        for col, b in enumerate(batches):
            axis = axes[row][col]
            lengths = sorted({length for (cd, cb, ch, ckv, length) in cases if (cd, cb, ch, ckv) == (d, b, h, kv)})
            for name in implementations:
                points = {length: cases[(d, b, h, kv, length)][name]["gbps"] for length in lengths
                          if "gbps" in cases[(d, b, h, kv, length)].get(name, {})}
                if points:
                    xs = sorted(points)
                    axis.plot(xs, [points[x] for x in xs], marker="o", markersize=3, label=name,
                              color=color_of[name], linestyle=decode_line_style(name))
            if copy > 0:
                axis.axhline(copy, color="grey", linestyle=":", linewidth=1)
                axis.axhline(COPY_TARGET * copy, color="grey", linestyle="-.", linewidth=0.8, alpha=0.6)
            axis.set_xscale("log", base=2)
            if lengths:
                axis.set_xticks(lengths)
                axis.set_xticklabels([length_label(length) for length in lengths])
            axis.set_title(f"batch {b}, heads {h}/{kv}" + (f", head_dim {d}" if len({r[0] for r in head_rows}) > 1 else ""))
            axis.set_xlabel("cache length (keys)")
            if col == 0:
                axis.set_ylabel("GB/s of K/V read")
            axis.set_ylim(bottom=0)
            axis.grid(True, which="major", alpha=0.3)
    handles = [plt.Line2D([], [], color=color_of[name], linestyle=decode_line_style(name), marker="o",
                          markersize=3, label=name) for name in implementations]
    if copy > 0:
        handles.append(plt.Line2D([], [], color="grey", linestyle=":", label=f"copy bandwidth {copy:.0f} GB/s"))
        handles.append(plt.Line2D([], [], color="grey", linestyle="-.", alpha=0.6,
                                  label=f"{100 * COPY_TARGET:.0f}% of it"))
    title = "flashlab-bench --decode: GB/s of K/V read"
    gpu = gpu_name(context)
    if gpu:
        title += f" on {gpu}"
    details = [f"{key} {context[key]}" for key in ("torch_version", "l2_flush", "torch_layout", "date")
               if context.get(key)]
    figure.suptitle(title + ("\n" + ", ".join(details) if details else ""))
    figure.tight_layout()
    figure.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0), frameon=False,
                  ncol=min(len(handles), 4))
    figure.savefig(output, dpi=120, bbox_inches="tight")
    plt.close(figure)


def is_decode(document):
    return any((entry.get("run_name") or entry.get("name", "")).startswith("decode/")
               for entry in document.get("benchmarks", []))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("json", help="Google Benchmark JSON from flashlab-bench --benchmark_out")
    parser.add_argument("-o", "--output", default="bench.png", help="PNG to write (default bench.png)")
    arguments = parser.parse_args()
    try:
        with open(arguments.json) as file:
            document = json.load(file)
        if is_decode(document):
            cases, copy = load_decode(document)
            if not any("gbps" in row for rows in cases.values() for row in rows.values()):
                print(f"plot_bench: no successful flashlab-bench --decode entries in {arguments.json}",
                      file=sys.stderr)
                return 1
            try:
                plot_decode(cases, copy, document.get("context", {}), arguments.output)
            except ImportError:
                print("plot_bench: needs matplotlib (pip install matplotlib)", file=sys.stderr)
                return 2
            print(f"plot_bench: wrote {arguments.output}")
            return 0
        results, context = load_results(arguments.json)
    except (OSError, json.JSONDecodeError) as error:
        print(f"plot_bench: cannot read {arguments.json}: {error}", file=sys.stderr)
        return 2
    if not results:
        print(f"plot_bench: no successful flashlab-bench entries in {arguments.json}", file=sys.stderr)
        return 1
    try:
        plot(results, context, arguments.output)
    except ImportError:
        print("plot_bench: needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 2
    print(f"plot_bench: wrote {arguments.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
