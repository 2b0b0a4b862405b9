"""The worker process of the local executor: rebuilds the runner from a ``RunSpec`` and runs groups.

Messages to the parent go over one pipe: ``("ready",)`` once the runner is built (the group's time
limit starts then, not while torch imports), ``("record", Record)`` as each is measured, ``("progress",
text)``, and ``("done", key, notes, replace)`` after a group. The name of the variant running at any
moment sits in shared memory (``marker``), so when this process dies or hangs the parent knows whom
to blame without a message. stdout and stderr go to the worker's log, whose last lines become the
reason of a crash.
"""

from __future__ import annotations

import faulthandler
import gc
import inspect
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from microscope.executors import compile_log

if TYPE_CHECKING:
    from microscope.runner import RunBase

#: Errors after which a CUDA context is unusable: the worker leaves, the parent starts a fresh one.
STICKY_CUDA = re.compile(r"illegal memory access|device-side assert|unspecified launch failure|"
                         r"misaligned address|illegal instruction|CUDA error: an illegal", re.IGNORECASE)
#: A group after which the GPU holds this much more than after the worker's previous group leaked (the
#: first group sets the level: cuBLAS workspaces, the L2-flush buffer and caches stay by design).
LEAK_BYTES = 64 * 2**20
#: Growth held by no Python tensor up to this size is a library's workspaces allocated on first use (cuBLAS
#: and cuBLASLt keep 32 MiB each per handle and stream on Hopper; cuDNN sizes its own per graph): the level
#: rises and the worker stays, rather than recompiling every kernel in a fresh one. Above it, a leak.
LIBRARY_CACHE_BYTES = 1 << 30
GROUP_BANNER = "=== microscope group: "


@dataclass(frozen=True)
class RunSpec:
    """What a worker needs to rebuild the runner of the parent (picklable; paths are absolute)."""

    config_path: str
    device: str
    quick: bool
    overrides: dict[str, Any]
    run_id: str
    out_root: str
    env: dict[str, Any]
    cwd: str
    memory_limit_gb: float | None = None
    threads: int | None = None  # the parent's intra-op threads: a CPU reduction's order, so its bits, follow them
    config_text: str | None = None  # the file as the parent read it (an edit during the run changes nothing)

    def build(self) -> RunBase:
        import torch

        from microscope import commands
        from microscope import config as cfgmod
        from microscope import device as devmod
        from microscope.model_runner import ModelRunner
        from microscope.runner import Runner

        os.chdir(self.cwd)
        if self.threads:  # Ray sets OMP_NUM_THREADS=1 in its workers; the numbers must not depend on the executor
            torch.set_num_threads(self.threads)
        interpreted = devmod.prepare(self.device)
        text = self.config_text if self.config_text is not None else Path(self.config_path).read_text(encoding="utf-8")
        config, plugin = commands.load_checked(Path(self.config_path), self.device, self.quick, dict(self.overrides),
                                               text=text)
        model_level = cfgmod.effective_level(config, plugin) == "model"
        cls = ModelRunner if model_level else Runner
        return cls(plugin, config, device=self.device, interpreted=interpreted, out_root=Path(self.out_root),
                   config_text=text, run_id=self.run_id, env=self.env)


def warm_gpu_libraries() -> None:
    """Pay now what a GPU worker's first group would: the CUDA context, cuBLAS and cuDNN handles, and the
    import of torch.compile's modules (seconds where Python may not cache their bytecode). Run by a worker
    started ahead of a precompile step, while it would wait idle; a failure here is left to the group."""
    import torch
    import torch.nn.functional as F

    try:
        x = torch.ones(64, 64, device="cuda", dtype=torch.bfloat16)
        x @ x  # noqa: B018 - cuBLAS's handle and workspace
        F.conv2d(x.view(1, 1, 64, 64), x[:3, :3].reshape(1, 1, 3, 3))  # cuDNN's handle
        torch.cuda.synchronize()
        import torch._dynamo  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401
    except Exception:  # noqa: BLE001 - the first group meets the same problem and records it
        pass


def _log_to(log_path: str, carried: str | None = None) -> None:
    """Send this process's stdout and stderr to ``log_path`` (after the lines of ``carried``, a log it wrote
    before it knew its run's, which is then removed)."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    if carried is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(fd, Path(carried).read_bytes())
        os.unlink(carried)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _await_run(conn: Any, early_log: str) -> tuple[RunSpec, bool] | None:
    """A worker started before its run was planned: import torch and the harness meanwhile, then take the
    run's spec, log and GPU from the parent; None when the parent closes it instead."""
    import torch  # noqa: F401 - the seconds this start is for

    import microscope.runner  # noqa: F401

    try:
        message = conn.recv()
    except (EOFError, OSError):
        message = None
    if not message:
        os.unlink(early_log)
        return None
    _, spec, log_path, warm, gpu, environ = message
    os.environ.update({k: v for k, v in environ.items() if os.environ.get(k) != v})  # the parent's, as of now
    if gpu is not None:  # before anything initialises CUDA
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    _log_to(log_path, carried=early_log)
    return spec, warm


def worker_main(spec: RunSpec | None, conn: Any, marker: Any, log_path: str, warm: bool = False) -> None:
    """Serve groups until the parent sends ``None`` (or this process must be replaced); ``warm``: run
    ``warm_gpu_libraries`` before the first group (a GPU run's worker started ahead of its precompile step).
    ``spec`` None: an early worker (``local.Worker.early``), told its run by a ``("setup", ...)`` message."""
    born = time.monotonic()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt stops
    _log_to(log_path)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    faulthandler.enable(file=sys.stderr)  # a segfault leaves its Python stack in the log
    waited = 0.0
    if spec is None:
        setup = _await_run(conn, log_path)
        if setup is None:
            return
        spec, warm = setup
        waited = time.monotonic() - born
    if spec.memory_limit_gb and spec.device == "cpu":
        import resource

        limit = int(spec.memory_limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    building = time.monotonic()
    runner = spec.build()
    warming = time.monotonic()
    if warm and spec.device == "cuda":
        warm_gpu_libraries()
    # The imports' objects (hundreds of thousands) move out of the collector's view, so the full collection
    # before each memory measurement scans only what the groups create (it took 0.18 s a variant); done
    # again after the first group, once its first calls have imported and compiled what the others reuse.
    gc.freeze()
    print(f"worker ready {time.monotonic() - born:.1f} s after its start"
          + (f" ({waited:.1f} s of them before its run was known)" if waited else "")
          + f": runner {warming - building:.1f} s"
          + (f", GPU libraries {time.monotonic() - warming:.1f} s" if warm and spec.device == "cuda" else ""),
          file=sys.stderr, flush=True)
    conn.send(("ready",))

    def mark(name: str) -> None:
        marker.value = name.encode("utf-8", "replace")[:255]

    def sink(record: Any) -> None:
        if record.status == "failed" and record.reason and STICKY_CUDA.search(record.reason):
            mark(record.variant)
            conn.send(("poisoned", record.variant, record.reason))
            os._exit(3)  # the context is gone for every later call; the parent reruns without this variant
        conn.send(("record", record))

    runner.mark = mark
    runner.sink = sink
    started = time.monotonic()

    def log(message: str) -> None:
        # the worker's log keeps each phase's start, so a slow group shows where its time went
        print(f"[{time.monotonic() - started:8.1f} s] {message}", file=sys.stderr, flush=True)

    def progress(message: str) -> None:
        log(message)
        conn.send(("progress", message))

    runner.on_progress = progress
    runner.log = log
    if spec.device == "cuda":
        compile_log.install(log)
    free_at_start = _gpu_free(spec.device)
    if spec.device == "cuda" and os.environ.get(LEAK_TRACE) == "1":
        import torch

        torch.cuda.memory._record_memory_history(max_entries=200_000)
    level: list[int] = []  # GPU memory allocated after the first group, and the highest level accepted since
    frozen_after_first = False
    while True:
        task = conn.recv()
        if task is None:
            break
        group, exclude = task
        print(f"{GROUP_BANNER}{group.key}", file=sys.stderr, flush=True)
        notes = _gpu_notes(spec.device, free_at_start)
        marker.value = b""
        runner.run_group(group, exclude)
        marker.value = b""
        log("group done")
        replace, health = _health(spec.device, level)
        if not frozen_after_first:
            gc.collect()
            gc.freeze()
            frozen_after_first = True
        conn.send(("done", group.key, notes + health, replace))
        if replace:
            break
    runner.close()
    conn.close()
    gc.unfreeze()  # the interpreter's shutdown frees them (nanobind reports objects it never saw freed)


def _gpu_free(device: str) -> int | None:
    if device != "cuda":
        return None
    import torch

    return int(torch.cuda.mem_get_info()[0])


def _gpu_notes(device: str, free_at_start: int | None) -> list[str]:
    """GPU memory held by others at a group's start (another process, or a leak this worker kept)."""
    if device != "cuda" or free_at_start is None:
        return []
    import torch

    free, total = torch.cuda.mem_get_info()
    if free < free_at_start - 2**30:
        return [f"GPU memory: {(free_at_start - free) / 2**30:.1f} GiB less free than when the worker started "
                f"({free / 2**30:.1f} of {total / 2**30:.1f} GiB free at this group's start)"]
    return []


def _health(device: str, level: list[int]) -> tuple[bool, list[str]]:
    """(replace this worker?, notes): a poisoned CUDA context or a leak ends the worker after its group."""
    if device != "cuda":
        return False, []
    import torch

    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
    except Exception as exc:  # noqa: BLE001 - any error here means the context cannot be trusted
        return True, [f"CUDA context unusable after the group ({type(exc).__name__}: {str(exc)[:200]}); "
                      "the next group gets a fresh worker"]
    gc.collect()
    torch.cuda.empty_cache()
    left = torch.cuda.memory_allocated()
    if not level:
        level.extend([left, left])  # after the first group; and the highest level accepted since
        _FIRST.update(_diagnosed(lambda: {"tensors": live_tensors("cuda"), "blocks": _live_blocks()}, {}))
    elif left > level[1] + LEAK_BYTES:
        grown = left - level[0]
        first = _FIRST.get("tensors", {})
        held = _diagnosed(lambda: sum(n for t, n in _tensors_on("cuda") if id(t) not in first), grown)
        if held <= LEAK_BYTES and grown <= LIBRARY_CACHE_BYTES:
            added, level[1] = left - level[1], left  # library workspaces first used here: allocated once, kept
            return False, [f"{added / 2**20:.0f} MiB more stays allocated after this group, held by no Python "
                           "tensor: library workspaces (cuBLAS, cuDNN) first used here, kept for later groups"]
        why = _diagnosed(lambda: leak_suspects(grown, "cuda", first), "what stayed allocated could not be listed")
        return True, [f"the group left {grown / 2**20:.0f} MiB more allocated on the GPU than the "
                      "worker's first group (a leak); the next group gets a fresh worker, so it is not inherited; "
                      + why]
    return False, []


#: What was alive after a worker's first group (the level a leak is measured from): tensor ids and, under
#: ``MICROSCOPE_LEAK_TRACE=1``, the allocator's live block addresses.
_FIRST: dict[str, Any] = {}
#: ``MICROSCOPE_LEAK_TRACE=1``: the CUDA allocator records a stack per allocation, so a leak note names
#: where the blocks no Python tensor holds were allocated (slows every allocation: diagnosis only).
LEAK_TRACE = "MICROSCOPE_LEAK_TRACE"


def _diagnosed(fn: Any, fallback: Any) -> Any:
    """A diagnosis never costs a group: any error in it gives the fallback."""
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return fallback


def live_tensors(device_type: str) -> dict[int, int]:
    """id -> bytes of every tensor on ``device_type`` the garbage collector can see (held from Python)."""
    return {id(t): n for t, n in _tensors_on(device_type)}


def leak_suspects(grown: int, device_type: str, first: dict[int, int], shown: int = 4) -> str:
    """What the growth is: the largest tensors born since the first group (``first``, by id) and what holds
    them, or memory no Python tensor holds (a C++-side cache such as a CUDA graph pool or a workspace)."""
    new = [(t, n) for t, n in _tensors_on(device_type) if id(t) not in first]
    held = sum(n for _, n in new)
    frozen = gc.get_freeze_count()
    if frozen:
        gc.unfreeze()  # a holder may be a frozen object (a module-level cache): get_referrers skips those
    try:
        return _describe_suspects(new, held, grown, device_type, shown)
    finally:
        if frozen:
            gc.freeze()


def _describe_suspects(new: list[tuple[Any, int]], held: int, grown: int, device_type: str, shown: int) -> str:
    """The leak note's text: the held and unheld bytes, then the largest new tensors and their holders."""
    parts = [f"{held / 2**20:.0f} MiB in {len(new)} Python-held tensor(s) new since the first group, "
             f"{max(grown - held, 0) / 2**20:.0f} MiB held by no Python tensor (C++ caches, CUDA graph pools)"]
    top = sorted(new, key=lambda tn: -tn[1])[:shown]
    for t, n in top:
        holders = [_holder(r) for r in gc.get_referrers(t) if r is not new and r is not top
                   and not isinstance(r, tuple) and not inspect.isframe(r)][:3]
        parts.append(f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')} {n / 2**20:.1f} MiB held by "
                     f"{', '.join(holders) or 'nothing visible'}")
    if device_type == "cuda" and _FIRST.get("blocks"):
        parts.extend(_new_block_sites(_FIRST["blocks"], shown))
    return "; ".join(parts)


def _tensors_on(device_type: str) -> list[tuple[Any, int]]:
    """(tensor, storage bytes) of every tensor whose storage is on ``device_type`` (vmap's batched tensors
    and other wrappers have none and are skipped; torch.compile's fake tensors say cuda but keep a meta
    storage, which holds no memory)."""
    import torch

    out = []
    for obj in gc.get_objects():
        try:
            if issubclass(type(obj), torch.Tensor) and obj.device.type == device_type:
                storage = obj.untyped_storage()
                if storage.device.type == device_type:
                    out.append((obj, storage.nbytes()))
        except Exception:  # noqa: BLE001 - a half-built object or a storage-less tensor subclass
            continue
    return out


#: Frames of the allocator and of the stack capture itself: left out of a block's allocation site.
_ALLOCATOR_FRAME = re.compile(r"unwind|CapturedTraceback|gather|CachingAllocator|c10::cuda::|::allocate|^malloc")


def _live_blocks() -> set[int]:
    """Addresses of the allocator's live blocks (only when allocations are traced)."""
    import torch

    if os.environ.get(LEAK_TRACE) != "1":
        return set()
    return {b["address"] for seg in torch.cuda.memory._snapshot()["segments"] for b in seg["blocks"]
            if b["state"] == "active_allocated"}


def _new_block_sites(first: set[int], shown: int) -> list[str]:
    """The largest live blocks allocated since the first group, each with the innermost frames of its stack."""
    import torch

    blocks = [b for seg in torch.cuda.memory._snapshot()["segments"] for b in seg["blocks"]
              if b["state"] == "active_allocated" and b["address"] not in first]
    out = []
    for b in sorted(blocks, key=lambda b: -b["size"])[:shown]:
        frames = [f"{f.get('name')} ({os.path.basename(str(f.get('filename')))}:{f.get('line')})"
                  for f in b.get("frames", []) if f.get("name") and not _ALLOCATOR_FRAME.search(str(f.get("name")))][:6]
        out.append(f"block {b['size'] / 2**20:.1f} MiB allocated at " + " < ".join(frames))
    return out


def _holder(ref: object) -> str:
    """A readable name for what refers to a tensor: the module or object whose attributes a dict is."""
    if isinstance(ref, dict):
        for owner in gc.get_referrers(ref):
            if getattr(owner, "__dict__", None) is ref:
                return f"module {owner.__name__}" if inspect.ismodule(owner) else f"a {type(owner).__qualname__}"
        return "a dict"
    return f"a {type(ref).__qualname__}"
