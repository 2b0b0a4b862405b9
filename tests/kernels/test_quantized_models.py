"""Model level of the compression rooms: every Linear of the embedded model swapped for its int8 or 4-bit
form, loading the float model's trained weights the way an inference-only arm does.

Kernels run through the Triton interpreter on CPU (compiled on a GPU host), so the model stays tiny.
"""

from __future__ import annotations

import pytest
import torch
from microscope_kernels.int4_weight_only.model_linear import int4_linears
from microscope_kernels.int8_linear.model_linear import (
    AffineInt8Linear,
    DynamicInt8Linear,
    use_affine_int8,
    use_dynamic_int8,
)
from torch import nn

from microscope.model_measures import weight_bytes
from microscope.workloads import ConvertedLinear, ModelConfig, build_model

SMALL = ModelConfig(n_layers=2, d_model=64, n_heads=2, context=32)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
#: patch -> (norm-relative logit error it may cost on a random-init model, weight bytes vs float32 at most)
PATCHES = {
    "int8_dynamic": (use_dynamic_int8, 0.03, 0.45),
    "int8_per_tensor": (use_affine_int8, 0.15, 0.45),
    "int4_g32": (int4_linears(32), 0.25, 0.45),
    "int4_g128": (int4_linears(128), 0.25, 0.45),
}


def _tokens(seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


@pytest.mark.parametrize("name", PATCHES)
def test_quantized_model_takes_the_float_weights_and_stays_close(name, seed):
    patch, budget, bytes_ratio = PATCHES[name]
    trained = build_model(SMALL, seed=seed % 1000 + 1, device=DEVICE)  # stands in for the trained baseline
    model = build_model(SMALL, seed=seed % 1000, device=DEVICE)
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())  # every projection and the output head
    patch(model)
    swapped = [m for m in model.modules() if isinstance(m, ConvertedLinear)]
    assert len(swapped) == linears >= SMALL.n_layers * 4 + 1
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    tokens = _tokens(seed)
    with torch.no_grad():
        model(tokens)  # a call before the load: what a module keeps from it must follow the loaded weights
    model.load_state_dict(trained.state_dict())  # strict: the float weight keys are taken and converted
    with torch.no_grad():
        want, got = trained(tokens).double(), model(tokens).double()
    rel = float((got - want).norm() / want.norm())
    assert rel <= budget, rel
    assert rel > 0  # the weights really are quantized
    # the weights' size: int8 or packed 4-bit values instead of float32, embeddings and norms unchanged
    linear_bytes = sum(m.weight.numel() * 4 for m in trained.modules() if isinstance(m, nn.Linear))
    saved = weight_bytes(trained) - weight_bytes(model)
    assert saved >= (1 - bytes_ratio) * linear_bytes, (saved, linear_bytes)


def test_loading_refuses_a_state_dict_of_another_shape():
    model = build_model(SMALL, seed=0, device=DEVICE)
    use_dynamic_int8(model)
    wider = build_model(ModelConfig(n_layers=2, d_model=128, n_heads=2, context=32), seed=0, device=DEVICE)
    with pytest.raises(RuntimeError, match=r"size mismatch for blocks\.0\.attn\.qkv\.weight"):
        model.load_state_dict(wider.state_dict())
    state = build_model(SMALL, seed=0, device=DEVICE).state_dict()
    del state["lm_head.weight"]
    with pytest.raises(RuntimeError, match=r"Missing key.*lm_head\.weight"):
        model.load_state_dict(state)


def test_quantized_linears_follow_autocast_like_nn_linear():
    linear = nn.Linear(40, 24, bias=True).to(DEVICE)
    for module in (DynamicInt8Linear(linear), AffineInt8Linear(linear)):
        x = torch.randn(3, 40, device=DEVICE)
        assert module(x).dtype == torch.float32
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            assert module(x).dtype == torch.bfloat16
        assert torch.allclose(module(x), linear(x), rtol=0.05, atol=0.05)


def _float_inputs(model: nn.Module, batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each Linear's input rows over the batches, as the float model sees them."""
    seen: dict[str, list[torch.Tensor]] = {}
    hooks = [m.register_forward_pre_hook(lambda _m, args, name=name: seen.setdefault(name, []).append(
        args[0].detach().reshape(-1, args[0].shape[-1]).double())) for name, m in model.named_modules()
        if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for tokens in batches:
            model(tokens)
    for h in hooks:
        h.remove()
    return {name: torch.cat(rows) for name, rows in seen.items()}


def test_gptq_calibration_swaps_every_linear_and_beats_rounding_on_the_layers_objective(seed):
    """GPTQ minimizes each layer's output error on its calibration inputs; round-to-nearest ignores them."""
    from microscope_kernels.int4_weight_only.model_linear import Int4Linear, gptq_calibration
    from microscope_kernels.int4_weight_only.reference import Int4Weight, dequantize

    trained = build_model(SMALL, seed=seed % 1000 + 1, device=DEVICE)
    batches = [_tokens(seed + i) for i in range(4)]
    rtn, gptq = (build_model(SMALL, seed=seed % 1000, device=DEVICE) for _ in range(2))
    int4_linears(32)(rtn)
    rtn.load_state_dict(trained.state_dict())
    gptq.load_state_dict(trained.state_dict())
    gptq_calibration(32)(gptq, batches)
    assert not any(isinstance(m, nn.Linear) for m in gptq.modules())
    inputs = _float_inputs(trained, batches)
    float_weights = {name: m.weight.detach().double() for name, m in trained.named_modules()
                     if isinstance(m, nn.Linear)}

    def objective(model: nn.Module) -> float:
        total = 0.0
        for name, m in model.named_modules():
            if isinstance(m, Int4Linear):
                w4 = dequantize(Int4Weight(m.packed, m.scale, m.zero, m.in_features, m.group), torch.float64)
                total += float((inputs[name] @ (float_weights[name] - w4).t()).pow(2).sum())
        return total

    assert objective(gptq) < objective(rtn)
    tokens = _tokens(seed + 99)
    with torch.no_grad():
        want, got = trained(tokens).double(), gptq(tokens).double()
    assert 0 < float((got - want).norm() / want.norm()) <= 0.25
