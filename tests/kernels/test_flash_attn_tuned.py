"""The flash_attn tuned tables: what a GPU run records can be read back, and every committed table lists
only configurations today's autotuning would still try for that key."""
from __future__ import annotations

import multiprocessing

import pytest
import torch
from microscope_kernels.flash_attn import kernel, tuned

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _parse(key: str) -> tuple[str, dict, torch.dtype]:
    name, *args, dtype = key.split("|")
    return name, {arg.split("=")[0]: int(arg.split("=")[1]) for arg in args}, _DTYPES[dtype]


def test_table_name_is_a_slug_of_the_gpu_and_triton_minor_version():
    name = tuned.table_name("NVIDIA H200 (SXM)")
    assert name.startswith("nvidia_h200_sxm-triton") and name.endswith(".json")
    assert name.count(".") == 2  # triton<major>.<minor>.json, no patch level


def test_table_key_names_kernel_arguments_and_dtype():
    kwargs = {"SQ_BUCKET": 4096, "SK_BUCKET": 8192, "HEAD_DIM": 128, "CAUSAL": True, "USE_TMA": False,
              "UNMASKED": False, "Sq": 4000}
    key = tuned.table_key("_attn_fwd", kwargs, torch.bfloat16)
    assert key == "_attn_fwd|SQ_BUCKET=4096|SK_BUCKET=8192|HEAD_DIM=128|CAUSAL=1|USE_TMA=0|UNMASKED=0|bfloat16"
    assert _parse(key) == ("_attn_fwd", {k: int(v) for k, v in kwargs.items() if k != "Sq"}, torch.bfloat16)


def _record_keys(args: tuple[str, int]) -> None:
    path, worker = args
    import os

    os.environ["MICROSCOPE_FLASH_TUNED_OUT"] = path
    for i in range(15):
        cfg = kernel._FWD.configs[(worker * 15 + i) % len(kernel._FWD.configs)]
        tuned.record("Test GPU", f"_attn_fwd|worker={worker}|i={i}", cfg)


def test_choices_recorded_by_concurrent_processes_all_land_and_read_back(tmp_path):
    path = tmp_path / "table.json"
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(_record_keys, [(str(path), 0), (str(path), 1)])
    configs = tuned.load(path)
    assert len(configs) == 30
    for worker in (0, 1):
        for i in range(15):
            want = kernel._FWD.configs[(worker * 15 + i) % len(kernel._FWD.configs)]
            got = configs[f"_attn_fwd|worker={worker}|i={i}"]
            assert (got.kwargs, got.num_warps, got.num_stages, got.maxnreg) == \
                (want.kwargs, want.num_warps, want.num_stages, want.maxnreg)


def test_record_without_the_environment_variable_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("MICROSCOPE_FLASH_TUNED_OUT", raising=False)
    monkeypatch.chdir(tmp_path)
    tuned.record("Test GPU", "_attn_fwd|x", kernel._FWD.configs[0])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path", sorted(tuned.TABLE_DIR.glob("*.json")), ids=lambda p: p.name)
def test_every_committed_entry_is_still_a_candidate_for_its_key(path):
    tuners = {t.fn.__name__: t for t in kernel.TUNERS.values()}
    configs = tuned.load(path)
    assert configs
    for key, cfg in configs.items():
        name, args, dtype = _parse(key)
        tuner = tuners[name]
        named = {"Q": torch.empty(0, dtype=dtype)}
        kept = kernel._PRUNES[tuner](tuner.configs, named, **args)
        assert any((c.kwargs, c.num_warps, c.num_stages, c.maxnreg)
                   == (cfg.kwargs, cfg.num_warps, cfg.num_stages, cfg.maxnreg) for c in kept), key
