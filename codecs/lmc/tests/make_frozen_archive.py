"""Writes tests/data/archive_v2/: an archive made by lmc 0.3.5 (archive format version 2: CRC-32 sections,
SHA-256 checksums), kept frozen so that every later version is tested to read it (test_archive_frozen.py).

Run once with the old code first on the path, from a checkout of that version:
    PYTHONPATH=<old checkout>/codecs/lmc python codecs/lmc/tests/make_frozen_archive.py
It writes the archive and archive_v2.json: for each step, the SHA-256 of every file of the folder it was made
from, which a restore must give back."""
import hashlib
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from helpers import tree_files  # noqa: E402
from test_archive import make_series  # noqa: E402

import lmc  # noqa: E402
from lmc.archive import Archive  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def digests(folder):
    """{path below folder: the sha256 of its bytes}, in path order."""
    return {k: hashlib.sha256(v).hexdigest() for k, v in sorted(tree_files(folder).items())}


def main():
    out = os.path.join(HERE, "archive_v2")
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        folders = make_series(tmp, steps=(2, 4, 6, 8), hidden=32, vocab=64)
        a = Archive(out, keyframe_every=3)
        for f in folders:
            a.add(f)
        want = {str(s): digests(f) for s, f in zip(a.steps(), folders)}
    with open(os.path.join(HERE, "archive_v2.json"), "w") as f:
        json.dump({"lmc": lmc.__version__, "archive_version": 2, "steps": want}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
