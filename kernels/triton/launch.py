"""What every Triton wrapper asks before a launch: can this kernel run on this device, and how
many SMs are there to fill.

Triton reads TRITON_INTERPRET when a kernel is decorated (at import), not at launch: a module
imported with TRITON_INTERPRET=1 holds interpreted kernels that run on CPU tensors (for tests),
otherwise compiled kernels that need CUDA tensors.
"""

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

# Stand-in SM count for the interpreter, so split heuristics still produce several splits.
_INTERPRETER_SMS = 4


def is_interpreted(kernel: object) -> bool:
    """True when `kernel` was decorated under TRITON_INTERPRET=1 (runs on CPU tensors)."""
    return isinstance(kernel, InterpretedFunction)


def check_launchable(kernel: object, device: torch.device) -> None:
    """Raise ValueError when `kernel` cannot run on tensors of `device`."""
    if is_interpreted(kernel):
        if device.type != "cpu":
            raise ValueError(
                f"Triton kernels were imported in interpreter mode (TRITON_INTERPRET=1) and need CPU "
                f"tensors, got {device}; unset TRITON_INTERPRET before importing kernels.triton"
            )
        return
    if device.type != "cuda":
        raise ValueError(
            f"Triton kernels need CUDA tensors, got {device}; use the torch reference in "
            f"kernels.reference on this device (or set TRITON_INTERPRET=1 before importing "
            f"kernels.triton to run them in Triton's CPU interpreter)"
        )


def dot_upcast(kernel: object, dtype: torch.dtype) -> bool:
    """Whether `kernel` must feed tl.dot fp32 instead of `dtype`: Triton 3.9's interpreter stores
    bf16 as uint16 and multiplies the bit patterns, so interpreted bf16 dots go through fp32.
    Always False for compiled kernels (the GPU path keeps bf16 tensor-core dots)."""
    return is_interpreted(kernel) and dtype == torch.bfloat16


@triton.jit
def dot(a, b, acc, UPCAST: tl.constexpr):
    """acc + a @ b with fp32 accumulation; UPCAST (interpreter + bf16 only) multiplies in fp32.
    fp32 inputs multiply in full fp32 ("ieee"), not TF32: an fp32 model on CUDA keeps fp32 logits."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    if a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors on `device` (a small stand-in on the CPU interpreter)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _INTERPRETER_SMS
