"""Tile choices the autotuner made on a known GPU, kept as a table so later runs there skip tuning.

Benchmarking every candidate of the forward and both backward kernels costs 3-11 s per shape on an H200,
most of a short GPU run. A table in ``tuned/<gpu>-triton<major.minor>.json`` holds, per kernel and tuning
key, the configuration the autotuner picked; where a table matches this GPU's name and this Triton, the
launcher uses its entry for a key it lists (and still autotunes keys it does not list).

``MICROSCOPE_FLASH_TUNING=autotune`` ignores the tables. ``MICROSCOPE_FLASH_TUNED_OUT=<path>`` merges every
choice the autotuner makes in this process into that JSON file, which is how a table is made: run the
profiles on the GPU with it set, then commit the file under ``tuned/``.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import os
import re
from pathlib import Path

import torch
import triton

__all__ = ["KEY_ARGS", "TABLE_DIR", "describe", "load", "lookup", "record", "table_key", "table_name"]

TABLE_DIR = Path(__file__).parent / "tuned"
_MODE_ENV = "MICROSCOPE_FLASH_TUNING"
_OUT_ENV = "MICROSCOPE_FLASH_TUNED_OUT"
#: The launch arguments that, with the kernel and the dtype, decide which tile is best.
KEY_ARGS = ("SQ_BUCKET", "SK_BUCKET", "HEAD_DIM", "CAUSAL", "USE_TMA", "UNMASKED")
_tables: dict[str, tuple[str | None, dict[str, triton.Config]]] = {}


def table_key(kernel: str, kwargs: dict, dtype: torch.dtype) -> str:
    """``"_attn_fwd|SQ_BUCKET=4096|...|bfloat16"``: readable in the JSON file and stable across versions."""
    parts = [kernel] + [f"{name}={int(kwargs[name])}" for name in KEY_ARGS] + [str(dtype).removeprefix("torch.")]
    return "|".join(parts)


def _triton_version() -> str:
    return ".".join(triton.__version__.split(".")[:2])


def table_name(device_name: str) -> str:
    """``nvidia_h200-triton3.6.json`` for "NVIDIA H200" under Triton 3.6.x."""
    slug = re.sub(r"[^a-z0-9]+", "_", device_name.lower()).strip("_")
    return f"{slug}-triton{_triton_version()}.json"


def _serialise(cfg: triton.Config) -> dict:
    return {"kwargs": dict(cfg.kwargs), "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
            "maxnreg": cfg.maxnreg}


def _config(entry: dict) -> triton.Config:
    return triton.Config(dict(entry["kwargs"]), num_warps=entry["num_warps"], num_stages=entry["num_stages"],
                         maxnreg=entry.get("maxnreg"))


def load(path: Path) -> dict[str, triton.Config]:
    """A table file's configurations by table key."""
    return {key: _config(entry) for key, entry in json.loads(path.read_text())["configs"].items()}


def _table(device_name: str) -> tuple[str | None, dict[str, triton.Config]]:
    """(file name, configurations) of the table for this GPU and Triton, or (None, {}) when none matches."""
    if device_name not in _tables:
        path = TABLE_DIR / table_name(device_name)
        configs = load(path) if os.environ.get(_MODE_ENV, "table") != "autotune" and path.is_file() else {}
        _tables[device_name] = (path.name if configs else None, configs)
    return _tables[device_name]


def lookup(device_name: str, key: str) -> triton.Config | None:
    """The table's configuration for ``key`` on this GPU, or None (no table, or the key is not in it)."""
    return _table(device_name)[1].get(key)


def describe(device_name: str) -> str:
    """Where tiles come from on this GPU, for logs and reports."""
    name, configs = _table(device_name)
    if name is None:
        return "tiles autotuned in this process (no tuned table for this GPU and Triton)"
    return f"tiles from kernels/flash_attn/tuned/{name} ({len(configs)} keys); keys it lacks are autotuned"


def record(device_name: str, key: str, cfg: triton.Config) -> None:
    """Merge one autotuned choice into the file named by ``MICROSCOPE_FLASH_TUNED_OUT``, if set.

    Worker processes may write at the same time, so the read-modify-write holds an exclusive lock.
    """
    out = os.environ.get(_OUT_ENV)
    if not out:
        return
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        text = handle.read()
        table = json.loads(text) if text.strip() else {}
        table.update(device=device_name, triton=triton.__version__, torch=torch.__version__,
                     tuned_on=datetime.date.today().isoformat())
        table.setdefault("configs", {})[key] = _serialise(cfg)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(table, indent=1, sort_keys=True) + "\n")
