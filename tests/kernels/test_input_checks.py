"""What the row and Linear-shaped kernels refuse (``input_checks.py``): inputs of a dtype they would compute
in another precision or truncate, and a bias of the wrong shape or device, which was read past its end; a
strided bias gives the output of its contiguous copy. CPU through the interpreter; GPU compiled."""

from __future__ import annotations

import pytest
import torch
from microscope_kernels.binarize_ste.kernel import binary_linear_triton
from microscope_kernels.fused_layernorm_gelu import layernorm_gelu
from microscope_kernels.int4_weight_only.kernel import int4_linear
from microscope_kernels.int4_weight_only.reference import quantize_int4
from microscope_kernels.int8_linear.kernel import int8_linear
from microscope_kernels.int8_linear.reference import quantize_per_channel
from microscope_kernels.magnitude_sparsity.kernel import block_index, block_sparse_linear
from microscope_kernels.safe_softmax.kernel import safe_softmax

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N, K = 40, 128


def _int8(weight):
    w_q, w_scale = quantize_per_channel(weight)
    return lambda x, bias: int8_linear(x, w_q, w_scale, bias)


def _int4(weight):
    w4 = quantize_int4(weight, 32)
    return lambda x, bias: int4_linear(x, w4, bias)


def _binary(weight):
    return lambda x, bias: binary_linear_triton(x, weight, bias)


def _block_sparse(weight):
    index, count = block_index(weight)
    return lambda x, bias: block_sparse_linear(x, weight, index, count, bias)


KERNELS = {"int8": _int8, "int4": _int4, "binary": _binary, "block_sparse": _block_sparse}


@pytest.mark.parametrize("rows", [3, 80], ids=["decode rows", "prefill rows"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_strided_bias_gives_the_output_of_its_contiguous_copy(kernel, rows, seed):
    gen = torch.Generator().manual_seed(seed)
    linear = KERNELS[kernel](torch.randn(N, K, generator=gen).to(DEVICE))
    x = torch.randn(rows, K, generator=gen).to(DEVICE)
    strided = torch.randn(2 * N, generator=gen).to(DEVICE)[::2]
    assert not strided.is_contiguous()
    assert torch.equal(linear(x, strided), linear(x, strided.contiguous()))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(("shape", "device", "message"), [
    ((N - 1,), DEVICE, f"bias must have shape ({N},)"),
    ((N + 8,), DEVICE, f"bias must have shape ({N},)"),
    ((N, 1), DEVICE, f"bias must have shape ({N},)"),
    ((N,), "meta", "bias is on meta"),
], ids=["short", "long", "2-D", "another device"])
def test_a_bias_of_the_wrong_shape_or_device_is_refused(kernel, shape, device, message, seed):
    gen = torch.Generator().manual_seed(seed)
    linear = KERNELS[kernel](torch.randn(N, K, generator=gen).to(DEVICE))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        linear(torch.randn(3, K, generator=gen).to(DEVICE), torch.zeros(shape, device=device))


ROW_KERNELS = {
    "safe_softmax": safe_softmax,
    "layernorm_gelu": lambda x: layernorm_gelu(x, torch.ones(K, device=DEVICE), torch.zeros(K, device=DEVICE)),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32], ids=str)
@pytest.mark.parametrize("kernel", [*KERNELS, *ROW_KERNELS])
def test_inputs_of_a_dtype_the_kernels_do_not_compute_in_are_refused(kernel, dtype, seed):
    """The kernels compute in float32 from fp32/fp16/bf16: float64 would come back with float32's precision,
    integers as truncated results."""
    gen = torch.Generator().manual_seed(seed)
    if kernel in KERNELS:
        linear = KERNELS[kernel](torch.randn(N, K, generator=gen).to(DEVICE))
        call = lambda x: linear(x, None)  # noqa: E731
    else:
        call = ROW_KERNELS[kernel]
    x = (torch.randn(3, K, generator=gen) * 4).to(DEVICE, dtype)
    with pytest.raises(ValueError, match=f"takes float32, float16 or bfloat16 input, got {dtype}"):
        call(x)


def test_softmax_of_rows_without_columns_is_empty_and_of_a_scalar_is_refused():
    x = torch.randn(3, 0, device=DEVICE)
    assert safe_softmax(x).shape == (3, 0) == torch.softmax(x, -1).shape
    with pytest.raises(ValueError, match="at least one dimension"):
        safe_softmax(torch.tensor(1.0, device=DEVICE))
