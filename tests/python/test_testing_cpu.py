"""flashlab.testing on the CPU (issue 35): problems from flashlab-run's options, check and
check_backward of torch functions (the report, the tolerance, the first bad element by
tile, poisoned outputs, LSE handling, layouts, varlen), the case matrix and the CLI. The
harness runs on CPU tensors too (cuRAND's host generator makes the same inputs)."""
import functools
import json
import math
from pathlib import Path

import pytest
import torch

import flashlab.testing as ft
from flashlab.testing.__main__ import main as cli
import user_functions as fns

CPU = "cpu"


@functools.lru_cache(maxsize=None)
def _problem(options):
    return ft.problem(device=CPU, **dict(options))


def small(**options):
    """A small problem, made once per options: cuRAND's host MT19937 takes seconds to seed."""
    defaults = dict(batch=2, heads=4, kv_heads=2, seqlen_q=113, seqlen_k=203, head_dim=32, dtype="fp16", seed=7)
    defaults.update(options)
    return _problem(tuple(sorted(defaults.items())))


# ---------------------------------------------------------------------------- problems


def test_problem_options_are_flashlab_runs():
    p = small(causal=True, window=(30, 0), softmax_scale=0.25, softcap=20.0, alibi="per-head", sinks=True)
    assert p.arguments[:2] == ["--heads", "4"]
    assert p.describe() == ("batch 2, heads 4/2, seqlen 113x203, head_dim 32, Half, causal, window (30, 0), "
                            "softmax_scale 0.25, softcap 20, alibi per head, sinks, bshd, seed 7")
    assert p.q.shape == (2, 113, 4, 32) and p.k.shape == (2, 203, 2, 32) and p.dout.shape == p.q.shape
    assert p.alibi_slopes.shape == (4,) and p.sinks.shape == (4,)
    assert p.softmax_scale == 0.25 and p.window_size == (30, 0) and p.causal
    assert p.command().startswith("flashlab-run --heads 4")


def test_same_seed_same_inputs_and_fresh_seed_recorded():
    tiny = dict(batch=1, heads=2, seqlen_q=5, seqlen_k=9, head_dim=16, device=CPU)
    a, b, c = ft.problem(seed=3, **tiny), ft.problem(seed=3, **tiny), ft.problem(**tiny)
    for x, y in zip((a.q, a.k, a.v, a.dout), (b.q, b.k, b.v, b.dout)):
        assert torch.equal(x, y)
    assert not torch.equal(c.q, a.q) and "--seed" in c.arguments and c.seed != 3
    assert torch.isfinite(a.q).all() and a.q.float().std() > 0.5  # normal(0, 1), not zeros


def test_problem_defaults_resolved():
    p = ft.problem_from_arguments(["--heads", "6", "--seqlen-q", "7", "--head-dim", "64", "--seed", "3"], CPU)
    assert (p.info["kv_heads"], p.info["seqlen_k"], p.info["dtype"]) == (6, 7, "fp16")
    assert math.isclose(p.softmax_scale, 1 / 8)


def test_varlen_and_packed_layouts():
    p = ft.problem(device=CPU, heads=4, kv_heads=1, seqlens=[7, 0, 113], seqlens_k=[20, 5, 113], head_dim=32,
                   seed=2)
    assert p.varlen and p.q.shape == (120, 4, 32) and p.k.shape == (138, 1, 32)
    assert p.cu_seqlens_q.tolist() == [0, 7, 7, 120] and p.info["max_seqlen_k"] == 113
    packed = small(seqlen_k=113, layout="packed-qkv")
    assert packed.q._base is packed.k._base and packed.q.stride(1) == (4 + 2 * 2) * 32


@pytest.mark.parametrize("arguments, message", [
    (["--batch", "0"], "--batch expects an integer from 1"),
    (["--heads", "6", "--kv-heads", "4"], "--heads 6 must be a multiple of --kv-heads 4"),
    (["--seqlens-k", "3,5"], "--seqlens-k needs --seqlens"),
    (["--dtype", "fp8"], "unknown --dtype 'fp8'; accepted: fp32, fp16, bf16, e4m3"),
    (["--dtype", "e4m3", "--head-dim", "128"], "--dtype e4m3 is not supported here"),
    (["--bogus"], "--bogus"),
    (["--seqlens", "3,4", "--batch", "2"], "--seqlens replaces --batch"),
    (["--softcap", "-1"], "--softcap must be >= 0"),
])
def test_bad_problem_options_say_what_and_expected(arguments, message):
    with pytest.raises(ValueError, match="flashlab.testing: .*" + message.replace("(", r"\(")):
        ft.problem_from_arguments(arguments, CPU)


def test_operators_need_a_seed_and_traces_no_modifications():
    import torch as _torch
    with pytest.raises(ValueError, match="--seed is needed"):
        _torch.ops.flashlab.testing_flops(["--batch", "1"], "fwd")
    with pytest.raises(ValueError, match="unmodified scores"):
        ft.trace_tiles(lambda q, k, v, tile_trace=None, **kw: None, small(softcap=5.0), tile=(64, 64))


def test_bad_keyword_values():
    with pytest.raises(ValueError, match="dtype 'fp8'; accepted: fp32, fp16, bf16"):
        ft.problem(dtype="fp8", device=CPU)
    with pytest.raises(ValueError, match="--seqlens replaces --batch"):
        ft.problem(seqlens=[3, 5], batch=5, device=CPU)
    with pytest.raises(ValueError, match=r"window 8; expected \(left, right\)"):
        ft.problem(window=8, device=CPU)
    assert ft.problem_arguments(dtype="float16")[5] == "fp16"


@pytest.mark.parametrize("tile, message", [((64, 0), "block_m and block_n > 0"), ((-64, -32), "> 0"),
                                           ((64,), "two integers"), ("64x64", "two integers")])
def test_bad_tiles(tile, message):
    with pytest.raises(ValueError, match=message):
        ft.check(fns.torch_attention, small(), tile=tile)


# ---------------------------------------------------------------------------- check


def test_correct_function_passes_with_the_tolerance_explained():
    p = small(causal=True)
    report = ft.check(fns.torch_attention, p, tile=(64, 64))
    assert report.passed, report.text
    data = report.data
    # The rule: twice torch's same-precision error, plus flash-attn's atol, plus 4 float32 ulps.
    assert data["tolerance"] >= 2 * data["ref_err"] + data["rounding_atol"]
    assert data["tolerance"] <= 2 * data["ref_err"] + data["rounding_atol"] + 1e-4
    assert data["ref_err"] > 0 and data["lse_passed"] is True
    assert "PASSED" in report.text and "2 x math error + flash-attn's fwd_atol" in report.text


@pytest.mark.parametrize("fraction, passes", [(0.9, True), (1.1, False)])
def test_pass_rule_edge(fraction, passes):
    p = small()
    tolerance = ft.check(fns.torch_attention, p).data["tolerance"]

    def shifted(q, k, v, causal=False, softmax_scale=None):
        out, lse = fns.torch_attention(q, k, v, causal, softmax_scale)
        exact, _ = fns.torch_attention(q.double(), k.double(), v.double(), causal, softmax_scale)
        out = out.clone()
        out[0, 0, 0, 0] = (exact[0, 0, 0, 0] + fraction * tolerance).to(out.dtype)
        return out, lse
    # fp16 rounding of the planted value moves it by at most half an ulp (< 1e-3 here).
    assert ft.check(shifted, p).passed == passes


def test_first_bad_element_named_by_tile():
    report = ft.check(fns.off_by_one_element, small(), tile=(64, 128))
    assert not report.passed
    bad = report.first_bad
    assert (bad["tensor"], bad["batch"], bad["row"], bad["head"], bad["col"]) == ("out", 1, 100, 3, 5)
    assert bad["query_tile"] == 1 and bad["key_tiles"] == [0, 1]
    assert "query tile 1 (rows 64..127, block_q 64)" in report.text
    with pytest.raises(ft.CheckFailed, match="inputs: flashlab-run .*--seed 7"):
        report.assert_passed()
    assert json.loads(report.to_json())["command"] == report.problem.command()


def test_unwritten_elements_fail_as_nan():
    report = ft.check(fns.skips_last_row, small())
    assert not report.passed
    assert report.data["nan_count"] == 2 * 4 * 32  # batch x heads x head_dim of the last row
    assert report.data["first_bad"]["row"] == 112 and "NaN" in report.text


def test_lse_optional_and_units():
    p = small(causal=True)
    without = ft.check(fns.out_only, p)
    assert without.passed and without.data["lse_passed"] is None and "lse: not returned" in without.text
    assert ft.check(fns.lse_in_log2, p, lse_units="log2").passed
    assert not ft.check(fns.lse_in_log2, p).passed


def test_bhsd_layout_and_varlen():
    assert ft.check(fns.bhsd_attention, small(), layout="bhsd").passed
    p = ft.problem(device=CPU, heads=4, kv_heads=2, seqlens=[7, 113, 1], seqlens_k=[113, 20, 9], head_dim=32,
                   causal=True, seed=4)
    assert ft.check(fns.torch_varlen_attention, p).passed


def test_varlen_mismatch_is_named_by_sequence_row_and_tile():
    p = ft.problem(device=CPU, heads=4, kv_heads=2, seqlens=[7, 113, 1], seqlens_k=[113, 20, 9], head_dim=32,
                   causal=True, seed=4)

    def off_in_second_sequence(*arguments, **keywords):
        out, lse = fns.torch_varlen_attention(*arguments, **keywords)
        out = out.clone()
        out[7 + 100, 2, 3] += 0.5  # sequence 1, row 100: packed row 107
        return out, lse
    report = ft.check(off_in_second_sequence, p, tile=(64, 16))
    assert not report.passed
    bad = report.first_bad
    assert (bad["sequence"], bad["row"], bad["packed_row"], bad["head"], bad["col"]) == (1, 100, 107, 2, 3)
    # causal, bottom-right: row 100 of the 113 x 20 sequence sees keys 0..(100 + 20 - 113) = 0..7
    assert bad["query_tile"] == 1 and bad["key_tiles"] == [0, 0]
    assert "(sequence 1, row 100 = packed row 107, head 2, col 3)" in report.text
    assert "it lies in query tile 1 (rows 64..127, block_q 64)" in report.text


def test_modifications_reach_the_function():
    p = small(softcap=10.0, alibi="per-batch", sinks=True, seqlen_k=113)
    assert ft.check(fns.torch_attention, p).passed

    def ignores_them(q, k, v, causal=False, softmax_scale=None, **modifications):
        return fns.torch_attention(q, k, v, causal, softmax_scale)
    assert not ft.check(ignores_them, p).passed


def test_writes_into_modification_tensors_do_not_reach_the_reference():
    p = small(seqlen_k=113, sinks=True, alibi="per-head")

    def ignores(q, k, v, causal=False, softmax_scale=None, sinks=None, alibi_slopes=None):
        return fns.torch_attention(q, k, v, causal, softmax_scale)

    def scribbles(q, k, v, causal=False, softmax_scale=None, sinks=None, alibi_slopes=None):
        sinks.fill_(-1e4)
        alibi_slopes.zero_()
        return ignores(q, k, v, causal, softmax_scale)
    assert not ft.check(scribbles, p).passed and not ft.check(ignores, p).passed
    assert ft.check(fns.torch_attention, p).passed


def test_keyword_forwarders_and_out_argument():
    p = small()
    assert ft.check(lambda q, k, v, **kw: fns.torch_attention(q, k, v, **kw), p).passed  # no out= pushed in

    def fills_out(q, k, v, causal=False, softmax_scale=None, out=None):
        out.copy_(fns.torch_attention(q, k, v, causal, softmax_scale)[0])
    assert ft.check(fills_out, p).passed
    with pytest.raises(TypeError, match="returned a tuple whose first entry is NoneType"):
        ft.check(lambda q, k, v, **kw: (None, None), p)


def test_wrong_output_shape_and_dtype_are_errors():
    with pytest.raises(ValueError, match="out has shape"):
        ft.check(lambda q, k, v, causal, softmax_scale: q[:, :5], small())
    with pytest.raises(ValueError, match="out is Float; the problem's dtype is Half"):
        ft.check(lambda q, k, v, causal, softmax_scale: q.float(), small())


# ---------------------------------------------------------------------------- check_backward


def test_backward_of_a_correct_function_passes():
    report = ft.check_backward(fns.torch_attention, small(causal=True, sinks=True), tile=(64, 64))
    assert report.passed, report.text
    assert set(report.data["tensors"]) == {"out", "lse", "dq", "dk", "dv", "dsinks"}
    # A Python function has no backward tiles, mode or workspace of its own to report.
    assert report.text.splitlines()[0].endswith("(tiles 64x64)") and "workspace" not in report.text
    assert report.data["workspace_bytes"] is None and report.data["deterministic"] is None


def test_backward_names_the_bad_key_row():
    report = ft.check_backward(fns.wrong_dk_row, small(), tile=(64, 64))
    assert not report.passed
    bad = report.tensor("dk")["first_bad"]
    assert (bad["batch"], bad["row"], bad["head"]) == (0, 70, 1)
    assert report.tensor("dq")["passed"] and report.tensor("dv")["passed"]


@pytest.mark.parametrize("layout", ["bshd", "packed-qkv"])
def test_backward_gradient_never_produced_is_nan(layout):
    p = small(seqlen_k=113, layout=layout)

    def detached_k(q, k, v, causal=False, softmax_scale=None):
        return fns.torch_attention(q, k.detach(), v, causal, softmax_scale)
    report = ft.check_backward(detached_k, p)
    assert report.tensor("dk")["nan_count"] == p.k.numel() and report.tensor("dq")["passed"]


def test_backward_needs_a_differentiable_function():
    with pytest.raises(TypeError, match="no grad_fn"):
        ft.check_backward(lambda q, k, v, causal, softmax_scale: fns.torch_attention(
            q.detach(), k.detach(), v.detach(), causal, softmax_scale), small())


# ---------------------------------------------------------------------------- the case matrix


def test_case_matrix():
    matrix = ft.cases(head_dims=(64,), dtypes=("bf16",), causal=(True,))
    assert len(matrix) == len(ft._cases.SEQLENS) * 3
    assert len({c.id for c in matrix}) == len(matrix)
    assert len({dict(c.options)["seed"] for c in matrix}) == len(matrix)
    p = matrix[0].problem(CPU)
    assert p.causal and p.info["dtype"] == "bf16" and p.info["seqlen_q"] == 1


@ft.parametrize(head_dims=(32,), dtypes=("fp16",), causal=(False, True), seqlens=((7, 113), (113, 7)),
                kv_heads=(2,), heads=4, batch=1)
def test_parametrize_with_plugin_fixture(case, flashlab_check):
    flashlab_check(fns.torch_attention, case.problem(CPU), tile=(64, 64))


# ---------------------------------------------------------------------------- the CLI

PROBLEM = ["--batch", "2", "--heads", "4", "--kv-heads", "2", "--seqlen-q", "113", "--seqlen-k", "203",
           "--head-dim", "32", "--seed", "7", "--device", "cpu"]


def test_cli_check_passes_and_fails(capsys):
    path = Path(__file__).with_name("user_functions.py")
    assert cli(["check", f"{path}:torch_attention", "--causal", *PROBLEM]) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and "inputs: flashlab-run" in out
    assert cli(["check", "user_functions:off_by_one_element", "--tile", "64x64", "--json", *PROBLEM]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert json.loads(lines[-1])["first_bad"]["query_tile"] == 1


def test_cli_backward(capsys):
    assert cli(["check", "user_functions:wrong_dk_row", "--backward", *PROBLEM]) == 1
    assert "dk: FAIL" in capsys.readouterr().out


@pytest.mark.parametrize("arguments, message", [
    (["check", "user_functions:torch_attention", "--dtype", "fp8"], "unknown --dtype 'fp8'"),
    (["check", "user_functions:nothing_here"], "has no function 'nothing_here'"),
    (["check", "no_such_module:f"], "cannot import no_such_module"),
    (["check", "missing.py:f"], "missing.py is not a file"),
    (["check", "justaname"], "expected module:function"),
])
def test_cli_bad_arguments_exit_2(arguments, message, capsys):
    assert cli(arguments + ["--device", "cpu"]) == 2
    assert message in capsys.readouterr().err


def test_cli_function_errors_and_devices(capsys, tmp_path):
    module = tmp_path / "raising.py"
    module.write_text("def attention(q, k, v, **kw):\n    raise ValueError('first line\\nsecond line')\n")
    assert cli(["check", f"{module}:attention", *PROBLEM]) == 1
    assert "second line" in capsys.readouterr().err  # the traceback, whole
    assert cli(["check", "user_functions:torch_attention", "--trace-tiles", *PROBLEM]) == 2
    assert "--trace-tiles needs --tile" in capsys.readouterr().err
    assert cli(["check", "user_functions:torch_attention", *PROBLEM[:-2], "--device", "gpu"]) == 2
    if not torch.cuda.is_available():
        assert cli(["check", "user_functions:torch_attention", *PROBLEM[:-2], "--device", "cuda"]) == 3


def test_cli_help_lists_the_problem_options(capsys):
    with pytest.raises(SystemExit):
        cli(["check", "--help"])
    out = capsys.readouterr().out
    assert "--seqlen-q" in out and "--kv-heads" in out and "--tile" in out


def test_cli_tile_format():
    with pytest.raises(SystemExit) as exit_info:
        cli(["check", "user_functions:torch_attention", "--tile", "64by64"])
    assert exit_info.value.code == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_cli_bench_without_gpu_exits_3(capsys):
    assert cli(["bench", "user_functions:torch_attention", "--seqlen-list", "128"]) == 3
    assert "no usable CUDA device" in capsys.readouterr().err
    # A registered kernel is a target too (its arguments are read before the GPU is looked for).
    assert cli(["bench", "flashlab:fa2_mma_sm80", "--seqlen-list", "128"]) == 3
    assert "no usable CUDA device" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        ft.bench([fns.torch_attention], [small()])


def test_cli_bench_names_what_it_takes_for_an_unknown_kernel_or_baseline(capsys):
    assert cli(["bench", "flashlab:fa9_made_up", "--seqlen-list", "128"]) == 2
    error = capsys.readouterr().err
    assert "flashlab:fa9_made_up: no kernel of that name" in error and "fa2_mma_sm80" in error
    assert cli(["bench", "user_functions:torch_attention", "--baselines", "sdpa_cudnn,flashlab:nope"]) == 2
    assert "flashlab:nope: no kernel of that name" in capsys.readouterr().err
    assert cli(["bench", "user_functions:torch_attention", "--baselines", "sdpa_math"]) == 2
    assert "baseline 'sdpa_math'" in capsys.readouterr().err
