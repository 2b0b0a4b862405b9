"""``run.json``: how a run was started (config, device, overrides) and how far it got.

Written when the run starts and again when it ends, so ``microscope resume DIR`` can restart it the
same way, refuse a config that changed since (its hash), and reports can say a run is partial even
when its process was killed before it could say so itself.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from microscope.env import config_hash

RUN_FILE = "run.json"


@dataclass
class RunState:
    config: str  # the config file, absolute
    config_hash: str
    device: str
    quick: bool
    overrides: dict[str, Any]
    executor: str
    groups_planned: int
    status: str = "running"  # running | complete | interrupted | out of budget
    groups_finished: int = 0
    groups_failed: int = 0
    stopped: str | None = None
    resumes: int = 0
    failed_groups: list[dict[str, Any]] = field(default_factory=list)

    def save(self, folder: Path) -> None:
        path = Path(folder) / RUN_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1, default=str), encoding="utf-8")
        os.replace(tmp, path)

    @classmethod
    def load(cls, folder: Path) -> RunState | None:
        path = Path(folder) / RUN_FILE
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            known = cls.__dataclass_fields__
            return cls(**{k: v for k, v in data.items() if k in known})
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: not a run state file ({exc})") from exc

    def adopt(self, config_path: Path, device: str, quick: bool, overrides: dict[str, Any]) -> None:
        """Take a forced resume's arguments (e.g. ``workload.seeds`` raised to add seeds to a finished run)."""
        config_path = Path(config_path).resolve()
        self.config, self.config_hash = str(config_path), config_hash(config_path.read_text(encoding="utf-8"))
        self.device, self.quick, self.overrides = device, quick, dict(overrides)

    def mismatch(self, config_path: Path, device: str, quick: bool, overrides: dict[str, Any]) -> list[str]:
        """What differs between this run's start and a resume's arguments (empty: the same run)."""
        problems = []
        text = Path(config_path).read_text(encoding="utf-8")
        if config_hash(text) != self.config_hash:
            problems.append(f"the config {config_path} changed since the run started (hash "
                            f"{config_hash(text)[:12]} vs {self.config_hash[:12]})")
        if device != self.device:
            problems.append(f"device {device} vs {self.device}")
        if quick != self.quick:
            problems.append(f"--quick {'on' if quick else 'off'} vs {'on' if self.quick else 'off'}")
        if dict(overrides) != dict(self.overrides):
            problems.append(f"overrides {overrides} vs {self.overrides}")
        return problems
