"""PyTorch Distributed Checkpoint (``torch.distributed.checkpoint``) storage with every tensor LMC-coded.

>>> import torch.distributed.checkpoint as dcp
>>> from lmc.dcp import LMCStorageWriter, LMCStorageReader
>>> dcp.save(state, storage_writer=LMCStorageWriter("ckpt/step-200", reference="ckpt/step-100"))
>>> dcp.load(state, storage_reader=LMCStorageReader("ckpt/step-200"))

Each rank writes one file ``__<rank>_0.lmc`` (a header naming the save, then one blob per item); the
coordinator writes ``lmc-metadata.json`` last, atomically, so a folder without it is an incomplete save. The
metadata is JSON (nothing is unpickled to read it); each item records its file, offset, length, codec, dtype,
shape, CRC-32 and, when it was delta-coded, the CRC-32 of its reference item in the reference checkpoint (whose
save id and path are recorded too). The layout is described in ``DCP.md``. Needs torch (not a dependency of
``lmc`` itself).
"""
from __future__ import annotations

import io
import json
import os
import uuid
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, SavePlan, SavePlanner
from torch.distributed.checkpoint.planner import WriteItemType
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from ._core import FormatError, compress, info
from ._files import atomic_file
from ._dcp_format import (
    _LMC_DTYPES, MAGIC, METADATA_FILE, SUFFIX, _Checkpoint, _crc, _dtype_name, _Item, _key,
    _metadata_json, _Plan, _tensor_bytes, is_lmc_checkpoint,
)

__all__ = ["LMCStorageWriter", "LMCStorageReader", "METADATA_FILE", "is_lmc_checkpoint"]

# -------------------------------------------------------------------------------------------------- writer
class LMCStorageWriter(StorageWriter):
    """A DCP ``StorageWriter`` storing every tensor chunk LMC-coded with its dtype.

    ``reference``: an earlier LMC DCP checkpoint folder; a chunk with the same FQN, offsets, sizes and dtype
    there is this chunk's reference (XOR delta per LMC chunk where smaller); other chunks are coded alone.
    Loading then needs the reference (and its own references) in place. ``keyframe=True`` ignores
    ``reference``, and so does a reference already ``max_chain - 1`` links deep: the checkpoint is then a
    keyframe, so that loading one decodes at most ``max_chain`` versions of a tensor and the cost of a save
    (which decodes its reference) stays bounded however long the run (``None``: no limit). ``threads``: LMC threads (None: all cores). Bytes items are stored as they are, or
    zlib-compressed when smaller."""

    def __init__(self, path, reference=None, keyframe=False, threads=None, sync_files=True, max_chain=10):
        super().__init__()
        if max_chain is not None and (isinstance(max_chain, bool) or not isinstance(max_chain, int) or max_chain < 1):
            raise ValueError(f"lmc.dcp: max_chain must be a positive integer or None, got {max_chain!r}")
        self.max_chain = max_chain
        self.path = os.fspath(path)
        self.reference = None if reference is None else os.fspath(reference)
        self.keyframe = bool(keyframe)
        self.threads = threads
        self.sync_files = sync_files
        self.save_id = str(uuid.uuid4())
        self.is_coordinator = False
        self.rank = None
        self._ref = None

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
        self.save_id = str(uuid.uuid4())
        self._ref = None

    @property
    def checkpoint_id(self):
        return self.path

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        if "://" in str(checkpoint_id):
            return False
        return any(p.exists() and os.access(p, os.W_OK) for p in Path(checkpoint_id).parents)

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        if kwargs.get("use_collectives", True) is False:
            raise NotImplementedError("lmc.dcp: use_collectives=False is not supported (one metadata file is "
                                      "written by the coordinator)")
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")
        self.save_id = str(uuid.uuid4())  # a new id per save, also when the writer is reused for the same path

    def _reference_checkpoint(self):
        if self.reference is None or self.keyframe:
            return None
        if self._ref is None:
            if os.path.realpath(self.reference) == os.path.realpath(self.path):
                raise ValueError(f"lmc.dcp: {self.path}: a checkpoint cannot be its own reference")
            if not os.path.isdir(self.reference):
                raise FileNotFoundError(f"lmc.dcp: reference checkpoint {self.reference}: no such folder")
            ref = _Checkpoint(self.reference, self.threads)
            self._ref = False if self._too_deep(ref) else ref
        return None if self._ref is False else self._ref

    def _too_deep(self, ref) -> bool:
        """Whether coding against ``ref`` would make a chain of more than ``max_chain`` checkpoints."""
        if self.max_chain is None:
            return False
        links = 1  # this checkpoint against ref
        ck = ref
        while ck.doc.get("reference") is not None:
            links += 1
            if links >= self.max_chain:
                return True
            ck = ck.reference()
        return links >= self.max_chain

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        os.makedirs(self.path, exist_ok=True)
        self._reference_checkpoint()  # a missing or broken reference fails here, before anything is written
        if self.is_coordinator:
            # an older checkpoint in this folder stops being complete before any of its files is replaced
            try:
                os.remove(os.path.join(self.path, METADATA_FILE))
            except FileNotFoundError:
                pass
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [replace(p, storage_data=_Plan(f"__{i}_", self.save_id)) for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        sp: _Plan = plan.storage_data
        name = f"{sp.prefix}0{SUFFIX}"
        final = os.path.join(self.path, name)
        ref = self._reference_checkpoint()
        results = []
        with atomic_file(final, sync=self.sync_files) as f:
            f.write(MAGIC + sp.save_id.encode("ascii"))
            # bytes first, then tensors one at a time: one resolved tensor in memory at a time
            order = sorted(plan.items, key=lambda w: w.type != WriteItemType.BYTE_IO)
            for wi in order:
                data = planner.resolve_data(wi)
                if wi.type == WriteItemType.BYTE_IO:
                    raw = data.getbuffer() if isinstance(data, io.BytesIO) else memoryview(bytes(data))
                    blob, codec = self._code_bytes(raw)
                    rec = dict(codec=codec, size=len(raw), crc32=_crc(raw))
                else:
                    blob, rec = self._code_tensor(wi, data, ref, sp.save_id)
                pos = f.tell()
                f.write(blob)
                item = _Item(name, pos, len(blob), **rec)
                results.append(WriteResult(index=wi.index, size_in_bytes=len(blob), storage_data=item))
                del data, blob
        fut: Future = Future()
        fut.set_result(results)
        return fut

    @staticmethod
    def _code_bytes(raw):
        z = zlib.compress(raw, 6)
        if len(z) < len(raw):
            return z, "zlib"
        return bytes(raw), "raw"

    def _code_tensor(self, wi, t: torch.Tensor, ref: _Checkpoint | None, save_id):
        dtype = _dtype_name(t.dtype)
        shape = tuple(t.shape)
        if wi.tensor_data is not None and tuple(wi.tensor_data.chunk.sizes) != shape:
            raise ValueError(f"lmc.dcp: {wi.index.fqn}: resolved tensor {shape} is not the chunk "
                             f"{tuple(wi.tensor_data.chunk.sizes)}")
        u8 = _tensor_bytes(t)
        rec = dict(size=u8.size, crc32=_crc(u8), dtype=dtype, shape=shape)
        npdt = _LMC_DTYPES.get(t.dtype)
        if npdt is None:
            blob, codec = self._code_bytes(u8)
            return blob, dict(rec, codec=codec)
        reference = item_ref = None
        if ref is not None:
            key = _key(wi.index)
            r = ref.items.get(key)
            if r is not None and r[1].dtype == dtype and r[1].shape == shape:
                reference = np.asarray(ref.decode(key)).view(npdt)
                item_ref = (ref.save_id, r[1].crc32)
        blob = compress(u8.view(npdt), reference=reference, threads=self.threads)
        if item_ref is not None and not info(blob)["has_reference"]:
            item_ref = None  # LMC coded every chunk alone: the item does not need its reference
        return blob, dict(rec, codec="lmc", ref=item_ref)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        items = {}
        for rl in results:
            for wr in rl:
                items[wr.index] = wr.storage_data
        ref = self._reference_checkpoint()
        reference = None
        if ref is not None:
            reference = {"save_id": ref.save_id, "path": os.path.relpath(ref.path, os.path.abspath(self.path)),
                         "abspath": ref.path}
        for it in items.values():
            if it.ref is not None and (reference is None or it.ref[0] != reference["save_id"]):
                raise ValueError("lmc.dcp: the ranks were given different reference checkpoints")
        if metadata.version is None:
            metadata.version = CURRENT_DCP_VERSION
        doc = _metadata_json(metadata, items, self.save_id, reference, self.path)
        data = json.dumps(doc, separators=(",", ":")).encode("utf-8")
        with atomic_file(os.path.join(self.path, METADATA_FILE), sync=self.sync_files) as f:
            f.write(data)




# -------------------------------------------------------------------------------------------------- reader
class LMCStorageReader(StorageReader):
    """A DCP ``StorageReader`` for checkpoints written by :class:`LMCStorageWriter` (delta-coded items are
    decoded through their reference checkpoint, found by its path relative to this one, then by its absolute
    path, and checked by save id and checksum)."""

    def __init__(self, path, threads=None):
        super().__init__()
        self.path = os.fspath(path)
        self.threads = threads
        self.load_id = str(uuid.uuid4())
        self._ckpt = None
        self.storage_data = {}

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
        self.load_id = str(uuid.uuid4())
        self._ckpt = None
        self.storage_data = {}

    @property
    def checkpoint_id(self):
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return "://" not in str(checkpoint_id) and is_lmc_checkpoint(checkpoint_id)

    def read_metadata(self, *args, **kwargs) -> Metadata:
        if kwargs.get("rank") is not None:
            raise FileNotFoundError("lmc.dcp writes no rank-local metadata")
        self._ckpt = _Checkpoint(self.path, self.threads)
        md = self._ckpt.metadata
        md.storage_meta.load_id = self.load_id
        return md

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args, **kwargs) -> None:
        if self._ckpt is None:
            self._ckpt = _Checkpoint(self.path, self.threads)
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        ck = self._ckpt
        per_file: dict[str, list] = {}
        for req in plan.items:
            key = _key(req.storage_index)
            if key not in ck.items:
                raise FormatError(f"{ck.path}: no item {req.storage_index.fqn!r} at {key[1]}")
            per_file.setdefault(ck.items[key][1].file, []).append((key, req))
        for name, reqs in per_file.items():
            reqs.sort(key=lambda kr: ck.items[kr[0]][1].offset)
            with open(os.path.join(ck.path, name), "rb") as f:
                cached = (None, None)  # several requests may cut one stored chunk (resharding)
                for key, req in reqs:
                    if req.type == LoadItemType.BYTE_IO:
                        planner.load_bytes(req, io.BytesIO(bytes(ck.decode(key, f))))
                        continue
                    if cached[0] != key:
                        cached = (key, ck.tensor(key, f))
                    t = cached[1]
                    for dim, (o, n) in enumerate(zip(req.storage_offsets, req.lengths)):
                        t = t.narrow(dim, o, n)
                    target = planner.resolve_tensor(req).detach()
                    if target.size() != t.size():
                        raise FormatError(f"{ck.path}: item {req.storage_index.fqn!r}: stored chunk "
                                          f"{tuple(t.size())} does not fit the target {tuple(target.size())}")
                    target.copy_(t)
                    planner.commit_tensor(req, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut
