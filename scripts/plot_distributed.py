#!/usr/bin/env python3
"""Plot scripts/bench_distributed.py results: TFLOP/s per GPU against the total
sequence length.

Reads one or more of its --json files (e.g. one per world size: 1, 2, 4 GPUs) and draws
one panel per (causal or not, direction), the total length L on a log2 axis, one line
per (scheme, world size); records that did not run (oom, skipped, error) are left out.
With --single, each world size's single-GPU baseline (flashlab's kernel at L / world,
the efficiency's denominator) is drawn too, dotted.

    python3 scripts/plot_distributed.py cp_w1.json cp_w2.json cp_w4.json -o cp.png

Tooling only: needs matplotlib (imported in main), never runs in the test loop.
"""
import argparse
import json
import sys
from collections import defaultdict

DIRECTION_TITLES = {"fwd": "forward", "fwdbwd": "forward + backward"}
SCHEME_STYLES = {"ring": "-", "ulysses": "--", "torch_cp_cudnn": "-.", "torch_cp_flash": ":"}


def load(paths):
    """(headers, records) of every file; each record gets its file's world size if it lacks one."""
    headers, records = [], []
    for path in paths:
        with open(path) as source:
            report = json.load(source)
        if not isinstance(report, dict) or "records" not in report:
            raise SystemExit(f"{path}: not a bench_distributed.py JSON (expected an object with 'header' "
                             f"and 'records')")
        header = report.get("header", {})
        headers.append(header)
        for record in report["records"]:
            record.setdefault("world_size", header.get("world_size"))
            records.append(record)
    return headers, records


def series(records, single):
    """{(causal, direction): {label: [(seqlen, tflops), ...] sorted}} from the records that ran."""
    panels = defaultdict(lambda: defaultdict(dict))
    for r in records:
        panel = (bool(r["causal"]), r["direction"])
        if r.get("status") == "ok" and r.get("tflops_per_gpu"):
            panels[panel][(r["scheme"], r["world_size"])][r["seqlen"]] = r["tflops_per_gpu"]
        if single and r.get("single_gpu_tflops"):
            panels[panel][("1 GPU @ L/world", r["world_size"])][r["seqlen"]] = r["single_gpu_tflops"]
    return {panel: {key: sorted(points.items()) for key, points in lines.items()} for panel, lines in panels.items()}


def title_of(headers):
    first = headers[0] if headers else {}
    worlds = sorted({h.get("world_size") for h in headers if h.get("world_size") is not None})
    shape = (f"B={first.get('batch')} H={first.get('heads')} KV={first.get('kv_heads')} D={first.get('head_dim')} "
             f"{first.get('dtype')}")
    return f"context parallel attention, {first.get('device_name', '?')}, {shape}, world {worlds}"


def main(argv=None):
    parser = argparse.ArgumentParser(description="TFLOP/s per GPU against total length from bench_distributed.py "
                                                 "JSON files")
    parser.add_argument("json", nargs="+", help="bench_distributed.py --json files (e.g. one per world size)")
    parser.add_argument("-o", "--output", default="bench_distributed.png", help="image to write "
                                                                                "(default bench_distributed.png)")
    parser.add_argument("--single", action="store_true",
                        help="also draw each world size's single-GPU baseline at L / world (dotted)")
    args = parser.parse_args(argv)

    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_distributed.py needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 1

    headers, records = load(args.json)
    panels = series(records, args.single)
    if not panels:
        print("no measured record in " + ", ".join(args.json) + " (every case oom, skipped or failed?)",
              file=sys.stderr)
        return 1

    keys = sorted(panels, key=lambda p: (not p[0], list(DIRECTION_TITLES).index(p[1])
                                         if p[1] in DIRECTION_TITLES else 99))
    columns = min(2, len(keys))
    rows = (len(keys) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 4.5 * rows), squeeze=False)
    worlds = sorted({world for lines in panels.values() for (_, world) in lines if world is not None})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    legend = {}  # one legend for all panels: label -> line
    for axis, key in zip(axes.flat, keys):
        causal, direction = key
        for (scheme, world), points in sorted(panels[key].items(), key=lambda item: (str(item[0][0]),
                                                                                      item[0][1] or 0)):
            xs, ys = [x for x, _ in points], [y for _, y in points]
            color = colors[worlds.index(world) % len(colors)] if world in worlds else None
            style = SCHEME_STYLES.get(scheme, (0, (1, 3)))  # the baseline: sparse dots
            marker = "o" if scheme in SCHEME_STYLES else None
            label = f"{scheme}, {world} GPU{'s' if world != 1 else ''}"
            (line,) = axis.plot(xs, ys, linestyle=style, marker=marker, color=color,
                                alpha=0.6 if marker is None else 1.0, label=label)
            legend.setdefault(label, line)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("total sequence length L")
        axis.set_ylabel("TFLOP/s per GPU")
        axis.set_ylim(bottom=0)
        axis.set_title(f"{'causal' if causal else 'full'}, {DIRECTION_TITLES.get(direction, direction)}")
        axis.grid(True, which="both", alpha=0.3)
    for axis in list(axes.flat)[len(keys):]:
        axis.set_visible(False)
    # Colour is the world size, line style the scheme; the legend goes under the panels, off the data.
    order = sorted(legend, key=lambda label: (label.split(",")[0], label))
    figure.legend([legend[label] for label in order], order, loc="lower center", fontsize="small",
                  ncol=min(4, len(order)), frameon=False)
    figure.suptitle(title_of(headers), fontsize="medium")
    legend_rows = (len(order) + 3) // 4
    figure.tight_layout(rect=(0, 0.04 * legend_rows / rows, 1, 0.97))
    figure.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
