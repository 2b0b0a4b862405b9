import math

import numpy as np
import pytest
import torch

from microscope.workloads.batching import WindowSampler
from microscope.workloads.model import build_model
from microscope.workloads.profiles import get_profile
from microscope.workloads.stability import loss_spikes
from microscope.workloads.synthetic import AssociativeRecall
from microscope.workloads.train import TrainRecipe, lr_at, train


def _run(corpus, cfg, recipe, model_seed=0, data_seed=0):
    model = build_model(cfg, model_seed)
    sampler = WindowSampler(corpus.train, cfg.context, recipe.batch_size, data_seed)
    return model, train(model, sampler, recipe)


def test_same_seed_twice_gives_bitwise_identical_curves(corpus, tiny_cfg):
    recipe = TrainRecipe(steps=8, batch_size=4)
    m1, r1 = _run(corpus, tiny_cfg, recipe)
    m2, r2 = _run(corpus, tiny_cfg, recipe)
    assert np.array_equal(r1.loss, r2.loss)
    assert np.array_equal(r1.grad_norm, r2.grad_norm)
    assert np.array_equal(r1.layer_update_ratio, r2.layer_update_ratio)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)
    _, r3 = _run(corpus, tiny_cfg, recipe, data_seed=1)
    assert not np.array_equal(r1.loss, r3.loss)


def test_training_lowers_the_loss_on_the_tiny_profile(corpus):
    profile = get_profile("tiny")
    _, result = _run(corpus, profile.model, profile.recipe)
    assert result.loss[0] > math.log(200)  # starts near uniform over the byte vocabulary
    assert result.loss[-5:].mean() < result.loss[0] - 1.5


def test_step_record_has_every_stability_field(corpus, tiny_cfg):
    recipe = TrainRecipe(steps=6, batch_size=2, warmup=2)
    model, r = _run(corpus, tiny_cfg, recipe)
    n_groups = len(r.layer_names)
    assert r.layer_names == ("embed", "blocks.0", "blocks.1", "norm", "lm_head")
    assert r.layer_grad_norm.shape == r.layer_update_ratio.shape == (6, n_groups)
    # global norm = root of the sum of the per-layer squares
    np.testing.assert_allclose(r.grad_norm, np.sqrt((r.layer_grad_norm**2).sum(1)), rtol=1e-5)
    assert (r.update_ratio > 0).all() and (r.update_ratio < 1).all()
    assert (r.nan_count == 0).all() and (r.inf_count == 0).all()
    assert np.isnan(r.loss_scale).all() and not r.skipped.any()
    assert (r.tokens == 2 * tiny_cfg.context).all() and (r.step_time > 0).all()
    assert r.tokens_per_s() > 0
    np.testing.assert_allclose(r.lr, [lr_at(s, recipe) for s in range(6)])
    assert set(r.to_dict()) >= {"loss", "spikes", "layer_names"}


def test_schedule_warms_up_then_decays_to_the_floor():
    recipe = TrainRecipe(steps=20, warmup=4, lr=1.0, min_lr_ratio=0.1)
    lrs = [lr_at(s, recipe) for s in range(20)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))
    assert lrs[-1] == pytest.approx(0.1)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_recipes(corpus, tiny_cfg, precision):
    recipe = TrainRecipe(steps=3, batch_size=2, precision=precision)
    _, r = _run(corpus, tiny_cfg, recipe)
    assert np.isfinite(r.loss).all()
    if precision == "fp16":
        assert (r.loss_scale > 0).all() and r.loss_scale[0] == recipe.init_scale
    else:
        assert np.isnan(r.loss_scale).all()


def test_recipe_hooks_swap_the_optimizer_and_turn_on_checkpointing(corpus, tiny_cfg):
    built = []

    def sgd(groups, recipe):
        built.append(recipe.lr)
        return torch.optim.SGD(groups, lr=recipe.lr)

    recipe = TrainRecipe(steps=2, batch_size=2, optimizer_factory=sgd, checkpoint_every=1)
    model, _ = _run(corpus, tiny_cfg, recipe)
    assert built == [recipe.lr]
    assert all(b.checkpoint for b in model.blocks)


def test_trains_on_the_synthetic_task(tiny_cfg):
    task = AssociativeRecall()
    recipe = TrainRecipe(steps=3, batch_size=4)
    r = train(build_model(tiny_cfg, 0), task.batches(4, tiny_cfg.context, seed=0), recipe)
    assert np.isfinite(r.loss).all()


def test_batch_size_mismatch_is_refused(corpus, tiny_cfg):
    with pytest.raises(ValueError, match="batch_size"):
        sampler = WindowSampler(corpus.train, 32, 3, seed=0)
        train(build_model(tiny_cfg, 0), sampler, TrainRecipe(steps=1, batch_size=4))


def test_loss_spike_rule():
    losses = np.array([2.0, 2.1, 1.9, 2.0, 2.05, 1.95, 3.5, 2.0, float("nan"), 2.0])
    spikes = loss_spikes(losses, window=5, k=3.0)
    # median of the 5 before step 6 is 2.0, MAD 0.05 -> threshold 2.15: 3.5 spikes, 2.0 does not
    assert spikes.tolist() == [False] * 6 + [True, False, True, False]
    assert not loss_spikes(losses[:5], window=5).any()


def test_distillation_loss_is_zero_against_itself_and_grows_with_disagreement():
    from microscope.workloads.train import distillation_loss

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=gen)
    targets = torch.randint(0, 11, (2, 5), generator=gen)
    assert distillation_loss(logits, logits, targets, 2.0).item() == pytest.approx(0.0, abs=1e-6)
    near, far = logits + 0.1 * torch.randn(2, 5, 11, generator=gen), torch.randn(2, 5, 11, generator=gen)
    assert 0 < distillation_loss(near, logits, targets, 2.0) < distillation_loss(far, logits, targets, 2.0)
    targets[:, 2:] = -100  # ignored positions do not count, as in lm_loss
    masked = distillation_loss(far, logits, targets, 2.0)
    by_hand = distillation_loss(far[:, :2], logits[:, :2], targets[:, :2], 2.0)
    assert masked.item() == pytest.approx(by_hand.item(), rel=1e-6)


def test_a_student_distilled_alone_moves_toward_its_teacher_and_records_the_label_loss(corpus, tiny_cfg):
    """weight 1: the student learns only the teacher's soft targets, so its KL to the teacher falls;
    the per-step loss it records stays the cross entropy on the labels."""
    from microscope.workloads.train import Distillation, distillation_loss, lm_loss

    teacher, _ = _run(corpus, tiny_cfg, TrainRecipe(steps=8, batch_size=4))
    student = build_model(tiny_cfg, 1)
    batches = WindowSampler(corpus.train, tiny_cfg.context, 4, seed=3)
    x, y = batches(0)

    def kl() -> float:
        with torch.no_grad():
            return float(distillation_loss(student(x), teacher(x), y, 2.0))

    before = kl()
    result = train(student, WindowSampler(corpus.train, tiny_cfg.context, 4, seed=0),
                   TrainRecipe(steps=8, batch_size=4), distill=Distillation(teacher, weight=1.0))
    assert kl() < 0.5 * before
    assert not any(p.requires_grad for p in teacher.parameters())
    xs, ys = WindowSampler(corpus.train, tiny_cfg.context, 4, seed=0)(7)
    with torch.no_grad():
        assert result.loss[-1] > 0 and math.isfinite(result.loss[-1])
        assert float(lm_loss(student(xs), ys)) == pytest.approx(result.loss[-1], rel=0.5)


def test_a_distilling_arm_is_a_training_candidate_with_a_share_in_0_1():
    from microscope.api import Arm, Role

    assert Arm(distill=0.5).distill == 0.5
    for bad, message in (({"role": Role.BASELINE, "distill": 0.5}, "not the baseline itself"),
                         ({"distill": 0.5, "inference_only": True}, "not the baseline itself"),
                         ({"distill": 1.5}, "lies in \\[0, 1\\]"),
                         ({"distill": 0.5, "distill_temperature": 0.0}, "temperature is > 0")):
        with pytest.raises(ValueError, match=message):
            Arm(**bad)
