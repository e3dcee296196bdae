"""The tinygpt corpus is pinned: the shipped file holds the recorded bytes (checked on load, a damaged file is a
one-line error), its hash is part of the series' cache key and of every report's header, and the file is
rebuilt from its recorded commit byte for byte."""

import hashlib
import importlib
import json
import lzma
import subprocess

import pytest

from lmcbench.errors import SourceError
from lmcbench.tinygpt import TRAIN_DEFAULTS, series
from lmcbench_testlib import REPO

C = importlib.import_module("lmcbench.tinygpt.corpus")  # the module (the package's ``corpus`` is the function)


def test_corpus_bytes_match_the_recorded_hash():
    data = C.corpus(10**9)
    assert len(data) == C.SIZE and hashlib.sha256(data).hexdigest() == C.SHA256
    assert C.corpus(1000) == data[:1000] and C.corpus(4_000_000) == data  # beyond the size: the whole corpus
    text = data.decode("utf-8")  # text, mostly Python
    assert text.count("def ") > 2000 and text.count("import ") > 1000
    assert C.corpus_id() == f"lmcbench-text-v1 sha256:{C.SHA256[:16]}"


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing"])
def test_a_damaged_corpus_file_is_a_one_line_error(tmp_path, damage):
    raw = bytearray(open(C.FILE, "rb").read())
    bad = tmp_path / "corpus.txt.xz"
    if damage == "flip":  # a valid xz of other bytes: the hash check catches it
        bad.write_bytes(lzma.compress(lzma.decompress(bytes(raw))[:-1] + b"!", preset=0))
        match = "damaged"
    elif damage == "truncate":
        bad.write_bytes(bytes(raw[: len(raw) // 2]))
        match = "cannot be read"
    else:
        match = "cannot be read"
    with pytest.raises(SourceError, match=match) as e:
        C._whole(str(bad), C.SHA256)
    assert "\n" not in str(e.value) and "reinstall lmcbench" in str(e.value)


def test_series_key_changes_with_the_corpus(monkeypatch, tmp_path):
    opts = dict(TRAIN_DEFAULTS)
    key = series.series_key(opts)
    assert key == series.series_key(dict(opts)) and key != "955a483a2560"  # the stdlib-corpus key of before
    assert series.series_folder(opts, tmp_path) == str(tmp_path / f"tinygpt-{key}")
    monkeypatch.setattr(series, "CORPUS_SHA256", hashlib.sha256(b"another corpus").hexdigest())
    assert series.series_key(opts) != key
    monkeypatch.undo()
    assert series.series_key(opts) == key and series.series_key({**opts, "seed": 1}) != key


def test_corpus_in_every_report_header(tmp_path):
    from lmcbench.report import header
    from lmcbench.sources.tinygpt import TinyGPTSource

    env = header.collect("lmcbench", source="somewhere")
    assert env["corpus"] == C.corpus_id()
    (tmp_path / "environment.json").write_text(json.dumps(env))
    assert f"- tinygpt corpus: {C.corpus_id()}" in header.lines("T", header.load(tmp_path))
    assert not any("corpus" in ln for ln in header.lines("T", {"command": "x"}))  # runs from before: no line
    assert C.corpus_id() in TinyGPTSource(cache_dir=str(tmp_path)).describe()


def test_freeze_rebuilds_the_shipped_file_from_its_commit(tmp_path):
    """``python -m lmcbench.tinygpt.corpus freeze`` at the recorded commit gives the recorded bytes (skipped
    where the checkout lacks that commit: a shallow clone, an installed copy)."""
    have = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{C.COMMIT}^{{commit}}"],
                          capture_output=True).returncode == 0
    if not have:
        pytest.skip(f"commit {C.COMMIT[:7]} not in this checkout")
    out = tmp_path / "c.txt.xz"
    info = C.freeze(C.COMMIT, str(out), str(REPO))
    assert info == {"commit": C.COMMIT, "files": 325, "size": C.SIZE, "sha256": C.SHA256}
    assert lzma.decompress(out.read_bytes()) == C.corpus(C.SIZE)
