import torch

from microscope.workloads.batching import WindowSampler, eval_windows
from microscope.workloads.corpus import CorpusSpec, load_corpus, stdlib_files
from microscope.workloads.tokenizer import EOS


def test_same_spec_same_hash_and_tokens(corpus, small_spec):
    load_corpus.cache_clear()
    again = load_corpus(small_spec)
    assert again is not corpus
    assert again.sha256 == corpus.sha256
    assert again.train_files == corpus.train_files
    assert torch.equal(again.train, corpus.train) and torch.equal(again.val, corpus.val)


def test_different_cap_different_hash(corpus):
    other = load_corpus(CorpusSpec(max_bytes=500_000))
    assert other.sha256 != corpus.sha256


def test_split_is_by_file_and_disjoint(corpus, small_spec):
    assert corpus.train_files and corpus.val_files
    assert not set(corpus.train_files) & set(corpus.val_files)
    assert list(corpus.train_files) == sorted(corpus.train_files)
    # each file ends with one EOS, so the stream holds exactly one EOS per file
    assert int((corpus.train == EOS).sum()) == len(corpus.train_files)
    n_files = len(corpus.train_files) + len(corpus.val_files)
    assert corpus.train.numel() + corpus.val.numel() - n_files <= small_spec.max_bytes


def test_stdlib_excludes_tests_site_packages_and_build_files():
    names = [d.name for d in stdlib_files()]
    assert names == sorted(names) and len(names) > 100
    for name in names:
        parts = name.split("/")
        assert not {"test", "tests", "idle_test", "site-packages", "pydoc_data"} & set(parts), name
        assert not parts[-1].startswith("_sysconfigdata"), name
        assert not name.startswith("/")


def test_out_of_domain_is_prose_not_code(corpus):
    ood = bytes(corpus.ood[corpus.ood < 256].to(torch.uint8).tolist()[:200_000])
    code = bytes(corpus.val[corpus.val < 256].to(torch.uint8).tolist()[:200_000])
    assert ood[:20000] not in code
    # Python code is dense in 'def '/'self.'; the documentation prose much less so per byte.
    assert code.count(b"self.") / len(code) > 3 * ood.count(b"self.") / len(ood)
    assert corpus.ood_names == tuple(sorted(corpus.ood_names))


def test_user_files_corpus(tmp_path):
    (tmp_path / "docs").mkdir()
    for i in range(6):
        (tmp_path / "docs" / f"note{i}.txt").write_text(f"note number {i}\n" * 50)
    (tmp_path / "docs" / "skip.bin").write_bytes(b"\x00" * 100)
    spec = CorpusSpec(kind="files", paths=(str(tmp_path / "docs"),), val_fraction=0.3)
    c = load_corpus(spec)
    assert len(c.train_files) + len(c.val_files) == 6
    assert all(n.startswith("docs/") and n.endswith(".txt") for n in c.train_files + c.val_files)
    same = CorpusSpec(kind="files", paths=[str(tmp_path / "docs")], val_fraction=0.3)  # a list, as from YAML
    assert load_corpus(same).sha256 == c.sha256


def test_window_sampler_depends_only_on_seed_and_step(corpus):
    a = WindowSampler(corpus.train, 32, 4, seed=7)
    b = WindowSampler(corpus.train, 32, 4, seed=7)
    xa, ya = a(3)
    b(0), b(1)  # drawing other steps first must not change step 3
    xb, yb = b(3)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert xa.dtype == torch.long and xa.shape == (4, 32)
    assert torch.equal(xa[:, 1:], ya[:, :-1])
    assert not torch.equal(a(4)[0], xa)
    assert not torch.equal(WindowSampler(corpus.train, 32, 4, seed=8)(3)[0], xa)


def test_eval_windows_are_contiguous_and_capped(corpus):
    x, y = eval_windows(corpus.val, 16, max_tokens=100)
    assert x.shape == (6, 16)
    assert torch.equal(x.flatten(), corpus.val[:96].long())
    assert torch.equal(y.flatten(), corpus.val[1:97].long())
