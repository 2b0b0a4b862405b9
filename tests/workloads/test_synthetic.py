import torch

from microscope.workloads.synthetic import AssociativeRecall, recall_accuracy
from microscope.workloads.tokenizer import BOS, ByteTokenizer


def _pairs(text: str, key_len: int) -> dict[str, str]:
    body = text.split("?")[0].strip()
    return {item[:key_len]: item[key_len:] for item in body.split()}


def test_answer_is_the_value_of_the_query_key():
    task = AssociativeRecall(key_len=2)
    tok = ByteTokenizer()
    batch = task.sample(16, 64, torch.Generator().manual_seed(0))
    assert batch.x.shape == batch.y.shape == (16, 64)
    for row in range(16):
        text = tok.decode(batch.x[row])
        pairs = _pairs(text, 2)
        assert len(pairs) == task.max_pairs(64)  # keys are distinct
        query = text.split("?")[1]
        assert chr(int(batch.answer[row])) == pairs[query]
        assert batch.x[row, 0] == BOS
        assert batch.y[row, -1] == batch.answer[row]
        assert (batch.y[row, :-1] == -100).all()


def test_longer_context_and_fixed_pairs():
    task = AssociativeRecall()
    gen = torch.Generator().manual_seed(1)
    for context in (128, 256, 512):
        batch = task.sample(2, context, gen)
        assert batch.x.shape == (2, context)
    fixed = task.sample(2, 512, gen, n_pairs=10)
    assert len(_pairs(ByteTokenizer().decode(fixed.x[0]), 2)) == 10


def test_batches_are_seeded_per_step():
    task = AssociativeRecall()
    a = task.batches(4, 64, seed=3)
    b = task.batches(4, 64, seed=3)
    b(5)
    assert torch.equal(a(1)[0], b(1)[0])
    assert not torch.equal(a(1)[0], a(2)[0])


class _Oracle(torch.nn.Module):
    """Reads the answer from the sequence itself: accuracy must be 1.0 by construction."""

    def __init__(self, key_len: int) -> None:
        super().__init__()
        self.key_len = key_len
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*x.shape, 259)
        for row in range(x.shape[0]):
            text = ByteTokenizer().decode(x[row])
            answer = _pairs(text, self.key_len)[text.split("?")[1]]
            logits[row, -1, ord(answer)] = 1.0
        return logits


def test_accuracy_of_an_oracle_is_one_and_of_a_constant_is_chance():
    task = AssociativeRecall()
    assert recall_accuracy(_Oracle(2), task, 64, n_examples=40) == 1.0

    class Constant(_Oracle):
        def forward(self, x):
            logits = torch.zeros(*x.shape, 259)
            logits[..., ord("3")] = 1.0
            return logits

    acc = recall_accuracy(Constant(2), task, 64, n_examples=400)
    assert 0.05 < acc < 0.16
