"""What share of requests a KV-cache budget serves in time, contiguous vs paged, under a stated policy.

The claim "long-text (8k) success rate 35% -> 99%" names no serving policy, and success depends on
one, so this module states its own and simulates it step by step (``serve``):

* Requests arrive in a seeded Poisson stream and wait in one first-come-first-served queue; each has
  a prompt and an output length.
* Each decode step the scheduler admits requests from the head of the queue while the cache has room
  for the tokens they hold (strict order: a request that does not fit blocks the ones behind it).
  Contiguous: a free slot of ``max_len`` tokens, reserved for the request's whole life. Paged: blocks
  from the ``BlockAllocator`` for its prompt (and any tokens it generated before a preemption).
* Every running request then generates one token. A paged request takes a new block when its last is
  full; when the pool is empty the most recently admitted running request is preempted: its blocks are
  freed and it returns to the head of the queue, to recompute its tokens when readmitted (vLLM's
  recompute preemption). A contiguous slot never runs out.
* A request succeeds if it has generated its whole output within ``deadline`` steps of its arrival (a
  client's timeout); one still queued or running then is dropped, and its memory freed.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import torch
from microscope_kernels.paged_attention.allocator import BlockAllocator, PoolExhausted


@dataclass(frozen=True)
class Request:
    """One request: the step it arrives at, its prompt tokens and the tokens it generates."""

    arrival: int
    prompt: int
    output: int
    long: bool = False  # a long-text request (the claim's "8k" class)

    @property
    def tokens(self) -> int:
        return self.prompt + self.output


@dataclass(frozen=True)
class Served:
    """How one layout served a request stream."""

    requests: int
    succeeded: int
    long_requests: int
    long_succeeded: int
    preemptions: int
    steps: int
    peak_running: int  # the most requests decoding in one step

    @property
    def success(self) -> float:
        """Share of requests that finished within the deadline."""
        return self.succeeded / self.requests if self.requests else math.nan

    @property
    def long_success(self) -> float:
        """Share of long-text requests that finished within the deadline (NaN when there were none)."""
        return self.long_succeeded / self.long_requests if self.long_requests else math.nan


def chat_and_documents(duration: int, max_len: int, seed: int, long_share: float = 0.2, load: float = 2.0,
                       slots: int = 1) -> list[Request]:
    """A seeded stream of requests arriving over ``duration`` steps: ``long_share`` long-text requests
    (prompt 3/4 of ``max_len`` or more, output ``max_len``/32) among chat requests (prompt and output
    log-uniform up to ``max_len``/8 and ``max_len``/16). Arrivals are Poisson at ``load`` times the rate
    ``slots`` contiguous slots serve (by the stream's mean output), so ``load`` > 1 overloads a
    contiguous cache of ``slots`` sequences."""
    if duration < 0 or max_len < 32 or not 0 <= long_share <= 1 or load <= 0 or slots < 1:
        raise ValueError(f"need duration >= 0, max_len >= 32, 0 <= long_share <= 1, load > 0 and slots >= 1; got "
                         f"{duration}, {max_len}, {long_share}, {load}, {slots}")
    gen = torch.Generator().manual_seed(seed)
    long_out, chat_prompt, chat_out = max_len // 32, max_len // 8, max_len // 16
    low = 3 * max_len // 4

    def draw(n: int) -> list[tuple[int, int, bool, float]]:
        rows = torch.rand(n, 4, generator=gen, dtype=torch.float64).tolist()
        return [(low + int(a * (max_len - long_out - low + 1)), long_out, True, gap) if kind < long_share else
                (max(1, int(math.exp(a * math.log(chat_prompt)))), max(1, int(math.exp(b * math.log(chat_out)))),
                 False, gap) for kind, a, b, gap in rows]

    mean_output = sum(out for _, out, _, _ in draw(4096)) / 4096  # the rate's yardstick, from the same seed
    rate = load * slots / mean_output  # requests per step
    out: list[Request] = []
    t = 0.0
    while True:
        for prompt, output, is_long, gap in draw(1024):
            t += -math.log(1.0 - gap) / rate
            if t >= duration:
                return out
            out.append(Request(int(t), prompt, output, is_long))


def serve(requests: list[Request], budget_tokens: int, max_len: int, deadline: int,
          block_size: int | None = None) -> Served:
    """Simulate the module's policy: contiguous slots of ``max_len`` tokens (``block_size`` None) or a
    paged pool of ``budget_tokens // block_size`` blocks; see the module docstring."""
    if any(r.tokens > max_len for r in requests):
        raise ValueError(f"a request of {max(r.tokens for r in requests)} tokens exceeds max_len={max_len}")
    if deadline < 1 or budget_tokens < 0:
        raise ValueError(f"need deadline >= 1 and budget_tokens >= 0, got {deadline} and {budget_tokens}")
    pending = deque(sorted(range(len(requests)), key=lambda i: requests[i].arrival))
    queue: deque[int] = deque()
    running: list[int] = []  # admission order
    generated = [0] * len(requests)
    slots = budget_tokens // max_len
    pool = BlockAllocator(budget_tokens // block_size, block_size) if block_size else None
    succeeded = long_succeeded = preemptions = peak = 0
    step = 0
    while pending or queue or running:
        while pending and requests[pending[0]].arrival <= step:
            queue.append(pending.popleft())
        for i in [i for i in running if step - requests[i].arrival >= deadline]:
            running.remove(i)
            if pool is not None:
                pool.free(i)
        queue = deque(i for i in queue if step - requests[i].arrival < deadline)
        while queue:  # admit in order while the head fits
            head = queue[0]
            if pool is None:
                if len(running) >= slots:
                    break
            else:
                try:
                    pool.append(head, requests[head].prompt + generated[head])
                except PoolExhausted:
                    break
            running.append(queue.popleft())
        peak = max(peak, len(running))
        for i in list(running):
            if i not in running:
                continue  # preempted earlier in this step
            while pool is not None:
                try:
                    pool.append(i, 1)
                    break
                except PoolExhausted:
                    victim = running.pop()
                    pool.free(victim)
                    queue.appendleft(victim)
                    preemptions += 1
                    if victim == i:
                        break
            if i not in running:
                continue
            generated[i] += 1
            if generated[i] == requests[i].output:
                running.remove(i)
                if pool is not None:
                    pool.free(i)
                succeeded += 1
                long_succeeded += requests[i].long
        step += 1
        if not running and not queue and pending:
            step = max(step, requests[pending[0]].arrival)
    longs = sum(r.long for r in requests)
    return Served(len(requests), succeeded, longs, long_succeeded, preemptions, step, peak)
