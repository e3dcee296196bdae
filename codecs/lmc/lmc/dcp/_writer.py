"""lmc.dcp.LMCStorageWriter: a DCP ``StorageWriter`` that LMC-codes every tensor (DCP.md)."""
from __future__ import annotations

import io
import json
import os
import time
import uuid
import zlib
from dataclasses import replace
from pathlib import Path

import torch
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from ..api import FormatError, check_prefer, compress, shaped
from ..chains import DEFAULT_KEYFRAME_EVERY  # one default chain length for the archive and DCP
from ..worker import Phases
from ..storage import TMP_PREFIX, backend, canonical, is_url, join, parent, relpath
from ._folder import (  # the folder's format and its validated reader
    LMC_DTYPES, MAGIC, METADATA_FILE, SUFFIX, CheckpointFolder, Item, Plan, checksum, dtype_name, item_json,
    is_data_file, item_key, metadata_json, next_generation, tensor_bytes,
)
from ._recode import (  # re-coding the reference in place (or behind the save)
    _location, _metadata_field, _Recoder, _remove_unnamed, finish_left_behind, start_behind, wait,
)
from ._pool import _Lanes, _Window, _item_threads  # items coded and written on worker threads
from ._signpost import PLAIN_METADATA, signpost


# -------------------------------------------------------------------------------------------------- writer
def _one_process() -> bool:
    """True unless torch.distributed runs a process group of more than one rank (background=None's rule)."""
    import torch.distributed as dist
    try:
        return not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)
    except (RuntimeError, ValueError):
        return True


class LMCStorageWriter(StorageWriter):
    """A DCP ``StorageWriter`` storing every tensor chunk LMC-coded with its dtype.

    ``reference``: the previous LMC DCP checkpoint folder (normally the newest one). This checkpoint is coded
    alone, so loading the latest checkpoint costs a keyframe's decode however long the run; then the
    reference is re-coded against this one (each chunk with the same FQN, offsets, sizes and dtype as its
    reference; its folder gets new data files and its metadata is replaced atomically, its decoded contents and
    save id unchanged). Every checkpoint then depends only on newer ones, so deleting the oldest folders with a
    plain ``rm -rf`` (torchtitan's ``keep_latest_k``, the Trainer's ``save_total_limit``) never breaks one that
    is kept. A save costs the same at any position: one coding alone, one decode of the reference (coded alone
    as the newest), one coding against this save. ``max_chain``: a reference whose group (it and the
    checkpoints whose chains end at it) already holds ``max_chain`` checkpoints is left as it is, so loading
    any checkpoint decodes at most ``max_chain`` versions of a tensor (``None``: no limit). ``keyframe=True``
    leaves the reference alone. ``threads``: worker threads (None: all cores): items are coded on them, about
    two per worker in flight, each with one LMC thread (all of them for an item of 32 MiB or more). ``prefer``:
    ``"speed"`` (default), ``"size"`` or ``"fast"``, ``lmc.compress``'s choice for this save's tensors and the
    reference's re-coded ones. Bytes items are stored as they are, or zlib-compressed when smaller.
    ``last_phases``: the last save's seconds per phase (workers' time summed; ``wall``: the whole save).
    ``background``: True: the save returns once this checkpoint is complete (coded alone); the reference is
    re-coded against it on a thread of the coordinator's process, from the files (see :func:`wait`; a kill or a
    failure leaves the reference complete, coded alone, and the next save against this one re-codes it first;
    ``os.fork()`` waits for that thread, so a DataLoader's workers never inherit a lock it holds). False: the
    reference is re-coded within the save, each rank its own items. None (default): True where one process
    saves, False where torch.distributed runs more than one rank.

    A ``reference`` that is missing, incomplete (no ``lmc-metadata.json``: make the writer after the previous
    save, an ``async_save`` too, has completed) or the target itself is refused when the writer is made, with one
    plain exception, before anything is created. Saving into a folder that another checkpoint beside it depends
    on is refused (it would become unloadable); a plain DCP checkpoint's ``.metadata`` and ``.distcp`` files
    left in the folder are removed."""

    def __init__(self, path, reference=None, keyframe=False, threads=None, sync_files=True,
                 max_chain=DEFAULT_KEYFRAME_EVERY, prefer="speed", background=None):
        super().__init__()
        check_prefer(prefer, "lmc.dcp")
        self.prefer = prefer
        if max_chain is not None and (isinstance(max_chain, bool) or not isinstance(max_chain, int) or max_chain < 1):
            raise ValueError(f"lmc.dcp: max_chain must be a positive integer or None, got {max_chain!r}")
        self.max_chain = max_chain
        if background is not None and not isinstance(background, bool):
            raise ValueError(f"lmc.dcp: background must be True, False or None (one process: True), "
                             f"got {background!r}")
        self.background = background
        self.path = _location(path)
        self.reference = None if reference is None else _location(reference)
        self.keyframe = bool(keyframe)
        self.threads = threads
        self.sync_files = sync_files
        self.save_id = str(uuid.uuid4())
        self.is_coordinator = False
        self.rank = None
        self._ref = None
        self._all_keys = None
        self._carried = {}
        self._check_reference()

    @property
    def _behind(self) -> bool:
        """Whether the reference is re-coded behind the save: ``background``, or where it is None, where one
        process saves (with several ranks each re-codes its own items in the save; behind it, the coordinator
        alone would re-code every rank's)."""
        return self.background if self.background is not None else _one_process()

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id:
            self.path = _location(checkpoint_id)
            self._check_reference()
        self.save_id = str(uuid.uuid4())
        self._ref = None
        self._all_keys = None
        self._carried = {}

    @property
    def checkpoint_id(self):
        return self.path

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        if is_url(checkpoint_id):
            try:
                backend(checkpoint_id, FormatError)  # fsspec knows the scheme (and its package is there)
                return True
            except FormatError:
                return False
        return any(p.exists() and os.access(p, os.W_OK) for p in Path(checkpoint_id).parents)

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        if kwargs.get("use_collectives", True) is False:
            raise NotImplementedError("lmc.dcp: use_collectives=False is not supported (one metadata file is "
                                      "written by the coordinator)")
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")
        self.save_id = str(uuid.uuid4())  # a new id per save, also when the writer is reused for the same path

    def _check_reference(self):
        """A reference that is missing, incomplete or this checkpoint itself fails here, when the writer is made
        (or given another checkpoint_id): a plain exception naming the folder, before DCP's machinery runs (it
        would wrap the error in a traceback) and before anything is created."""
        if self.reference is None or self.keyframe:
            return
        if canonical(self.reference) == canonical(self.path):
            raise ValueError(f"lmc.dcp: {self.path}: a checkpoint cannot be its own reference")
        fs = backend(self.reference, FormatError)
        if not fs.is_dir():
            raise FileNotFoundError(f"lmc.dcp: reference checkpoint {self.reference}: no such folder")
        if not fs.isfile(METADATA_FILE):
            raise FormatError(f"lmc.dcp: reference checkpoint {self.reference}: not a complete LMC DCP checkpoint "
                              f"(no {METADATA_FILE}: an interrupted save, or another storage writer's)")

    def _reference_checkpoint(self):
        """The previous checkpoint, to be re-coded against this save, or None (keyframe=True, no reference, or
        its group is full)."""
        if self.reference is None or self.keyframe:
            return None
        if self._ref is None:
            if canonical(self.reference) == canonical(self.path):
                raise ValueError(f"lmc.dcp: {self.path}: a checkpoint cannot be its own reference")
            if not backend(self.reference, FormatError).is_dir():
                raise FileNotFoundError(f"lmc.dcp: reference checkpoint {self.reference}: no such folder")
            ref = CheckpointFolder(self.reference, self.threads)
            self._ref = ref if self._group_of(ref) is not None else False
        return None if self._ref is False else self._ref

    def _group_of(self, ref):
        """This save's group size when ``ref`` is re-coded against it, or None when ``ref`` is left alone."""
        group = ref.doc.get("group", 1)  # (format 1: the newest of a forward chain; nothing depends on it)
        if self.max_chain is not None and group + 1 > self.max_chain:
            return None
        return group + 1

    def _refuse_overwriting_a_reference(self):
        """A checkpoint in the target folder that a checkpoint beside it is coded against must not be
        replaced: that one would become unloadable."""
        sid = _metadata_field(self.path, "save_id")
        if sid is None:
            return  # not a readable checkpoint: nothing can depend on it
        up = parent(self.path)
        for name in sorted(backend(up, FormatError).listdir()):
            other = join(up, name)
            if canonical(other) == canonical(self.path):
                continue
            ref = _metadata_field(other, "reference")
            if isinstance(ref, dict) and ref.get("save_id") == sid:
                raise ValueError(f"lmc.dcp: {self.path}: the checkpoint there is the reference of {other}, "
                                 "which would become unloadable; save into another folder")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        self._t0, self._ph = time.perf_counter(), Phases()  # this save's seconds per phase (last_phases)
        with self._ph.time("plan"):
            return self._prepare_local_plan(plan)

    def _prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        wait(quiet=True)  # a re-coding a background save of this process left behind
        ref = self._reference_checkpoint()  # a missing or broken reference fails here, before anything is created
        fs = backend(self.path, FormatError)
        fs.makedirs()
        if self.is_coordinator:
            self._refuse_overwriting_a_reference()
            # an older checkpoint in this folder stops being complete before any of its files is replaced (its
            # metadata goes first); a plain DCP checkpoint's files there would be read by
            # dcp.load(checkpoint_id=...), and a killed save's temporary files are garbage: removed
            names = fs.listdir()
            for name in sorted(names, key=lambda n: n != METADATA_FILE):
                if name in (METADATA_FILE, PLAIN_METADATA) or name.endswith(".distcp") or name.startswith(TMP_PREFIX) \
                        or is_data_file(name):  # the replaced checkpoint's data (it may have had more files)
                    fs.remove(name)
            if ref is not None:  # leftovers of an interrupted re-coding of the reference
                named = {it.file for _, it in ref.items.values()}
                for name in ref.fs.listdir():
                    if (name.endswith(SUFFIX) and name.startswith("__") and name not in named) \
                            or name.startswith(TMP_PREFIX):
                        ref.fs.remove(name)
                finish_left_behind(ref, self.threads, self.prefer)  # a killed background save's re-coding
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        self._all_keys = {item_key(wi.index) for p in plans for wi in p.items}
        return [replace(p, storage_data=Plan(f"__{i}_", self.save_id)) for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        ph = self._ph = getattr(self, "_ph", None) or Phases()
        sp: Plan = plan.storage_data
        ref = self._reference_checkpoint()
        results = []
        recoder = None
        if ref is not None and not self._behind:  # the reference's items re-coded against this save's, into a
            # new data file of its own
            gen = next_generation(ref.items)
            recoder = _Recoder(ref, f"{sp.prefix}{gen}{SUFFIX}", self.threads, self.sync_files, self.prefer, ph)
        # a local file appears by a rename when complete; an object when its upload completes
        lanes = _Lanes(backend(self.path, FormatError), sp.prefix, SUFFIX, MAGIC + sp.save_id.encode("ascii"),
                       self.sync_files, ph)
        pool = _Window(self.threads)
        try:
            def put(wi, coded):  # in this thread, in the plan's order: DCP's results and the reference's re-coding
                name, pos, size, rec, prev = coded
                item = Item(name, pos, size, **rec)
                if recoder is not None:
                    t0 = time.perf_counter()
                    item = replace(item, prev=None if prev is None else recoder.put(*prev))
                    ph.add("write reference", time.perf_counter() - t0)
                results.append(WriteResult(index=wi.index, size_in_bytes=size, storage_data=item))

            # bytes first, then tensors; each item is coded (and its reference item re-coded) and written to its
            # worker's data file on a worker thread, about two items per worker in flight: memory stays bounded
            # by a few resolved tensors
            order = sorted(plan.items, key=lambda w: w.type != WriteItemType.BYTE_IO)
            for wi in order:
                with ph.time("resolve"):
                    data = planner.resolve_data(wi)  # the planner in this thread only
                with ph.time("wait for workers"):
                    done = pool.submit(wi, self._code_and_write, wi, data, recoder, sp.save_id, lanes)
                for d in done:
                    put(*d)
                del data
            with ph.time("wait for workers"):
                done = pool.drain()
            for d in done:
                put(*d)
            with ph.time("commit (fsync)"):
                lanes.commit()
            if recoder is not None:
                if self.is_coordinator and self._all_keys is not None:
                    # the reference's items this save has not (a tensor dropped since): carried over as they are
                    for key in ref.items:
                        if key not in self._all_keys:
                            self._carried[key] = recoder.put(*recoder.carried(key))
                with ph.time("commit (fsync)"):
                    recoder.commit()
                recoder = None
        finally:
            pool.close()  # first: no worker writes to a lane after this
            lanes.abort()
            if recoder is not None:
                recoder.abort()
        self.last_phases = ph.as_dict()
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def _code_and_write(self, wi, data, recoder, save_id, lanes):
        """(data file, offset, size, record, the reference's item re-coded or None) of one write item, coded and
        appended to this worker's data file: what a worker thread does."""
        blob, rec, prev = self._code_item(wi, data, recoder, save_id)
        name, pos = lanes.write(blob)
        return name, pos, len(blob), rec, prev

    def _code_item(self, wi, data, recoder, save_id):
        """(blob, record, the reference's same item re-coded as (blob, record) or None) of one write item: what
        a worker thread does."""
        if wi.type == WriteItemType.BYTE_IO:
            raw = data.getbuffer() if isinstance(data, io.BytesIO) else memoryview(bytes(data))
            with self._ph.time("code"):
                blob, codec = self._code_bytes(raw)
            with self._ph.time("hash"):
                rec = dict(codec=codec, size=len(raw), check=checksum(raw))
            cur = None
        else:
            blob, rec, cur = self._code_tensor(wi, data)
        prev = None
        if recoder is not None:
            prev = recoder.recoded(item_key(wi.index), rec, cur, save_id, _item_threads(self.threads, rec["size"]))
        return blob, rec, prev

    @staticmethod
    def _code_bytes(raw):
        z = zlib.compress(raw, 6)
        if len(z) < len(raw):
            return z, "zlib"
        return bytes(raw), "raw"

    def _code_tensor(self, wi, t: torch.Tensor):
        """(blob, record, the tensor's bytes as its coding dtype or None) of a tensor item, coded alone."""
        dtype = dtype_name(t.dtype)
        shape = tuple(t.shape)
        if wi.tensor_data is not None and tuple(wi.tensor_data.chunk.sizes) != shape:
            raise ValueError(f"lmc.dcp: {wi.index.fqn}: resolved tensor {shape} is not the chunk "
                             f"{tuple(wi.tensor_data.chunk.sizes)}")
        with self._ph.time("tensor bytes"):
            u8 = tensor_bytes(t)
        with self._ph.time("hash"):
            rec = dict(size=u8.size, check=checksum(u8), dtype=dtype, shape=shape)
        npdt = LMC_DTYPES.get(t.dtype)
        if npdt is None:
            with self._ph.time("code"):
                blob, codec = self._code_bytes(u8)
            return blob, dict(rec, codec=codec), None
        arr = u8.view(npdt)
        with self._ph.time("code"):
            blob = compress(shaped(arr, shape), threads=_item_threads(self.threads, u8.size), prefer=self.prefer)
        return blob, dict(rec, codec="lmc"), arr

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        ph = getattr(self, "_ph", None) or Phases()
        with ph.time("metadata"):
            self._finish(metadata, results)
        self.last_phases = dict(ph.as_dict(), wall=round(time.perf_counter() - getattr(self, "_t0", 0.0), 6))

    def _finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        items, prev = {}, {}
        for rl in results:
            for wr in rl:
                items[wr.index] = wr.storage_data
                if wr.storage_data.prev is not None:
                    prev[item_key(wr.index)] = wr.storage_data.prev
        ref = self._reference_checkpoint()
        if metadata.version is None:
            metadata.version = CURRENT_DCP_VERSION
        doc = metadata_json(metadata, items, self.save_id, None, self.path,
                             group=1 if ref is None else self._group_of(ref))
        doc["time"] = int(time.time())  # when it was saved (re-coding it later keeps this)
        behind = ref is not None and self._behind
        if behind:  # what is left to do once this save is complete (a kill: the next save does it)
            me = self.path if is_url(self.path) else os.path.abspath(self.path)
            doc["behind"] = {"save_id": ref.save_id, "path": relpath(ref.path, me), "abspath": ref.path}
        data = json.dumps(doc, separators=(",", ":")).encode("utf-8")
        fs = backend(self.path, FormatError)
        fs.put(METADATA_FILE, data, sync=self.sync_files)  # the commit point (a rename, or one PUT)
        fs.put(PLAIN_METADATA, signpost(), sync=self.sync_files)
        if behind:
            start_behind(ref.path, self.path, self.threads, self.prefer)
        if ref is None or behind:
            return
        # this checkpoint is complete; now the reference's metadata names its re-coded items (one atomic
        # replace: a crash before it leaves the reference as it was, coded alone, and complete)
        prev.update(self._carried)
        missing = [k for k in ref.items if k not in prev]
        if missing:
            raise ValueError(f"lmc.dcp: {ref.path}: items {missing[:3]} were not re-coded (the ranks were given "
                             "different reference checkpoints?)")
        rdoc = dict(ref.doc)
        rdoc.pop("group", None)
        rdoc["format_version"] = doc["format_version"]
        used = any(it.ref is not None for it in prev.values())
        me = self.path if is_url(self.path) else os.path.abspath(self.path)
        rdoc["reference"] = ({"save_id": self.save_id, "path": relpath(me, ref.path), "abspath": me}
                             if used else None)
        rdoc["items"] = [item_json(idx, prev[k]) for k, (idx, _) in ref.items.items()]
        ref.fs.put(METADATA_FILE, json.dumps(rdoc, separators=(",", ":")).encode("utf-8"), sync=self.sync_files)
        _remove_unnamed(ref, {it.file for it in prev.values()})
