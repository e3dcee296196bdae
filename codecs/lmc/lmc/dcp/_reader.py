"""lmc.dcp.LMCStorageReader: a DCP ``StorageReader`` for LMC DCP checkpoints (DCP.md); ``lmc_to_torch_save``;
``dcp_refs``, the tensors of any DCP folder (plain or LMC) as ``lmc.formats`` tensor references."""
from __future__ import annotations

import io
import os
import threading
import uuid

import torch
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from ..api import FormatError
from ..formats.dcp import dcp_refs as _dcp_refs
from ..storage import atomic_file
from ._folder import TORCH_DTYPES, CheckpointFolder, is_lmc_checkpoint, item_key
from ._recode import _location, wait
from ._pool import _Window, _item_threads  # items decoded on worker threads


# -------------------------------------------------------------------------------------------------- reader
class LMCStorageReader(StorageReader):
    """A DCP ``StorageReader`` for checkpoints written by :class:`LMCStorageWriter` (delta-coded items are
    decoded through their reference checkpoint, found by its path relative to this one, then by its absolute
    path, and checked by save id and checksum). ``threads``: worker threads (None: all cores) that decode the
    items, as the writer's do; a whole stored chunk loaded into a contiguous CPU tensor of its dtype is decoded
    straight into it."""

    def __init__(self, path, threads=None):
        super().__init__()
        self.path = _location(path)
        self.threads = threads
        self.load_id = str(uuid.uuid4())
        self._ckpt = None
        self.storage_data = {}

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id:
            self.path = _location(checkpoint_id)
        self.load_id = str(uuid.uuid4())
        self._ckpt = None
        self.storage_data = {}

    @property
    def checkpoint_id(self):
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return is_lmc_checkpoint(checkpoint_id)

    def read_metadata(self, *args, **kwargs) -> Metadata:
        wait(quiet=True)  # a folder a background save of this process is re-coding: read it once done
        if kwargs.get("rank") is not None:
            raise FileNotFoundError("lmc.dcp writes no rank-local metadata")
        self._ckpt = CheckpointFolder(self.path, self.threads)
        md = self._ckpt.metadata
        md.storage_meta.load_id = self.load_id
        return md

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args, **kwargs) -> None:
        if self._ckpt is None:
            self._ckpt = CheckpointFolder(self.path, self.threads)
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        ck = self._ckpt
        per_key: dict[tuple, list] = {}  # several requests may cut one stored chunk (resharding): decoded once
        for req in plan.items:
            key = item_key(req.storage_index)
            if key not in ck.items:
                raise FormatError(f"{ck.path}: no item {req.storage_index.fqn!r} at {key[1]}")
            per_key.setdefault(key, []).append(req)
        # decoded on worker threads, about two items per worker in flight, in file order, each worker reading
        # through its own open file per data file; the planner is called in this thread only. A request for a
        # whole stored chunk into a CPU tensor of its dtype is decoded straight into that tensor (no copy)
        files = _OpenFiles(ck)
        pool = _Window(self.threads)
        try:
            for key in sorted(per_key, key=lambda k: (ck.items[k][1].file, ck.items[k][1].offset)):
                reqs = per_key[key]
                target = self._whole_target(ck.items[key][1], reqs, planner)
                for (k, target), data in pool.submit((key, target), self._decode, ck, key, files, target):
                    self._deliver(ck, per_key[k], data, target, planner)
            for (k, target), data in pool.drain():
                self._deliver(ck, per_key[k], data, target, planner)
        finally:
            pool.close()
            files.close()
        fut: Future = Future()
        fut.set_result(None)
        return fut

    @staticmethod
    def _whole_target(it, reqs, planner):
        """The target tensor of the one request that reads the whole of tensor item ``it``, when the item can be
        decoded into it (a contiguous CPU tensor of the item's dtype and shape), else None."""
        if len(reqs) != 1 or it.dtype is None or reqs[0].type == LoadItemType.BYTE_IO:
            return None
        req = reqs[0]
        if any(o != 0 for o in req.storage_offsets) or tuple(req.lengths) != tuple(it.shape):
            return None
        t = planner.resolve_tensor(req).detach()
        if (t.device.type != "cpu" or t.dtype != TORCH_DTYPES[it.dtype] or tuple(t.shape) != tuple(it.shape)
                or not t.is_contiguous() or t.is_conj() or t.is_neg() or t.numel() * t.element_size() != it.size):
            return None
        return t

    def _decode(self, ck, key, files, target):
        it = ck.items[key][1]
        f = files.get(it.file)
        if it.dtype is None:
            return ck.decode(key, f, threads=1)
        threads = _item_threads(self.threads, it.size)
        if target is not None:
            ck.decode(key, f, threads=threads, out=target.reshape(-1).view(torch.uint8).numpy())
            return target
        return ck.tensor(key, f, threads=threads)

    @staticmethod
    def _deliver(ck, reqs, data, target, planner):
        if target is not None:  # decoded into it
            planner.commit_tensor(reqs[0], target)
            return
        for req in reqs:
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(bytes(data)))
                continue
            t = data
            for dim, (o, n) in enumerate(zip(req.storage_offsets, req.lengths)):
                t = t.narrow(dim, o, n)
            target = planner.resolve_tensor(req).detach()
            if target.size() != t.size():
                raise FormatError(f"{ck.path}: item {req.storage_index.fqn!r}: stored chunk "
                                  f"{tuple(t.size())} does not fit the target {tuple(target.size())}")
            target.copy_(t)
            planner.commit_tensor(req, target)


class _OpenFiles:
    """One open handle per data file and thread (a seek and a read are one step of one handle)."""

    def __init__(self, ck):
        self._ck = ck
        self._local = threading.local()
        self._all = []
        self._lock = threading.Lock()

    def get(self, name):
        d = self._local.__dict__.setdefault("files", {})
        f = d.get(name)
        if f is None:
            f = d[name] = self._ck.fs.open_read(name)
            with self._lock:
                self._all.append(f)
        return f

    def close(self):
        with self._lock:
            for f in self._all:
                f.close()
            self._all.clear()


# -------------------------------------------------------------------------------------------------- convert
def lmc_to_torch_save(dcp_dir, torch_save_path, threads=None) -> None:
    """An LMC DCP checkpoint folder as one ``torch.save`` file of the whole, unsharded state, as
    ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` does for plain DCP folders (one process, no
    process group; memory: the whole state). The file loads with ``torch.load(..., weights_only=True)``.

        python -m lmc.dcp to-torch CKPT_DIR OUT.pt
    """
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    CheckpointFolder(dcp_dir, threads)  # a missing or foreign folder: one clear error before DCP's machinery
    sd: dict = {}
    _load_state_dict(sd, storage_reader=LMCStorageReader(dcp_dir, threads=threads),
                     planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    with atomic_file(os.fspath(torch_save_path)) as f:
        torch.save(sd, f)


def dcp_refs(d) -> list:
    """Every tensor of a DCP checkpoint folder, plain or LMC-coded, as ``lmc.formats`` tensor references (kinds
    and names from the FQNs, from the metadata alone; see :func:`lmc.formats.dcp.dcp_refs`)."""
    return _dcp_refs(d, lmc_reader=LMCStorageReader)
