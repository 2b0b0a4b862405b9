"""Mutated configs through ``microscope validate``: exit 0 or 2 with a message naming the file, never a traceback.

Every mutant starts from one of the shipped configs in ``ablations/`` and gets one to three seeded
mutations: keys deleted, duplicated or renamed, values of the wrong type, NaN/inf/huge/negative numbers,
nulls, deep nesting, aliases and alias bombs, non-UTF-8 bytes and control characters, rich markup
(``[/]``, ``[bold red]``) in names and values, unhashable case values, long strings, odd plugin paths
and plugins that raise, truncations and random byte flips. Each goes through the same code path as
``microscope validate FILE`` (``microscope.cli.main`` in-process, output captured).

CI runs a few hundred mutants (seed 0, or ``MICROSCOPE_FUZZ_SEED``). For a big run::

    python tests/test_config_fuzz.py --mutants 10000 [--seed 1] [--keep crashes/]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "ablations").glob("*.yaml"))
CI_MUTANTS = 300
#: No mutant may take longer than this to validate (an alias bomb used to take 88 s and 6 GB).
SLOWEST_ALLOWED_S = 2.0

#: Plugin files the mutants may point at, written next to them: each fails to import in its own way.
PLUGIN_FILES = {
    "raising_plugin.py": "import math\n\n\ndef half(x):\n    return x / 0\n\n\nVALUE = half(math.pi)\n",
    "syntax_plugin.py": "def broken(:\n    pass\n",
    "exit_plugin.py": "import sys\n\nsys.exit(3)\n",
    "binary_plugin.py": "x = 1\n\x00\x01\x02\n",
}
PLUGIN_SOURCES = [
    "raising_plugin.py", "syntax_plugin.py", "exit_plugin.py", "binary_plugin.py", "~nobody_here/x.py",
    "~/surely_not_here.py", "a" * 5000 + ".py", "b/" * 3000 + "x.py", "/dev/null", ".", "..", "",
    "a b c", "no_such_module_xyz", "[/]", "[bold red]x[/]", "x\\0y.py", "../" * 50 + "x.py", "os.path",
    "tests/plugins/", "C:\\\\plugins\\\\x.py",
]
WRONG_TYPES = ["text", "'42'", "[1, 2]", "{a: 1}", "true", "null", "3.5", "-7", "''", "[]", "{}", "[[1], {b: 2}]"]
NUMBERS = [".nan", ".NaN", ".inf", "-.inf", "1e30", "1.0e30", "-1", "0", "-0.0", "10" * 40, "9" * 5000,
           "99999999999999999999", "1e-320", "0x7fffffffffffffff", "0.5", "1.0", "100001", "2.0e+400"]
MARKUP = ["[/]", "[bold red]", "[bold red]x[/bold red]", "[link=file:///etc/passwd]x[/link]", "[/bold]",
          "\\[escaped]", "[red", "]"]
TAGS = ["!!python/object/apply:os.system ['true']", "!!binary aGVsbG8=", "!!timestamp 2001-12-14",
        "!custom x", "!!set {a, b}", "!!omap [a: 1]", "!!python/name:os.system"]
CONTROL = [b"\x00", b"\x07", b"\x1b[31m", b"\x7f", b"\x0c", b"\xc2\x85", b"\xef\xbb\xbf"]
ODD_KEYS = ["<<", "? [a, b]", "'': 1", "1", "null", "true", "a.b.c", "x" * 300]

Mutation = Callable[[bytes, random.Random], bytes]


# --- mutations ------------------------------------------------------------------------------------


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def _value_lines(lines: list[bytes]) -> list[int]:
    """Indexes of lines holding ``key: value``."""
    return [i for i, line in enumerate(lines) if re.match(rb"^\s*[\w.-]+:\s*\S", line)]


def _key_lines(lines: list[bytes]) -> list[int]:
    return [i for i, line in enumerate(lines) if re.match(rb"^\s*[\w.-]+:", line)]


def _set_value(data: bytes, rng: random.Random, values: list[str] | list[bytes]) -> bytes:
    lines = _lines(data)
    picks = _value_lines(lines)
    if not picks:
        return data
    i = rng.choice(picks)
    value = rng.choice(values)
    value = value.encode() if isinstance(value, str) else value
    key, _, _ = lines[i].partition(b":")
    lines[i] = key + b": " + value
    return b"\n".join(lines)


def delete_line(data: bytes, rng: random.Random) -> bytes:
    lines = _lines(data)
    picks = _key_lines(lines) or list(range(len(lines)))
    del lines[rng.choice(picks)]
    return b"\n".join(lines)


def duplicate_line(data: bytes, rng: random.Random) -> bytes:
    lines = _lines(data)
    i = rng.choice(_key_lines(lines) or [0])
    lines.insert(i + 1, lines[i])
    return b"\n".join(lines)


def rename_key(data: bytes, rng: random.Random) -> bytes:
    lines = _lines(data)
    picks = _key_lines(lines)
    if not picks:
        return data
    i = rng.choice(picks)
    indent, key, rest = re.match(rb"^(\s*)([\w.-]+)(:.*)$", lines[i]).groups()
    edits = [key[:-1], key + b"z", key.upper(), key[::-1], rng.choice(ODD_KEYS).encode(),
             key + rng.choice(MARKUP).encode(), key.replace(b"_", b"-")]
    lines[i] = indent + rng.choice(edits) + rest
    return b"\n".join(lines)


def swap_type(data: bytes, rng: random.Random) -> bytes:
    return _set_value(data, rng, WRONG_TYPES)


def inject_number(data: bytes, rng: random.Random) -> bytes:
    lines = _lines(data)
    numeric = [i for i in _value_lines(lines) if re.match(rb"^\s*[\w.-]+:\s*-?[\d.]", lines[i])]
    if numeric and rng.random() < 0.8:
        i = rng.choice(numeric)
        key, _, _ = lines[i].partition(b":")
        lines[i] = key + b": " + rng.choice(NUMBERS).encode()
        return b"\n".join(lines)
    return _set_value(data, rng, NUMBERS)


def null_value(data: bytes, rng: random.Random) -> bytes:
    return _set_value(data, rng, ["null", "~", "", "Null"])


def deep_nesting(data: bytes, rng: random.Random) -> bytes:
    depth = rng.choice([5, 31, 32, 33, 100, 3000, 50_000])
    if rng.random() < 0.5:
        nested = b"[" * depth + b"]" * depth
    else:
        nested = b"{a: " * depth + b"1" + b"}" * depth
    return _set_value(data, rng, [nested])


def block_nesting(data: bytes, rng: random.Random) -> bytes:
    depth = rng.choice([10, 40, 400])
    block = b"\n".join(b"  " * i + b"k%d:" % i for i in range(depth)) + b" 1"
    return data + b"\n" + block + b"\n"


def aliases(data: bytes, rng: random.Random) -> bytes:
    lines = _lines(data)
    picks = [i for i in _value_lines(lines) if re.match(rb"^[\w.-]+:", lines[i])]  # top-level keys
    if len(picks) < 2:
        return data
    a, b = rng.sample(picks, 2)
    key_a, _, value_a = lines[a].partition(b":")
    key_b, _, _ = lines[b].partition(b":")
    lines[a] = key_a + b": &anchor " + value_a.strip()
    lines[b] = key_b + b": " + rng.choice([b"*anchor", b"*undefined", b"[*anchor, *anchor]", b"&self [*self]"])
    if rng.random() < 0.3:
        lines.append(b"<<: *anchor")
    return b"\n".join(lines)


def alias_bomb(data: bytes, rng: random.Random) -> bytes:
    width, depth = rng.choice([3, 9, 12]), rng.choice([3, 6, 9, 12])
    names = [f"l{i}" for i in range(depth)]
    bomb = [f"{names[0]}: &{names[0]} [" + ", ".join(['"lol"'] * width) + "]"]
    for prev, name in zip(names, names[1:]):
        bomb.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * width) + "]")
    if rng.random() < 0.5:  # hide it inside a known section
        bomb = ["description: x", "workload:", "  model:"] + [f"    {line}" for line in bomb]
    return data + b"\n" + "\n".join(bomb).encode() + b"\n"


def non_utf8(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    junk = bytes(rng.randrange(0x80, 0x100) for _ in range(rng.randint(1, 4)))
    return data[:at] + junk + data[at:]


def control_chars(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.choice(CONTROL) + data[at:]


def markup(data: bytes, rng: random.Random) -> bytes:
    tag = rng.choice(MARKUP)
    choice = rng.random()
    if choice < 0.3:
        return re.sub(rb"^plugin: .*$", b"plugin: '" + tag.encode() + b"'", data, count=1, flags=re.M)
    if choice < 0.5:
        return data + b"\nvariants: ['" + tag.encode() + b"', eager]\n"
    if choice < 0.7:
        return data + b"\n" + tag.encode() + b": 1\n"
    return _set_value(data, rng, [f"'{tag}'", f"\"x {tag} y\""])


def unhashable_case(data: bytes, rng: random.Random) -> bytes:
    value = rng.choice([b"[{a: 1}]", b"[[1, 2]]", b"{x: 1}", b"[[]]", b"[{}]", b"[1, [2]]", b"[.nan]", b"[1, 1]"])
    lines = _lines(data)
    axes = [i for i, line in enumerate(lines) if re.match(rb"^\s+\w+: \[.*\]", line)]
    if axes and rng.random() < 0.7:
        i = rng.choice(axes)
        key, _, _ = lines[i].partition(b":")
        lines[i] = key + b": " + value
        return b"\n".join(lines)
    return data + b"\ncases:\n  " + rng.choice([b"seq", b"profile", b"task", b"dtype"]) + b": " + value + b"\n"


def model_cases(data: bytes, rng: random.Random) -> bytes:
    cases = rng.choice([b"{profile: [tiny]}", b"{task: [lm, recall]}", b"{seq: [128]}", b"{}"])
    return data + b"\ncases: " + cases + b"\n"


def long_string(data: bytes, rng: random.Random) -> bytes:
    text = rng.choice(["x", "[/]", "\u00e9", "ab "]) * rng.choice([300, 5000, 200_000])
    if rng.random() < 0.5:
        return _set_value(data, rng, [f"'{text}'"])
    return data + b"\n" + text.encode() + b": 1\n"


def odd_plugin(data: bytes, rng: random.Random) -> bytes:
    source = rng.choice(PLUGIN_SOURCES)
    return data + b"\nplugins: [\"" + source.encode() + b"\"]\n"


def tags(data: bytes, rng: random.Random) -> bytes:
    return _set_value(data, rng, TAGS)


def workload_profile(data: bytes, rng: random.Random) -> bytes:
    name = rng.choice(["huge", "gpu ", "TINY", "[/]", "", "null", "[tiny]", "gp"])
    if b"profile:" in data:
        return re.sub(rb"profile: \S+", b"profile: " + name.encode(), data, count=1)
    return data + b"\nworkload: {profile: " + (name.encode() or b"''") + b"}\n"


def indentation(data: bytes, rng: random.Random) -> bytes:
    lines = _lines(data)
    i = rng.randrange(len(lines))
    lines[i] = rng.choice([b"\t", b" ", b"   ", b""]) + lines[i].lstrip(b" " if rng.random() < 0.5 else b"")
    return b"\n".join(lines)


def structure(data: bytes, rng: random.Random) -> bytes:
    lines = _lines(data)
    lines.insert(rng.randrange(len(lines) + 1), rng.choice([b"---", b"...", b"- item", b"%YAML 1.1", b"? x"]))
    return b"\n".join(lines)


def big_grid(data: bytes, rng: random.Random) -> bytes:
    n = rng.choice([20, 200, 2000])
    return data + b"\ncases:\n" + b"".join(b"  %s: [%s]\n" % (axis, b", ".join(b"%d" % v for v in range(1, n + 1)))
                                            for axis in (b"seq", b"batch", b"heads"))


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def byte_flips(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def oversized(data: bytes, rng: random.Random) -> bytes:
    return data + b"\n# " + b"x" * (1 << 20) + b"\n"


MUTATIONS: dict[str, tuple[Mutation, float]] = {  # name -> (mutation, weight)
    "delete_line": (delete_line, 3), "duplicate_line": (duplicate_line, 2), "rename_key": (rename_key, 3),
    "swap_type": (swap_type, 4), "inject_number": (inject_number, 4), "null_value": (null_value, 3),
    "deep_nesting": (deep_nesting, 1.5), "block_nesting": (block_nesting, 1), "aliases": (aliases, 2),
    "alias_bomb": (alias_bomb, 1), "non_utf8": (non_utf8, 2), "control_chars": (control_chars, 1),
    "markup": (markup, 2), "unhashable_case": (unhashable_case, 2), "model_cases": (model_cases, 1),
    "long_string": (long_string, 1), "odd_plugin": (odd_plugin, 2), "tags": (tags, 1),
    "workload_profile": (workload_profile, 1), "indentation": (indentation, 1), "structure": (structure, 1),
    "big_grid": (big_grid, 0.5), "truncate": (truncate, 2), "byte_flips": (byte_flips, 3),
    "oversized": (oversized, 0.1),
}


# --- mutants and outcomes -------------------------------------------------------------------------


@dataclass
class Mutant:
    """One fuzzed input: bytes written as a config, or a path that is a folder or missing."""

    index: int
    base: str
    recipe: list[str]
    data: bytes | None
    kind: str = "file"  # file | folder | missing


def make_mutant(index: int, seed: int, shipped: list[tuple[str, bytes]]) -> Mutant:
    """Mutant ``index`` of the run seeded ``seed``: the same arguments always give the same bytes."""
    rng = random.Random(f"{seed}:{index}")
    base, data = rng.choice(shipped)
    roll = rng.random()
    if roll < 0.005:
        return Mutant(index, base, ["folder"], None, "folder")
    if roll < 0.01:
        return Mutant(index, base, ["missing"], None, "missing")
    if roll < 0.02:
        return Mutant(index, base, ["empty"], rng.choice([b"", b"\n", b"# only a comment\n", b"---\n"]))
    names = list(MUTATIONS)
    weights = [MUTATIONS[n][1] for n in names]
    recipe = rng.choices(names, weights, k=rng.choice([1, 1, 2, 3]))
    for name in recipe:
        data = MUTATIONS[name][0](data, rng)
    return Mutant(index, base, recipe, data)


@dataclass
class Outcome:
    mutant: Mutant
    path: Path
    code: int | None
    output: str
    seconds: float
    crash: str | None = None  # the traceback of an exception that escaped main()


def validate_in_process(path: Path) -> tuple[int | None, str, str | None]:
    """``microscope validate PATH`` through ``cli.main``: exit code, captured output, traceback if any."""
    from microscope.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = main(["validate", str(path)])
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 - SystemExit included: validate must return, never exit
        return None, out.getvalue() + err.getvalue(), traceback.format_exc()
    return code, out.getvalue() + err.getvalue(), None


def run_mutant(mutant: Mutant, folder: Path) -> Outcome:
    path = folder / f"mutant_{mutant.index:05d}_{mutant.base}"
    if mutant.kind == "folder":
        path.mkdir(exist_ok=True)
    elif mutant.kind == "file":
        path.write_bytes(mutant.data or b"")
    start = time.perf_counter()
    code, output, crash = validate_in_process(path)
    seconds = time.perf_counter() - start
    if mutant.kind == "file":
        path.unlink()
    return Outcome(mutant, path, code, output, seconds, crash)


@dataclass
class Summary:
    clean: int = 0  # exit 2 with a message naming the file
    accepted: int = 0  # exit 0
    crashes: list[Outcome] = field(default_factory=list)  # an exception escaped, or another exit code
    unnamed: list[Outcome] = field(default_factory=list)  # exit 2 whose message does not name the file
    slowest: Outcome | None = None


def fuzz(mutants: int, seed: int, folder: Path, progress: Callable[[int], None] | None = None) -> Summary:
    """Validate ``mutants`` seeded mutants of the shipped configs inside ``folder``."""
    for name, text in PLUGIN_FILES.items():
        (folder / name).write_text(text)
    shipped = [(p.name, p.read_bytes()) for p in SHIPPED]
    code, output, crash = validate_in_process(SHIPPED[0])  # imports the plugins once, outside the timing
    assert code == 0 and crash is None, output + (crash or "")
    summary = Summary()
    for index in range(mutants):
        outcome = run_mutant(make_mutant(index, seed, shipped), folder)
        if summary.slowest is None or outcome.seconds > summary.slowest.seconds:
            summary.slowest = outcome
        if outcome.crash is not None or outcome.code not in (0, 2):
            summary.crashes.append(outcome)
        elif outcome.code == 0:
            summary.accepted += 1
        elif outcome.path.name not in outcome.output:
            summary.unnamed.append(outcome)
        else:
            summary.clean += 1
        if progress is not None:
            progress(index + 1)
    return summary


def _describe(outcome: Outcome) -> str:
    m = outcome.mutant
    head = f"mutant {m.index} ({m.base}: {', '.join(m.recipe)}) exit {outcome.code} in {outcome.seconds:.2f} s"
    return f"{head}\n{outcome.crash or outcome.output[-2000:]}"


# --- the test -------------------------------------------------------------------------------------


def test_mutated_configs_exit_0_or_2_and_name_the_file(tmp_path):
    seed = int(os.environ.get("MICROSCOPE_FUZZ_SEED", "0"))
    summary = fuzz(CI_MUTANTS, seed, tmp_path)
    assert not summary.crashes, "\n\n".join(_describe(o) for o in summary.crashes[:3])
    assert not summary.unnamed, "\n\n".join(_describe(o) for o in summary.unnamed[:3])
    assert summary.slowest is not None and summary.slowest.seconds < SLOWEST_ALLOWED_S, _describe(summary.slowest)
    # the mutations must bite, and mild ones (a duplicated comment, a flipped bit in one) must pass
    assert summary.clean > CI_MUTANTS // 2 and summary.accepted > 0


def test_the_generator_is_seeded():
    shipped = [(p.name, p.read_bytes()) for p in SHIPPED]
    assert make_mutant(7, 3, shipped) == make_mutant(7, 3, shipped)
    assert {make_mutant(i, 3, shipped).data for i in range(20)} != {make_mutant(i, 4, shipped).data for i in range(20)}


# --- the big run ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fuzz `microscope validate` with mutated configs.")
    parser.add_argument("--mutants", type=int, default=CI_MUTANTS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None, help="write crashing mutants into this folder")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRITON_INTERPRET", "1")  # as tests/conftest.py does where no GPU is present

    def progress(done: int) -> None:
        if done % 1000 == 0:
            print(f"  {done} mutants", file=sys.stderr, flush=True)

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="microscope-fuzz-") as tmp:
        summary = fuzz(args.mutants, args.seed, Path(tmp), progress)
    wall = time.perf_counter() - start
    slowest = summary.slowest
    print(f"mutants:        {args.mutants} (seed {args.seed})")
    print(f"clean errors:   {summary.clean}")
    print(f"accepted:       {summary.accepted}")
    print(f"tracebacks:     {len(summary.crashes)}")
    print(f"unnamed errors: {len(summary.unnamed)}")
    if slowest is not None:
        print(f"slowest mutant: {slowest.seconds:.3f} s ({slowest.mutant.base}: {', '.join(slowest.mutant.recipe)})")
    print(f"wall time:      {wall:.1f} s")
    for outcome in (summary.crashes + summary.unnamed)[:5]:
        print("\n" + _describe(outcome))
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        for outcome in summary.crashes + summary.unnamed:
            if outcome.mutant.data is not None:
                (args.keep / outcome.path.name).write_bytes(outcome.mutant.data)
    return 1 if summary.crashes or summary.unnamed else 0


if __name__ == "__main__":
    sys.exit(main())
