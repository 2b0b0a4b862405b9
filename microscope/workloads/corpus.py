"""The real corpus: the running Python's own standard library (code) and documentation (prose).

Why this corpus: it is on every machine that runs microscope, needs no download, is real text with
real structure, and has a natural out-of-domain partner -- the English prose of the interpreter's
bundled documentation topics (``pydoc_data.topics``). A user can point a ``CorpusSpec`` at their own
files instead.

Determinism: files are listed in sorted order of their path relative to the corpus root (never an
absolute path, so two installs of the same Python give the same corpus), the train/validation split
is decided per FILE by a hash of that relative path (no file contributes to both), and a ``max_bytes``
cap keeps the files that come first in hash order (an even sample of the library, not just the files
starting with ``a``). The SHA-256 over the split file list, the bytes, and the out-of-domain text is
``Corpus.sha256``; records carry it so results on different corpora are never compared silently.

Excluded from the standard library: ``site-packages``/``dist-packages`` (not the standard library),
test suites (``test``/``tests``/``idle_test`` folders: huge, and full of deliberately odd files),
``pydoc_data`` (it *is* the out-of-domain text), and build-specific files whose content depends on how
this interpreter was configured (``_sysconfigdata_*``, the ``config-*`` folder).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from microscope.workloads.tokenizer import EOS

__all__ = ["Corpus", "CorpusSpec", "Document", "load_corpus", "pydoc_topics", "stdlib_files"]

_EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "pydoc_data"}
)
_DEFAULT_SUFFIXES = (".txt", ".md", ".rst", ".py")


@dataclass(frozen=True)
class CorpusSpec:
    """Which text to train and evaluate on.

    ``kind="stdlib"``: the running Python's standard-library ``.py`` files (``paths`` must be empty).
    ``kind="files"``: the files and folders in ``paths`` (folders are walked for ``suffixes``).
    ``max_bytes`` caps the in-domain bytes (train + validation); ``val_fraction`` is the expected
    fraction of files held out for validation. ``ood_paths`` replaces the default out-of-domain split
    (the interpreter's documentation topics) with the user's own files.
    """

    kind: str = "stdlib"
    paths: tuple[str, ...] = ()
    max_bytes: int | None = None
    val_fraction: float = 0.1
    suffixes: tuple[str, ...] = _DEFAULT_SUFFIXES
    ood_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("stdlib", "files"):
            raise ValueError(f"CorpusSpec.kind must be 'stdlib' or 'files', got {self.kind!r}")
        if self.kind == "stdlib" and self.paths:
            raise ValueError("CorpusSpec(kind='stdlib') takes no paths; use kind='files' for your own text")
        if self.kind == "files" and not self.paths:
            raise ValueError("CorpusSpec(kind='files') needs at least one path (a file or a folder)")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"CorpusSpec.val_fraction must lie in (0, 1), got {self.val_fraction}")
        if self.max_bytes is not None and self.max_bytes <= 0:
            raise ValueError(f"CorpusSpec.max_bytes must be positive (or None), got {self.max_bytes}")
        # Lists from a YAML config become tuples so the spec stays hashable (load_corpus caches on it).
        object.__setattr__(self, "paths", tuple(str(p) for p in self.paths))
        object.__setattr__(self, "suffixes", tuple(self.suffixes))
        object.__setattr__(self, "ood_paths", tuple(str(p) for p in self.ood_paths))


@dataclass(frozen=True)
class Document:
    """One file (or documentation topic): a stable name and its bytes."""

    name: str
    data: bytes


@dataclass(frozen=True)
class Corpus:
    """Token streams of the three splits, the documents behind them, and the corpus hash.

    Token tensors are 1-D ``int32`` (ids < 259); each document is followed by one EOS token. Batching
    helpers (``microscope.workloads.batching``) cut windows from them and return ``int64``.
    """

    spec: CorpusSpec
    train: torch.Tensor
    val: torch.Tensor
    ood: torch.Tensor
    train_files: tuple[str, ...]
    val_files: tuple[str, ...]
    ood_names: tuple[str, ...]
    sha256: str

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary for run records (``env.corpus``)."""
        return {
            "kind": self.spec.kind,
            "sha256": self.sha256,
            "train_files": len(self.train_files),
            "val_files": len(self.val_files),
            "train_tokens": int(self.train.numel()),
            "val_tokens": int(self.val.numel()),
            "ood_documents": len(self.ood_names),
            "ood_tokens": int(self.ood.numel()),
            "max_bytes": self.spec.max_bytes,
            "python": sys.version.split()[0],
        }


def _hash_unit(tag: str, name: str) -> float:
    """A number in [0, 1) fixed by ``name`` alone (stable across processes, unlike ``hash()``)."""
    digest = hashlib.sha256(f"{tag}\x1f{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _walk(root: Path, suffixes: Sequence[str], excluded: frozenset[str] = frozenset()) -> list[Path]:
    """Regular files under ``root`` with one of ``suffixes``, skipping excluded folders and symlinks."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in excluded and not d.startswith("config-")]
        for name in filenames:
            path = Path(dirpath) / name
            if name.endswith(tuple(suffixes)) and not path.is_symlink() and path.is_file():
                found.append(path)
    return found


def stdlib_root() -> Path:
    """The folder of the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[Document]:
    """The standard library's ``.py`` files (see the module docstring for what is excluded), sorted."""
    root = stdlib_root()
    docs = []
    for path in _walk(root, (".py",), _EXCLUDED_DIRS):
        rel = path.relative_to(root).as_posix()
        if Path(rel).name.startswith("_sysconfigdata"):
            continue
        docs.append(Document(rel, path.read_bytes()))
    return sorted(docs, key=lambda d: d.name)


def user_files(paths: Iterable[str], suffixes: Sequence[str]) -> list[Document]:
    """The user's files: a file is named by its file name, a folder's files by ``folder/relative``."""
    docs: dict[str, Document] = {}
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_file():
            docs[path.name] = Document(path.name, path.read_bytes())
        elif path.is_dir():
            for file in _walk(path, suffixes):
                name = f"{path.resolve().name}/{file.relative_to(path).as_posix()}"
                docs[name] = Document(name, file.read_bytes())
        else:
            raise FileNotFoundError(f"corpus path {raw!r} is neither a file nor a folder")
    if not docs:
        raise ValueError(f"corpus paths {list(paths)} hold no files ending in {list(suffixes)}")
    return sorted(docs.values(), key=lambda d: d.name)


def pydoc_topics() -> list[Document]:
    """The interpreter's bundled documentation topics (English prose), sorted by topic key."""
    from pydoc_data.topics import topics

    return [Document(key, topics[key].encode("utf-8")) for key in sorted(topics)]


def _cap(docs: list[Document], max_bytes: int | None) -> list[Document]:
    """Keep files in hash order while they fit in ``max_bytes``; return them sorted by name."""
    if max_bytes is None:
        return docs
    kept, total = [], 0
    for doc in sorted(docs, key=lambda d: (_hash_unit("cap", d.name), d.name)):
        if total + len(doc.data) <= max_bytes:
            kept.append(doc)
            total += len(doc.data)
    if not kept:
        smallest = min(len(d.data) for d in docs)
        raise ValueError(f"max_bytes={max_bytes} is smaller than the smallest file ({smallest} bytes)")
    return sorted(kept, key=lambda d: d.name)


def _split(docs: list[Document], val_fraction: float) -> tuple[list[Document], list[Document]]:
    """Split by file: validation = files whose path hash falls below ``val_fraction``.

    With very few files the rule may pick none (or all); then the file with the lowest hash is the
    whole validation split, so both splits are always non-empty.
    """
    if len(docs) < 2:
        raise ValueError("a corpus needs at least two files to split into train and validation")
    val = [d for d in docs if _hash_unit("split", d.name) < val_fraction]
    if not val or len(val) == len(docs):
        val = [min(docs, key=lambda d: _hash_unit("split", d.name))]
    names = {d.name for d in val}
    return [d for d in docs if d.name not in names], val


def _tokens(docs: Sequence[Document]) -> torch.Tensor:
    """Concatenated bytes of ``docs``, each followed by EOS, as an int32 tensor."""
    total = sum(len(d.data) + 1 for d in docs)
    out = np.empty(total, dtype=np.int32)
    pos = 0
    for doc in docs:
        n = len(doc.data)
        out[pos : pos + n] = np.frombuffer(doc.data, dtype=np.uint8)
        out[pos + n] = EOS
        pos += n + 1
    return torch.from_numpy(out)


def _digest(train: Sequence[Document], val: Sequence[Document], ood: Sequence[Document]) -> str:
    """SHA-256 over every split's document names, sizes and bytes, in order."""
    h = hashlib.sha256(b"microscope-corpus-v1\0")
    for split, docs in (("train", train), ("val", val), ("ood", ood)):
        for doc in docs:
            h.update(f"{split}\0{doc.name}\0{len(doc.data)}\0".encode())
            h.update(doc.data)
    return h.hexdigest()


@functools.lru_cache(maxsize=4)
def load_corpus(spec: CorpusSpec = CorpusSpec()) -> Corpus:
    """Read, split, tokenize and hash the corpus ``spec`` describes (cached per spec in-process).

    The returned tensors are shared between callers of the same spec: treat them as read-only.
    """
    if spec.kind == "stdlib":
        docs = stdlib_files()
    else:
        docs = user_files(spec.paths, spec.suffixes)
    train, val = _split(_cap(docs, spec.max_bytes), spec.val_fraction)
    ood = user_files(spec.ood_paths, spec.suffixes) if spec.ood_paths else pydoc_topics()
    return Corpus(
        spec=spec,
        train=_tokens(train),
        val=_tokens(val),
        ood=_tokens(ood),
        train_files=tuple(d.name for d in train),
        val_files=tuple(d.name for d in val),
        ood_names=tuple(d.name for d in ood),
        sha256=_digest(train, val, ood),
    )
