#!/usr/bin/env python3
"""CPU test of scripts/bench_table.py, scripts/plot_bench.py and
scripts/plot_timeline.py on synthetic flashlab-bench / flashlab-run output: the
--decode table (rows, ratios, % of copy, the issue's targets, rows without a
time), the --ab table (minimum of rounds, ratios, the control rows' range), the
decode and block-timeline plots (when matplotlib is there), and that the forward
table still reads a text summary. Run by CTest (label cpu) or
directly: python3 tests/scripts/test_bench_scripts.py
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")
sys.path.insert(0, SCRIPTS)
import bench_table  # noqa: E402

COPY_GBPS = 3000.0
KERNEL = "fa2_mma_sm80"
PAGED = KERNEL + "(paged256)"


def kv_bytes(batch, length, kv_heads=8, head_dim=128):
    return 2.0 * batch * length * kv_heads * head_dim * 2


def entry(batch, heads, length, implementation, gbps=None, error=None, splits=None):
    """One Google Benchmark entry as flashlab-bench --decode writes it."""
    name = f"decode/d128/b{batch}/h{heads}/kv8/L{length}/{implementation}/iterations:100/manual_time"
    result = {"name": name, "run_name": name, "run_type": "iteration", "repetitions": 1, "iterations": 100,
              "time_unit": "us"}
    if error is not None:
        result.update({"error_occurred": True, "error_message": error})
        return result
    seconds = kv_bytes(batch, length) / (gbps * 1e9)
    result.update({"real_time": seconds * 1e6, "median_ms": seconds * 1e3, "GBps": gbps,
                   "copy_fraction": gbps / COPY_GBPS, "kv_bytes": kv_bytes(batch, length), "max_abs_err": 1e-4})
    if splits is not None:
        result["splits"] = splits
    return result


def decode_document():
    """heads 32/8, batches 1 and 8, cache lengths 8k and 32k. The kernel: 2800 GB/s (93%) except
    batch 1 at 8k (1500 GB/s, slower than FLASH and cuDNN there); cuDNN 2500 GB/s, FLASH 2000;
    the paged rows 2600 (87%) except batch 8 at 8k, where cuDNN refused the case."""
    benchmarks = []
    for batch in (1, 8):
        for length in (8192, 32768):
            slow = batch == 1 and length == 8192
            benchmarks.append(entry(batch, 32, length, KERNEL, 1500.0 if slow else 2800.0, splits=4 if slow else 2))
            benchmarks.append(entry(batch, 32, length, "sdpa_flash", 2000.0))
            if batch == 8 and length == 8192:
                benchmarks.append(entry(batch, 32, length, "sdpa_cudnn",
                                        error="unavailable: No available kernel. Aborting execution. (reason)"))
            else:
                benchmarks.append(entry(batch, 32, length, "sdpa_cudnn", 2500.0))
            benchmarks.append(entry(batch, 32, length, PAGED, 1400.0 if slow else 2600.0, splits=4))
    return {"context": {"gpu": "Synthetic GPU", "mode": "decode", "copy_GBps": str(COPY_GBPS),
                        "torch_version": "2.x", "l2_flush": "on", "torch_layout": "bhsd"},
            "benchmarks": benchmarks}


def run_script(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT)


class DecodeTable(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.TemporaryDirectory()
        cls.json_path = os.path.join(cls.directory.name, "decode.json")
        with open(cls.json_path, "w") as file:
            json.dump(decode_document(), file)
        cls.result = run_script(os.path.join(SCRIPTS, "bench_table.py"), "--decode", cls.json_path)
        cls.lines = cls.result.stdout.splitlines()

    @classmethod
    def tearDownClass(cls):
        cls.directory.cleanup()

    def row(self, batch, length):
        for line in self.lines:
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            if len(cells) > 4 and cells[1] == "32/8" and cells[2] == str(batch) and cells[3] == str(length):
                return cells
        self.fail(f"no row for batch {batch}, cache length {length} in:\n{self.result.stdout}")

    def test_parses_names(self):
        self.assertEqual(bench_table.parse_decode_name(
            "decode/d128/b8/h64/kv8/L131072/fa2_mma_sm80(paged256)/iterations:100/manual_time"),
            ((128, 8, 64, 8, 131072), "fa2_mma_sm80(paged256)"))
        self.assertIsNone(bench_table.parse_decode_name("d128/s4096/b8/h16/full/fa2_mma_sm80/min_time:0.300"))

    def test_one_row_per_case(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr)
        table = [line for line in self.lines if line.startswith("| 128 ")]
        self.assertEqual(len(table), 4, self.result.stdout)
        self.assertIn("3000 GB/s", self.result.stdout)

    def test_cells(self):
        # head_dim, heads, batch, len, K/V MB, GB/s, % copy, splits, paged GB/s, % copy, splits,
        # FLASH GB/s, cuDNN GB/s, vs FLASH, vs cuDNN, paged vs cuDNN
        cells = self.row(8, 32768)
        self.assertEqual(cells[4], f"{kv_bytes(8, 32768) / 1e6:.0f}")
        self.assertEqual(cells[5:8], ["2800", "93.3%", "2"])
        self.assertEqual(cells[8:11], ["2600", "86.7%", "4"])
        self.assertEqual(cells[11:13], ["2000", "2500"])
        self.assertEqual(cells[13], "1.40x")
        self.assertEqual(cells[14], "**1.12x**")
        self.assertEqual(cells[15], "1.04x")

    def test_a_refused_backend_is_na_and_explained(self):
        cells = self.row(8, 8192)
        self.assertEqual(cells[12], "n/a")
        self.assertEqual(cells[14], "**-**")
        self.assertIn("- b8 h32/8 L8192 sdpa_cudnn: unavailable: No available kernel", self.result.stdout)

    def test_targets(self):
        text = self.result.stdout
        # cuDNN: batch 1 at 8k is 1500 against 2500 GB/s (0.60x); batch 8 at 8k has no cuDNN time.
        self.assertIn("- >= 1.0x cuDNN on every case (contiguous): **not met** (2 of 3 cases meet it): b1 h32/8 L8192 0.600x", text)
        # 85% of copy: batch >= 8 or L >= 32k: three cases, all at 93%; paged: 87%.
        self.assertIn("- >= 85% of the copy bandwidth at batch >= 8 or cache length >= 32k (contiguous): met (3 of 3 cases meet it)",
                      text)
        self.assertIn("(paged): met (3 of 3 cases meet it)", text)
        # Batch 1 at 8k: 1500 GB/s against cuDNN's 2500: 1.67x cuDNN's time.
        self.assertIn("of the fastest backend (contiguous, b1 h32/8 L8192): **not met**", text)
        self.assertIn("against sdpa_cudnn", text)
        self.assertIn("1.67x its time", text)

    def test_kernel_must_be_named_when_ambiguous(self):
        document = decode_document()
        document["benchmarks"].append(entry(1, 32, 8192, "other_kernel", 100.0, splits=1))
        path = os.path.join(self.directory.name, "two.json")
        with open(path, "w") as file:
            json.dump(document, file)
        result = run_script(os.path.join(SCRIPTS, "bench_table.py"), "--decode", path)
        self.assertEqual(result.returncode, 2)
        self.assertIn("name the kernel with --kernel", result.stderr)
        result = run_script(os.path.join(SCRIPTS, "bench_table.py"), "--decode", path, "--kernel", KERNEL)
        self.assertEqual(result.returncode, 0, result.stderr)


class DecodeTableWithAPlainRead(unittest.TestCase):
    """plain_read rows (the cache streamed by a read-only kernel) add two columns and name the
    plain read beside each copy-bandwidth miss; they are not a kernel."""

    @classmethod
    def setUpClass(cls):
        document = decode_document()
        for batch in (1, 8):
            for length in (8192, 32768):
                document["benchmarks"].append(entry(batch, 32, length, bench_table.PLAIN_READ, 2400.0 if batch == 1 and length == 8192 else 3100.0))
        # Batch 8 at 32k: the kernel at 2000 GB/s (67% of copy) where a plain read gives 3100.
        for item in document["benchmarks"]:
            if item["name"].startswith("decode/d128/b8/h32/kv8/L32768/" + KERNEL + "/"):
                item.update(entry(8, 32, 32768, KERNEL, 2000.0, splits=2))
        cls.directory = tempfile.TemporaryDirectory()
        path = os.path.join(cls.directory.name, "decode.json")
        with open(path, "w") as file:
            json.dump(document, file)
        cls.result = run_script(os.path.join(SCRIPTS, "bench_table.py"), "--decode", path)

    @classmethod
    def tearDownClass(cls):
        cls.directory.cleanup()

    def test_columns_after_the_kernel(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr)
        self.assertIn("| splits | plain read GB/s | of plain read |", self.result.stdout)
        # Batch 1 at 8k: the kernel 1500 GB/s against a plain read of 2400: 62.5%.
        self.assertIn("| 128 | 32/8 | 1 | 8192 | 34 | 1500 | 50.0% | 4 | 2400 | 62.5% |", self.result.stdout)

    def test_a_copy_miss_names_the_plain_read(self):
        self.assertIn("b8 h32/8 L32768 66.7% (a plain read of it: 103.3%)", self.result.stdout)


def bench_document(times):
    """A flashlab-bench JSON with one entry per {row name: median_ms}."""
    return {"context": {}, "benchmarks": [
        {"name": f"{row}/min_time:0.300/manual_time", "run_type": "iteration", "median_ms": ms, "real_time": ms}
        for row, ms in times.items()]}


class AbTable(unittest.TestCase):
    """--ab: two arms of two rounds; the minimum over rounds, the ratio to the first arm, the
    control rows' range."""
    ROWS = ("bwd/d128/s4096/b4/h16/full/fa3_wgmma_sm90", "bwd/d128/s4096/b4/h16/full/sdpa_cudnn",
            "bwd/d64/s1024/b16/h32/full/sdpa_cudnn")

    def run_ab(self, *extra):
        rounds = {"old": [(2.8, 2.7, 1.0), (2.9, 2.6, 1.1)], "new": [(2.7, 2.65, 1.02), (2.5, 2.7, 1.0)]}
        with tempfile.TemporaryDirectory() as directory:
            specs = []
            for arm, arm_rounds in rounds.items():
                paths = []
                for index, times in enumerate(arm_rounds):
                    path = os.path.join(directory, f"{arm}_r{index}.json")
                    with open(path, "w") as file:
                        json.dump(bench_document(dict(zip(self.ROWS, times))), file)
                    paths.append(path)
                specs.append(f"{arm}=" + ",".join(paths))
            return run_script(os.path.join(SCRIPTS, "bench_table.py"), "--ab", *specs, *extra)

    def test_minimum_of_rounds_and_ratio(self):
        result = self.run_ab("--control", "sdpa_")
        self.assertEqual(result.returncode, 0, result.stderr)
        # old min 2.8, new min 2.5: 0.893.
        self.assertIn("| bwd/d128/s4096/b4/h16/full/fa3_wgmma_sm90 | 2.800 | 2.500 | 0.893 | old 2.800/2.900; new 2.700/2.500 |",
                      result.stdout)
        # The control rows: 2.65 / 2.6 = 1.019 and 1.0 / 1.0 = 1.000.
        self.assertIn("control rows /sdpa_/, new / old: 1.000-1.019 over 2 rows", result.stdout)

    def test_needs_two_arms(self):
        result = run_script(os.path.join(SCRIPTS, "bench_table.py"), "--ab", "old=old.json")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("--ab compares at least two arms", result.stderr)

    def test_names_a_missing_file(self):
        result = run_script(os.path.join(SCRIPTS, "bench_table.py"), "--ab", "old=missing_a.json", "new=missing_b.json")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("--ab arm 'old'", result.stderr)
        self.assertIn("missing_a.json", result.stderr)


class ApiTrainTable(unittest.TestCase):
    """scripts/bench_api.py --train's table: the backward alone is fwd+bwd - fwd of each row."""

    def test_backward_is_the_difference(self):
        try:
            import bench_api  # imports torch
        except ImportError as error:
            self.skipTest(f"bench_api.py needs torch: {error}")
        import contextlib
        import io

        def row(us):
            return {"step_us": us, "host_us": 5.0}
        cases = {"d128 b4 s4096 full": {
            "fwd": {"flashlab": row(900.0), "flashlab_det": row(900.0), "sdpa_cudnn": row(950.0),
                    "sdpa_flash": row(1500.0)},
            "fwd+bwd": {"flashlab": row(3500.0), "flashlab_det": row(3640.0), "sdpa_cudnn": row(3600.0),
                        "sdpa_flash": {"error": "RuntimeError: refused"}}}}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            bench_api.print_train_table(cases)
        line = next(text for text in out.getvalue().splitlines() if text.startswith("d128 b4 s4096 full"))
        cells = line.split()
        # fwd+bwd x cuDNN 3600 / 3500; backward alone (3600 - 950) / (3500 - 900); det/def 3640 / 3500.
        self.assertEqual(cells[4:8], ["3.500", "3.640", "3.600", "fails"])
        self.assertEqual(cells[8:], ["1.029", "-", "1.019", "-", "1.040"])
        self.assertIn("fwd+bwd sdpa_flash: RuntimeError: refused", out.getvalue())


class ApiInterleavedLoops(unittest.TestCase):
    """scripts/bench_api.py's rows: warm-ups, then the rows' loops in turn, round by round; per row
    the median over rounds; an error row passes through, a row that raises leaves the rounds."""

    def test_rounds_interleave_rows(self):
        try:
            import bench_api  # imports torch
        except ImportError as error:
            self.skipTest(f"bench_api.py needs torch: {error}")
        import argparse
        order, calls = [], {"a": 0, "b": 0, "c": 0}
        # (device us per step, host us per call) of each round's loop; c raises in round 2.
        fake_times = {"a": iter([(30.0, 1.0), (10.0, 3.0), (20.0, 2.0)]),
                      "b": iter([(5.0, 9.0), (7.0, 8.0), (6.0, 7.0)]),
                      "c": iter([(1.0, 1.0)])}

        def row(name):
            def call():
                calls[name] += 1
            call.row = name
            return call

        def timer(call, steps):
            self.assertEqual(steps, 4)
            order.append(call.row)
            if call.row == "c" and order.count("c") == 2:
                raise RuntimeError("lost the device\nsecond line")
            return next(fake_times[call.row])

        rows = {"a": row("a"), "refused": "NotImplementedError: no", "b": row("b"), "c": row("c")}
        results = bench_api.run_rows(rows, argparse.Namespace(warmup=2, loops=3, steps=4), loop_timer=timer,
                                     synchronize=lambda: None)
        self.assertEqual(order, ["a", "b", "c", "a", "b", "c", "a", "b"])
        self.assertEqual(calls, {"a": 2, "b": 2, "c": 2})  # the warm-ups (the fake timer calls nothing)
        self.assertEqual(list(results), ["a", "refused", "b", "c"])
        self.assertEqual(results["a"], {"step_us": 20.0, "host_us": 2.0})
        self.assertEqual(results["b"], {"step_us": 6.0, "host_us": 8.0})
        self.assertEqual(results["refused"], {"error": "NotImplementedError: no"})
        self.assertEqual(results["c"], {"error": "RuntimeError: lost the device"})


class ForwardTable(unittest.TestCase):
    def test_reads_a_text_summary(self):
        summary = (
            "bf16 matmul peak measured in this run: 772.8 TFLOP/s (8192^3, median of 10)\n"
            "case                                         implementation    median ms   TFLOP/s  % peak  vs flash  vs cudnn\n"
            "d128/s4096/b8/h16/full                       fa3_wgmma_sm90        0.505     543.9   71.1%     1.64x     0.94x\n"
            "d128/s4096/b8/h16/full                       sdpa_cudnn            0.473     580.8   75.2%     1.74x     1.00x\n")
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as file:
            file.write(summary)
        try:
            result = run_script(os.path.join(SCRIPTS, "bench_table.py"), "--kernel", "fa3_wgmma_sm90",
                                f"bf16={file.name}")
        finally:
            os.unlink(file.name)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("| bf16 | fwd | 128 | 4096 | full | 543.9 | 71.1% | 1.64x | **0.94x** | 580.8 | - |", result.stdout)

    def table_of(self, document, kernel="fa3_wgmma_sm90"):
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "bench.json")
            with open(path, "w") as file:
                json.dump(document, file)
            return run_script(os.path.join(SCRIPTS, "bench_table.py"), "--kernel", kernel, f"bf16={path}")

    def test_reads_the_json_with_ratios_from_the_medians(self):
        def entry(name, ms, tflops):
            return {"name": name + "/min_time:0.300/manual_time", "run_type": "iteration", "median_ms": ms,
                    "TFLOPS": tflops, "peak_fraction": tflops / 765.0}
        document = {"benchmarks": [entry("d128/s4096/b8/h16/full/fa3_wgmma_sm90", 0.505, 543.9),
                                   entry("d128/s4096/b8/h16/full/fa3_wgmma_sm90(det)", 0.600, 457.8),
                                   entry("d128/s4096/b8/h16/full/sdpa_cudnn", 0.473, 580.8),
                                   entry("d128/s4096/b8/h16/full/sdpa_flash", 0.8282, 331.6),
                                   entry("bwd/d64/s1023/b8/h32/causal/fa3_wgmma_sm90", 1.0, 300.0),
                                   entry("bwd/d64/s1023/b8/h32/causal/sdpa_cudnn", 1.25, 240.0)]}
        result = self.table_of(document)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("| bf16 | fwd | 128 | 4096 | full | 543.9 | 71.1% | 1.64x | **0.94x** | 580.8 | - |", result.stdout)
        self.assertIn("| bf16 | bwd | 64 | 1023 | causal | 300.0 | 39.2% | - | **1.25x** | 240.0 | - |", result.stdout)
        self.assertNotIn("(det)", result.stdout)

    def test_a_file_without_the_kernel_is_an_error(self):
        result = self.table_of({"benchmarks": []})
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("has no row of fa3_wgmma_sm90", result.stderr)
        self.assertEqual(result.stdout, "")


def has_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


@unittest.skipUnless(has_matplotlib(), "matplotlib is not installed")
class Plots(unittest.TestCase):
    def test_decode_plot(self):
        with tempfile.TemporaryDirectory() as directory:
            path, png = os.path.join(directory, "decode.json"), os.path.join(directory, "decode.png")
            with open(path, "w") as file:
                json.dump(decode_document(), file)
            result = run_script(os.path.join(SCRIPTS, "plot_bench.py"), path, "-o", png)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(png, "rb") as image:
                self.assertEqual(image.read(8), b"\x89PNG\r\n\x1a\n")

    def test_timeline_plot(self):
        with tempfile.TemporaryDirectory() as directory:
            path, png = os.path.join(directory, "timeline.csv"), os.path.join(directory, "timeline.png")
            with open(path, "w") as file:
                file.write("block,sm,start_us,end_us\n0,0,0.000,10.000\n1,1,0.000,6.000\n2,0,2.000,12.000\n")
            result = run_script(os.path.join(SCRIPTS, "plot_timeline.py"), path, "-o", png)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(png, "rb") as image:
                self.assertEqual(image.read(8), b"\x89PNG\r\n\x1a\n")

    def test_forward_plot_still_works(self):
        name = "d64/s1024/b32/h32/full/fa2_mma_sm80/min_time:0.300/manual_time"
        document = {"context": {"gpu": "Synthetic GPU", "matmul_peak_tflops": "700"},
                    "benchmarks": [{"name": name, "run_name": name, "run_type": "iteration", "TFLOPS": 300.0}]}
        with tempfile.TemporaryDirectory() as directory:
            path, png = os.path.join(directory, "bench.json"), os.path.join(directory, "bench.png")
            with open(path, "w") as file:
                json.dump(document, file)
            result = run_script(os.path.join(SCRIPTS, "plot_bench.py"), path, "-o", png)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertTrue(os.path.getsize(png) > 0)

    def test_distributed_plot(self):
        def document(world, status):
            records = [{"seqlen": seqlen, "causal": causal, "direction": direction, "scheme": scheme,
                        "status": status if scheme == "ring" and seqlen == 65536 else "ok",
                        "tflops_per_gpu": 500.0 - world * 10, "single_gpu_tflops": 600.0}
                       for seqlen in (32768, 65536) for causal in (True, False) for direction in ("fwd", "fwdbwd")
                       for scheme in ("ring", "ulysses", "torch_cp_cudnn")]
            return {"header": {"world_size": world, "device_name": "Synthetic GPU", "batch": 1, "heads": 32,
                               "kv_heads": 8, "head_dim": 128, "dtype": "bf16"}, "records": records}
        with tempfile.TemporaryDirectory() as directory:
            paths = []
            for world, status in ((1, "ok"), (2, "oom")):
                paths.append(os.path.join(directory, f"cp_w{world}.json"))
                with open(paths[-1], "w") as file:
                    json.dump(document(world, status), file)
            png = os.path.join(directory, "cp.png")
            result = run_script(os.path.join(SCRIPTS, "plot_distributed.py"), *paths, "--single", "-o", png)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(png, "rb") as image:
                self.assertEqual(image.read(8), b"\x89PNG\r\n\x1a\n")
            with open(paths[0], "w") as file:
                json.dump({"header": {}, "records": [{"seqlen": 1, "causal": True, "direction": "fwd",
                                                       "scheme": "ring", "status": "oom"}]}, file)
            result = run_script(os.path.join(SCRIPTS, "plot_distributed.py"), paths[0], "-o", png)
            self.assertEqual(result.returncode, 1)
            self.assertIn("no measured record", result.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
