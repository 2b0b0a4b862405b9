"""``train_on_ranks``: spawn one process per rank, train a strategy-wrapped model on each rank's shard of
every global batch (the whole batch for a ``@whole_batch`` strategy), gather the measurements; any failure
or hang becomes a RuntimeError naming the rank."""

from __future__ import annotations

import faulthandler
import gc
import os
import queue as queue_mod
import shutil
import signal
import socket
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from microscope.distributed.context import RankContext, Strategy, take_notes, takes_own_step, takes_whole_batch
from microscope.distributed.counting import CommCounter
from microscope.distributed.peak import LocalTensorBytes
from microscope.distributed.stats import (
    DistributedResult,
    RankStats,
    held_bytes,
    merge_train,
    optimizer_state_bytes,
    unwrap,
)
from microscope.distributed.trainer import RankTrainer
from microscope.workloads.train import StepMetrics, TrainRecipe, TrainResult

__all__ = ["train_on_ranks"]

_BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
_NOTES = [
    "bytes_sent: bytes of the tensors each rank passed to torch.distributed / functional collectives during "
    "training (the payload it contributes, not wire traffic: a ring allreduce moves ~2(N-1)/N of it)",
    "comm_s: wall time of synchronous collective calls plus issue-to-completion of async ones (these overlap "
    "compute, so comm_s is not the exposed wait)",
    "step_s: wall time of each whole Trainer.step (instrumentation included); train.step_time is the slowest "
    "rank's work time",
]
_CPU_PEAK_NOTE = (
    "peak_bytes (cpu): peak bytes of the tensor storages created during training (LiveTensorBytes; DTensors by "
    "their local shards); weights loaded before the first step are not counted. FSDP2 frees its gathered "
    "parameters by resizing their storage, which a dispatch mode cannot see: they count as live from their "
    "first gather on, so zero2/zero3 peaks may be overestimated by up to the full parameter bytes"
)
_CUDA_PEAK_NOTE = "peak_bytes (cuda): torch.cuda.max_memory_allocated over training (absolute)"


@contextmanager
def _children_allowed() -> Iterator[None]:
    """Lift multiprocessing's "daemonic processes may not have children" while the ranks start: a microscope
    executor worker is a daemon, and this launcher itself stops and reaps every rank it starts."""
    me = mp.current_process()
    was = me._config.get("daemon")  # noqa: SLF001 - the flag multiprocessing checks in Process.start
    me._config["daemon"] = False  # noqa: SLF001
    try:
        yield
    finally:
        me._config["daemon"] = was  # noqa: SLF001


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _strip(key: str) -> str:
    for prefix in ("module.", "_orig_mod."):
        while key.startswith(prefix):
            key = key[len(prefix):]
    return key.replace("._orig_mod.", ".").replace("._checkpoint_wrapped_module.", ".")


def _full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded CPU weights under the original names (every rank must call: DTensors are gathered)."""
    out = {}
    for key, value in unwrap(model).state_dict().items():
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        out[_strip(key)] = value.detach().cpu().clone()
    return out


def _peak_probe(device: torch.device) -> Any:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return None
    gc.collect()
    return LocalTensorBytes()


def _run_rank(rank: int, world_size: int, device_type: str, build: Callable[[], torch.nn.Module],
              state: dict[str, torch.Tensor], batches: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
              recipe: TrainRecipe, strategy: Strategy) -> dict[str, Any]:
    device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
    ctx = RankContext(rank, world_size, device, _BACKENDS[device_type])
    model = build()
    model.load_state_dict(state)
    counter = CommCounter()
    rows = slice(None) if takes_whole_batch(strategy) else slice(rank, None, world_size)
    with counter.installed():
        model = strategy(model.to(device), ctx)
        if takes_own_step(strategy):
            trainer = model.rank_trainer(recipe, device, counter)
        else:
            trainer = RankTrainer(model, recipe, device, counter)
        steps: list[StepMetrics] = []
        step_s: list[float] = []
        step_bytes: list[int] = []
        counter.bytes, counter.seconds, counter.calls = 0, 0.0, 0
        probe = _peak_probe(device)
        rng_devices = [device.index] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=rng_devices):
            torch.manual_seed(recipe.seed)
            with probe if probe is not None else nullcontext():
                for step in range(recipe.steps):
                    x, y = batches(step)
                    if x.shape[0] != recipe.batch_size:
                        raise ValueError(f"batches({step}) gave {x.shape[0]} rows but recipe.batch_size="
                                         f"{recipe.batch_size}")
                    before = counter.bytes
                    t0 = time.perf_counter()
                    steps.append(trainer.step(step, x[rows].to(device), y[rows].to(device)))
                    step_s.append(time.perf_counter() - t0)
                    step_bytes.append(counter.bytes - before)
        if device.type == "cuda":
            peak = int(torch.cuda.max_memory_allocated(device))
        else:
            peak = int(probe.peak)
        comm_s, sent = counter.seconds, counter.bytes
    stats = RankStats(
        rank=rank,
        peak_bytes=peak,
        param_bytes=held_bytes(model.parameters()),
        grad_bytes=held_bytes(p.grad for p in trainer.params),
        optimizer_bytes=optimizer_state_bytes(trainer.optimizer),
        bytes_sent=sent,
        comm_s=comm_s,
        step_s=step_s,
        step_bytes=step_bytes,
    )
    state_dict = _full_state_dict(model)
    return {
        "train": TrainResult.from_steps(steps, trainer.group_names, recipe),
        "stats": stats,
        "state_dict": state_dict if rank == 0 else None,
        "notes": take_notes() + [_CUDA_PEAK_NOTE if device.type == "cuda" else _CPU_PEAK_NOTE],
    }


def _worker(rank: int, world_size: int, port: int, workdir: str, device_type: str, timeout_s: float,
            build: Callable[[], torch.nn.Module], batches: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
            recipe: TrainRecipe, strategy: Strategy, messages: Any) -> None:
    """One rank: report ("ok", rank, "") after writing its result file, or ("error", rank, traceback)."""
    work = Path(workdir)
    dump = open(work / f"stack{rank}.txt", "w")  # noqa: SIM115 -- must outlive the body for the signal
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    try:
        warnings.filterwarnings("ignore", message="Found a non-scalar tensor with numel=1")  # DTensor clip noise
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if device_type == "cuda":
            torch.cuda.set_device(rank)
        else:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        dist.init_process_group(_BACKENDS[device_type], rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s + 60))
        state = torch.load(work / "state.pt", weights_only=True)
        out = _run_rank(rank, world_size, device_type, build, state, batches, recipe, strategy)
        torch.save(out, work / f"rank{rank}.pt")
        messages.put(("ok", rank, ""))
    except BaseException:  # noqa: BLE001 -- everything goes back to the parent
        messages.put(("error", rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "(no message)"


def _stop(procs: list[Any]) -> None:
    """Terminate, then kill, every rank process still alive; reap them all."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


def train_on_ranks(
    build: Callable[[], torch.nn.Module],
    state: dict[str, torch.Tensor],
    batches: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    recipe: TrainRecipe,
    strategy: Strategy,
    world_size: int,
    device_type: str = "cpu",
    timeout_s: float = 600.0,
) -> DistributedResult:
    """Train ``strategy(build())`` on ``world_size`` spawned ranks, each on rows ``rank::world_size`` of
    every global batch (all rows for a ``@whole_batch`` strategy); return the merged record, the full
    trained weights and each rank's measurements."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    whole = takes_whole_batch(strategy)
    if not whole and recipe.batch_size % world_size:
        raise ValueError(f"global batch size {recipe.batch_size} (recipe.batch_size) is not divisible by "
                         f"world_size={world_size}: every rank trains on batch_size / world_size rows")
    if device_type not in _BACKENDS:
        raise ValueError(f"device_type must be one of {list(_BACKENDS)}, got {device_type!r}")
    if device_type == "cuda" and torch.cuda.device_count() < world_size:
        raise ValueError(f"world_size={world_size} needs as many GPUs, found {torch.cuda.device_count()}")

    workdir = Path(tempfile.mkdtemp(prefix="microscope-dist-"))
    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    procs: list[Any] = []
    try:
        torch.save({k: v.detach().cpu() for k, v in state.items()}, workdir / "state.pt")
        port = _free_port()
        deadline = time.monotonic() + timeout_s
        with _children_allowed():
            for rank in range(world_size):
                p = ctx.Process(target=_worker, daemon=True, name=f"microscope-rank{rank}",
                                args=(rank, world_size, port, str(workdir), device_type, timeout_s, build, batches,
                                      recipe, strategy, messages))
                p.start()
                procs.append(p)
        _wait(procs, messages, deadline, timeout_s, workdir)
        outs = [torch.load(workdir / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
    finally:
        _stop(procs)
        messages.close()
        messages.cancel_join_thread()
        shutil.rmtree(workdir, ignore_errors=True)

    notes = list(_NOTES)
    for out in outs:
        notes += [n for n in out["notes"] if n not in notes]
    return DistributedResult(
        train=merge_train([o["train"] for o in outs], whole_batch=whole),
        state_dict=outs[0]["state_dict"],
        ranks=[o["stats"] for o in outs],
        notes=notes,
    )


def _wait(procs: list[Any], messages: Any, deadline: float, timeout_s: float, workdir: Path) -> None:
    """Block until every rank reported ok; raise RuntimeError on the first failure, crash or the deadline."""
    pending = set(range(len(procs)))
    errors: dict[int, str] = {}
    while pending:
        try:
            kind, rank, text = messages.get(timeout=0.2)
        except queue_mod.Empty:
            kind = None
        if kind == "ok":
            pending.discard(rank)
        elif kind == "error":
            errors[rank] = text
        if not errors:
            dead = [r for r in sorted(pending) if procs[r].exitcode not in (None, 0)]
            if dead:  # a rank that raised exits after queueing its traceback: prefer that text
                _drain(messages, errors, grace=1.0)
                if not errors:
                    errors[dead[0]] = _died(procs[dead[0]])
        if errors:
            _drain(messages, errors, grace=1.0)
            # a rank that died without a traceback (segfault, os._exit, OOM kill) is the likelier cause
            # of the others' "connection closed" errors: name it first
            crashed = {r: _died(procs[r]) for r in range(len(procs)) if r not in errors and procs[r].exitcode}
            raise RuntimeError(_describe({**crashed, **errors}))
        if time.monotonic() > deadline:
            stacks = _dump_stacks(procs, sorted(pending), workdir)
            ranks = ", ".join(str(r) for r in sorted(pending))
            raise RuntimeError(f"rank(s) {ranks} did not finish within timeout_s={timeout_s:g}s (hung or too "
                               f"slow); killed.{stacks}")


def _died(proc: Any) -> str:
    code = proc.exitcode
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    return f"rank process died ({how}) without a Python traceback"


def _drain(messages: Any, errors: dict[int, str], grace: float) -> None:
    """Collect other ranks' errors for a moment (often consequences of the first one)."""
    end = time.monotonic() + grace
    while time.monotonic() < end:
        try:
            kind, rank, text = messages.get(timeout=max(0.01, end - time.monotonic()))
        except queue_mod.Empty:
            return
        if kind == "error" and rank not in errors:
            errors[rank] = text


def _describe(errors: dict[int, str]) -> str:
    first, text = next(iter(errors.items()))
    msg = f"rank {first} failed: {_last_line(text)}"
    if len(text.strip().splitlines()) > 1:
        msg += f"\n--- rank {first} traceback (tail) ---\n{_tail(text)}"
    others = [f"rank {r}: {_last_line(t)}" for r, t in errors.items() if r != first]
    if others:
        msg += "\n--- other ranks, probably in consequence ---\n" + "\n".join(others)
    return msg


def _dump_stacks(procs: list[Any], ranks: list[int], workdir: Path) -> str:
    """Ask hung ranks for their Python stacks (faulthandler on SIGUSR1) and return the tails."""
    if not hasattr(signal, "SIGUSR1"):
        return ""
    for r in ranks:
        if procs[r].is_alive():
            os.kill(procs[r].pid, signal.SIGUSR1)
    time.sleep(0.5)
    parts = []
    for r in ranks:
        path = workdir / f"stack{r}.txt"
        text = path.read_text() if path.exists() else ""
        if text.strip():
            parts.append(f"\n--- rank {r} stack at the timeout (tail) ---\n{_tail(text, 12)}")
    return "".join(parts)
