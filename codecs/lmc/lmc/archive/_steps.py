"""Helpers about the step folders an archive takes in and gives back: the folders of a run,
the bytes of a step's files that went in as plain bytes, the disk a restore needs, the name and
time a step is recorded with."""
import os

from ._index import file_tensors
from ..formats.errors import SourceError
from ..formats.trainer_folder import step_folders as _step_folders
from ..formats.trainer_folder import step_of
from ._manifest import ArchiveError


def step_folders(run_dir):
    """lmc.formats.trainer_folder.step_folders, its error as an ArchiveError."""
    try:
        return _step_folders(run_dir)
    except SourceError as e:
        raise ArchiveError(str(e)) from None


def opaque_bytes(files):
    """Bytes of a step's files that went in as plain bytes: files lmc did not understand, the
    verbatim regions (headers, zip directories, pickles) of those it did, tensors it cannot code."""
    n = 0
    for fe in files:
        if fe["kind"] == "bytes":
            n += fe["size"]
            continue
        n += sum(c["n"] for p in fe.get("parts", []) if p["t"] == "raw" for c in p["chunks"])
        n += sum(c["n"] for c in fe.get("skeleton", []))
        n += sum(t["n"] for t in file_tensors(fe) if t["enc"] != "lmc")
    return n


def restore_bytes(files):
    """Disk bytes a restore of these files needs at its peak: the files, plus for a torch file of
    the legacy format the scratch map its tensors are decoded into (4 KiB per file for blocks)."""
    n = 0
    for fe in files:
        n += fe["size"] + 4096
        if fe["kind"] == "torch":
            n += sum(-(-t["n"] // 64) * 64 for t in fe["tensors"])
    return n


def _folder_name(folder, step):
    """The name a step is restored under: its folder's own name where that is a step folder
    name of this step, else checkpoint-<step>."""
    base = os.path.basename(os.path.normpath(folder))
    return base if step_of(base) == step else f"checkpoint-{step}"


def _folder_time(folder):
    """When a checkpoint folder was written: its newest file's mtime (whole seconds)."""
    t = os.stat(folder).st_mtime
    for d, _, names in os.walk(folder):
        for n in names:
            try:
                t = max(t, os.stat(os.path.join(d, n)).st_mtime)
            except OSError:
                pass
    return int(t)
