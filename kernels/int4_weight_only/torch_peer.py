"""torch's own int4 weight-only GEMM (the "tinygemm" layout behind ``_weight_int4pack_mm``) as a peer.

A user who wants 4-bit weights without writing a kernel calls this op, so the Triton GEMM has to beat
it. The op wants the weight repacked into its tiled layout and one (scale, zero) pair per group in the
activations' dtype, with the zero point in the float domain: ``w = (q - 8) * scale + zero``. Our
``(q - zp) * scale`` is the same weight with ``zero = (8 - zp) * scale``, so the peer computes the same
product from the same 4-bit values. The repacking happens once, in the plugin's ``inputs``, outside the
timed call. CUDA needs bfloat16 activations, N a multiple of 8 and K of 128 (8 inner K tiles); the CPU
op takes float32/16 too, with N a multiple of 16.
"""

from __future__ import annotations

import torch

from .reference import Int4Weight, unpack

#: The op's inner K tiles: 8 is the layout torch's own int4 users (gpt-fast, torchao) pick on CUDA.
INNER_K_TILES = 8
_GROUPS = (32, 64, 128, 256)


def _ops() -> tuple[object, object] | None:
    """(convert, matmul) for CUDA; None where this build of torch lacks the op."""
    aten = torch.ops.aten
    if hasattr(aten, "_weight_int4pack_mm") and hasattr(aten, "_convert_weight_to_int4pack"):
        return aten._convert_weight_to_int4pack, aten._weight_int4pack_mm
    return None


def _cpu_ops() -> tuple[object, object] | None:
    aten = torch.ops.aten
    if hasattr(aten, "_weight_int4pack_mm_for_cpu") and hasattr(aten, "_convert_weight_to_int4pack_for_cpu"):
        return aten._convert_weight_to_int4pack_for_cpu, aten._weight_int4pack_mm_for_cpu
    return None


def unsupported(n: int, k: int, group: int, dtype: torch.dtype, device: str) -> str | None:
    """Why torch's int4 op cannot run this case here, or None where it can."""
    kind = torch.device(device).type
    if kind == "cuda":
        if _ops() is None:
            return f"this torch ({torch.__version__}) has no aten._weight_int4pack_mm"
        if torch.version.hip is not None or torch.cuda.get_device_capability() < (8, 0):
            return "torch's int4 GEMM needs an NVIDIA GPU of compute capability 8.0 or newer"
        if dtype != torch.bfloat16:
            return "torch's CUDA int4 GEMM takes bfloat16 activations only"
        n_multiple, k_multiple = 8, INNER_K_TILES * 16
    elif kind == "cpu":
        if _cpu_ops() is None:
            return f"this torch ({torch.__version__}) has no aten._weight_int4pack_mm_for_cpu"
        n_multiple, k_multiple = 16, 2
    else:
        return f"torch's int4 GEMM has no {kind} kernel"
    if group not in _GROUPS:
        return f"torch's int4 GEMM takes groups of {', '.join(map(str, _GROUPS))}, not {group}"
    if n % n_multiple or k % k_multiple or k % group:
        return (f"torch's int4 GEMM on {kind} needs N a multiple of {n_multiple} and K of {k_multiple} and of the "
                f"group (N={n}, K={k}, group={group})")
    return None


def pack(weight: Int4Weight, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight in the op's tiled layout and its (scale, float zero) pairs, shape (K / group, N, 2)."""
    q = unpack(weight)[:, : weight.k]
    if weight.packed.device.type == "cpu":
        convert, _ = _cpu_ops()
        packed = convert(q.to(torch.int32).contiguous(), INNER_K_TILES)
    else:
        convert, _ = _ops()
        packed = convert(((q[:, 0::2] << 4) | q[:, 1::2]).contiguous(), INNER_K_TILES)  # column 2j high
    zero = (8.0 - weight.zero) * weight.scale
    scale_zero = torch.stack((weight.scale, zero), dim=-1).transpose(0, 1).contiguous().to(dtype)
    return packed, scale_zero


def int4pack_linear(x: torch.Tensor, packed: torch.Tensor, scale_zero: torch.Tensor, group: int,
                    bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W^T + bias`` through torch's int4 op, over a weight repacked by ``pack``."""
    _, matmul = _cpu_ops() if x.device.type == "cpu" else _ops()
    out = matmul(x.reshape(-1, x.shape[-1]).contiguous(), packed, group, scale_zero)
    out = out.reshape(*x.shape[:-1], -1)
    return out + bias if bias is not None else out
