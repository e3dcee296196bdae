"""A Hugging Face Hub repository's revisions as a series: ``source.repo_id`` at ``source.revisions`` (branches
or tags, e.g. Pythia's ``step1000``), each revision a checkpoint folder as the Trainer writes it (the
weights, and ``optimizer.pt`` with Adam's moments when the repository has one), read by
:mod:`lmc.formats.trainer_folder` as ``source=hf_trainer`` reads a local ``checkpoint-<step>/``.

Each revision is fetched with ``huggingface_hub.snapshot_download`` into the Hugging Face cache (``cache_dir``,
the usual one by default), one revision at a time, and only the files ``allow_patterns`` names: the weight
files, ``optimizer.pt`` and ``config.json`` (it names the optimizer's slots), never ``training_args.bin`` or
the RNG and scheduler states. When a revision holds both safetensors and ``pytorch_model.bin`` weights, only the
safetensors are fetched (they are what is read). With ``HF_HUB_OFFLINE=1`` the revisions are resolved from the
cache alone. The step of a revision is the integer ``step_regex`` finds in its name.

``delete_after``: the disk holds one revision at a time. The entries then come step-major (every tensor of a
revision before the next revision, :attr:`Source.step_major`), so a revision is downloaded when its first
tensor is loaded and deleted from the cache once the run moves to the next one (the last at the end of the
run). Only what this run put into the cache is deleted: the files of the repository's cache folder that were
not there before the revision was fetched (its snapshot links, its blobs unless a snapshot kept in the cache
still links to them, the ref and the tree listing). Nothing is deleted when the run stops on an error, and a
revision already in the cache before the run is left as it was. (Another process downloading into the same
repository's cache folder at the same moment would have its new files counted as this run's.)

Step-major, the first selected revision is fetched to build the index and the others are listed with its
tensors; each is checked against them when it is fetched (a revision with other tensors is a one-line error).
Tensors are copied into memory when loaded, so that a deleted revision's files are not kept alive by the
runner's references (memory-mapped files only free their disk space when unmapped).
"""

from __future__ import annotations

import functools
import glob
import os
import stat
import sys
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from lmc.formats.fileio import one_line
from ..errors import ConfigError, SourceError
from .base import Source, TensorEntry
from .pattern import STEP_REGEX, compile_step_regex, parse_step
from .hf_trainer import checkpoint_refs

ALLOW_PATTERNS = ["model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json",
                  "pytorch_model.bin", "pytorch_model-*-of-*.bin", "pytorch_model.bin.index.json",
                  "optimizer.pt", "config.json"]


def _log(msg: str) -> None:
    tqdm.write(msg, file=sys.stderr)  # between the lines of a progress bar, if one is drawn


class _Quiet(tqdm):
    """No progress bar (the dry run's, which lists files)."""

    def __init__(self, *args, **kwargs):
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def read_files(names: list[str]) -> list[str]:
    """The files of ``names`` (a revision's, relative) worth fetching, as
    :func:`~lmc.formats.trainer_folder.weight_refs` chooses the weights: safetensors weights leave any
    ``pytorch_model*.bin`` out, one ``model.safetensors`` the shards too."""
    def st_shards(n):
        return n.startswith("model-") and n.endswith(".safetensors") or n == "model.safetensors.index.json"

    if "model.safetensors" in names:
        return [n for n in names if not (n.startswith("pytorch_model") or st_shards(n))]
    if "model.safetensors.index.json" in names:
        return [n for n in names if not n.startswith("pytorch_model")]
    return list(names)


def cache_listing(folder: str) -> set[str]:
    """Every file, link and folder under ``folder`` (the folder itself as ``./``), relative, ``/``-separated,
    folders ending in ``/``; empty when it does not exist."""
    if not os.path.isdir(folder):
        return set()
    out = {"./"}
    for root, dirs, files in os.walk(folder):
        rel = os.path.relpath(root, folder).replace(os.sep, "/")
        pre = "" if rel == "." else rel + "/"
        out.update(pre + d + "/" for d in dirs)
        out.update(pre + f for f in files)
    return out


def delete_from_cache(folder: str, paths: set[str]) -> int:
    """Delete ``paths`` (as :func:`cache_listing` gives them) from a repository's cache folder: files and links
    first, keeping a blob that a snapshot link not being deleted still points to, then the folders that are
    left empty. Returns the bytes freed; a file that cannot be deleted is reported and left."""
    files = {p for p in paths if not p.endswith("/")}
    kept_targets = set()
    for root, _, names in os.walk(os.path.join(folder, "snapshots")):
        for n in names:
            p = os.path.join(root, n)
            if os.path.relpath(p, folder).replace(os.sep, "/") not in files and os.path.islink(p):
                kept_targets.add(os.path.realpath(p))
    freed = 0
    for rel in sorted(files):
        p = os.path.join(folder, *rel.split("/"))
        try:
            st = os.lstat(p)
            if not os.path.islink(p) and os.path.realpath(p) in kept_targets:
                continue
            os.unlink(p)
            freed += 0 if stat.S_ISLNK(st.st_mode) else st.st_size
        except FileNotFoundError:
            pass
        except OSError as ex:
            _log(f"hf_hub: note: could not delete {p} ({one_line(ex)}); left in the cache")
    for rel in sorted((p for p in paths if p.endswith("/")), key=len, reverse=True):
        try:
            os.rmdir(os.path.join(folder, *rel.rstrip("/").split("/")) if rel != "./" else folder)
        except OSError:
            pass  # not empty: something else lives there
    return freed


class HFHubSource(Source):
    source_type = "hf_hub"

    def __init__(self, repo_id=None, revisions=None, repo_type="model", cache_dir=None, endpoint=None,
                 step_regex=STEP_REGEX, allow_patterns=ALLOW_PATTERNS, delete_after=False, **kw):
        super().__init__(**kw)
        if not repo_id:
            raise SourceError("source=hf_hub needs source.repo_id=ORG/NAME (e.g. EleutherAI/pythia-70m)")
        if isinstance(revisions, (str, int)):
            revisions = [revisions]
        revs = [str(r) for r in revisions] if revisions is not None and not isinstance(revisions, dict) else []
        if not revs:
            raise SourceError("source=hf_hub needs 'source.revisions=[REV,...]' (branches or tags, the step in "
                              "each name, e.g. [step1000,step2000])")
        try:
            from huggingface_hub import constants
            from huggingface_hub.file_download import repo_folder_name
            from huggingface_hub.utils import validate_repo_id
        except ImportError:
            raise ConfigError("source=hf_hub needs the huggingface_hub package (pip install 'lmcbench[hub]')") \
                from None
        self.repo_id = str(repo_id)
        try:
            validate_repo_id(self.repo_id)
        except ValueError as e:
            raise ConfigError(f"source.repo_id: {one_line(e)}") from None
        known = [t for t in constants.REPO_TYPES if t]
        if repo_type not in known:
            raise ConfigError(f"source.repo_type: unknown {repo_type!r}; known: {', '.join(known)}")
        self.repo_type = repo_type
        self.cache_dir = str(Path(cache_dir or constants.HF_HUB_CACHE).expanduser().resolve())
        self.endpoint = endpoint or None
        self.step_regex = compile_step_regex(step_regex)
        pats = [allow_patterns] if isinstance(allow_patterns, str) else list(allow_patterns or [])
        if not pats:
            raise ConfigError("source.allow_patterns: empty (nothing would be downloaded)")
        self.allow_patterns = [str(p) for p in pats]
        self.delete_after = bool(delete_after)
        self.step_major = self.delete_after
        self.located = sorted((parse_step(self.step_regex, r, f"{self.repo_id}@{r}", "revision name"), r)
                              for r in revs)
        for (s1, r1), (s2, r2) in zip(self.located, self.located[1:]):
            if s1 == s2:
                raise SourceError(f"{self.repo_id}: revisions {r1!r} and {r2!r} are both step {s1} "
                                  f"(source.step_regex: {self.step_regex.pattern})")
        self.folder = os.path.join(self.cache_dir, repo_folder_name(repo_id=self.repo_id, repo_type=self.repo_type))
        self._step_of = {r: s for s, r in self.located}
        self._snapshots: dict[str, str] = {}  # revision -> its snapshot folder
        self._ours: dict[str, set[str]] = {}  # revision -> what fetching it added to the cache folder
        self._current = None  # step-major: (revision, {(name, kind): TensorRef}) of the revision in hand
        self._template = None  # step-major: (revision, {(name, kind): (dtype, shape)}) of the first one
        self._files: dict[tuple, str] = {}  # step-major: (name, kind) -> its file in the revision

    def describe(self):
        return f"{self.repo_id} (Hugging Face Hub)"

    # -- fetching ------------------------------------------------------------------------------------------
    def _call(self, rev: str, **kw):
        from huggingface_hub import snapshot_download

        return snapshot_download(self.repo_id, revision=rev, repo_type=self.repo_type, cache_dir=self.cache_dir,
                                 endpoint=self.endpoint, **kw)

    def _error(self, rev: str, ex: Exception) -> SourceError:
        from huggingface_hub import constants, errors

        where = f"{self.repo_id}@{rev}"
        if isinstance(ex, errors.RevisionNotFoundError):
            return SourceError(f"{self.repo_id}: revision {rev!r} not found on the Hub")
        if isinstance(ex, errors.GatedRepoError):
            return SourceError(f"{self.repo_id}: a gated repository (accept its terms on the Hub, then log in "
                               "with `hf auth login`)")
        if isinstance(ex, errors.RepositoryNotFoundError):
            return SourceError(f"{self.repo_id}: repository not found on the Hub (a private one needs "
                               "`hf auth login`)")
        if isinstance(ex, errors.IncompleteSnapshotError):
            return SourceError(f"{where}: the cached snapshot misses files and the Hub cannot be reached")
        if isinstance(ex, errors.LocalEntryNotFoundError):
            why = "HF_HUB_OFFLINE is set" if constants.is_offline_mode() else "the Hub cannot be reached"
            return SourceError(f"{self.repo_id}: revision {rev!r} is not in the cache ({self.folder}) and {why}")
        return SourceError(f"{where}: cannot fetch it ({type(ex).__name__}: {one_line(ex)[:300]})")

    def _select(self, rev: str) -> tuple[list[str], int | None]:
        """The patterns to fetch ``rev`` with, and the bytes to download: asked of the Hub (a dry run) where it
        can be reached, so that only the files read are fetched; offline, ``allow_patterns`` as they are."""
        from huggingface_hub.errors import DryRunError

        try:
            infos = self._call(rev, allow_patterns=self.allow_patterns, dry_run=True, tqdm_class=_Quiet)
        except DryRunError:
            return self.allow_patterns, None  # offline or unreachable: what the cache holds decides
        except Exception as ex:  # noqa: BLE001 - any Hub failure is one line naming the repository and revision
            raise self._error(rev, ex) from None
        names = read_files([i.filename for i in infos])
        if not names:
            raise SourceError(f"{self.repo_id}@{rev}: no file matches source.allow_patterns {self.allow_patterns}")
        size = sum(i.file_size or 0 for i in infos if i.will_download and i.filename in names)
        return [glob.escape(n) for n in names], size

    def _fetch(self, rev: str) -> str:
        """The snapshot folder of ``rev``, downloaded if the cache does not have it; what the download added to
        the cache is recorded (:meth:`_forget` deletes that and nothing else)."""
        if rev in self._snapshots:
            return self._snapshots[rev]
        before = cache_listing(self.folder)  # before the dry run too: it writes the revision's ref
        patterns, size = self._select(rev)
        sel = [r for s, r in self.located if self.steps is None or s in self.steps]
        what = "in the cache" if size == 0 else ("from the cache (the Hub is not reached)" if size is None
                                                 else f"downloading {_size(size)}")
        _log(f"hf_hub: {self.repo_id}@{rev} (step {self._step_of[rev]}, revision {sel.index(rev) + 1}/{len(sel)}): "
             f"{what}")
        try:
            path = self._call(rev, allow_patterns=patterns)
        except Exception as ex:  # noqa: BLE001 - see _select; a partial download stays in the cache
            raise self._error(rev, ex) from None
        self._ours[rev] = cache_listing(self.folder) - before
        if os.path.realpath(os.path.dirname(os.path.dirname(path))) != os.path.realpath(self.folder):
            self._ours[rev] = set()  # not where the cache layout puts it: never delete anything there
        self._snapshots[rev] = path
        return path

    def _forget(self, rev: str) -> None:
        """Delete what fetching ``rev`` added to the cache (``delete_after``)."""
        self._snapshots.pop(rev, None)
        ours = self._ours.pop(rev, set())
        if self.delete_after and ours:
            freed = delete_from_cache(self.folder, ours)
            _log(f"hf_hub: deleted {self.repo_id}@{rev} from the cache ({_size(freed)} freed)")

    # -- the index -----------------------------------------------------------------------------------------
    def _index(self):
        if not self.step_major:  # every selected revision fetched now, read tensor-major
            return self._index_steps(self.located, lambda rev: checkpoint_refs(self._fetch(rev), self.kinds))
        # step-major: the first selected revision is fetched and indexed; the others are listed with its
        # tensors and checked against them when they are fetched in turn
        entries = []
        for step, rev in self.located:
            if self.steps is not None and step not in self.steps:
                entries.append(TensorEntry(step, "", "weight", None, (), lambda: None, f"{self.repo_id}@{rev}"))
                continue
            if self._template is None:
                refs = self._enter(rev)
                self._files = {(r.name, r.kind): os.path.relpath(r.file, self._snapshots[rev]) for r in refs}
            for (name, kind), (dtype, shape) in self._template[1].items():
                entries.append(TensorEntry(step, name, kind, dtype, shape,
                                           functools.partial(self._read, rev, name, kind),
                                           f"{self.repo_id}@{rev}/{self._files[name, kind]}"))
        return entries

    def _enter(self, rev: str) -> list:
        """Fetch and index ``rev``, the revision in hand from now on; its tensors must be the first one's."""
        refs = checkpoint_refs(self._fetch(rev), self.kinds)
        have = {(r.name, r.kind): (r.dtype, tuple(r.shape)) for r in refs}
        if self._template is None:
            self._template = (rev, have)
        elif have != self._template[1]:
            first, want = self._template
            diff = sorted(f"{n} ({k})" for (n, k) in set(have) ^ set(want)) or \
                sorted(f"{n} ({k})" for (n, k) in have if have[n, k] != want[n, k])
            raise SourceError(f"{self.repo_id}@{rev}: its tensors are not {first}'s ({len(diff)} differ, e.g. "
                              f"{diff[0]}); delete_after=true needs the same tensors in every revision")
        self._current = (rev, {(r.name, r.kind): r for r in refs})
        return refs

    def _read(self, rev: str, name: str, kind: str) -> np.ndarray:
        if self._current is None or self._current[0] != rev:
            self.finish()  # the run has moved past the revision in hand
            self._enter(rev)
        return self._current[1][name, kind].load()

    def load(self, e):
        rec = super().load(e)
        if self.delete_after and rec.array.base is not None:
            # a copy in memory, not a map of a file that will be deleted while the runner keeps it as a reference
            a = np.array(rec.array)
            a.flags.writeable = False
            rec.array = a
        return rec

    def finish(self) -> None:
        if self._current is not None:
            rev = self._current[0]
            self._current = None
            self._forget(rev)
