"""Process isolation, resume and executors through the real CLI: crashes, hangs, kills and interrupts.

Every run here is a real ``microscope run`` of a small config; the planted_crashes candidates abort,
segfault and hang for real in spawned worker processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from microscope import cli
from microscope.executors.groups import read_group_log
from microscope.store.records import read_records

ROOT = Path(__file__).resolve().parents[1]
CRASHES = ROOT / "ablations" / "planted_crashes.yaml"
FAST = ["dimensions.throughput.rounds=3", "dimensions.throughput.reps=1", "dimensions.throughput.warmup=1"]


def _run(args: list[str]) -> int:
    return cli.main(["run", *args, "--device", "cpu", "--no-progress", "--no-report"])


def _records(run_dir: Path) -> list[dict]:
    return list(read_records(run_dir))


def _only_run(root: Path) -> Path:
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    return run_dir


def test_crashing_and_hanging_candidates_fail_alone(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = _run([str(CRASHES), "--quick", "--out", str(tmp_path), "--set", "timeout_s=4",
                 "variants=[correct,aborts,segfaults,hangs]", *FAST])
    out = capsys.readouterr().out
    assert code == 1, out
    recs = _records(_only_run(tmp_path))
    by_variant: dict[str, list[dict]] = {}
    for rec in recs:
        by_variant.setdefault(rec["variant"], []).append(rec)
    # the correct candidate and the baseline are measured in every dimension
    for name in ("eager", "correct"):
        dims = {r["dimension"] for r in by_variant[name] if r["status"] == "ok"}
        assert dims == {"accuracy", "throughput", "memory"}, (name, by_variant[name])
    reasons = {name: {r["reason"] for r in by_variant[name]} for name in ("aborts", "segfaults", "hangs")}
    assert all("SIGABRT" in why for why in reasons["aborts"]), reasons
    assert all("SIGSEGV" in why for why in reasons["segfaults"]), reasons
    assert all("timed out after 4 s" in why for why in reasons["hangs"]), reasons
    assert all(r["status"] == "failed" for n in reasons for r in by_variant[n])
    (group,) = read_group_log(_only_run(tmp_path))
    assert group["status"] == "failed" and set(group["culprits"]) == {"aborts", "segfaults", "hangs"}
    assert "trial group(s) failed" in out and "--retry-failed" in out
    # the report says so before any verdict, one line per variant that took the worker down
    assert cli.main(["report", str(_only_run(tmp_path)), "--out", str(tmp_path / "rep"), "--format", "md"]) == 0
    md = next((tmp_path / "rep").glob("*.md")).read_text()
    top = md[: md.index("**accuracy**")]
    assert "1 of 1 trial groups failed" in top and "--retry-failed" in top
    for name, why in (("aborts", "SIGABRT"), ("segfaults", "SIGSEGV"), ("hangs", "timed out after 4 s")):
        assert any(f": {name}: " in line and why in line for line in top.splitlines()), (name, top)


def test_inline_executor_dies_with_the_process(tmp_path: Path) -> None:
    """Why isolation exists: the same abort inline kills the run itself (SIGABRT, nothing after)."""
    done = subprocess.run([sys.executable, "-m", "microscope.cli", "run", str(CRASHES), "--quick", "--device", "cpu",
                           "--executor", "inline", "--out", str(tmp_path), "--no-progress", "--no-report",
                           "--set", "variants=[aborts]", *FAST], capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGABRT


def _toy_config(tmp_path: Path, rows: str = "[9, 17, 33, 65]") -> Path:
    """planted_crashes with only its correct candidate: one cheap group per row count."""
    cfg = tmp_path / "softmax.yaml"
    cfg.write_text(CRASHES.read_text(encoding="utf-8").replace("plugin: planted_crashes", f"plugin: planted_crashes\n"
                   f"variants: [correct]\ncases: {{rows: {rows}}}"), encoding="utf-8")
    cfg.write_text(cfg.read_text().replace("seed: 0", "seed: 3") + "\n")
    return cfg


def _trial_keys(recs: list[dict]) -> list[tuple]:
    return sorted((r["variant"], r["case_id"], r["dimension"], r["metric"], r["seed"]) for r in recs)


def _accuracy_values(recs: list[dict]) -> dict[tuple, float]:
    return {(r["variant"], r["case_id"], r["metric"]): r["value"] for r in recs if r["dimension"] == "accuracy"}


def test_sigterm_stops_cleanly_and_resume_completes_the_run(tmp_path: Path) -> None:
    cfg = _toy_config(tmp_path)
    ref_code = _run([str(cfg), "--out", str(tmp_path / "ref")])
    assert ref_code == 0
    ref = _records(_only_run(tmp_path / "ref"))

    out = tmp_path / "cut"
    proc = subprocess.Popen([sys.executable, "-m", "microscope.cli", "run", str(cfg), "--device", "cpu", "--out",
                             str(out), "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # stop it once one group is finished and before the last
        logs = list(out.glob("*/groups.jsonl"))
        if logs and logs[0].read_text().count("\n") >= 1:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=120)
    run_dir = _only_run(out)
    state = json.loads((run_dir / "run.json").read_text())
    if state["groups_finished"] < state["groups_planned"]:  # it was cut (on a fast machine it may have ended)
        assert proc.returncode == 130, text
        assert state["status"] == "interrupted" and "microscope resume" in text
        assert list(run_dir.glob("*.md")), "the reports of what finished are written"
    assert cli.main(["resume", str(run_dir), "--no-progress", "--no-report"]) == 0
    got = _records(run_dir)
    assert _trial_keys(got) == _trial_keys(ref)  # every trial exactly once
    assert _accuracy_values(got) == _accuracy_values(ref)  # bit for bit on CPU
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"


SLOW_ARM = '''
import os
import time
from pathlib import Path

from microscope.api import Ablation, Arm, Role, register


def _stall(model):
    Path(os.environ["SLOW_ARM_FLAG"]).touch()  # the baseline arm of this seed is done: its records are sent
    time.sleep(300)


@register("slow_second_arm")
class SlowSecondArm(Ablation):
    """A baseline that trains in seconds and an arm that never finishes."""

    arms = {"base": Arm(Role.BASELINE, "the workload as is"),
            "stalls": Arm(description="its patch sleeps", patch=_stall)}
'''


def _slow_arm_run(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A one-seed model-level config of ``SLOW_ARM``, the file its stalling arm touches, and the runs folder."""
    (tmp_path / "slow_arm.py").write_text(SLOW_ARM)
    cfg = tmp_path / "slow.yaml"
    cfg.write_text("plugin: slow_second_arm\nplugins: [slow_arm.py]\nlevel: model\nworkload:\n  seeds: 1\n"
                   "  steps: 4\n  batch_size: 4\n  eval_tokens: 512\n  decode_tokens: 2\n"
                   "  model: {d_model: 32, n_heads: 2, context: 32}\n  corpus: {max_bytes: 1000000}\n")
    return cfg, tmp_path / "stalling", tmp_path / "runs"


def test_an_interrupted_model_level_seed_keeps_its_finished_arms_until_a_resume(tmp_path: Path) -> None:
    """SIGTERM while a seed's second arm runs: the baseline arm's records are kept and reported (the group has
    no groups.jsonl line), and a resume drops them to rerun the seed whole."""
    from microscope.executors.groups import Resume

    cfg, flag, out = _slow_arm_run(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "microscope.cli", "run", str(cfg), "--device", "cpu", "--out",
                             str(out), "--no-progress", "--no-report", "--executor", "local"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "SLOW_ARM_FLAG": str(flag)})
    deadline = time.monotonic() + 240
    while not flag.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert flag.exists(), proc.communicate(timeout=60)[0]
    proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, text
    run_dir = _only_run(out)
    kept = _records(run_dir)
    assert kept and {r["variant"] for r in kept} == {"base"}, text
    assert {"final_loss", "val_loss"} <= {r["metric"] for r in kept if r["status"] == "ok"}
    assert read_group_log(run_dir) == []  # the seed never finished
    assert f"{len(kept)} record(s) of the groups cut short are kept" in text
    resume = Resume.prepare(run_dir)
    assert resume.dropped_records == len(kept) and not _records(run_dir)  # the seed reruns whole


def test_a_cut_groups_records_are_on_disk_before_its_worker_is_killed(tmp_path: Path, monkeypatch) -> None:
    """A killed CUDA worker can take seconds to go, and a supervisor's SIGKILL (``timeout -k``) may follow the
    SIGTERM within them: the kept records must already be written when the kill starts."""
    import threading

    from microscope.executors import local

    cfg, flag, out = _slow_arm_run(tmp_path)
    monkeypatch.setenv("SLOW_ARM_FLAG", str(flag))
    on_disk_at_kill: list[int] = []
    real_kill = local.Worker.kill

    def kill(worker: local.Worker) -> None:
        if worker.attempt is not None and worker.attempt.records:  # the stalled group's worker
            on_disk_at_kill.append(len(_records(_only_run(out))))
        real_kill(worker)

    monkeypatch.setattr(local.Worker, "kill", kill)

    def interrupt() -> None:
        deadline = time.monotonic() + 240
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # the baseline arm's last records reach the parent's pipe
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=interrupt, daemon=True).start()
    code = cli.main(["run", str(cfg), "--device", "cpu", "--out", str(out), "--no-progress", "--no-report",
                     "--executor", "local"])
    assert code == 130 and flag.exists()
    kept = _records(_only_run(out))
    assert kept and {r["variant"] for r in kept} == {"base"}
    assert on_disk_at_kill == [len(kept)]


def test_resume_drops_a_cut_group_and_a_torn_last_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = _toy_config(tmp_path, "[9, 17]")
    assert _run([str(cfg), "--out", str(tmp_path), "--executor", "inline"]) == 0
    run_dir = _only_run(tmp_path)
    full = _records(run_dir)
    groups = (run_dir / "groups.jsonl").read_text().splitlines()
    (run_dir / "groups.jsonl").write_text(groups[0] + "\n")  # the second group never said it finished
    with (run_dir / "records.jsonl").open("a") as fh:
        fh.write('{"run_id": "x", "plugin": "flash_at')  # a kill in the middle of a write
    capsys.readouterr()
    assert cli.main(["run", str(cfg), "--resume", str(run_dir), "--no-progress", "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "(resumed)" in out
    got = _records(run_dir)
    assert _trial_keys(got) == _trial_keys(full) and _accuracy_values(got) == _accuracy_values(full)


def test_resume_refuses_a_changed_config_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = _toy_config(tmp_path, "[9]")
    assert _run([str(cfg), "--out", str(tmp_path), "--executor", "inline"]) == 0
    run_dir = _only_run(tmp_path)
    cfg.write_text(cfg.read_text().replace("seed: 3", "seed: 4"))
    assert cli.main(["resume", str(run_dir), "--no-progress", "--no-report"]) == 2
    assert "changed since the run started" in capsys.readouterr().err
    assert cli.main(["resume", str(run_dir), "--no-progress", "--no-report", "--force"]) == 0
    assert cli.main(["resume", str(tmp_path / "nothing"), "--no-progress"]) == 2


TWO_ARMS = '''
from microscope.api import Ablation, Arm, Role, register


@register("two_quick_arms")
class TwoQuickArms(Ablation):
    """A baseline and an arm that trains the same model: seeds that take a second each."""

    arms = {"base": Arm(Role.BASELINE, "the workload as is"),
            "same": Arm(description="no patch", patch=lambda model: None)}
'''


def test_a_forced_resume_adds_seeds_to_a_finished_run_and_remembers_them(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    """Raising ``workload.seeds`` on a finished model-level run trains only the new seeds, keeps the old ones bit
    for bit, and run.json takes the new count, so a later plain resume continues the larger run."""
    (tmp_path / "two_arms.py").write_text(TWO_ARMS)
    cfg = tmp_path / "two.yaml"
    cfg.write_text("plugin: two_quick_arms\nplugins: [two_arms.py]\nlevel: model\nworkload:\n  seeds: 1\n"
                   "  steps: 3\n  batch_size: 4\n  eval_tokens: 256\n  decode_tokens: 2\n"
                   "  model: {d_model: 32, n_heads: 2, context: 32}\n  corpus: {max_bytes: 1000000}\n"
                   "dimensions: {throughput: {enabled: false}, memory: {enabled: false}}\n")
    out = tmp_path / "runs"
    assert _run([str(cfg), "--out", str(out), "--executor", "inline"]) in (0, 1)
    run_dir = _only_run(out)
    first = _records(run_dir)
    groups = [e["group"] for e in read_group_log(run_dir)]
    assert groups[-1] == "seed 0"
    more = ["--set", "workload.seeds=2", "--executor", "inline", "--no-progress", "--no-report"]
    assert cli.main(["run", str(cfg), "--resume", str(run_dir), *more]) == 2  # a changed run needs --force
    assert cli.main(["run", str(cfg), "--resume", str(run_dir), *more, "--force"]) in (0, 1)
    assert [e["group"] for e in read_group_log(run_dir)] == [*groups, "seed 1"]
    two = _records(run_dir)
    (seed_0,) = {r["seed"] for r in first}
    assert len({r["seed"] for r in two}) == 2 and len(two) == 2 * len(first)
    assert _accuracy_values([r for r in two if r["seed"] == seed_0]) == _accuracy_values(first)
    state = json.loads((run_dir / "run.json").read_text())
    assert state["overrides"] == {"workload.seeds": 2} and state["groups_planned"] == len(groups) + 1
    # the same through ``resume --set``, on top of the overrides run.json now holds
    more = ["--set", "workload.seeds=3", "--executor", "inline", "--no-progress", "--no-report"]
    assert cli.main(["resume", str(run_dir), *more]) == 2
    assert cli.main(["resume", str(run_dir), *more, "--force"]) in (0, 1)
    got = _records(run_dir)
    assert len({r["seed"] for r in got}) == 3 and len(got) == 3 * len(first)
    state = json.loads((run_dir / "run.json").read_text())
    assert state["overrides"] == {"workload.seeds": 3} and state["status"] == "complete"
    fewer = ["--set", "workload.seeds=1", "--force", "--no-progress", "--no-report"]
    assert cli.main(["resume", str(run_dir), *fewer]) == 2  # finished seeds are never silently dropped
    assert "cannot remove them" in capsys.readouterr().err
    assert json.loads((run_dir / "run.json").read_text())["overrides"] == {"workload.seeds": 3}
    assert cli.main(["resume", str(run_dir), "--no-progress", "--no-report", "--executor", "inline"]) in (0, 1)
    assert len(_records(run_dir)) == len(got)  # nothing left to run, nothing run twice


def test_max_wall_s_leaves_a_resumable_partial_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = _toy_config(tmp_path, "[9, 17, 33]")
    code = _run([str(cfg), "--out", str(tmp_path), "--executor", "inline", "--set", "executor.max_wall_s=0.001"])
    out = capsys.readouterr().out
    assert code == 1 and "partial run (max_wall_s" in out
    run_dir = _only_run(tmp_path)
    state = json.loads((run_dir / "run.json").read_text())
    assert state["status"] == "out of budget" and state["groups_finished"] == 1
    assert cli.main(["report", str(run_dir), "--out", str(tmp_path / "rep"), "--format", "md"]) == 0
    md = next((tmp_path / "rep").glob("*.md")).read_text()
    assert "Partial run: 1 of 3 trial groups finished (max\\_wall\\_s" in md[: md.index("**accuracy**")]
    # each resume gets the same budget and finishes at least one more group
    codes = [cli.main(["resume", str(run_dir), "--no-progress", "--no-report", "--executor", "inline"]) for _ in (1, 2)]
    assert codes == [1, 0]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"


def _comparable(run_dir: Path) -> pd.DataFrame:
    table = pd.read_csv(run_dir / "comparison.csv")
    acc = table[table["dimension"] == "accuracy"]
    return acc[["candidate", "case_id", "metric", "ratio_or_delta", "verdict"]].sort_values(
        ["candidate", "case_id", "metric"]).reset_index(drop=True)


def test_two_jobs_give_the_same_records_as_one(tmp_path: Path) -> None:
    cfg = _toy_config(tmp_path, "[9, 17]")
    assert _run([str(cfg), "--out", str(tmp_path / "one")]) == 0
    assert _run([str(cfg), "--out", str(tmp_path / "two"), "--jobs", "2"]) == 0
    one, two = _only_run(tmp_path / "one"), _only_run(tmp_path / "two")
    assert _trial_keys(_records(one)) == _trial_keys(_records(two))
    assert _accuracy_values(_records(one)) == _accuracy_values(_records(two))
    pd.testing.assert_frame_equal(_comparable(one), _comparable(two))
    assert len(list((two / "workers").glob("worker-*.log"))) == 2


@pytest.mark.skipif(os.environ.get("MICROSCOPE_SKIP_RAY") == "1", reason="MICROSCOPE_SKIP_RAY=1")
def test_ray_executor_on_a_local_ray_matches_local(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    cfg = _toy_config(tmp_path, "[9, 17]")
    assert _run([str(cfg), "--out", str(tmp_path / "local")]) == 0
    assert _run([str(cfg), "--out", str(tmp_path / "ray"), "--executor", "ray", "--jobs", "2"]) == 0
    local, ray_dir = _only_run(tmp_path / "local"), _only_run(tmp_path / "ray")
    assert _trial_keys(_records(local)) == _trial_keys(_records(ray_dir))
    assert _accuracy_values(_records(local)) == _accuracy_values(_records(ray_dir))
    pd.testing.assert_frame_equal(_comparable(local), _comparable(ray_dir))


def test_workers_use_the_parents_threads_whatever_ray_sets(tmp_path: Path) -> None:
    """Ray exports OMP_NUM_THREADS=1 to its workers; a CPU matmul's bits depend on the thread count, so a
    worker takes the parent's count (flash_attn's grad_q rel_err differed in its 4th digit without this)."""
    cfg = _toy_config(tmp_path, "[9]")
    code = (f"import torch; from microscope.executors.worker import RunSpec\n"
            f"spec = RunSpec(config_path={str(cfg)!r}, device='cpu', quick=True, overrides={{}}, run_id='t', "
            f"out_root={str(tmp_path)!r}, env={{}}, cwd={str(tmp_path)!r}, threads=2)\n"
            "before = torch.get_num_threads(); spec.build(); print(before, torch.get_num_threads())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "2"]


class _PlanCache:
    """Stands in for a kernel's per-shape cache: a module-level object that keeps a tensor alive."""

    def __init__(self) -> None:
        self.table = None


def test_a_leak_note_names_the_new_tensors_and_what_holds_them() -> None:
    """The worker's leak note (GPU only in a run) is built from the garbage collector's live tensors: a
    tensor kept by an object's attribute after the first group is named with its size and holder."""
    import torch

    from microscope.executors.worker import leak_suspects, live_tensors

    first = live_tensors("cpu")
    cache = _PlanCache()
    cache.table = torch.zeros(1024, 1024)  # 4 MiB born after the "first group"
    note = leak_suspects(6 * 2**20, "cpu", first)
    assert "(1024, 1024) float32 4.0 MiB held by a _PlanCache" in note
    assert note.startswith("4 MiB in ") and "2 MiB held by no Python tensor" in note


def test_a_leak_note_finds_a_holder_the_worker_froze() -> None:
    """The worker freezes the collector's view of its imports (gc.freeze); a module-level cache made then
    must still be named as the holder of a tensor it keeps later."""
    import gc

    import torch

    from microscope.executors.worker import leak_suspects, live_tensors

    cache = _PlanCache()
    gc.freeze()
    try:
        first = live_tensors("cpu")
        cache.table = torch.zeros(512, 1024)  # 2 MiB, kept by the frozen object
        assert "(512, 1024) float32 2.0 MiB held by a _PlanCache" in leak_suspects(2 * 2**20, "cpu", first)
        assert gc.get_freeze_count() > 0  # frozen again after the listing
    finally:
        gc.unfreeze()


def test_the_leak_listing_leaves_out_fake_tensors() -> None:
    """torch.compile keeps FakeTensors of its example inputs (dynamo's TrackedFake): they report the input's
    device and size but hold no memory, so a note blaming them (paged_attention's "1024 MiB held by a
    TrackedFake" on the H200) pointed at the wrong thing and replaced a healthy worker."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from microscope.executors.worker import leak_suspects, live_tensors

    first = live_tensors("cpu")
    with FakeTensorMode():
        fake = torch.empty(1024, 1024)
    assert fake.device.type == "cpu" and id(fake) not in live_tensors("cpu")
    assert leak_suspects(2**20, "cpu", first).startswith("0 MiB in 0 Python-held tensor(s)")


def test_the_leak_listing_skips_tensors_without_a_storage() -> None:
    """vmap's batched tensors (flex_attention's compile has them) have no storage: listing live tensors
    while one exists must not raise (it once ended H200 workers after their first group)."""
    import torch

    from microscope.executors.worker import live_tensors

    seen = []

    def body(x):
        seen.append(live_tensors("cpu"))
        return x * 2

    out = torch.func.vmap(body)(torch.ones(3, 2))
    assert out.shape == (3, 2) and seen and all(n >= 0 for n in seen[0].values())


def test_a_prestarted_worker_imports_while_the_run_prepares_and_serves_the_first_group(tmp_path: Path) -> None:
    """``prestart`` (called before a GPU run's precompile step) starts the first worker; it reports ready
    while idle, the first group goes to it rather than to a second process, and ``close`` ends it."""
    from microscope.executors.local import LocalExecutor
    from microscope.executors.worker import RunSpec

    cfg = _toy_config(tmp_path, "[9]")
    spec = RunSpec(config_path=str(cfg), device="cpu", quick=True, overrides={}, run_id="early",
                   out_root=str(tmp_path), env={}, cwd=str(tmp_path), threads=1)
    executor = LocalExecutor(None, spec)  # type: ignore[arg-type] - the runner is only read by run()
    executor.prestart()
    executor.prestart()  # once: a second call starts nothing
    (worker,) = executor.idle
    assert worker.conn.poll(120) and worker.conn.recv() == ("ready",)
    assert executor._worker() is worker and executor._started == 1
    executor.idle.append(worker)
    executor.close()
    assert worker.proc.exitcode == 0 and not executor.idle


def test_an_early_worker_imports_before_its_run_is_known_then_serves_the_run_with_one_log(tmp_path: Path) -> None:
    """``microscope run`` starts its first worker before the CLI imports torch; the executor tells it the run
    later: the worker builds that runner, its log (start-up lines included) moves into the run's folder."""
    from microscope.executors.local import LocalExecutor, early_worker
    from microscope.executors.worker import RunSpec

    cfg = _toy_config(tmp_path, "[9]")
    early = early_worker(cfg, None)
    assert early is not None and not early.adopted
    first_log = early.log
    spec = RunSpec(config_path=str(cfg), device="cpu", quick=True, overrides={}, run_id="early",
                   out_root=str(tmp_path), env={}, cwd=str(tmp_path), threads=1)
    executor = LocalExecutor(None, spec, early=early)  # type: ignore[arg-type] - the runner is only read by run()
    assert early.adopted
    executor.prestart()
    (worker,) = executor.idle
    assert worker is early
    assert worker.conn.poll(120) and worker.conn.recv() == ("ready",)
    assert worker.log == tmp_path / "early" / "workers" / "worker-0.log" and not first_log.exists()
    assert "before its run was known" in worker.log.read_text()
    executor.close()
    assert worker.proc.exitcode == 0


def test_no_early_worker_where_the_run_names_another_executor_and_an_unused_one_leaves_nothing(tmp_path: Path) -> None:
    from microscope.executors.local import early_worker

    cfg = _toy_config(tmp_path, "[9]")
    assert early_worker(cfg, "inline") is None and early_worker(tmp_path / "missing.yaml", None) is None
    inline = tmp_path / "inline.yaml"
    inline.write_text(cfg.read_text() + "profiles:\n  cpu:\n    executor: {kind: inline}\n")
    assert early_worker(inline, None) is None
    unused = early_worker(cfg, "local")
    assert unused is not None
    log = unused.log
    unused.discard()
    assert not unused.proc.is_alive() and not log.exists()


def test_the_microscope_command_runs_on_its_early_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The console entry point (``main(early_worker=True)``): the run's one worker is the early one, and no
    log of it is left outside the run's folder."""
    import tempfile

    # a temporary folder of this test's own: another test file's early worker, on the other xdist process,
    # may write its log to the shared one meanwhile
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    before = set(Path(tempfile.gettempdir()).glob("microscope-worker-*.log"))
    cfg = _toy_config(tmp_path, "[9, 17]")
    code = cli.main(["run", str(cfg), "--device", "cpu", "--no-progress", "--no-report", "--out", str(tmp_path / "r"),
                     *sum((["--set", s] for s in FAST), [])], early_worker=True)
    assert code == 0
    run_dir = _only_run(tmp_path / "r")
    assert [p.name for p in (run_dir / "workers").iterdir()] == ["worker-0.log"]
    assert "before its run was known" in (run_dir / "workers" / "worker-0.log").read_text()
    assert {g["status"] for g in read_group_log(run_dir)} == {"ok"}
    assert set(Path(tempfile.gettempdir()).glob("microscope-worker-*.log")) <= before


SEMAPHORE_PLUGIN = '''
import multiprocessing
import torch
from microscope.api import Ablation, Tolerance, baseline, candidate, grid, randn, register

HELD = []  # a semaphore the worker process made and keeps, as a compile pool's queue does


@register("semaphore_probe")
class Probe(Ablation):
    variants = {"base": baseline(lambda x: torch.tanh(x)), "same": candidate(lambda x: torch.tanh(x))}
    cases = grid(n=[9], dtype=["fp32"])
    tolerance = {"*": Tolerance(rtol=1e-6, atol=1e-7)}

    def inputs(self, case, gen, device):
        HELD.append(multiprocessing.get_context("spawn").Lock())
        return {"x": randn((case["n"],), case.dtype, gen, device)}
'''


def test_a_worker_leaves_no_semaphore_of_its_own_behind(tmp_path: Path) -> None:
    """A worker's semaphores (a compile pool's queue) are released when it leaves: Python's resource tracker
    would otherwise warn about leaked semaphores at the end of the run's console."""
    (tmp_path / "probe.py").write_text(SEMAPHORE_PLUGIN)
    cfg = tmp_path / "probe.yaml"
    cfg.write_text("plugin: semaphore_probe\nplugins: [probe.py]\ndimensions:\n"
                   "  throughput: {warmup: 1, rounds: 2, reps: 1}\n  memory: {enabled: false}\n")
    done = subprocess.run([sys.executable, "-m", "microscope.cli", "run", str(cfg), "--device", "cpu", "--no-progress",
                           "--no-report", "--out", str(tmp_path / "r")], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "leaked semaphore" not in done.stderr, done.stderr
