#!/usr/bin/env python3
"""Markdown table of one kernel against the others from flashlab-bench's text
summaries (the lines after 'matmul peak measured') or its Google Benchmark JSON
(--benchmark_out: the ratios then computed from the rows' median_ms), one file
per dtype; a file without a row of the kernel is an error.

  scripts/bench_table.py --kernel fa3_wgmma_sm90 bf16=bench-bf16.log fp16=bench-fp16.log
  scripts/bench_table.py --kernel fa3_wgmma_sm90 bf16=bench-bf16.json

With --decode, the table of `flashlab-bench --decode` from its Google Benchmark
JSON (--benchmark_out=decode.json --benchmark_out_format=json): one row per case
(head_dim, query/kv heads, batch, cache length), the kernel on the contiguous and
the paged cache against torch's FLASH and cuDNN backends, then the issue's
targets, met or not, case by case:

  scripts/bench_table.py --decode decode.json [--kernel fa2_mma_sm80]

With --ab, an A/B of runs of the same flashlab-bench command (Google Benchmark
JSON, --benchmark_out), each arm's files its rounds: per row the minimum over
rounds of each arm's median_ms, each arm's time over the first arm's, each
round's time, and the range of those ratios over the control rows (a regex on
the row name: rows whose code is the same in every arm, such as torch's
backends), the run's spread:

  scripts/bench_table.py --ab old=old_r1.json,old_r2.json new=new_r1.json,new_r2.json \
      [--control 'sdpa_']
"""
import argparse
import json
import re
import statistics
import sys
from collections import defaultdict

ROW = re.compile(r"^(?:(\w+)/)?d(\d+)/s(\d+)/b\d+/h\d+/(\w+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%\s+(\S+)\s+(\S+)")


# The same rows in the JSON: DIR/dD/sS/bB/hH/MASK/IMPL/min_time:.../manual_time (fwd without DIR/).
JSON_ROW = re.compile(r"^(?:(\w+)/)?d(\d+)/s(\d+)/b\d+/h\d+/(\w+)/([^/]+)")


def read_json(document):
    """read()'s rows from flashlab-bench's --benchmark_out JSON: vs FLASH / vs cuDNN are the
    sdpa_flash / sdpa_cudnn row's median_ms over this row's, as the text summary prints them."""
    medians, counters = {}, {}
    for entry in document.get("benchmarks", []):
        if entry.get("run_type") == "aggregate" or entry.get("error_occurred") or "median_ms" not in entry:
            continue
        match = JSON_ROW.match(entry.get("run_name") or entry.get("name", ""))
        if match:
            direction, d, s, mask, impl = match.groups()
            key = (direction or "fwd", int(d), int(s), mask, impl)
            medians[key] = float(entry["median_ms"])
            counters[key] = (float(entry.get("TFLOPS", 0)), 100 * float(entry.get("peak_fraction", 0)))

    def versus(key, backend):
        reference = medians.get(key[:4] + (backend,))
        return f"{reference / medians[key]:.2f}x" if reference and medians[key] > 0 else "-"

    return {key: counters[key] + (versus(key, "sdpa_flash"), versus(key, "sdpa_cudnn")) for key in medians}


def read(path):
    """{(direction, head_dim, seqlen, mask, implementation): (TFLOP/s, % peak, vs FLASH, vs cuDNN)}
    from a text summary or the JSON."""
    with open(path) as file:
        text = file.read()
    if text.lstrip().startswith("{"):
        return read_json(json.loads(text))
    rows = {}
    for line in text.splitlines():
        match = ROW.match(line.strip())
        if match:
            direction, d, s, mask, impl, ms, tflops, pct, vs_flash, vs_cudnn = match.groups()
            rows[(direction or "fwd", int(d), int(s), mask, impl)] = (float(tflops), float(pct), vs_flash, vs_cudnn)
    return rows


# --- --decode -----------------------------------------------------------------
# flashlab-bench --decode names its rows decode/d128/b8/h32/kv8/L16384/IMPL (Google
# Benchmark appends /iterations:N/manual_time); IMPL is a kernel, KERNEL(pagedN), sdpa_* or
# plain_read (the K and V streamed by a read-only kernel: a reference, not a kernel).
DECODE_NAME = re.compile(r"^decode/d(\d+)/b(\d+)/h(\d+)/kv(\d+)/L(\d+)/([^/]+)")
PLAIN_READ = "plain_read"

# The targets (issue 11).
CUDNN_TARGET = 1.0          # kernel time <= cuDNN's on every case
COPY_TARGET = 0.85          # >= 85% of the copy bandwidth ...
COPY_TARGET_MIN_BATCH = 8   # ... at batch >= 8
COPY_TARGET_MIN_LEN = 32768  # ... or cache length >= 32k
FASTEST_BATCH, FASTEST_LEN, FASTEST_SLACK = 1, 8192, 1.10  # batch 1 at 8k: within 10% of the fastest backend


def parse_decode_name(name):
    """((head_dim, batch, heads, kv_heads, cache_len), implementation) or None."""
    match = DECODE_NAME.match(name)
    if not match:
        return None
    d, b, h, kv, length, implementation = match.groups()
    return (int(d), int(b), int(h), int(kv), int(length)), implementation


def load_decode(document):
    """{case: {implementation: entry}} where entry has ms, gbps, fraction, splits or error;
    repetitions of one row are reduced to their median, aggregates ignored."""
    samples = defaultdict(list)
    errors = {}
    for entry in document.get("benchmarks", []):
        if entry.get("run_type") == "aggregate":
            continue
        parsed = parse_decode_name(entry.get("run_name") or entry.get("name", ""))
        if parsed is None:
            continue
        if entry.get("error_occurred"):
            errors[parsed] = entry.get("error_message", "error")
        elif "GBps" in entry and "median_ms" in entry:
            samples[parsed].append(entry)
    copy = float(document.get("context", {}).get("copy_GBps", 0) or 0)
    cases = defaultdict(dict)
    for (case, implementation), entries in samples.items():
        ms = statistics.median(float(e["median_ms"]) for e in entries)
        gbps = statistics.median(float(e["GBps"]) for e in entries)
        splits = entries[0].get("splits")
        cases[case][implementation] = {
            "ms": ms, "gbps": gbps, "fraction": gbps / copy if copy > 0 else None,
            "splits": int(splits) if splits is not None else None,
            "kv_bytes": float(entries[0].get("kv_bytes", 0) or 0)}
    for (case, implementation), message in errors.items():
        cases[case].setdefault(implementation, {"error": message})
    return cases, copy


def decode_kernels(cases):
    """The flashlab kernels in the file (implementations that are neither sdpa_*, paged nor plain_read)."""
    names = {impl.split("(paged")[0] for rows in cases.values() for impl in rows
             if not impl.startswith("sdpa_") and impl != PLAIN_READ}
    return sorted(names)


def paged_name(rows, kernel):
    return next((impl for impl in sorted(rows) if impl.startswith(kernel + "(paged")), None)


def ok(row):
    return row is not None and "error" not in row


def case_label(case):
    d, b, h, kv, length = case
    return f"b{b} h{h}/{kv} L{length}" + (f" d{d}" if d != 128 else "")


def decode_table(cases, copy, kernel):
    """Markdown lines: the table, then the targets."""
    lines = []
    paged_column = any(paged_name(rows, kernel) for rows in cases.values())
    read_column = any(PLAIN_READ in rows for rows in cases.values())
    header = ["head_dim", "heads", "batch", "cache len", "K/V MB", f"{kernel} GB/s", "% copy", "splits"]
    if read_column:
        header += ["plain read GB/s", "of plain read"]
    if paged_column:
        header += ["paged GB/s", "% copy", "splits"]
    header += ["FLASH GB/s", "cuDNN GB/s", "vs FLASH", "vs cuDNN"]
    if paged_column:
        header += ["paged vs cuDNN"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + " --- |" * len(header))

    def gbps_cells(row):
        if row is None:
            return ["-", "-", "-"]
        if "error" in row:
            return ["n/a", "-", "-"]
        fraction = f"{100 * row['fraction']:.1f}%" if row["fraction"] is not None else "-"
        splits = str(row["splits"]) if row.get("splits") is not None else "-"
        return [f"{row['gbps']:.0f}", fraction, splits]

    def ratio(reference, row):
        return f"{reference['ms'] / row['ms']:.2f}x" if ok(reference) and ok(row) else "-"

    notes = []
    order = sorted(cases, key=lambda c: (c[0], c[2], c[3], c[1], c[4]))
    for case in order:
        rows = cases[case]
        d, b, h, kv, length = case
        contiguous, paged = rows.get(kernel), rows.get(paged_name(rows, kernel) or "")
        flash, cudnn = rows.get("sdpa_flash"), rows.get("sdpa_cudnn")
        # K and V bytes as the bench counted them (else those of a 2-byte dtype, bf16/fp16).
        kv_bytes = next((r["kv_bytes"] for r in rows.values() if r.get("kv_bytes")), 2 * b * length * kv * d * 2)
        cells = [str(d), f"{h}/{kv}", str(b), str(length), f"{kv_bytes / 1e6:.0f}"] + gbps_cells(contiguous)
        if read_column:
            read = rows.get(PLAIN_READ)
            cells += [gbps_cells(read)[0],
                      f"{100 * read['ms'] / contiguous['ms']:.1f}%" if ok(read) and ok(contiguous) else "-"]
        if paged_column:
            cells += gbps_cells(paged)
        cells += [gbps_cells(flash)[0], gbps_cells(cudnn)[0], ratio(flash, contiguous), f"**{ratio(cudnn, contiguous)}**"]
        if paged_column:
            cells += [ratio(cudnn, paged)]
        lines.append("| " + " | ".join(cells) + " |")
        for impl, row in sorted(rows.items()):
            if "error" in row:
                notes.append(f"- {case_label(case)} {impl}: {row['error']}")
    if notes:
        lines += ["", "Rows without a time (n/a):"] + notes
    lines += [""] + decode_targets(cases, kernel)
    return lines


def decode_targets(cases, kernel):
    """The issue's three targets, each with the cases that miss it."""
    lines = ["Targets:"]
    for label, name_of in (("contiguous", lambda rows: kernel), ("paged", lambda rows: paged_name(rows, kernel))):
        measured, misses = 0, []
        for case in sorted(cases):
            rows = cases[case]
            row, cudnn = rows.get(name_of(rows) or ""), rows.get("sdpa_cudnn")
            if not ok(row) or not ok(cudnn):
                continue
            measured += 1
            if cudnn["ms"] / row["ms"] < CUDNN_TARGET:
                # three decimals: a miss never reads 1.00x
                misses.append(f"{case_label(case)} {cudnn['ms'] / row['ms']:.3f}x")
        if measured:
            lines.append(f"- >= {CUDNN_TARGET:.1f}x cuDNN on every case ({label}): "
                         + ("met" if not misses else "**not met**")
                         + f" ({measured - len(misses)} of {measured} cases meet it)" + (": " + ", ".join(misses) if misses else ""))
        measured, misses = 0, []
        for case in sorted(cases):
            d, b, h, kv, length = case
            row = cases[case].get(name_of(cases[case]) or "")
            if not (b >= COPY_TARGET_MIN_BATCH or length >= COPY_TARGET_MIN_LEN) or not ok(row):
                continue
            if row["fraction"] is None:
                continue
            measured += 1
            if row["fraction"] < COPY_TARGET:
                read = cases[case].get(PLAIN_READ)
                plain_read_note = f" (a plain read of it: {100 * read['fraction']:.1f}%)" if ok(read) and read["fraction"] else ""
                misses.append(f"{case_label(case)} {100 * row['fraction']:.1f}%{plain_read_note}")
        if measured:
            lines.append(f"- >= {100 * COPY_TARGET:.0f}% of the copy bandwidth at batch >= {COPY_TARGET_MIN_BATCH} "
                         f"or cache length >= {COPY_TARGET_MIN_LEN // 1024}k ({label}): "
                         + ("met" if not misses else "**not met**")
                         + f" ({measured - len(misses)} of {measured} cases meet it)" + (": " + ", ".join(misses) if misses else ""))
        for case in sorted(cases):
            d, b, h, kv, length = case
            if b != FASTEST_BATCH or length != FASTEST_LEN:
                continue
            rows = cases[case]
            row = rows.get(name_of(rows) or "")
            backends = {impl: r for impl, r in rows.items() if impl.startswith("sdpa_") and ok(r)}
            if not ok(row) or not backends:
                continue
            fastest = min(backends, key=lambda impl: backends[impl]["ms"])
            slowdown = row["ms"] / backends[fastest]["ms"]
            lines.append(f"- batch {FASTEST_BATCH} at {FASTEST_LEN // 1024}k within {100 * (FASTEST_SLACK - 1):.0f}% "
                         f"of the fastest backend ({label}, {case_label(case)}): "
                         + ("met" if slowdown <= FASTEST_SLACK else "**not met**")
                         + f" ({1e3 * row['ms']:.1f} us against {fastest} {1e3 * backends[fastest]['ms']:.1f} us, "
                         f"{slowdown:.2f}x its time)")
    return lines


def decode_main(path, kernel):
    try:
        with open(path) as file:
            document = json.load(file)
    except (OSError, json.JSONDecodeError) as error:
        print(f"bench_table: cannot read {path}: {error}", file=sys.stderr)
        return 2
    cases, copy = load_decode(document)
    if not cases:
        print(f"bench_table: no flashlab-bench --decode rows in {path}", file=sys.stderr)
        return 1
    kernels = decode_kernels(cases)
    if kernel is None:
        if len(kernels) != 1:
            print(f"bench_table: name the kernel with --kernel (the file has: {', '.join(kernels) or 'none'})",
                  file=sys.stderr)
            return 2
        kernel = kernels[0]
    context = document.get("context", {})
    gpu = context.get("gpu", "the GPU")
    print(f"Copy bandwidth on {gpu} in the same run: {copy:.0f} GB/s ((read + write) / time); GB/s: K and V bytes "
          f"read / median time; ratios: torch's time / the kernel's (> 1: the kernel is faster).")
    print()
    for line in decode_table(cases, copy, kernel):
        print(line)
    return 0


def load_ab_arm(paths):
    """{row name: [median_ms of each round]} from an arm's rounds (rows without a time left out)."""
    rounds = defaultdict(list)
    for path in paths:
        with open(path) as file:
            document = json.load(file)
        for benchmark in document.get("benchmarks", []):
            if benchmark.get("error_occurred") or "median_ms" not in benchmark:
                continue
            rounds[benchmark["name"].split("/min_time")[0].split("/iterations")[0]].append(benchmark["median_ms"])
    return rounds


def ab_main(specs, control):
    if len(specs) < 2:
        raise SystemExit(f"--ab compares at least two arms (ARM=PATH[,PATH...] each); got {len(specs)}")
    arms = []
    for spec in specs:
        if "=" not in spec:
            raise SystemExit(f"--ab takes ARM=PATH[,PATH...] per arm; got '{spec}'")
        name, paths = spec.split("=", 1)
        try:
            arms.append((name, load_ab_arm(paths.split(","))))
        except (OSError, json.JSONDecodeError) as error:
            raise SystemExit(f"--ab arm '{name}': {error}")
    base_name, base = arms[0]
    others = arms[1:]
    header = ["row", *(f"{name} ms" for name, _ in arms), *(f"{name} / {base_name}" for name, _ in others), "rounds"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    pattern = re.compile(control) if control else None
    control_ratios = defaultdict(list)
    rows = sorted(set(base).union(*(arm for _, arm in others)))
    for row in rows:
        best = [min(arm[row]) if row in arm else None for _, arm in arms]
        ratios = [b / best[0] if b is not None and best[0] else None for b in best[1:]]
        if pattern and pattern.search(row):
            for (name, _), ratio in zip(others, ratios):
                if ratio is not None:
                    control_ratios[name].append(ratio)
        rounds = "; ".join(f"{name} " + "/".join(f"{t:.3f}" for t in arm[row]) for name, arm in arms if row in arm)
        cells = [row, *("-" if b is None else f"{b:.3f}" for b in best),
                 *("-" if r is None else f"{r:.3f}" for r in ratios), rounds]
        print("| " + " | ".join(cells) + " |")
    if pattern:
        for name, _ in others:
            values = control_ratios.get(name)
            spread = f"{min(values):.3f}-{max(values):.3f} over {len(values)} rows" if values else "no control row"
            print(f"control rows /{control}/, {name} / {base_name}: {spread}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", help="the row the ratios belong to (required without --decode)")
    parser.add_argument("--other", default="fa2_mma_sm80", help="a second kernel whose TFLOP/s is listed")
    parser.add_argument("--decode", metavar="JSON", help="flashlab-bench --decode's Google Benchmark JSON")
    parser.add_argument("--ab", action="store_true", help="an A/B of flashlab-bench JSON runs: ARM=PATH[,PATH...] per arm, the first the base")
    parser.add_argument("--control", help="--ab: a regex naming the rows whose code is the same in every arm")
    parser.add_argument("logs", nargs="*", help="DTYPE=PATH (--ab: ARM=PATH[,PATH...])")
    args = parser.parse_args()
    if args.ab:
        return ab_main(args.logs, args.control)
    if args.decode:
        if args.logs:
            parser.error("--decode reads one JSON file; give no DTYPE=PATH logs with it")
        return decode_main(args.decode, args.kernel)
    if not args.kernel or not args.logs:
        parser.error("the forward/backward table needs --kernel and at least one DTYPE=PATH")
    tables = []
    for spec in args.logs:
        dtype, path = spec.split("=", 1)
        rows = read(path)
        if not any(key[4] == args.kernel for key in rows):
            print(f"bench_table.py: {path} has no row of {args.kernel} (expected flashlab-bench's text summary or "
                  "its --benchmark_out JSON)", file=sys.stderr)
            return 1
        tables.append((dtype, rows))

    def tflops_cell(row):
        return f"{row[0]:.1f}" if row else "-"

    print(f"| dtype | dir | head_dim | seqlen | mask | {args.kernel} TFLOP/s | % matmul peak | vs FLASH | vs cuDNN | cuDNN TFLOP/s | {args.other} TFLOP/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for dtype, rows in tables:
        for key in sorted(k for k in rows if k[4] == args.kernel):
            direction, d, s, mask, _ = key
            tflops, pct, vs_flash, vs_cudnn = rows[key]
            cudnn = tflops_cell(rows.get((direction, d, s, mask, "sdpa_cudnn")))
            other = tflops_cell(rows.get((direction, d, s, mask, args.other)))
            print(f"| {dtype} | {direction} | {d} | {s} | {mask} | {tflops:.1f} | {pct:.1f}% | {vs_flash} | **{vs_cudnn}** | {cudnn} | {other} |")

if __name__ == "__main__":
    sys.exit(main())
