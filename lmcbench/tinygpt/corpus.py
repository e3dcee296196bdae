"""The training corpus of the tinygpt series: text this project wrote, frozen into a file shipped in the
package, so every interpreter and every machine trains on the same bytes.

``corpus-v1.txt.xz`` holds lmcbench's own source and documentation — every tracked ``.py``, ``.md``,
``.yaml`` and ``.toml`` file outside ``results/`` and ``notebooks/`` at commit :data:`COMMIT`, concatenated in
sorted path order: :data:`SIZE` bytes (about 89% Python), SHA-256 :data:`SHA256`, checked on every load. A
series trains on the first ``corpus_bytes`` of it; a request beyond :data:`SIZE` takes the whole corpus (the
cap: the default 4,000,000 and the large preset's 8,000,000 both train on all of it; their random windows
cover about 1.6 M and 0.5 M bytes, fewer than the 2.18 MB of its training split). :data:`SHA256` is part of
the series' cache key (:func:`lmcbench.tinygpt.series.series_key`) and of every report's header
(:func:`corpus_id`).

A new corpus is made with ``python -m lmcbench.tinygpt.corpus freeze COMMIT OUT`` from a checkout: it gets a
new file name, :data:`NAME`, :data:`SHA256` and :data:`SIZE` here and a line in CHANGELOG.md (every cached
series is then trained again, under new keys).
"""

from __future__ import annotations

import functools
import hashlib
import lzma
import os
import subprocess

from ..errors import SourceError

NAME = "lmcbench-text-v1"
FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus-v1.txt.xz")
SHA256 = "88eb05911133cfc20faff089a32787e9b11d618c9e5976d550b6029514dab111"
SIZE = 2_289_623
COMMIT = "eef5aee1340c10b7b4d960d79e32b22b4796ab05"
SUFFIXES = (".py", ".md", ".yaml", ".toml")
LEFT_OUT = ("results/", "notebooks/")  # generated reports and notebooks with outputs


def corpus_id() -> str:
    """``lmcbench-text-v1 sha256:<first 16 hex digits>``: the corpus as the report headers name it."""
    return f"{NAME} sha256:{SHA256[:16]}"


@functools.lru_cache(maxsize=1)
def _whole(path: str = FILE, sha256: str = SHA256) -> bytes:
    try:
        with open(path, "rb") as f:
            data = lzma.decompress(f.read())
    except (OSError, lzma.LZMAError, EOFError) as e:
        raise SourceError(f"{path}: the tinygpt corpus cannot be read ({e}); reinstall lmcbench") from None
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise SourceError(f"{path}: the tinygpt corpus is damaged (SHA-256 {got[:16]}…, recorded {sha256[:16]}…); "
                          "reinstall lmcbench")
    return data


def corpus(nbytes: int) -> bytes:
    """The first ``nbytes`` of the corpus (all of it when ``nbytes`` is beyond :data:`SIZE`), its hash checked
    (read once per process: every :class:`Trainer` and :func:`evaluate` asks again)."""
    return _whole()[:nbytes]


def freeze(commit: str, out: str, repo: str = ".") -> dict:
    """Write the corpus of ``commit`` of the git checkout ``repo`` to ``out`` (xz); returns its name, commit,
    size, SHA-256 and file count, the values to record above."""
    full = subprocess.run(["git", "-C", repo, "rev-parse", commit], capture_output=True, text=True,
                          check=True).stdout.strip()
    names = subprocess.run(["git", "-C", repo, "ls-tree", "-r", "--name-only", full], capture_output=True,
                           text=True, check=True).stdout.splitlines()
    names = sorted(n for n in names if n.endswith(SUFFIXES) and not n.startswith(LEFT_OUT))
    batch = subprocess.run(["git", "-C", repo, "cat-file", "--batch"], input="".join(f"{full}:{n}\n" for n in names)
                           .encode(), capture_output=True, check=True).stdout
    parts, pos = [], 0
    for _ in names:  # "<oid> blob <size>\n<bytes>\n" per file
        eol = batch.index(b"\n", pos)
        size = int(batch[pos:eol].split()[2])
        parts.append(batch[eol + 1: eol + 1 + size])
        pos = eol + 2 + size
    data = b"".join(parts)
    with open(out, "wb") as f:
        f.write(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    return {"commit": full, "files": len(names), "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def main(argv=None) -> None:
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m lmcbench.tinygpt.corpus",
                                description="Freeze the tinygpt corpus from a commit of a checkout.")
    sub = p.add_subparsers(dest="cmd", required=True)
    fr = sub.add_parser("freeze", help="write the corpus of COMMIT to OUT (xz) and print what to record")
    fr.add_argument("commit")
    fr.add_argument("out")
    fr.add_argument("--repo", default=".")
    a = p.parse_args(argv)
    print(json.dumps(freeze(a.commit, a.out, a.repo), indent=1))


if __name__ == "__main__":
    main()
