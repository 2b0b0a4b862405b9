"""1-bit sign compression as a DDP comm hook, with error feedback and one scale per gradient tensor.

gloo has no 1-bit type, so the signs travel packed 8 per byte in uint8 and are all_gathered (a sum of
signs cannot be all_reduced in packed form); each rank then averages the decoded gradients.
"""

import torch
import torch.distributed as dist

__all__ = ["SignState", "pack_signs", "sign_hook", "unpack_signs"]

_SHIFTS = torch.arange(7, -1, -1, dtype=torch.uint8)


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """Signs of a flat tensor as bits, 8 per uint8 (bit set: x >= 0), zero-padded to a whole byte."""
    bits = (x >= 0).to(torch.uint8)
    pad = (-bits.numel()) % 8
    if pad:
        bits = torch.cat([bits, bits.new_zeros(pad)])
    return (bits.view(-1, 8) << _SHIFTS.to(bits.device)).sum(dim=1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of ``pack_signs``: +1/-1 float32 of length ``n`` (leading dims kept)."""
    bits = (packed.unsqueeze(-1) >> _SHIFTS.to(packed.device)) & 1
    return bits.flatten(-2)[..., :n].float() * 2 - 1


class SignState:
    """Error-feedback memory per bucket (what compression dropped, added back next step)."""

    def __init__(self, process_group: dist.ProcessGroup | None = None) -> None:
        self.process_group = process_group
        self.errors: dict[int, torch.Tensor] = {}


def sign_hook(state: SignState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket's gradients from 1 bit per element plus a float32 scale (mean |g|) per tensor."""
    group = state.process_group
    world = dist.get_world_size(group)
    flat = bucket.buffer()
    sizes = [p.numel() for p in bucket.parameters()]
    if sum(sizes) != flat.numel():  # unexpected layout: one scale for the whole bucket
        sizes = [flat.numel()]
    err = state.errors.get(bucket.index())
    if err is None or err.shape != flat.shape:  # buckets are rebuilt after the first step
        err = torch.zeros_like(flat, dtype=torch.float32)
    corrected = flat.float() + err
    segments = corrected.split(sizes)
    scales = torch.stack([s.abs().mean() for s in segments])
    packed = pack_signs(corrected)
    repeats = torch.tensor(sizes, device=flat.device)
    local = unpack_signs(packed, flat.numel()) * torch.repeat_interleave(scales, repeats)
    state.errors[bucket.index()] = corrected - local

    all_packed = packed.new_empty(world * packed.numel())
    all_scales = scales.new_empty(world * scales.numel())
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(all_packed, packed, group=group)
    gather(all_scales, scales, group=group)
    signs = unpack_signs(all_packed.view(world, -1), flat.numel())
    per_elem = torch.repeat_interleave(all_scales.view(world, -1), repeats, dim=1)
    flat.copy_((signs * per_elem).mean(dim=0).to(flat.dtype))
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(flat)
    return fut
