"""The Python package without a GPU: the import, the operators' schemas, the fake
(meta) kernels' shapes, autograd and torch.compile on the meta device,
torch.library.opcheck on meta tensors, flash-attn's signatures, and every
argument error the Python layer raises."""
import inspect
import os
import subprocess
import sys

import pytest
import torch

import flashlab
from flashlab import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)
from flashlab import _ops


def meta(*shape, dtype=torch.float16, grad=False):
    return torch.randn(*shape, device="meta", dtype=dtype, requires_grad=grad)


def cu_seqlens(*lengths, device="meta"):
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    return torch.tensor(offsets, dtype=torch.int32, device=device)


# ---------------------------------------------------------------------------
# The import


def test_import_loads_the_extension_without_initializing_cuda():
    # A fresh process: importing flashlab loads libflashlab_ops.so and makes no CUDA call.
    code = ("import torch, flashlab; print(torch.cuda.is_initialized()); "
            "print(flashlab.library_path())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, env=os.environ.copy())
    initialized, path = result.stdout.split()
    assert initialized == "False"
    if os.environ.get("FLASHLAB_OPS_LIBRARY"):
        assert path == os.environ["FLASHLAB_OPS_LIBRARY"]
    assert path.endswith("libflashlab_ops.so")


def test_a_missing_library_is_a_clear_import_error(tmp_path):
    env = dict(os.environ, FLASHLAB_OPS_LIBRARY=str(tmp_path / "nothing.so"))
    result = subprocess.run([sys.executable, "-c", "import flashlab"], capture_output=True,
                            text=True, env=env)
    assert result.returncode != 0
    assert "FLASHLAB_OPS_LIBRARY=" in result.stderr and "is not a file" in result.stderr


def test_the_registry_lists_the_kernels_with_their_passes():
    kernels = flashlab.kernels()
    assert {"fa2_mma_sm80", "fa1_scalar"} <= set(kernels)
    assert kernels["fa2_mma_sm80"].backward and kernels["fa1_scalar"].backward
    assert kernels["fa2_mma_sm80"].kvcache
    assert "fp32" in kernels["fa1_scalar"].summary  # the float32-capable kernel
    if "fa3_wgmma_sm90" in kernels:
        assert kernels["fa3_wgmma_sm90"].backward  # head dims 64 and 128 (others: fa2_mma_sm80's)
        assert kernels["fa3_wgmma_sm90"].head_dims == (64, 128, 256)
        assert kernels["fa3_wgmma_sm90"].dtypes == ("fp16", "bf16")
    # What the tests read instead of the summary line: dtypes and head dims from the registry.
    assert kernels["fa1_scalar"].dtypes == ("fp16", "bf16", "fp32")
    assert kernels["fa1_scalar"].head_dims == tuple(range(1, 129))
    assert kernels["fa2_mma_sm80"].head_dims == (32, 64, 96, 128, 256)
    assert kernels["fa2_mma_sm80"].runs_head_dim(59) and not kernels["fa1_scalar"].runs_head_dim(160)


# ---------------------------------------------------------------------------
# The schemas

SCHEMAS = {
    "fwd": "flashlab::fwd(Tensor q, Tensor k, Tensor v, float? softmax_scale=None, bool causal=False, "
           "int window_left=-1, int window_right=-1, bool deterministic=False, str kernel_name=\"auto\", float softcap=0., Tensor? alibi_slopes=None, Tensor? sinks=None, "
           "int sm_margin=0) -> (Tensor out, Tensor lse)",
    "varlen_fwd": "flashlab::varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, "
                  "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float? softmax_scale=None, "
                  "bool causal=False, int window_left=-1, int window_right=-1, bool deterministic=False, "
                  "str kernel_name=\"auto\", float softcap=0., Tensor? alibi_slopes=None, Tensor? sinks=None, int sm_margin=0) "
                  "-> (Tensor out, Tensor lse)",
    "bwd": "flashlab::bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
           "float? softmax_scale=None, bool causal=False, int window_left=-1, int window_right=-1, "
           "bool deterministic=False, str kernel_name=\"auto\", float softcap=0., Tensor? alibi_slopes=None, Tensor? sinks=None) "
           "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)",
    "varlen_bwd": "flashlab::varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, "
                  "Tensor lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
                  "int max_seqlen_k, float? softmax_scale=None, bool causal=False, int window_left=-1, "
                  "int window_right=-1, bool deterministic=False, str kernel_name=\"auto\", float softcap=0., Tensor? alibi_slopes=None, Tensor? sinks=None) "
                  "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)",
    "fwd_kvcache": "flashlab::fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, "
                   "Tensor? k=None, Tensor? v=None, Tensor? cache_seqlens=None, "
                   "Tensor? block_table=None, float? softmax_scale=None, bool causal=False, "
                   "int window_left=-1, int window_right=-1, int num_splits=0, str kernel_name=\"auto\", float softcap=0., Tensor? alibi_slopes=None, Tensor? sinks=None) "
                   "-> (Tensor out, Tensor lse)",
    "fwd_fp8": "flashlab::fwd_fp8(Tensor q, Tensor k, Tensor v, Tensor? q_descale=None, Tensor? k_descale=None, "
               "Tensor? v_descale=None, float? softmax_scale=None, bool causal=False, int window_left=-1, "
               "int window_right=-1, ScalarType? out_dtype=None, str kernel_name=\"auto\") -> (Tensor out, Tensor lse)",
    "varlen_fwd_fp8": "flashlab::varlen_fwd_fp8(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
                      "int max_seqlen_q, int max_seqlen_k, Tensor? q_descale=None, Tensor? k_descale=None, "
                      "Tensor? v_descale=None, float? softmax_scale=None, bool causal=False, int window_left=-1, "
                      "int window_right=-1, ScalarType? out_dtype=None, str kernel_name=\"auto\") -> (Tensor out, Tensor lse)",
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema(name):
    op = getattr(torch.ops.flashlab, name).default
    assert str(op._schema) == SCHEMAS[name]
    assert torch.Tag.pt2_compliant_tag in op.tags


def test_only_the_caches_are_mutated():
    schema = torch.ops.flashlab.fwd_kvcache.default._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["k_cache", "v_cache"]
    for name in ("fwd", "varlen_fwd", "bwd", "varlen_bwd", "fwd_fp8", "varlen_fwd_fp8"):
        schema = getattr(torch.ops.flashlab, name).default._schema
        assert all(a.alias_info is None for a in schema.arguments), name


def test_the_kernels_op_needs_no_device():
    entries = torch.ops.flashlab.kernels()
    assert all(entry.count("\t") >= 2 for entry in entries)
    assert [entry.split("\t")[0] for entry in entries] == list(flashlab.kernels())


def test_cpu_tensors_reach_no_kernel():
    q = torch.randn(1, 4, 2, 64, dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="flashlab::fwd.*CPU"):
        flash_attn_func(q, q, q)


# ---------------------------------------------------------------------------
# flash-attn's signatures: same names, order and defaults, plus kernel="auto"

COMMON = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
          ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
          ("return_attn_probs", False)]
SIGNATURES = {
    flash_attn_func: ["q", "k", "v"] + COMMON,
    flash_attn_qkvpacked_func: ["qkv"] + COMMON,
    flash_attn_kvpacked_func: ["q", "kv"] + COMMON,
    flash_attn_varlen_func: ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                             "max_seqlen_k"] + COMMON + [("block_table", None)],
    flash_attn_varlen_qkvpacked_func: ["qkv", "cu_seqlens", "max_seqlen"] + COMMON,
    flash_attn_varlen_kvpacked_func: ["q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                                      "max_seqlen_k"] + COMMON,
    flash_attn_with_kvcache: ["q", "k_cache", "v_cache", ("k", None), ("v", None),
                              ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
                              ("cache_batch_idx", None), ("cache_leftpad", None),
                              ("block_table", None), ("softmax_scale", None), ("causal", False),
                              ("window_size", (-1, -1)), ("softcap", 0.0),
                              ("rotary_interleaved", True), ("alibi_slopes", None),
                              ("num_splits", 0), ("return_softmax_lse", False)],
}


@pytest.mark.parametrize("function", list(SIGNATURES), ids=lambda f: f.__name__)
def test_flash_attn_signature(function):
    parameters = list(inspect.signature(function).parameters.values())
    positional = [p for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
    expected = [(e, inspect.Parameter.empty) if isinstance(e, str) else e
                for e in SIGNATURES[function]]
    assert [(p.name, p.default) for p in positional] == expected
    keyword_only = [(p.name, p.default) for p in parameters if p.kind is p.KEYWORD_ONLY]
    fp8 = [("q_descale", None), ("k_descale", None), ("v_descale", None), ("out_dtype", None)]  # FA3's FP8 forward
    takes_fp8 = function in (flash_attn_func, flash_attn_varlen_func)
    assert keyword_only == [("kernel", "auto"), ("sinks", None)] + (fp8 if takes_fp8 else [])


# ---------------------------------------------------------------------------
# Fake kernels: shapes and dtypes on the meta device and under FakeTensorMode

HEAD_DIMS = [32, 40, 59, 64, 111, 128, 224, 256]


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32],
                         ids=["fp16", "bf16", "fp32"])
def test_fixed_length_shapes(head_dim, dtype):
    q, k, v = meta(3, 17, 6, head_dim, dtype=dtype), meta(3, 33, 2, head_dim, dtype=dtype), \
        meta(3, 33, 2, head_dim, dtype=dtype)
    out = flash_attn_func(q, k, v, causal=True)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    out, lse, probs = flash_attn_func(q, k, v, window_size=(8, 2), return_attn_probs=True)
    assert lse.shape == (3, 6, 17) and lse.dtype == torch.float32 and probs.numel() == 0


def test_packed_shapes():
    qkv = meta(2, 19, 3, 4, 64)
    out, lse, probs = flash_attn_qkvpacked_func(qkv, return_attn_probs=True)
    assert out.shape == (2, 19, 4, 64) and lse.shape == (2, 4, 19) and probs.numel() == 0
    q, kv = meta(2, 5, 4, 64), meta(2, 19, 2, 1, 64)
    assert flash_attn_kvpacked_func(q, kv, causal=True).shape == (2, 5, 4, 64)


def test_varlen_shapes():
    cu_q, cu_k = cu_seqlens(3, 0, 14), cu_seqlens(20, 7, 1)
    q, k, v = meta(17, 6, 96), meta(28, 3, 96), meta(28, 3, 96)
    out, lse, probs = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 14, 20, causal=True,
                                             return_attn_probs=True)
    assert out.shape == (17, 6, 96) and lse.shape == (6, 17) and lse.dtype == torch.float32
    assert probs.shape == (0,)
    qkv = meta(17, 3, 6, 64)
    assert flash_attn_varlen_qkvpacked_func(qkv, cu_q, 14).shape == (17, 6, 64)
    kv = meta(28, 2, 3, 96)
    assert flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 14, 20).shape == (17, 6, 96)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("cache_seqlens", [None, 5, "tensor"])
def test_kvcache_shapes(paged, cache_seqlens):
    batch, heads, kv_heads, head_dim = 3, 8, 2, 128
    q = meta(batch, 2, heads, head_dim)
    if paged:
        k_cache, v_cache = meta(10, 16, kv_heads, head_dim), meta(10, 16, kv_heads, head_dim)
        block_table = torch.zeros(batch, 4, dtype=torch.int32, device="meta")
    else:
        k_cache, v_cache = meta(batch, 64, kv_heads, head_dim), meta(batch, 64, kv_heads, head_dim)
        block_table = None
    if cache_seqlens == "tensor":
        cache_seqlens = torch.zeros(batch, dtype=torch.int32, device="meta")
    k = v = None
    if cache_seqlens is not None:
        k, v = meta(batch, 2, kv_heads, head_dim), meta(batch, 2, kv_heads, head_dim)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens,
                                       block_table=block_table, causal=True,
                                       return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (batch, heads, 2)
    assert flash_attn_with_kvcache(q, k_cache, v_cache, block_table=block_table).shape == q.shape


def test_fake_tensor_mode_on_cuda_device():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 7, 4, 80, device="cuda", dtype=torch.bfloat16)
        k = torch.empty(2, 9, 1, 80, device="cuda", dtype=torch.bfloat16)
        out, lse, _ = flash_attn_func(q, k, k, return_attn_probs=True)
        assert out.shape == q.shape and out.device.type == "cuda" and out.dtype == torch.bfloat16
        assert lse.shape == (2, 4, 7) and lse.device.type == "cuda"


# ---------------------------------------------------------------------------
# Autograd and torch.compile on the meta device


def test_autograd_on_meta():
    q, k, v = meta(2, 17, 4, 40, grad=True), meta(2, 33, 2, 40, grad=True), meta(2, 33, 2, 40, grad=True)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad  # lse has no gradient, as in flash-attn
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_packed_autograd_on_meta():
    qkv = meta(2, 9, 3, 4, 64, grad=True)
    flash_attn_qkvpacked_func(qkv, causal=True).sum().backward()
    assert qkv.grad.shape == qkv.shape
    q, kv = meta(11, 4, 64, grad=True), meta(13, 2, 2, 64, grad=True)
    flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens(5, 6), cu_seqlens(6, 7), 6, 7).sum().backward()
    assert q.grad.shape == q.shape and kv.grad.shape == kv.shape


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compile_fullgraph_on_meta(dynamic):
    torch._dynamo.reset()

    def loss(q, k, v):
        return flash_attn_func(q, k, v, causal=True, window_size=(16, 0), deterministic=True).float().sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    q, k, v = meta(2, 17, 4, 64, grad=True), meta(2, 33, 2, 64, grad=True), meta(2, 33, 2, 64, grad=True)
    compiled(q, k, v).backward()
    assert q.grad.shape == q.shape and v.grad.shape == v.shape


def test_compile_fullgraph_varlen_and_kvcache_on_meta():
    torch._dynamo.reset()

    def varlen(q, k, v, cu_q, cu_k):
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 12, causal=True).float().sum()

    q, k, v = meta(13, 4, 64, grad=True), meta(20, 4, 64, grad=True), meta(20, 4, 64, grad=True)
    torch.compile(varlen, fullgraph=True, backend="aot_eager")(q, k, v, cu_seqlens(4, 9),
                                                               cu_seqlens(8, 12)).backward()
    assert k.grad.shape == k.shape

    def decode(q, k_cache, v_cache, k, v):
        return flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=7, causal=True)

    q, k_cache, v_cache = meta(2, 1, 4, 128), meta(2, 64, 2, 128), meta(2, 64, 2, 128)
    k, v = meta(2, 1, 2, 128), meta(2, 1, 2, 128)
    out = torch.compile(decode, fullgraph=True, backend="aot_eager")(q, k_cache, v_cache, k, v)
    assert out.shape == q.shape


# ---------------------------------------------------------------------------
# torch.library.opcheck on meta tensors: the schema (mutations declared),
# the autograd registration, the fake kernel against the meta kernel, and
# AOT dispatch with dynamic shapes. (On the meta device the fake and the
# "real" kernel are the same function; the GPU suite runs opcheck for real.)


def opcheck_cases():
    q, k, v = meta(2, 17, 4, 40, grad=True), meta(2, 33, 2, 40, grad=True), meta(2, 33, 2, 40, grad=True)
    qv, kv_, vv = meta(17, 4, 64, grad=True), meta(20, 2, 64, grad=True), meta(20, 2, 64, grad=True)
    cu_q, cu_k = cu_seqlens(5, 12), cu_seqlens(8, 12)
    dout, out, lse = meta(2, 17, 4, 40), meta(2, 17, 4, 40), meta(2, 4, 17, dtype=torch.float32)
    dv_out, v_out, v_lse = meta(17, 4, 64), meta(17, 4, 64), meta(4, 17, dtype=torch.float32)
    return {
        "fwd": (torch.ops.flashlab.fwd.default, (q, k, v, None, True, -1, -1, False, "auto")),
        "fwd_window_scale": (torch.ops.flashlab.fwd.default, (q, k, v, 0.3, False, 8, 3, True, "auto")),
        # softcap, ALiBi slopes (no gradient) and sinks (a gradient: dsinks from bwd's fake)
        "fwd_modified": (torch.ops.flashlab.fwd.default,
                         (q, k, v, None, True, -1, -1, False, "auto", 2.5,
                          meta(4, dtype=torch.float32), meta(4, dtype=torch.float32, grad=True))),
        "bwd_sinks": (torch.ops.flashlab.bwd.default,
                      (dout, out, meta(2, 33, 2, 40), meta(2, 33, 2, 40), out, lse, None, True, -1, -1,
                       False, "auto", 0.0, None, meta(4, dtype=torch.float32))),
        "varlen_fwd": (torch.ops.flashlab.varlen_fwd.default,
                       (qv, kv_, vv, cu_q, cu_k, 12, 12, None, True, -1, -1, False, "auto")),
        "bwd": (torch.ops.flashlab.bwd.default,
                (dout, out, meta(2, 33, 2, 40), meta(2, 33, 2, 40), out, lse, None, True, -1, -1,
                 True, "auto")),
        "varlen_bwd": (torch.ops.flashlab.varlen_bwd.default,
                       (dv_out, v_out, meta(20, 2, 64), meta(20, 2, 64), v_out, v_lse, cu_q, cu_k,
                        12, 12, None, False, -1, -1, False, "auto")),
        "fwd_kvcache": (torch.ops.flashlab.fwd_kvcache.default,
                        (meta(2, 1, 4, 64), meta(2, 32, 2, 64), meta(2, 32, 2, 64),
                         meta(2, 1, 2, 64), meta(2, 1, 2, 64),
                         torch.zeros(2, dtype=torch.int32, device="meta"), None, None, True, -1,
                         -1, 0, "auto")),
        # e4m3 (no autograd: a forward only), the descales (batch, kv_heads), a half output
        "fwd_fp8": (torch.ops.flashlab.fwd_fp8.default,
                    (*(torch.empty(2, 17, h, 128, device="meta", dtype=torch.float8_e4m3fn) for h in (4, 2, 2)),
                     *(meta(2, 2, dtype=torch.float32) for _ in range(3)), None, True, -1, -1, torch.float16,
                     "auto")),
        # packed e4m3: a descale row a sequence (2 here)
        "varlen_fwd_fp8": (torch.ops.flashlab.varlen_fwd_fp8.default,
                           (*(torch.empty(rows, h, 128, device="meta", dtype=torch.float8_e4m3fn)
                              for rows, h in ((17, 4), (20, 2), (20, 2))),
                            cu_q, cu_k, 12, 12, *(meta(2, 2, dtype=torch.float32) for _ in range(3)),
                            None, False, -1, -1, None, "auto")),
    }


@pytest.mark.parametrize("case", list(opcheck_cases()))
def test_opcheck_on_meta(case):
    op, args = opcheck_cases()[case]
    results = torch.library.opcheck(op, args)
    assert set(results.values()) == {"SUCCESS"}, results


# ---------------------------------------------------------------------------
# Argument errors: what flashlab lacks raises, naming what was given and what is taken

q16, k16 = meta(1, 4, 2, 64), meta(1, 4, 2, 64)
vq, vk = meta(4, 2, 64), meta(4, 2, 64)
cu = cu_seqlens(4)
cache = meta(1, 16, 2, 64)

ERRORS = [
    ("dropout", lambda: flash_attn_func(q16, k16, k16, dropout_p=0.1), NotImplementedError,
     "flash_attn_func: flashlab has no dropout; dropout_p must be 0.0, got 0.1"),
    ("dropout_positional", lambda: flash_attn_func(q16, k16, k16, 0.5), NotImplementedError,
     "dropout_p must be 0.0, got 0.5"),
    ("softcap_negative", lambda: flash_attn_func(q16, k16, k16, softcap=-1.0), ValueError,
     "flash_attn_func: softcap must be a float >= 0 (0: off); got -1.0"),
    ("softcap_str", lambda: flash_attn_func(q16, k16, k16, softcap="30"), ValueError,
     "softcap must be a float >= 0 (0: off); got '30'"),
    ("alibi_list", lambda: flash_attn_func(q16, k16, k16, alibi_slopes=[1.0, 2.0]), TypeError,
     "flash_attn_func: alibi_slopes must be a float32 tensor or None; got a list"),
    ("sinks_list", lambda: flash_attn_func(q16, k16, k16, sinks=[0.0, 0.0]), TypeError,
     "flash_attn_func: sinks must be a float32 tensor or None; got a list"),
    ("window_not_a_pair", lambda: flash_attn_func(q16, k16, k16, window_size=5), ValueError,
     "window_size must be a pair (left, right) of ints or integer tensors (negative: unbounded); "
     "got 5"),
    ("window_float", lambda: flash_attn_func(q16, k16, k16, window_size=(1.5, 0)), ValueError,
     "got (1.5, 0)"),
    ("window_float_tensor",
     lambda: flash_attn_func(q16, k16, k16, window_size=torch.tensor([1.5, 0.0])), ValueError,
     "window_size must be a pair"),
    ("window_three_items", lambda: flash_attn_func(q16, k16, k16, window_size=torch.tensor([1, 2, 3])),
     ValueError, "window_size must be a pair"),
    ("unknown_kernel", lambda: flash_attn_func(q16, k16, k16, kernel="fa9"), ValueError,
     "flash_attn_func: unknown kernel 'fa9'; registered kernels: "),
    ("kernel_not_str", lambda: flash_attn_func(q16, k16, k16, kernel=2), TypeError,
     "kernel must be a str, got int"),
    ("scale_not_number", lambda: flash_attn_func(q16, k16, k16, softmax_scale="x"), TypeError,
     "softmax_scale must be a float or None, got str"),
    ("qkvpacked_shape", lambda: flash_attn_qkvpacked_func(meta(1, 4, 2, 2, 64)), ValueError,
     "qkv must be (batch, seqlen, 3, heads, head_dim); got shape (1, 4, 2, 2, 64)"),
    ("kvpacked_shape", lambda: flash_attn_kvpacked_func(q16, meta(1, 4, 3, 2, 64)), ValueError,
     "kv must be (batch, seqlen_k, 2, kv_heads, head_dim); got shape (1, 4, 3, 2, 64)"),
    ("qkvpacked_dropout", lambda: flash_attn_qkvpacked_func(meta(1, 4, 3, 2, 64), 0.1),
     NotImplementedError, "flash_attn_qkvpacked_func: flashlab has no dropout"),
    ("varlen_block_table",
     lambda: flash_attn_varlen_func(vq, vk, vk, cu, cu, 4, 4, block_table=torch.zeros(1, 1)),
     NotImplementedError, "takes no paged K/V; block_table must be None"),
    ("varlen_max_seqlen_float", lambda: flash_attn_varlen_func(vq, vk, vk, cu, cu, 4.5, 4),
     TypeError, "max_seqlen_q must be an int, got float"),
    ("varlen_softcap", lambda: flash_attn_varlen_func(vq, vk, vk, cu, cu, 4, 4, softcap=-5.0),
     ValueError, "flash_attn_varlen_func: softcap must be a float >= 0"),
    ("varlen_qkvpacked_shape", lambda: flash_attn_varlen_qkvpacked_func(meta(4, 2, 2, 64), cu, 4),
     ValueError, "qkv must be (total, 3, heads, head_dim); got shape (4, 2, 2, 64)"),
    ("varlen_kvpacked_alibi",
     lambda: flash_attn_varlen_kvpacked_func(vq, meta(4, 2, 2, 64), cu, cu, 4, 4,
                                             alibi_slopes=(1.0, 2.0)),
     TypeError, "flash_attn_varlen_kvpacked_func: alibi_slopes must be a float32 tensor or None"),
    ("kvcache_rotary",
     lambda: flash_attn_with_kvcache(q16, cache, cache, rotary_cos=torch.ones(4, 32),
                                     rotary_sin=torch.ones(4, 32)),
     NotImplementedError, "flashlab applies no rotary embedding; rotary_cos and rotary_sin must be None"),
    ("kvcache_batch_idx",
     lambda: flash_attn_with_kvcache(q16, cache, cache, cache_batch_idx=torch.zeros(1, dtype=torch.int32)),
     NotImplementedError, "cache_batch_idx is not supported; it must be None"),
    ("kvcache_leftpad",
     lambda: flash_attn_with_kvcache(q16, cache, cache, cache_leftpad=torch.zeros(1, dtype=torch.int32)),
     NotImplementedError, "cache_leftpad is not supported; it must be None"),
    ("kvcache_softcap", lambda: flash_attn_with_kvcache(q16, cache, cache, softcap=-1.0),
     ValueError, "flash_attn_with_kvcache: softcap must be a float >= 0"),
    ("kvcache_sinks", lambda: flash_attn_with_kvcache(q16, cache, cache, sinks=1.0),
     TypeError, "flash_attn_with_kvcache: sinks must be a float32 tensor or None; got a float"),
    ("kvcache_k_without_v", lambda: flash_attn_with_kvcache(q16, cache, cache, k=k16, cache_seqlens=1),
     ValueError, "k and v go together (both new keys and values, or neither); got k a tensor, v None"),
    ("kvcache_seqlens_int64",
     lambda: flash_attn_with_kvcache(q16, cache, cache, cache_seqlens=torch.zeros(1, dtype=torch.int64)),
     ValueError, "cache_seqlens must have dtype torch.int32; got torch.int64"),
    ("kvcache_seqlens_negative", lambda: flash_attn_with_kvcache(q16, cache, cache, cache_seqlens=-1),
     ValueError, "cache_seqlens must be >= 0; got -1"),
    ("kvcache_seqlens_str", lambda: flash_attn_with_kvcache(q16, cache, cache, cache_seqlens="3"),
     TypeError, "cache_seqlens must be an int, an int32 tensor or None; got str"),
    ("kvcache_seqlens_bool", lambda: flash_attn_with_kvcache(q16, cache, cache, cache_seqlens=True),
     TypeError, "got a bool"),
    ("kvcache_num_splits", lambda: flash_attn_with_kvcache(q16, cache, cache, num_splits=-1),
     ValueError, "num_splits must be >= 0 (0: the kernel's heuristic); got -1"),
    ("kvcache_block_table_int64",
     lambda: flash_attn_with_kvcache(q16, cache, cache, block_table=torch.zeros(1, 1, dtype=torch.int64)),
     ValueError, "block_table must be an int32 tensor (batch, pages per sequence); got torch.int64"),
    ("kvcache_window", lambda: flash_attn_with_kvcache(q16, cache, cache, window_size=(0,)),
     ValueError, "flash_attn_with_kvcache: window_size must be a pair"),
    ("kvcache_unknown_kernel", lambda: flash_attn_with_kvcache(q16, cache, cache, kernel="nope"),
     ValueError, "unknown kernel 'nope'"),
]


@pytest.mark.parametrize("window_size", [(-2, 0), (torch.tensor(-5), 0), torch.tensor([-1, -7]),
                                         (torch.tensor(3, dtype=torch.int32), torch.tensor(0))],
                         ids=["minus_two", "tensor_item", "tensor_pair", "int32_items"])
def test_window_items_as_flash_attn_takes_them(window_size, monkeypatch):
    """Ints or integer tensors (torch.randint(0, n, (2,)) in flash-attn's tests), any negative
    value unbounded: the op sees -1 there and the values as ints."""
    seen = []

    class Spy:
        def __getattr__(self, name):
            return getattr(torch.ops.flashlab, name)

        def fwd(self, q, k, v, scale, causal, left, right, deterministic, kernel, *modifications):
            seen.append((left, right))
            return torch.ops.flashlab.fwd(q, k, v, scale, causal, left, right, deterministic, kernel,
                                          *modifications)

    monkeypatch.setattr(flashlab.flash_attn_interface, "ops", Spy())
    flash_attn_func(q16, k16, k16, window_size=window_size)
    expected = [max(int(x), -1) for x in window_size]
    assert seen == [tuple(expected)] and all(type(x) is int for x in seen[0])


@pytest.mark.parametrize("call,error,message", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_argument_error(call, error, message):
    with pytest.raises(error) as raised:
        call()
    assert message in str(raised.value)


def test_unknown_kernel_lists_the_registered_ones():
    with pytest.raises(ValueError) as raised:
        flash_attn_func(q16, k16, k16, kernel="fa9")
    for name in flashlab.kernels():
        assert name in str(raised.value)
    assert "(or 'auto')" in str(raised.value)
