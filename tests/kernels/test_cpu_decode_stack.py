"""The C decode stack (kernels/cpu/decode_stack.c) against the same layers run op by op with the torch
references: its output and the K/V it stores, over GQA groups, head sizes 16 to 128, qkv bias and
q/k norms, widths with vector tails, int8 / int4 quantized matrices, LoRA adapters per row; the same
floats with 1, 2 or 3 threads; what it refuses."""

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from kernel_cases import assert_close, randn
from paged_cases import block_tables_for, random_cache
from torch_threads import torch_threads

from kernels import reference
from kernels.cpu.decode_stack import NativeDecodeStack, StackLayer, StackShape, pack_rows
from kernels.cpu.gemv import NativeGemv
from kernels.cpu.quant_matmul import NativeQuantMatmul, QuantWeight, pack_int4, pack_int8
from kernels.cpu.stack_lora import LoraFactors, bind_lora, slice_bounds
from kernels.reference import lora as lora_ref
from kernels.reference import quant_matmul as qref
from worker.engine.models.rotary import cos_sin_cache

EPS = 1e-6
ADAPTED = ("qkv", "o_proj", "gate_up", "down")  # the matrices a LoRA adapter may wrap


@pytest.fixture(scope="module")
def native() -> NativeDecodeStack:
    return NativeDecodeStack()


def _layers(shape: StackShape, num_layers: int, bias: bool, qk_norm: bool, caches) -> list[StackLayer]:
    h, d, inter = shape.hidden, shape.head_dim, shape.intermediate
    nq = (shape.num_heads + 2 * shape.num_kv_heads) * d
    s = 0.5 / h**0.5  # weights scaled so activations stay O(1) through the layers
    return [
        StackLayer(1 + 0.1 * randn(h), randn(nq, h, scale=s), randn(nq, scale=0.1) if bias else None,
                   1 + 0.1 * randn(d) if qk_norm else None, 1 + 0.1 * randn(d) if qk_norm else None,
                   randn(h, shape.num_heads * d, scale=s), 1 + 0.1 * randn(h), randn(2 * inter, h, scale=s),
                   randn(h, inter, scale=0.5 / inter**0.5), k, v)  # fmt: skip
        for k, v in caches[:num_layers]
    ]


QuantRefs = dict[int, Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]]
Adapters = tuple[list[dict[str, LoraFactors]], torch.Tensor]  # each layer's factors by matrix, each row's slot


def _reference(shape: StackShape, layers, final_norm, cos_sin, x, positions, slots, tables, lens,
               quant: QuantRefs | None = None, adapters: Adapters | None = None) -> torch.Tensor:  # fmt: skip
    """The op-by-op path (models/decoder.py) over the torch references; a QuantWeight matrix through its
    reference in `quant` (by id: the kernel's math, kernels/reference/quant_matmul.py); each row's LoRA
    adapter added after each wrapped matrix as LoraLinear does (kernels/reference/lora.py)."""
    index = {id(getattr(layer, name)): (i, name) for i, layer in enumerate(layers) for name in ADAPTED}

    def linear(x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = quant[id(w)](x, bias) if isinstance(w, QuantWeight) else F.linear(x, w, bias)
        i, name = index[id(w)]
        f = adapters[0][i].get(name) if adapters else None
        if f is not None:
            h = lora_ref.lora_shrink(x, f.a, adapters[1])
            lora_ref.lora_expand(h, f.b, f.scaling, adapters[1], f.bounds, y)
        return y

    rows, d = x.shape[0], shape.head_dim
    q_size, kv_size = shape.num_heads * d, shape.num_kv_heads * d
    h, residual = x, None
    for layer in layers:
        normed, residual = reference.rms_norm(h, layer.input_norm, EPS, residual)
        q, k, v = linear(normed, layer.qkv, layer.qkv_bias).split([q_size, kv_size, kv_size], dim=-1)
        q, k, v = (t.reshape(rows, -1, d) for t in (q, k, v))
        if layer.q_norm is not None:
            q = reference.rms_norm(q.reshape(-1, d), layer.q_norm, EPS)[0].view(rows, -1, d)
            k = reference.rms_norm(k.reshape(-1, d), layer.k_norm, EPS)[0].view(rows, -1, d)
        q, k = q.contiguous(), k.contiguous()
        reference.apply_rotary(q, k, positions, cos_sin)
        reference.store_kv_cache(k, v, layer.k_cache, layer.v_cache, slots)
        out = reference.paged_decode_attention(q, layer.k_cache, layer.v_cache, tables, lens, shape.scale)
        normed, residual = reference.rms_norm(linear(out.reshape(rows, -1), layer.o_proj), layer.post_norm, EPS,
                                              residual)  # fmt: skip
        h = linear(reference.silu_mul(linear(normed, layer.gate_up)), layer.down)
    return reference.rms_norm(h, final_norm, EPS, residual)[0]


def _case(hidden, heads, kv_heads, head_dim, inter, block_size, lens, bias=False, qk_norm=False, layers=2):
    shape = StackShape(hidden, heads, kv_heads, head_dim, inter, EPS, head_dim**-0.5)
    num_blocks = sum(-(-n // block_size) for n in lens) + 4
    caches = [random_cache(num_blocks, block_size, kv_heads, head_dim, torch.float32) for _ in range(layers)]
    stack_layers = _layers(shape, layers, bias, qk_norm, caches)
    tables = block_tables_for(lens, block_size, num_blocks)
    cl = torch.tensor(lens, dtype=torch.int32)
    positions = cl.long() - 1
    slots = tables[torch.arange(len(lens)), positions // block_size].long() * block_size + positions % block_size
    return shape, stack_layers, 1 + 0.1 * randn(hidden), cos_sin_cache(head_dim, 512, 10000.0, None), \
        randn(len(lens), hidden), positions, slots, tables, cl  # fmt: skip


def _copy_caches(layers: list[StackLayer]) -> list[StackLayer]:
    return [StackLayer(*[t.clone() if name.endswith("cache") else t for name, t in vars(layer).items()])
            for layer in layers]  # fmt: skip


@pytest.mark.parametrize(
    ("hidden", "heads", "kv_heads", "head_dim", "inter", "block_size", "lens", "bias", "qk_norm"),
    [
        (64, 4, 2, 16, 128, 16, [1, 17, 40], False, False),  # the engine tests' shape
        (256, 4, 1, 64, 200, 16, [90], True, False),  # one row, a GQA group of 4, qkv bias
        (256, 2, 2, 128, 96, 8, [5, 9, 1, 12, 30, 64, 2, 33], False, True),  # 8 rows, head_dim 128, q/k norms
        (72, 4, 2, 16, 40, 4, [3, 19], True, True),  # widths with vector tails (72, 40)
    ],
)
def test_matches_the_layers_op_by_op(native, hidden, heads, kv_heads, head_dim, inter, block_size, lens, bias,
                                     qk_norm) -> None:  # fmt: skip
    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = _case(
        hidden, heads, kv_heads, head_dim, inter, block_size, lens, bias, qk_norm
    )
    slots[0] = -1  # a row whose K/V is already cached (a recomputed prompt token): not stored
    ref_layers = _copy_caches(layers)
    want = _reference(shape, ref_layers, final_norm, cos_sin, x, positions, slots, tables, cl)
    got = native.bind(shape, layers, final_norm, cos_sin)(x, positions, slots, tables, cl)
    assert_close(got, want, atol=2e-4, rtol=1e-4)
    for mine, theirs in zip(layers, ref_layers, strict=True):
        assert_close(mine.k_cache, theirs.k_cache, atol=2e-4, rtol=1e-4)  # the stored (rotated) keys
        assert_close(mine.v_cache, theirs.v_cache, atol=2e-4, rtol=1e-4)


def test_many_rows_through_torchs_sgemm(native) -> None:
    """Past 15 rows the matmuls are torch's sgemm (the same floats as F.linear); without it the stack
    takes at most 15 rows."""
    assert native.sgemm is not None and native.max_rows > 15
    lens = [1 + (7 * i) % 50 for i in range(40)]
    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = _case(64, 4, 2, 16, 128, 16, lens, True, True)
    want = _reference(shape, _copy_caches(layers), final_norm, cos_sin, x, positions, slots, tables, cl)
    got = native.bind(shape, layers, final_norm, cos_sin)(x, positions, slots, tables, cl)
    assert_close(got, want, atol=2e-4, rtol=1e-4)
    gemv_only = NativeDecodeStack(use_sgemm=False)
    assert gemv_only.max_rows == gemv_only.gemv_rows == 15
    with pytest.raises(ValueError, match="rows"):
        gemv_only.bind(shape, layers, final_norm, cos_sin)(x, positions, slots, tables, cl)


def test_threads_give_the_same_floats(native) -> None:
    case = _case(512, 8, 4, 64, 1536, 16, [37, 5, 90], bias=True, layers=3)
    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = case
    outs, caches = [], []
    for threads in (1, 2, 3):
        with torch_threads(threads):
            mine = _copy_caches(layers)
            outs.append(native.bind(shape, mine, final_norm, cos_sin)(x, positions, slots, tables, cl))
            caches.append(torch.cat([torch.stack([layer.k_cache, layer.v_cache]) for layer in mine]))
    want = _reference(shape, _copy_caches(layers), final_norm, cos_sin, x, positions, slots, tables, cl)
    assert_close(outs[0], want, atol=2e-4, rtol=1e-4)
    for out, cache in zip(outs[1:], caches[1:], strict=True):
        assert torch.equal(out, outs[0]) and torch.equal(cache, caches[0])


def test_refuses_what_it_does_not_fit(native) -> None:
    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = _case(64, 4, 2, 16, 128, 16, [3, 4])
    stack = native.bind(shape, layers, final_norm, cos_sin)
    with pytest.raises(IndexError):  # a position past the rotary table
        stack(x, positions + 600, slots, tables, cl)
    with pytest.raises(IndexError):  # a slot past the cache
        stack(x, positions, slots + 10_000, tables, cl)
    with pytest.raises(ValueError, match="rows"):
        stack(randn(native.max_rows + 1, 64), positions.repeat(5)[:9], slots.repeat(5)[:9], tables, cl)
    for head_dim in (20, 24):  # no compiled attention for these head sizes: the layers run op by op
        assert not native.supports(StackShape(64, 4, 2, head_dim, 128, EPS, 1.0), 16)
    bad = StackLayer(*[t.double() if name == "down" else t for name, t in vars(layers[0]).items()])
    with pytest.raises(ValueError, match="layer 0 down"):
        native.bind(shape, [bad], final_norm, cos_sin)


def test_fp16_matrices_give_the_fp32_matrices_floats(native) -> None:
    """A stack bound with half=True reads qkv, o_proj, gate_up and down as fp16 (half the bytes) and
    computes what the fp32 stack computes over their fp32 copies, bit for bit, K/V stores included; it
    takes GEMV rows only and refuses fp32 matrices."""
    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = _case(72, 4, 2, 16, 40, 4, [3, 19, 7], True, True)
    mats = ("qkv", "o_proj", "gate_up", "down")
    layers = [StackLayer(**{n: t.half().float() if n in mats else t for n, t in vars(layer).items()})
              for layer in layers]  # fmt: skip
    halves = [StackLayer(**{n: t.half() if n in mats else t for n, t in vars(layer).items()})
              for layer in _copy_caches(layers)]  # fmt: skip
    want = native.bind(shape, layers, final_norm, cos_sin)(x, positions, slots, tables, cl)
    stack = native.bind(shape, halves, final_norm, cos_sin, half=True)
    assert torch.equal(stack(x, positions, slots, tables, cl), want)
    for full, half in zip(layers, halves, strict=True):
        assert torch.equal(full.k_cache, half.k_cache) and torch.equal(full.v_cache, half.v_cache)
    assert stack.max_rows == stack.gemv_rows
    with pytest.raises(ValueError, match="float16"):
        native.bind(shape, layers, final_norm, cos_sin, half=True)


def test_pack_rows_lays_tiles_of_pack_width_rows_by_k(native) -> None:
    width = native.pack_width
    w = randn(width + 3, 5)  # a second tile with 3 real rows, zeros after
    packed = pack_rows(w, width)
    assert packed.shape == (2, 5, width) and packed.is_contiguous()
    assert torch.equal(packed[1, :, :3], w[width:].T) and torch.equal(packed[0], w[:width].T)
    assert not packed[1, :, 3:].any()


@pytest.mark.parametrize(
    ("hidden", "heads", "kv_heads", "head_dim", "inter", "lens", "bias", "qk_norm"),
    [
        (64, 4, 2, 16, 128, [1 + (7 * i) % 50 for i in range(40)], True, True),  # 40 rows: 6 + 6 + ... + 4
        (72, 4, 2, 16, 40, [3, 19, 7, 1, 30, 12, 5, 8, 22], True, False),  # 9 rows, widths not a tile's
        (256, 8, 4, 32, 768, [1 + (5 * i) % 90 for i in range(16)], False, False),  # the reference model's shape
    ],
)
def test_packed_matrices_match_the_layers_op_by_op(native, hidden, heads, kv_heads, head_dim, inter, lens, bias,
                                                   qk_norm) -> None:  # fmt: skip
    """From packed_rows rows a stack bound with packed=True multiplies with its packed copies (gemm.h);
    the result is the op-by-op path's to fp32 rounding, K/V stores included, on any number of rows."""
    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = _case(
        hidden, heads, kv_heads, head_dim, inter, 16, lens, bias, qk_norm
    )
    assert len(lens) >= native.packed_rows
    ref_layers = _copy_caches(layers)
    want = _reference(shape, ref_layers, final_norm, cos_sin, x, positions, slots, tables, cl)
    stack = native.bind(shape, layers, final_norm, cos_sin, packed=True)
    assert stack.max_rows == 4096
    assert_close(stack(x, positions, slots, tables, cl), want, atol=2e-4, rtol=1e-4)
    for mine, theirs in zip(layers, ref_layers, strict=True):
        assert_close(mine.k_cache, theirs.k_cache, atol=2e-4, rtol=1e-4)
        assert_close(mine.v_cache, theirs.v_cache, atol=2e-4, rtol=1e-4)


def _on_1_2_3_threads(native, shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl) -> list:
    """The packed stack's output for the same step on 1, 2 and 3 torch threads (each bound afresh
    over its own copy of the caches); the thread count is restored after."""
    outs = []
    for threads in (1, 2, 3):
        with torch_threads(threads):
            outs.append(native.bind(shape, _copy_caches(layers), final_norm, cos_sin, packed=True)(
                x, positions, slots, tables, cl))  # fmt: skip
    return outs


def test_packed_rows_give_the_same_floats_on_any_threads_and_batch(native) -> None:
    """Each packed output is one FMA chain over k: the same floats on 1, 2 or 3 threads (whose slices cut
    tiles) and whichever other rows share the step (from packed_rows rows on)."""
    lens = [37, 5, 90, 12, 64, 3, 18, 44, 7, 29, 51, 2, 8]
    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = _case(200, 4, 2, 16, 300, 16, lens, True)
    outs = _on_1_2_3_threads(native, shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl)
    assert all(torch.equal(out, outs[0]) for out in outs[1:])
    few = native.packed_rows
    stack = native.bind(shape, _copy_caches(layers), final_norm, cos_sin, packed=True)
    got = stack(x[:few], positions[:few], slots[:few], tables[:few], cl[:few])
    assert torch.equal(got, outs[0][:few])


def test_fp16_packed_matrices_give_the_fp32_packed_floats(native) -> None:
    """Packed fp16 copies (half=True, packed=True) widen exactly: the fp32 packed stack's floats, bit for
    bit, on 3 to 13 rows (past gemv_rows too: no sgemm needed)."""
    lens = [3, 19, 7, 1, 30, 12, 5, 8, 22, 4, 9, 11, 6]
    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = _case(72, 4, 2, 16, 40, 4, lens, True, True)
    mats = ("qkv", "o_proj", "gate_up", "down")
    layers = [StackLayer(**{n: t.half().float() if n in mats else t for n, t in vars(layer).items()})
              for layer in layers]  # fmt: skip
    halves = [StackLayer(**{n: t.half() if n in mats else t for n, t in vars(layer).items()}) for layer in layers]
    full = native.bind(shape, _copy_caches(layers), final_norm, cos_sin, packed=True)
    half = native.bind(shape, _copy_caches(halves), final_norm, cos_sin, half=True, packed=True)
    assert half.max_rows == 4096
    for rows in (native.packed_rows, 13):
        step = (x[:rows], positions[:rows], slots[:rows], tables[:rows], cl[:rows])
        assert torch.equal(half(*step), full(*step))


def _assert_close_but_flips(got: torch.Tensor, want: torch.Tensor) -> None:
    """The quantized stack against its reference: where the two paths' fp32 inputs to a matrix differ in
    their last bits (the norms and attention are summed in other orders), an activation's int8 rounding
    can flip by one step and move that row's outputs after it by up to about scale / 2 x |w| (~2e-3
    here); without a flip they agree to fp32 rounding (~1e-6)."""
    assert_close(got, want, atol=5e-3, rtol=1e-3)


def _quantized(layers: list[StackLayer], bits: int, group: int, names: tuple[str, ...] = ("qkv", "o_proj", "gate_up", "down"),
               ) -> tuple[list[StackLayer], QuantRefs]:  # fmt: skip
    """The layers with `names` quantized round-to-nearest (int8 per row; int4 in groups, fp16 scales) and
    packed for quant.h, with each one's reference (the kernel's math in float64)."""
    refs: QuantRefs = {}

    def quantize(w: torch.Tensor) -> QuantWeight:
        n, k = w.shape
        if bits == 8:
            s = w.abs().amax(dim=1) / 127
            q = torch.clamp(torch.round(w / s[:, None]), -127, 127).to(torch.int8)
            packed = pack_int8(q, s)
            refs[id(packed)] = lambda x, b: qref.int8_dynamic_matmul(x, q, s, b)
            return packed
        s = (w.view(n, k // group, group).abs().amax(-1) / 7).half().float()
        q4 = qref.pack_int4(torch.clamp(torch.round(w / s.repeat_interleave(group, dim=1)), -8, 7))
        packed = pack_int4(q4, s, group)
        refs[id(packed)] = lambda x, b: qref.int4_dynamic_matmul(x, q4, s, group, b)
        return packed

    out = [StackLayer(**{n: quantize(t) if n in names else t for n, t in vars(layer).items()}) for layer in layers]
    return out, refs


@pytest.mark.parametrize(("bits", "group"), [(8, 0), (4, 32), (4, 64)])
@pytest.mark.parametrize(
    ("hidden", "heads", "kv_heads", "head_dim", "inter", "lens", "bias", "qk_norm"),
    [
        (64, 4, 2, 16, 128, [1, 17, 40], True, True),  # the engine tests' shape, qkv bias, q/k norms
        (256, 8, 4, 32, 768, [1 + (5 * i) % 90 for i in range(16)], False, False),  # the reference model's
        (192, 4, 2, 32, 320, [1 + (7 * i) % 50 for i in range(40)], True, False),  # 40 rows: one thread; tails
    ],
)
def test_quantized_matrices_match_the_layers_op_by_op(native, bits, group, hidden, heads, kv_heads, head_dim, inter,
                                                      lens, bias, qk_norm) -> None:  # fmt: skip
    """int8 and int4 matrices (QuantWeight) multiply in integers on rows quantized per block: the op-by-op
    path over the kernel's reference, K/V stores included."""
    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = _case(
        hidden, heads, kv_heads, head_dim, inter, 16, lens, bias, qk_norm
    )
    layers, refs = _quantized(layers, bits, group)
    ref_layers = _copy_caches(layers)
    want = _reference(shape, ref_layers, final_norm, cos_sin, x, positions, slots, tables, cl, refs)
    stack = native.bind(shape, layers, final_norm, cos_sin)
    assert stack.max_rows == 4096  # every matrix quantized: any row count
    _assert_close_but_flips(stack(x, positions, slots, tables, cl), want)
    for mine, theirs in zip(layers, ref_layers, strict=True):
        _assert_close_but_flips(mine.k_cache, theirs.k_cache)
        _assert_close_but_flips(mine.v_cache, theirs.v_cache)


def test_quantized_rows_give_the_same_floats_on_any_threads_and_batch(native) -> None:
    """A quantized matrix's output depends on its own row only: the same floats on 1, 2 or 3 threads
    (their slices cut at 64-row tiles) and whichever rows share the step; some matrices quantized, the
    others fp32 packed copies."""
    lens = [37, 5, 90, 12, 64, 3, 18, 44, 7, 29, 51, 2, 8]
    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = _case(256, 4, 2, 32, 320, 16, lens, True)
    layers, refs = _quantized(layers, 4, 32, names=("qkv", "down"))
    want = _reference(shape, _copy_caches(layers), final_norm, cos_sin, x, positions, slots, tables, cl, refs)
    outs = _on_1_2_3_threads(native, shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl)
    _assert_close_but_flips(outs[0], want)
    assert all(torch.equal(out, outs[0]) for out in outs[1:])
    stack = native.bind(shape, _copy_caches(layers), final_norm, cos_sin, packed=True)
    assert torch.equal(stack(x[:1], positions[:1], slots[:1], tables[:1], cl[:1]), outs[0][:1])
    with pytest.raises(ValueError, match="layer 0 qkv"):  # a QuantWeight of the wrong shape
        native.bind(shape, [StackLayer(**{**vars(layers[0]), "qkv": layers[0].down})], final_norm, cos_sin)


@pytest.mark.parametrize(("bits", "group"), [(8, 0), (4, 32), (4, 64)])
@pytest.mark.parametrize("rows", [1, 13, 40])  # one row; a team; past gemv_rows (one thread)
def test_quantized_head_gives_its_kernels_logits_in_the_call(native, bits, group, rows) -> None:
    """A quantized lm_head bound to the stack multiplies the final-normed rows in the same call: the
    floats of the head's one-Linear kernel (NativeQuantMatmul) on the stack's hidden states, on 1, 2 or
    3 threads (the vocab, not a multiple of the 64-row tile, split between them), and within the
    flips' bound of the op-by-op reference."""
    lens = [1 + (7 * i) % 50 for i in range(rows)]
    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = _case(192, 4, 2, 32, 320, 16, lens, True)
    vocab = 300
    head_f = randn(vocab, shape.hidden, scale=0.5 / shape.hidden**0.5)
    (head_layer,), head_refs = _quantized([StackLayer(**{**vars(layers[0]), "qkv": head_f})], bits, group,
                                          names=("qkv",))  # fmt: skip
    head, head_bias = head_layer.qkv, randn(vocab, scale=0.1)
    layers, refs = _quantized(layers, bits, group)
    hidden = _reference(shape, _copy_caches(layers), final_norm, cos_sin, x, positions, slots, tables, cl, refs)
    want = head_refs[id(head)](hidden, head_bias)
    outs = []
    for threads in (1, 2, 3):
        with torch_threads(threads):
            stack = native.bind(shape, _copy_caches(layers), final_norm, cos_sin, head=head, head_bias=head_bias)
            assert stack.vocab == vocab
            outs.append(stack.logits(x, positions, slots, tables, cl))
            normed = native.bind(shape, _copy_caches(layers), final_norm, cos_sin)(x, positions, slots, tables, cl)
            assert torch.equal(outs[-1], NativeQuantMatmul()(normed, head, head_bias))
    assert all(torch.equal(out, outs[0]) for out in outs[1:])
    _assert_close_but_flips(outs[0], head_refs[id(head)](normed, head_bias))  # the head on the stack's rows
    # end to end: a hidden value moved by an upstream flip (up to ~2e-3) moves the logits of its row by
    # that times a head weight (|w| ~0.04 here, at most ~0.2) over the few flipped values, and may flip the head's own
    # rounding of that row: ~1e-2 at most, against logits of ~1
    assert_close(outs[0], want, atol=2e-2, rtol=1e-3)
    with pytest.raises(ValueError, match="no lm_head"):
        native.bind(shape, _copy_caches(layers), final_norm, cos_sin).logits(x, positions, slots, tables, cl)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows", [1, 13, 40])
def test_packed_head_gives_the_packed_products_logits_in_the_call(native, dtype, rows) -> None:
    """An fp32 lm_head bound as its packed copy (pack_rows, fp32 or fp16 whatever the layers are)
    multiplies the final-normed rows in the same call: NativeGemv.packed's floats on the stack's
    hidden states, on 1, 2 or 3 threads (a vocab of 300 cut between them, tiles split)."""
    lens = [1 + (7 * i) % 50 for i in range(rows)]
    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = _case(72, 4, 2, 16, 40, 4, lens, True, True)
    vocab, width = 300, native.pack_width
    weight = randn(vocab, shape.hidden, scale=0.5 / shape.hidden**0.5)
    head = pack_rows(weight.half() if dtype == torch.float16 else weight, width)
    outs = []
    for threads in (1, 2, 3):
        with torch_threads(threads):
            stack = native.bind(shape, _copy_caches(layers), final_norm, cos_sin, packed=True, head=head,
                                head_rows=vocab)  # fmt: skip
            outs.append(stack.logits(x, positions, slots, tables, cl))
            normed = native.bind(shape, _copy_caches(layers), final_norm, cos_sin, packed=True)(
                x, positions, slots, tables, cl)  # fmt: skip
            assert torch.equal(outs[-1], NativeGemv().packed(normed, head, vocab))
    assert all(torch.equal(out, outs[0]) for out in outs[1:])
    assert_close(outs[0], F.linear(normed, head.transpose(1, 2).reshape(-1, shape.hidden)[:vocab].float()),
                 atol=1e-4, rtol=1e-4)  # fmt: skip
    with pytest.raises(ValueError, match="head must be"):  # a copy packed at another width
        native.bind(shape, _copy_caches(layers), final_norm, cos_sin, head=pack_rows(weight, width * 2), head_rows=vocab)


def _adapters(shape: StackShape, layers: list[StackLayer], num_slots: int, rank: int) -> list[dict[str, LoraFactors]]:
    """Random factors for every matrix of every layer but layer 0's o_proj (none), slot by slot: slot 1
    wraps no q slice and only the gate of gate_up (scaling 0: zero factors), slot 2 at rank 3 of R."""
    sizes = {"qkv": layers[0].qkv.shape, "o_proj": layers[0].o_proj.shape, "gate_up": layers[0].gate_up.shape,
             "down": layers[0].down.shape}  # fmt: skip
    bounds = slice_bounds(shape)
    out = []
    for i in range(len(layers)):
        mine = {}
        for name, (n, k) in sizes.items():
            if i == 0 and name == "o_proj":
                continue
            slices = len(bounds[name]) - 1
            a = randn(num_slots, slices * rank, k, scale=1 / k**0.5)
            b = randn(num_slots, n, rank, scale=0.5 / rank**0.5)
            scaling = 0.5 + torch.rand(num_slots, slices)
            a[2].view(slices, rank, k)[:, 3:] = 0  # slot 2: rank 3, the rest padding
            b[2, :, 3:] = 0
            if name in ("qkv", "gate_up"):  # slot 1 leaves q / up alone
                unwrapped = 0 if name == "qkv" else 1
                a[1, unwrapped * rank : (unwrapped + 1) * rank] = 0
                b[1, bounds[name][unwrapped] : bounds[name][unwrapped + 1]] = 0
                scaling[1, unwrapped] = 0
            mine[name] = LoraFactors(a, b, scaling, bounds[name])
        out.append(mine)
    return out


@pytest.mark.parametrize(("packed", "rank", "lens", "lora_slots"), [
    (True, 16, [1, 17, 40, 9, 3, 25, 12, 60, 7, 33, 2], [0, 0, 0, -1, 2, 2, 1, -1, 0, 2, 2]),  # runs, scattered
    (False, 12, [1, 17, 40, 9, 3, 25, 12, 60, 7, 33, 2], [1, -1, 1, 0, 0, 2, -1, -1, 2, 0, 1]),  # GEMVs
    (True, 8, [5], [2]),  # one row
    (False, 20, [1 + (7 * i) % 50 for i in range(40)], [-1] * 3 + [1] * 10 + [0] * 12 + [-1, 2] * 7 + [0]),  # sgemm
])  # fmt: skip
def test_lora_adapters_match_the_layers_op_by_op(native, packed, rank, lens, lora_slots) -> None:
    """Each row's adapter (slot -1: none) added after each wrapped matrix in the call: the op-by-op
    path's LoRA products to fp32 rounding, K/V stores included; runs of one slot longer than a GEMV's
    rows; ranks of whole vectors and with tails; the same floats on 1, 2 and 3 threads (up to 15 rows)."""
    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = _case(72, 4, 2, 16, 40, 16, lens, True, True)
    adapters = _adapters(shape, layers, num_slots=3, rank=rank)
    row_slots = torch.tensor(lora_slots, dtype=torch.int32)
    ref_layers = _copy_caches(layers)
    want = _reference(shape, ref_layers, final_norm, cos_sin, x, positions, slots, tables, cl,
                      adapters=(adapters, row_slots))  # fmt: skip
    base = _reference(shape, _copy_caches(layers), final_norm, cos_sin, x, positions, slots, tables, cl)
    adapted = [i for i, slot in enumerate(lora_slots) if slot >= 0]
    assert (want - base)[adapted].abs().amax(dim=1).min() > 1e-2  # every adapter's rows changed
    outs = []
    for threads in (1, 2, 3) if len(lens) <= native.gemv_rows else (1,):
        mine = _copy_caches(layers) if threads > 1 else layers
        with torch_threads(threads):
            stack = native.bind(shape, mine, final_norm, cos_sin, packed=packed)
            outs.append(stack(x, positions, slots, tables, cl, lora=bind_lora(stack, adapters), lora_slots=row_slots))
    assert_close(outs[0], want, atol=2e-4, rtol=1e-4)
    assert all(torch.equal(out, outs[0]) for out in outs[1:])
    for mine, theirs in zip(layers, ref_layers, strict=True):
        assert_close(mine.k_cache, theirs.k_cache, atol=2e-4, rtol=1e-4)
        assert_close(mine.v_cache, theirs.v_cache, atol=2e-4, rtol=1e-4)
    plain = [i for i, slot in enumerate(lora_slots) if slot < 0]
    assert_close(outs[0][plain], base[plain], atol=2e-4, rtol=1e-4)  # rows without an adapter: the base's


def test_lora_refuses_slots_and_factors_it_does_not_fit(native) -> None:
    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = _case(64, 4, 2, 16, 128, 16, [3, 9])
    stack = native.bind(shape, layers, final_norm, cos_sin, packed=True)
    adapters = _adapters(shape, layers, num_slots=3, rank=4)
    lora = bind_lora(stack, adapters)
    with pytest.raises(IndexError):
        stack(x, positions, slots, tables, cl, lora=lora, lora_slots=torch.tensor([0, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="int32"):
        stack(x, positions, slots, tables, cl, lora=lora, lora_slots=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="layers"):
        bind_lora(stack, adapters[:1])
    f = adapters[1]["down"]
    adapters[1]["down"] = LoraFactors(f.a[:, :2].contiguous(), f.b, f.scaling, f.bounds)
    with pytest.raises(ValueError, match="layer 1 down"):
        bind_lora(stack, adapters)
