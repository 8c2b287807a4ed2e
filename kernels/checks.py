"""Argument validation shared by the kernel wrappers: dtypes, shapes, strides and devices.

A kernel launched on bad arguments reads or writes out of bounds without a word, so every wrapper
checks its inputs here first and raises ValueError naming the argument, what it got, what it needs
and how to fix it. Pure torch: no triton import, usable from references and wrappers alike.
"""

from collections.abc import Iterable, Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
) -> torch.Tensor:
    """`t` is a tensor with `ndim` dimensions and one of `dtypes`; returns it."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise ValueError(f"{name} must be {_dtype_names(dtypes)}, got {str(t.dtype).removeprefix('torch.')}")
    return t


def check_shape(name: str, t: torch.Tensor, expected: Sequence[int | None]) -> None:
    """`t.shape` equals `expected`, where None matches any size."""
    shape = tuple(t.shape)
    ok = len(shape) == len(expected) and all(
        e is None or e == s for s, e in zip(shape, expected, strict=False)
    )
    if not ok:
        want = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(shape)}")


def check_same_dtype(**tensors: torch.Tensor) -> None:
    """All given tensors share one dtype."""
    dtypes = {n: t.dtype for n, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        got = ", ".join(f"{n}={str(d).removeprefix('torch.')}" for n, d in dtypes.items())
        raise ValueError(f"these tensors must share one dtype, got {got}; cast them with .to(dtype)")


def check_same_device(**tensors: torch.Tensor) -> torch.device:
    """All given tensors live on one device; returns it."""
    devices = {n: t.device for n, t in tensors.items()}
    if len(set(devices.values())) > 1:
        got = ", ".join(f"{n}={d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on one device, got {got}; move them with .to(device)")
    return next(iter(devices.values()))


def check_writable(name: str, t: torch.Tensor) -> None:
    """`t` may be written element by element: no dimension of size > 1 has stride 0 (an expanded
    view would have several elements share one address and the kernel would race on them)."""
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if size > 1 and stride == 0:
            raise ValueError(
                f"{name} is an expanded view (a dimension of size {size} has stride 0) and cannot be "
                f"written in place; pass a real tensor (e.g. .clone() or .contiguous())"
            )


def check_last_dim_contiguous(name: str, t: torch.Tensor | None) -> None:
    """The last dimension is dense (stride 1), which the kernels' vector loads rely on (None passes)."""
    if t is not None and t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dimension (stride 1), got strides {t.stride()}; "
            f"call .contiguous() first"
        )


def check_positive(name: str, value: float) -> None:
    """A finite, positive scalar (softmax scale, epsilon)."""
    if not isinstance(value, int | float) or not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")


def check_row_scaled_weight(
    x: torch.Tensor, qweight: torch.Tensor, qdtype: torch.dtype, scales: torch.Tensor, scale_dtypes: Sequence[torch.dtype]
) -> tuple[int, int, int]:
    """x [M, K] float against a weight quantized per output row: qweight [N, K] of `qdtype`, scales [N]
    of `scale_dtypes`, dense. Returns (M, K, N)."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("qweight", qweight, ndim=2, dtypes=(qdtype,))
    check_tensor("scales", scales, ndim=1, dtypes=tuple(scale_dtypes))
    m, k = x.shape
    n = qweight.shape[0]
    check_shape("qweight", qweight, (n, k))
    check_shape("scales", scales, (n,))
    check_last_dim_contiguous("scales", scales)
    return m, k, n


def check_kv_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Paged caches [num_blocks, block_size, Hkv, D] of one shape and float dtype; returns that shape."""
    check_tensor("k_cache", k_cache, ndim=4, dtypes=FLOAT_DTYPES)
    check_tensor("v_cache", v_cache, ndim=4, dtypes=FLOAT_DTYPES)
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must have the same shape [num_blocks, block_size, num_kv_heads, "
            f"head_dim], got {list(k_cache.shape)} and {list(v_cache.shape)}"
        )
    check_same_dtype(k_cache=k_cache, v_cache=v_cache)
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    return num_blocks, block_size, num_kv_heads, head_dim


def check_paged_operands(**tensors: torch.Tensor | None) -> torch.device:
    """The operands of a paged-attention launch: each dense in its last dimension, k_cache and
    v_cache with one stride layout (they are allocated together), all on one device (returned)."""
    for name, t in tensors.items():
        check_last_dim_contiguous(name, t)
    k_cache, v_cache = tensors["k_cache"], tensors["v_cache"]
    assert k_cache is not None and v_cache is not None  # invariant: the wrappers always pass both
    if k_cache.stride() != v_cache.stride():
        raise ValueError(
            f"k_cache and v_cache must share strides, got {k_cache.stride()} and {v_cache.stride()}"
        )
    return check_same_device(**{n: t for n, t in tensors.items() if t is not None and n != "out"})


def check_gqa(num_heads: int, num_kv_heads: int) -> int:
    """Query heads split evenly over KV heads; returns the group size (query heads per KV head)."""
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(
            f"the number of query heads ({num_heads}) must be a multiple of the number of KV heads "
            f"({num_kv_heads})"
        )
    return num_heads // num_kv_heads


def check_attention_queries(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
) -> tuple[int, int, int, int, int]:
    """Query rows q [N, Hq, D] against paged caches [num_blocks, block_size, Hkv, D]: float, one dtype,
    one head size, Hq a multiple of Hkv. Returns (block_size, Hkv, D, Hq, group)."""
    _, block_size, num_kv_heads, head_dim = check_kv_cache(k_cache, v_cache)
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    rows, num_heads, _ = q.shape
    check_shape("q", q, (rows, num_heads, head_dim))
    check_same_dtype(q=q, k_cache=k_cache)
    return block_size, num_kv_heads, head_dim, num_heads, check_gqa(num_heads, num_kv_heads)


def check_sinks(sinks: torch.Tensor | None, num_heads: int, q: torch.Tensor) -> None:
    """Attention sinks: None, or fp32 [Hq] logits, dense, on q's device."""
    if sinks is None:
        return
    check_tensor("sinks", sinks, ndim=1, dtypes=(torch.float32,))
    check_shape("sinks", sinks, (num_heads,))
    check_last_dim_contiguous("sinks", sinks)
    check_same_device(q=q, sinks=sinks)


def check_out(name: str, out: torch.Tensor | None, shape: Sequence[int], like: torch.Tensor) -> None:
    """An optional output buffer has `shape`, `like`'s dtype and device, and is writable."""
    if out is None:
        return
    check_tensor(name, out, ndim=len(shape), dtypes=(like.dtype,))
    check_shape(name, out, shape)
    check_same_device(**{name: out, "input": like})
    check_writable(name, out)


FP8_MIN_CAPABILITY = (8, 9)  # torch._scaled_mm's e4m3 kernels: Ada (8.9), Hopper (9.0) and newer


def fp8_shortfall(device: torch.device) -> str | None:
    """None when the CUDA GPU `device` multiplies float8 (compute capability >= 8.9); else what it
    is instead, for the refusal: "<name> (<device>) is <major>.<minor>"."""
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) >= FP8_MIN_CAPABILITY:
        return None
    return f"{torch.cuda.get_device_name(device)} ({device}) is {major}.{minor}"


def check_fp8_capability(device: torch.device) -> None:
    """`device` is a CUDA GPU whose tensor cores multiply float8 (compute capability >= 8.9)."""
    if device.type != "cuda":
        raise ValueError(
            f"fp8 matmuls (torch._scaled_mm) need a CUDA GPU, got {device}; use the torch reference"
        )
    shortfall = fp8_shortfall(device)
    if shortfall is not None:
        raise ValueError(
            f"fp8 matmuls (torch._scaled_mm) need an NVIDIA GPU of compute capability 8.9 or newer "
            f"(Ada: L4, L40S, RTX 4090; Hopper: H100, H200; Blackwell); {shortfall}: use int8 or int4 "
            "weights on it"
        )
