#!/usr/bin/env python3
"""Plot a KV-cache launch's block timeline (flashlab-run --kvcache --timeline-csv FILE).

Reads the CSV (block,sm,start_us,end_us; times from the grid's first start) and draws
two panels: each block as a bar on its SM's line (SMs ordered by when their last block
ends, so the idle tail shows as a ragged right edge), and the number of blocks running
over time.

    build/release/flashlab-run --kvcache --batch 32 --heads 32 --kv-heads 8 --head-dim 128 \\
        --dtype bf16 --seqlen-k 4096 --cache-seqlens 4096 --timeline-csv timeline.csv
    python3 scripts/plot_timeline.py timeline.csv -o timeline.png

Tooling only: needs matplotlib, never runs in the test loop (tests/scripts checks it on a
synthetic CSV when matplotlib is there).
"""
import argparse
import csv
import sys
from collections import defaultdict


def load(path):
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    if not rows:
        raise SystemExit(f"{path}: no blocks (a kernel without a block timeline, or an empty grid)")
    return [(int(r["block"]), int(r["sm"]), float(r["start_us"]), float(r["end_us"])) for r in rows]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", help="flashlab-run --timeline-csv output")
    parser.add_argument("-o", "--output", default="timeline.png")
    parser.add_argument("--title", default="", help="added to the plot's title")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = load(args.csv)
    by_sm = defaultdict(list)
    for block in blocks:
        by_sm[block[1]].append(block)
    order = sorted(by_sm, key=lambda sm: max(b[3] for b in by_sm[sm]))
    span = max(b[3] for b in blocks)
    figure, (lanes, running) = plt.subplots(2, 1, figsize=(10, 8), sharex=True,
                                            gridspec_kw={"height_ratios": [3, 1]})
    for line, sm in enumerate(order):
        mine = sorted(by_sm[sm], key=lambda b: b[2])
        for slot, (_, _, start, end) in enumerate(mine):
            offset = (slot - (len(mine) - 1) / 2) * 0.8 / max(1, len(mine))
            lanes.plot([start, end], [line + offset, line + offset], linewidth=1.2, color=f"C{slot % 10}")
    lanes.set_ylabel(f"SM (ordered by its last block's end; {len(order)} SMs)")
    lanes.set_yticks([])
    lanes.set_title(f"block timeline: {len(blocks)} blocks, {span:.1f} us" + (f" - {args.title}" if args.title else ""))
    events = sorted([(b[2], 1) for b in blocks] + [(b[3], -1) for b in blocks])
    times, counts, active = [0.0], [0], 0
    for time, change in events:
        times.append(time)
        counts.append(active)
        active += change
        times.append(time)
        counts.append(active)
    running.plot(times, counts, color="C0")
    running.set_ylabel("blocks running")
    running.set_xlabel("us from the first block's start")
    running.set_ylim(bottom=0)
    figure.tight_layout()
    figure.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
