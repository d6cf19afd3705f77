#!/usr/bin/env python3
"""Markdown table of one kernel against the others from flashlab-bench's text
summaries (the lines after 'matmul peak measured'), one file per dtype.

  scripts/bench_table.py --kernel fa3_wgmma_sm90 bf16=bench-bf16.log fp16=bench-fp16.log
"""
import argparse
import re

ROW = re.compile(r"^(?:(\w+)/)?d(\d+)/s(\d+)/b\d+/h\d+/(\w+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%\s+(\S+)\s+(\S+)")


def read(path):
    rows = {}
    for line in open(path):
        match = ROW.match(line.strip())
        if match:
            direction, d, s, mask, impl, ms, tflops, pct, vs_flash, vs_cudnn = match.groups()
            rows[(direction or "fwd", int(d), int(s), mask, impl)] = (float(tflops), float(pct), vs_flash, vs_cudnn)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", required=True, help="the row the ratios belong to")
    parser.add_argument("--other", default="fa2_mma_sm80", help="a second kernel whose TFLOP/s is listed")
    parser.add_argument("logs", nargs="+", help="DTYPE=PATH")
    args = parser.parse_args()
    print(f"| dtype | dir | head_dim | seqlen | mask | {args.kernel} TFLOP/s | % matmul peak | vs FLASH | vs cuDNN | cuDNN TFLOP/s | {args.other} TFLOP/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for spec in args.logs:
        dtype, path = spec.split("=", 1)
        rows = read(path)
        for key in sorted(k for k in rows if k[4] == args.kernel):
            direction, d, s, mask, _ = key
            tflops, pct, vs_flash, vs_cudnn = rows[key]
            cudnn = rows.get((direction, d, s, mask, "sdpa_cudnn"), ("-",))[0]
            other = rows.get((direction, d, s, mask, args.other), ("-",))[0]
            print(f"| {dtype} | {direction} | {d} | {s} | {mask} | {tflops:.1f} | {pct:.1f}% | {vs_flash} | **{vs_cudnn}** | {cudnn} | {other} |")


if __name__ == "__main__":
    main()
