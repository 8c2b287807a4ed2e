"""The elementwise layers on the CPU: the C kernels (kernels/cpu/elementwise.c) against the torch
references they replace, at one prefill chunk of the benchmark model (2,048 tokens, hidden 512,
MLP 1,536, 8 query / 4 KV heads of 64; fp32, one thread).

    .venv/bin/python bench/cpu_elementwise.py       # ~20 seconds

CPU ms per call, median of 7 rounds of 20 calls; the layer's matmuls for scale (qkv, o, gate_up and
down projections of the same chunk).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from kernels import reference
from kernels.cpu.elementwise import NativeElementwise
from worker.engine.models.rotary import cos_sin_cache

T, H, INTER, HQ, HKV, D = 2048, 512, 1536, 8, 4, 64


def cpu_ms(fn, calls: int = 20, rounds: int = 7) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        times.append((time.process_time() - t0) / calls)
    return statistics.median(times) * 1e3


def main() -> None:
    torch.set_num_threads(1)
    native = NativeElementwise()
    x, residual, weight = torch.randn(T, H), torch.randn(T, H), torch.randn(H)
    gate_up = torch.randn(T, 2 * INTER)
    qkv = torch.randn(T, (HQ + 2 * HKV) * D)
    q, k = qkv[:, : HQ * D].view(T, HQ, D), qkv[:, HQ * D : (HQ + HKV) * D].view(T, HKV, D)
    positions, cos_sin = torch.randint(0, 4096, (T,)), cos_sin_cache(D, 4096, 10000.0, None)
    cases = [
        ("rms_norm + residual", lambda: reference.rms_norm(x, weight, 1e-6, residual),
         lambda: native.rms_norm(x, weight, 1e-6, residual)),
        ("silu_mul", lambda: reference.silu_mul(gate_up), lambda: native.silu_mul(gate_up)),
        ("apply_rotary", lambda: reference.apply_rotary(q, k, positions, cos_sin),
         lambda: native.apply_rotary(q, k, positions, cos_sin)),
    ]  # fmt: skip
    print(f"torch {torch.__version__}, 1 thread; {T} tokens\n")
    print(f"{'op':<20} {'torch ms':>9} {'C ms':>7} {'ratio':>6}")
    total_ref = total_c = 0.0
    for name, ref, c in cases:
        t_ref, t_c = cpu_ms(ref), cpu_ms(c)
        total_ref += t_ref * (2 if name.startswith("rms") else 1)  # two norms per layer
        total_c += t_c * (2 if name.startswith("rms") else 1)
        print(f"{name:<20} {t_ref:>9.2f} {t_c:>7.2f} {t_ref / t_c:>5.1f}x")
    # the engine's layers run rotary fused with the K/V store: against the C rotary + torch store
    v = qkv[:, (HQ + HKV) * D :].view(T, HKV, D)
    k_cache, v_cache = torch.zeros(T // 16 + 8, 16, HKV, D), torch.zeros(T // 16 + 8, 16, HKV, D)
    slots = torch.randperm(k_cache.shape[0] * 16)[:T]
    for tokens in (T, 64):
        args = (q[:tokens], k[:tokens], v[:tokens], positions[:tokens], slots[:tokens])
        t_two = cpu_ms(lambda a=args: (native.apply_rotary(a[0], a[1], a[3], cos_sin),
                                       reference.store_kv_cache(a[1], a[2], k_cache, v_cache, a[4])))  # fmt: skip
        t_one = cpu_ms(lambda a=args: native.rotary_store(a[0], a[1], a[2], a[3], cos_sin, k_cache, v_cache, a[4]))
        print(f"rotary + K/V store, {tokens} tokens: C rotary then torch store {t_two:.3f} ms, fused C "
              f"{t_one:.3f} ms ({t_two / t_one:.1f}x)")
    weights = [torch.randn(n, kk) for n, kk in (((HQ + 2 * HKV) * D, H), (H, HQ * D), (2 * INTER, H), (H, INTER))]
    inputs = [x, torch.randn(T, HQ * D), x, torch.randn(T, INTER)]
    t_mm = sum(cpu_ms(lambda a=a, w=w: F.linear(a, w), calls=3, rounds=3) for a, w in zip(inputs, weights, strict=True))
    print(f"\nper layer (2 norms, silu_mul, rotary): torch {total_ref:.1f} ms, C {total_c:.1f} ms; "
          f"the layer's matmuls {t_mm:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
