"""axial_attention: the grid reshapes, the operator against full attention where they must agree, the
flash_attn-backed candidate (forward and gradients) against float64 eager axial attention, the peers and
the plugin.

Kernels run through the Triton interpreter on CPU (compiled on a GPU host). Errors are judged against the
error eager axial attention itself makes in the same dtype (``rel_err(kernel) <= 4 * rel_err(eager) + floor``).
Every test draws from the printed ``seed`` fixture; rerun one with ``MICROSCOPE_TEST_SEED=<seed>``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from attention_checks import DEVICE, DTYPES, error_limit
from attention_checks import fwd_bwd as _fwd_bwd
from attention_checks import rel_err as _rel
from microscope_kernels.axial_attention.ablation import AxialAttention
from microscope_kernels.axial_attention.grid import axial, from_cols, from_rows, to_cols, to_rows
from microscope_kernels.axial_attention.kernel import axial_attention
from microscope_kernels.axial_attention.peers import flash_full, sdpa_axial, sdpa_full
from microscope_kernels.axial_attention.reference import (
    axial_attention_reference,
    eager_attention,
    full_attention_reference,
)

from microscope.api import Case


def _draw(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, n: int = 4) -> list[torch.Tensor]:
    return [torch.randn(shape, generator=gen, dtype=torch.float64).to(DEVICE, dtype) for _ in range(n)]


# -- the layout -----------------------------------------------------------------------------------------------


def test_reshapes_round_trip_and_group_rows_and_columns(seed):
    gen = torch.Generator().manual_seed(seed)
    rows, cols = 5, 7
    x = torch.randn(2, 3, rows * cols, 4, generator=gen)
    r, c = to_rows(x, rows, cols), to_cols(x, rows, cols)
    assert r.shape == (2, 3 * rows, cols, 4) and c.shape == (2, 3 * cols, rows, 4)
    assert torch.equal(from_rows(r, 3), x) and torch.equal(from_cols(c, 3, rows, cols), x)
    h, i, j = 2, 3, 6  # head 2, grid row 3, grid column 6: token 3 * 7 + 6
    assert torch.equal(r[1, h * rows + i, j], x[1, h, i * cols + j])
    assert torch.equal(c[1, h * cols + j, i], x[1, h, i * cols + j])
    with pytest.raises(ValueError, match="a 5 x 6 grid holds 30 tokens, but the sequence has 35"):
        axial(eager_attention, x, x, x, 5, 6, False)
    with pytest.raises(ValueError, match="rows must be a positive integer"):
        axial(eager_attention, x, x, x, 0, 35, False)


# -- axial against full attention -------------------------------------------------------------------------------


def test_equals_full_attention_when_scores_separate_over_rows_and_columns(seed):
    """q = [a_row ; b_col] and k = [a'_row ; b'_col]: every score is a row term plus a column term, so full
    softmax attention factors into a row softmax times a column softmax, which is what the two passes apply."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols, half = 6, 9, 16

    def separable() -> torch.Tensor:
        a = torch.randn(1, 2, rows, 1, half, generator=gen, dtype=torch.float64).expand(-1, -1, -1, cols, -1)
        b = torch.randn(1, 2, 1, cols, half, generator=gen, dtype=torch.float64).expand(-1, -1, rows, -1, -1)
        return torch.cat((a, b), dim=-1).reshape(1, 2, rows * cols, 2 * half)

    q, k = separable(), separable()
    v = torch.randn(1, 2, rows * cols, 2 * half, generator=gen, dtype=torch.float64)
    full = full_attention_reference(q, k, v)
    torch.testing.assert_close(axial_attention_reference(q, k, v, rows, cols), full)
    torch.testing.assert_close(axial_attention(q.float(), k.float(), v.float(), rows, cols).double(), full,
                               rtol=1e-4, atol=1e-5)
    generic = torch.randn(1, 2, rows * cols, 2 * half, generator=gen, dtype=torch.float64)
    assert _rel(axial_attention_reference(generic, k, v, rows, cols), full_attention_reference(generic, k, v)) > 0.05


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_one_row_is_full_attention(seed, causal):
    """A 1 x S grid: the row pass is full attention over the sequence, the column pass (length 1) the identity."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, _ = _draw(gen, (1, 2, 37, 32), torch.float32)
    full = full_attention_reference(q.double(), k.double(), v.double(), causal=causal)
    torch.testing.assert_close(axial_attention_reference(q.double(), k.double(), v.double(), 1, 37, causal), full)
    torch.testing.assert_close(axial_attention(q, k, v, 1, 37, causal).double(), full, rtol=1e-4, atol=1e-5)


def test_causal_axial_sees_only_tokens_up_and_left(seed):
    """Changing token (r, c) changes no output at (r', c') with r' < r or c' < c (it is past in raster order
    for c' < c, r' = r only, and never reachable above or left), and does change (r, c) itself."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols = 5, 6
    q, k, v, _ = _draw(gen, (1, 1, rows * cols, 32), torch.float64)
    r, c = 2, 3
    k2, v2 = k.clone(), v.clone()
    k2[:, :, r * cols + c] += 1.0
    v2[:, :, r * cols + c] += 1.0
    a = axial_attention_reference(q, k, v, rows, cols, True).reshape(rows, cols, -1)
    b = axial_attention_reference(q, k2, v2, rows, cols, True).reshape(rows, cols, -1)
    changed = (a - b).abs().amax(-1) > 0
    assert not changed[:r].any() and not changed[:, :c].any() and changed[r, c]


# -- the candidate against the reference ----------------------------------------------------------------------

# (rows, cols, D, dtype, causal): grid sides that are odd or no multiple of the interpreter's 32 x 16 tiles,
# passes longer than a tile (3 x 40, 33 x 3); one head (the other tests and the plugin run two).
CASES = [
    (7, 9, 64, "fp32", False),
    (7, 9, 64, "bf16", True),
    (5, 13, 32, "fp16", True),
    (3, 40, 128, "fp32", True),
    (33, 3, 32, "bf16", False),
    (6, 6, 64, "fp16", False),
]


@pytest.mark.parametrize(("rows", "cols", "head_dim", "dtype", "causal"), CASES,
                         ids=[f"{c[0]}x{c[1]}-d{c[2]}-{c[3]}-{'causal' if c[4] else 'full'}" for c in CASES])
def test_matches_float64_reference(seed, rows, cols, head_dim, dtype, causal):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = _draw(gen, (1, 1, rows * cols, head_dim), DTYPES[dtype])
    kw = {"rows": rows, "cols": cols, "causal": causal}
    ref = _fwd_bwd(axial_attention_reference, [q.double(), k.double(), v.double()], do.double(), **kw)
    eager = _fwd_bwd(axial_attention_reference, [q, k, v], do, **kw)
    got = _fwd_bwd(axial_attention, [q, k, v], do, **kw)
    for name, g, e, r in zip(("out", "dq", "dk", "dv"), got, eager, ref):
        assert g.dtype == DTYPES[dtype] and g.shape == r.shape, f"{name}: {g.dtype} {tuple(g.shape)}"
        err, (base, limit) = _rel(g, r), error_limit(e, r, g.dtype)
        assert err <= limit, f"{name}: rel. error {err:.2e} > {limit:.2e} (eager {base:.2e})"


def test_peers(seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, _ = _draw(gen, (1, 2, 45, 32), torch.float32)
    for causal in (False, True):
        axial64 = axial_attention_reference(q.double(), k.double(), v.double(), 5, 9, causal)
        full64 = full_attention_reference(q.double(), k.double(), v.double(), causal=causal)
        assert _rel(sdpa_axial(q, k, v, 5, 9, causal), axial64) < 1e-5
        assert _rel(sdpa_full(q, k, v, 5, 9, causal), full64) < 1e-5
        assert _rel(flash_full(q, k, v, 5, 9, causal), full64) < 1e-5
    with pytest.raises(ValueError, match="grid holds"):
        sdpa_full(q, k, v, 4, 9)


# -- the plugin -----------------------------------------------------------------------------------------------


def _case(**over) -> Case:
    params = {"batch": 1, "heads": 2, "rows": 7, "cols": 9, "head_dim": 64, "causal": False, "dtype": "fp32"}
    params.update(over)
    return Case.of(**params)


def test_the_configs_load_on_every_device():
    from microscope.commands import load_checked

    path = Path(__file__).resolve().parents[2] / "ablations" / "axial_attention.yaml"
    for device in ("cpu", "cuda"):
        for quick in (False, True):
            for profile in (None, "bench"):
                config, _ = load_checked(path, device, quick, {"profile": profile} if profile else None)
                assert config.variants == ()  # every variant, the full-attention peers included


def test_one_run_times_full_attention_as_speed_only_peers(run_room):
    """The claim's comparison and the accuracy check in one run: the full-attention peers are timed, their
    accuracy skipped as speed only, while the candidate is checked against the float64 axial truth."""
    run = run_room("axial_attention", {"cases": {"causal": [True], "dtype": ["fp32"]}})
    run.check_speed_only("sdpa_full", "flash_full")
    for name in ("triton", "sdpa_axial"):
        acc = run.find(variant=name, dimension="accuracy")
        assert acc and all(r.status == "ok" and r.passed for r in acc), name
    assert any(h.startswith("triton vs the fastest") for h in run.headlines), run.headlines


def test_inputs_reject_bad_case_values_with_a_clear_message():
    plugin = AxialAttention()
    for over, message in (({"rows": 0}, "rows must be a positive integer"), ({"cols": -2}, "cols must be"),
                          ({"heads": 0}, "heads must be a positive integer")):
        with pytest.raises(ValueError, match=message):
            plugin.inputs(_case(**over), torch.Generator().manual_seed(0), "cpu")
    inputs = plugin.inputs(_case(), torch.Generator().manual_seed(0), "cpu")
    assert inputs["q"].shape == (1, 2, 63, 64) and (inputs["rows"], inputs["cols"]) == (7, 9)


def test_flops_count_the_pairs_of_both_passes():
    plugin = AxialAttention()
    assert plugin.flops(_case()) == 4 * 2 * 64 * 63 * (7 + 9)
    assert plugin.flops(_case(causal=True)) == 4 * 2 * 64 * (7 * 9 * 10 // 2 + 9 * 7 * 8 // 2)
    assert plugin.flops(_case(), backward=True) == 3.5 * plugin.flops(_case())
