"""python -m flashlab.testing check|bench TARGET [options] [flashlab-run's problem options]

TARGET is module:function or path/to/file.py:function, a function with flash-attn's
signature (see flashlab.testing.check), or a flashlab kernel name (flashlab:<kernel>).
The problem options are flashlab-run's (--batch, --heads, --kv-heads, --seqlen-q,
--seqlen-k, --seqlens, --head-dim, --dtype, --causal, --window-left, --seed, ...), read
by the same C++ parser. Exit codes as flashlab-run's: 0 pass, 1 mismatch, 2 bad
arguments, 3 no usable GPU (bench; check runs on the CPU with --device cpu).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import traceback
from pathlib import Path

EXIT_PASS, EXIT_MISMATCH, EXIT_BAD_ARGUMENTS, EXIT_NO_GPU = 0, 1, 2, 3


class _ArgumentError(Exception):
    pass


def _load_target(target: str):
    """module:function, path.py:function, or flashlab:<kernel> (returned as the kernel name)."""
    if target.startswith("flashlab:"):
        return target.split(":", 1)[1]
    module_name, separator, function_name = target.rpartition(":")
    if not separator or not module_name or not function_name:
        raise _ArgumentError(f"target {target!r}: expected module:function, path/to/file.py:function or "
                             "flashlab:<kernel> (the target comes right after check / bench)")
    try:
        if module_name.endswith(".py") or "/" in module_name:
            path = Path(module_name)
            if not path.is_file():
                raise _ArgumentError(f"target {target!r}: {path} is not a file")
            spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as error:
        raise _ArgumentError(f"target {target!r}: cannot import {module_name}: {error}") from error
    function = getattr(module, function_name, None)
    if not callable(function):
        raise _ArgumentError(f"target {target!r}: {module_name} has no function {function_name!r}")
    return function


def _tile(text: str):
    try:
        block_m, block_n = (int(x) for x in text.lower().split("x"))
        if block_m < 0 or block_n < 0:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tile expects BLOCK_MxBLOCK_N (64x64), got {text!r}") from None
    return block_m, block_n


def _int_list(text: str):
    try:
        values = [int(x) for x in text.split(",")]
        if not values or min(values) < 1:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects lengths >= 1 separated by commas (1024,4096), got {text!r}") \
            from None
    return values


def _problem_options_help() -> str:
    """flashlab-run's problem options as its C++ parser lists them."""
    try:
        import torch
        import flashlab  # noqa: F401
        torch.ops.flashlab.testing_problem(["--help"], torch.device("cpu"))
    except (ValueError, RuntimeError) as error:
        text = str(error)
        start = text.find("the problem options are:")
        return text[start:].split("\n", 1)[-1] if start >= 0 else ""
    return ""


def parser(with_problem_help: bool = False) -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m flashlab.testing", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="command", required=True)
    problem_help = ("problem options (flashlab-run's):\n" + _problem_options_help()) if with_problem_help else None
    check = commands.add_parser("check", help="one problem through the function and the reference, with the report",
                                epilog=problem_help, formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("target", help="module:function, path/to/file.py:function or flashlab:<kernel>")
    check.add_argument("--backward", action="store_true", help="also dq, dk, dv (the function must be differentiable)")
    check.add_argument("--tile", type=_tile, default=(0, 0), metavar="MxN",
                       help="your kernel's block_m x block_n: the report names query and key tiles")
    check.add_argument("--fn-layout", choices=("bshd", "bhsd"), default="bshd",
                       help="the layout the function takes (default bshd, flash-attn's)")
    check.add_argument("--lse-units", choices=("natural", "log2"), default="natural",
                       help="the units of an LSE the function returns (default natural)")
    check.add_argument("--trace-tiles", action="store_true",
                       help="also diff the kernel's running max/sum per key tile (it takes tile_trace=; "
                            "needs --tile)")
    check.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when there is one)")
    check.add_argument("--json", action="store_true", help="print one JSON object last")
    bench = commands.add_parser("bench", help="time functions beside SDPA (cuDNN, FLASH) and flashlab",
                                epilog=problem_help, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("targets", nargs="+", help="module:function, path/to/file.py:function or flashlab:<kernel> "
                                                  "(timed through flash_attn_func(kernel=...))")
    bench.add_argument("--seqlen-list", type=_int_list, default=None, metavar="L1,L2",
                       help="time each length (seqlen_q = seqlen_k = L) instead of --seqlen-q/--seqlen-k")
    bench.add_argument("--directions", default="fwd", help="fwd, fwdbwd or fwd,fwdbwd (default fwd)")
    bench.add_argument("--fn-layout", choices=("bshd", "bhsd"), default="bshd")
    bench.add_argument("--warmup", type=int, default=10)
    bench.add_argument("--iters", type=int, default=30)
    bench.add_argument("--baselines", default="sdpa_cudnn,sdpa_flash,flashlab",
                       help="timed beside the targets: sdpa_cudnn, sdpa_flash, flashlab (auto) and "
                            "flashlab:<kernel> (default sdpa_cudnn,sdpa_flash,flashlab; '' for none)")
    bench.add_argument("--json", metavar="FILE", help="write the table as JSON")
    bench.add_argument("--plot", metavar="FILE", help="draw TFLOP/s against seqlen (needs matplotlib)")
    return top


def _replace_lengths(problem_options, length):
    """The problem options with --seqlen-q/--seqlen-k set to `length`."""
    kept, skip = [], False
    for option in problem_options:
        if skip:
            skip = False
            continue
        name = option.split("=", 1)[0]
        if name in ("--seqlen-q", "--seqlen-k"):
            skip = "=" not in option
            continue
        kept.append(option)
    return kept + ["--seqlen-q", str(length), "--seqlen-k", str(length)]


def _problem(problem_options, device):
    """The problem, or _ArgumentError (exit 2) for options the parser rejects."""
    import flashlab.testing as ft
    try:
        return ft.problem_from_arguments(problem_options, device)
    except (ValueError, TypeError) as error:
        raise _ArgumentError(str(error).splitlines()[0]) from None


def _run_check(arguments, problem_options) -> int:
    import torch
    import flashlab.testing as ft
    if arguments.trace_tiles and arguments.tile == (0, 0):
        raise _ArgumentError("--trace-tiles needs --tile BLOCK_MxBLOCK_N (the kernel's tiles)")
    if arguments.device is not None:
        try:
            device = torch.device(arguments.device)
        except RuntimeError as error:
            raise _ArgumentError(f"--device {arguments.device!r}: {error}; expected cuda, cuda:N or cpu") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            print(f"python -m flashlab.testing: --device {arguments.device}: no usable CUDA device", file=sys.stderr)
            return EXIT_NO_GPU
    target = _load_target(arguments.target)
    problem = _problem(problem_options, arguments.device)
    # From here on an exception is the function's (or the kernel's): its traceback, exit 1.
    run = ft.check_backward if arguments.backward else ft.check
    report = run(target, problem, tile=arguments.tile, layout=arguments.fn_layout, lse_units=arguments.lse_units)
    print(report.text, end="")
    trace = None
    if arguments.trace_tiles:
        trace = ft.trace_tiles(target, problem, tile=arguments.tile, layout=arguments.fn_layout)
        print(trace.text, end="")
    print(f"inputs: {problem.command()}" + (" --backward" if arguments.backward else "")
          + "  (flashlab-run makes the same q, k, v)")
    passed = report.passed and (trace is None or trace.matches)
    if arguments.json:
        data = json.loads(report.to_json())
        if trace is not None:
            data["trace"] = trace.data
        data["passed"] = passed
        print(json.dumps(data))
    return EXIT_PASS if passed else EXIT_MISMATCH


def _run_bench(arguments, problem_options) -> int:
    import torch
    import flashlab.testing as ft
    from flashlab.testing._bench import _baseline
    functions, kernel_rows = {}, []
    for text in arguments.targets:
        target = _load_target(text)
        if isinstance(target, str):  # a flashlab kernel: timed through flash_attn_func(kernel=...), as baselines are
            kernel_rows.append(text)
        else:
            functions[text] = target
    baselines = list(dict.fromkeys(kernel_rows + [b for b in arguments.baselines.split(",") if b]))
    for name in baselines:  # unknown names (kernels too) before the GPU is looked for
        try:
            _baseline(name)
        except ValueError as error:
            raise _ArgumentError(str(error)) from None
    if not torch.cuda.is_available():
        print("python -m flashlab.testing bench: no usable CUDA device (bench times GPU code)", file=sys.stderr)
        return EXIT_NO_GPU
    lengths = arguments.seqlen_list or [None]
    problems = [_problem(problem_options if n is None else _replace_lengths(problem_options, n), None)
                for n in lengths]
    directions = [d for d in arguments.directions.split(",") if d]
    table = ft.bench(functions, problems, directions=directions, layout=arguments.fn_layout, baselines=baselines,
                     warmup=arguments.warmup, iters=arguments.iters)
    print(table.format())
    if arguments.json:
        Path(arguments.json).write_text(table.to_json())
    if arguments.plot:
        table.plot(arguments.plot)
    return EXIT_PASS



def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    wants_help = any(a in ("-h", "--help") for a in argv)
    arguments, problem_options = parser(with_problem_help=wants_help).parse_known_args(argv)
    try:
        if arguments.command == "check":
            return _run_check(arguments, problem_options)
        return _run_bench(arguments, problem_options)
    except _ArgumentError as error:
        print(f"python -m flashlab.testing: {error}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    except Exception:  # noqa: BLE001  (the function under test failed: its traceback, a mismatch)
        traceback.print_exc()
        return EXIT_MISMATCH


if __name__ == "__main__":
    sys.exit(main())
