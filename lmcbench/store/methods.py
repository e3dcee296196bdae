"""The ways a training loop can save ``{"model": ..., "optimizer": ...}`` (torch tensors), each into its own folder:
``save`` returns (seconds the caller was blocked, seconds until the checkpoint is complete and durable, bytes it
added on disk); ``restore`` loads a step back as torch tensors."""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import struct
import time
import warnings

import torch


def dir_bytes(path: str) -> int:
    """Bytes of every file under ``path`` (apparent sizes)."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    n = 0
    for root, _, files in os.walk(path):
        n += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return n


def _write_durable(path: str, data) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def tensors_of(obj) -> list:
    """The tensors of a nested state dict, in a fixed traversal order (dicts in insertion order)."""
    out = []

    def walk(o):
        if isinstance(o, torch.Tensor):
            out.append(o)
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)
    walk(obj)
    return out


def replace_tensors(obj, fn):
    """``obj`` with every tensor ``t`` replaced by ``fn(t)`` (same traversal order as :func:`tensors_of`)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: replace_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(replace_tensors(v, fn) for v in obj)
    return copy.deepcopy(obj)


def same_state(a, b) -> bool:
    """Same structure, equal non-tensor values, every tensor of the same dtype and shape and bit-identical."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return torch.equal(a.detach().reshape(-1).contiguous().view(torch.uint8),
                           b.detach().reshape(-1).contiguous().view(torch.uint8))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def empty_like_state(state):
    """What a training loop loads into: the same structure, tensors allocated but not filled."""
    return replace_tensors(state, torch.empty_like)


class Method:
    """One way of saving: a folder under the run directory, a checkpoint per step."""

    name = ""
    asynchronous = False  # the call returns before the checkpoint is complete
    phases = None  # after a save: {phase: seconds} where the method can tell (the LMC archive's Archive.last_phases)

    def __init__(self, root: str, cfg):
        self.cfg = cfg
        self.dir = os.path.join(root, self.name)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)

    def path(self, step: int) -> str:
        return os.path.join(self.dir, f"step-{step}")

    def save(self, state, step: int, keyframe: bool) -> tuple[float, float, int]:
        """(seconds blocked, seconds until complete, bytes the save added to storage: the growth of the method's
        folder, so a save that also re-codes an older checkpoint counts what that changed)."""
        before = dir_bytes(self.dir)
        t0 = time.perf_counter()
        self._save(state, step, keyframe)
        t = time.perf_counter() - t0
        return t, t, dir_bytes(self.dir) - before

    def _save(self, state, step, keyframe):
        raise NotImplementedError

    def restore(self, step: int, like):
        raise NotImplementedError

    def discard(self, steps: list[int], keep: set[int]) -> None:
        """Remove the files of ``steps`` not in ``keep`` (a method with a chain keeps what later steps need)."""
        for s in steps:
            if s not in keep:
                p = self.path(s)
                shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else (os.path.exists(p) and os.remove(p))

    def close(self) -> None:
        pass


class TorchSave(Method):
    """``torch.save`` of the whole state into one file, fsynced."""

    name = "torch_save"

    def path(self, step):
        return os.path.join(self.dir, f"step-{step}.pt")

    def _save(self, state, step, keyframe):
        with open(self.path(step), "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())

    def restore(self, step, like):
        return torch.load(self.path(step), weights_only=True)


class ZstdTorchSave(TorchSave):
    """The ``torch.save`` bytes through zstd (``store.zstd_level``), one file, fsynced."""

    name = "zstd_torch_save"

    def path(self, step):
        return os.path.join(self.dir, f"step-{step}.pt.zst")

    def _save(self, state, step, keyframe):
        import zstandard

        buf = io.BytesIO()
        torch.save(state, buf)
        _write_durable(self.path(step), zstandard.ZstdCompressor(level=self.cfg.zstd_level).compress(buf.getbuffer()))

    def restore(self, step, like):
        import zstandard

        with open(self.path(step), "rb") as f:
            raw = zstandard.ZstdDecompressor().decompress(f.read())
        return torch.load(io.BytesIO(raw), weights_only=True)


_ZIPNN_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class ZipNNPerTensor(Method):
    """ZipNN on every float tensor (a private copy each time: ZipNN rewrites its input); the rest of the state
    (``torch.save`` of the structure with the tensors emptied) and tiny or non-float tensors stored as they are.
    One file: u64 header length, JSON header, the structure, the blobs."""

    name = "zipnn"
    MIN_BYTES = 256

    _z = {}  # (dtype name, threads) -> a ZipNN object, made once per process (the warm-up makes them)

    def path(self, step):
        return os.path.join(self.dir, f"step-{step}.zipnn")

    def _zipnn(self, dtype):
        from zipnn import ZipNN

        key = (_ZIPNN_DTYPES.get(dtype, "bfloat16"), self.cfg.threads or 0)
        if key not in self._z:
            self._z[key] = ZipNN(method="AUTO", input_format="byte", bytearray_dtype=key[0], threads=key[1])
        return self._z[key]

    def _save(self, state, step, keyframe):
        skel = io.BytesIO()
        torch.save(replace_tensors(state, lambda t: torch.empty(0, dtype=t.dtype)), skel)
        entries, blobs = [], []
        for t in tensors_of(state):
            raw = bytearray(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy())
            if t.dtype in _ZIPNN_DTYPES and len(raw) >= self.MIN_BYTES:
                blob, codec = self._zipnn(t.dtype).compress(raw), "zipnn"
            else:
                blob, codec = bytes(raw), "raw"
            entries.append([str(t.dtype).removeprefix("torch."), list(t.shape), codec, len(blob)])
            blobs.append(blob)
        head = json.dumps({"structure": skel.getbuffer().nbytes, "tensors": entries}).encode()
        _write_durable(self.path(step), b"".join([struct.pack("<Q", len(head)), head, skel.getvalue(), *blobs]))

    def restore(self, step, like):
        with open(self.path(step), "rb") as f:
            data = f.read()
        (n,) = struct.unpack_from("<Q", data)
        head = json.loads(data[8:8 + n])
        pos = 8 + n + head["structure"]
        skel = torch.load(io.BytesIO(data[8 + n:pos]), weights_only=True)
        out = []
        for dtype, shape, codec, length in head["tensors"]:
            blob = data[pos:pos + length]
            pos += length
            raw = self._zipnn(getattr(torch, dtype)).decompress(blob) if codec == "zipnn" else blob
            out.append(torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).reshape(shape))
        it = iter(out)
        return replace_tensors(skel, lambda _: next(it))


class DCP(Method):
    """``dcp.save`` with ``FileSystemWriter`` (one process, ``no_dist``; files fsynced, its default)."""

    name = "dcp"

    def writer(self, step, keyframe):
        import torch.distributed.checkpoint as dcp

        return dcp.FileSystemWriter(self.path(step))

    def reader(self, step):
        import torch.distributed.checkpoint as dcp

        return dcp.FileSystemReader(self.path(step))

    def _save(self, state, step, keyframe):
        import torch.distributed.checkpoint as dcp

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(state, storage_writer=self.writer(step, keyframe), no_dist=True)

    def restore(self, step, like):
        import torch.distributed.checkpoint as dcp

        out = empty_like_state(like)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(out, storage_reader=self.reader(step), no_dist=True)
        return out


class DCPZstd(DCP):
    """``FileSystemWriter`` with DCP's ``ZStandard`` stream extension (zstd over each item's ``torch.save`` bytes)."""

    name = "dcp_zstd"

    def writer(self, step, keyframe):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint._extension import ZStandard

        return dcp.FileSystemWriter(self.path(step), _extensions=[ZStandard()])


class LMCDCP(DCP):
    """``lmc.dcp.LMCStorageWriter`` with the previous step's folder as its reference: the new step coded alone,
    the previous one re-coded against it (a new chain every ``keyframe_every``). Every checkpoint depends only on
    newer ones, so older folders are deleted as any other method's."""

    name = "lmc_dcp"

    def __init__(self, root, cfg):
        super().__init__(root, cfg)
        self.prev = None

    def writer(self, step, keyframe):
        from lmc.dcp import LMCStorageWriter

        ref = None if keyframe or self.prev is None else self.path(self.prev)
        self.prev = step
        # the re-coding within the save (lmc.dcp's default in one process is behind it: lmc_dcp_behind)
        self._writer = LMCStorageWriter(self.path(step), reference=ref, threads=self.cfg.threads,
                                        max_chain=self.cfg.keyframe_every, background=False)
        return self._writer

    def _save(self, state, step, keyframe):
        super()._save(state, step, keyframe)
        self.phases = getattr(self._writer, "last_phases", None)  # seconds per phase of the save

    def reader(self, step):
        from lmc.dcp import LMCStorageReader

        return LMCStorageReader(self.path(step), threads=self.cfg.threads)


class LMCDCPAsync(LMCDCP):
    """The same through ``dcp.async_save``: blocked until the call returns (the state staged), complete when its
    future resolves."""

    name = "lmc_dcp_async"
    asynchronous = True

    def save(self, state, step, keyframe):
        import torch.distributed.checkpoint as dcp

        before = dir_bytes(self.dir)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fut = dcp.async_save(state, storage_writer=self.writer(step, keyframe), no_dist=True)
        blocked = time.perf_counter() - t0
        (fut.upload_completion if hasattr(fut, "upload_completion") else fut).result()
        return blocked, time.perf_counter() - t0, dir_bytes(self.dir) - before


class LMCDCPBehind(LMCDCP):
    """``LMCStorageWriter(..., background=True)``: blocked until the new step is complete, coded alone; the
    previous step's re-code against it runs on a thread of the process, complete at ``lmc.dcp.wait()``."""

    name = "lmc_dcp_behind"
    asynchronous = True

    def writer(self, step, keyframe):
        w = super().writer(step, keyframe)
        w.background = True
        return w

    def save(self, state, step, keyframe):
        import lmc.dcp

        before = dir_bytes(self.dir)
        t0 = time.perf_counter()
        self._save(state, step, keyframe)
        blocked = time.perf_counter() - t0
        lmc.dcp.wait()
        return blocked, time.perf_counter() - t0, dir_bytes(self.dir) - before


def write_trainer_folder(state, folder: str) -> None:
    """``model.safetensors`` and ``optimizer.pt``, as a Trainer writes a checkpoint folder."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state["model"].items()}, os.path.join(folder, "model.safetensors"),
              metadata={"format": "pt"})
    torch.save(state["optimizer"], os.path.join(folder, "optimizer.pt"))


def read_trainer_folder(folder: str) -> dict:
    from safetensors.torch import load_file

    return {"model": load_file(os.path.join(folder, "model.safetensors")),
            "optimizer": torch.load(os.path.join(folder, "optimizer.pt"), weights_only=True)}


class LMCArchive(Method):
    """The Trainer's folder (``raw/checkpoint-<step>``), then ``Archive.add`` of it in the caller's thread; the bytes
    are what the archive grew by (the raw folder is the Trainer's own; it is deleted once the next step is in)."""

    name = "lmc_archive"

    def __init__(self, root, cfg):
        from lmc.archive import Archive

        super().__init__(root, cfg)
        self.archive_path = os.path.join(self.dir, "run.lmca")
        self.raw = os.path.join(self.dir, "raw")
        self.archive = Archive(self.archive_path, keyframe_every=cfg.keyframe_every, threads=cfg.threads)
        self.prev = None

    def folder(self, step):
        return os.path.join(self.raw, f"checkpoint-{step}")

    def save(self, state, step, keyframe):
        before = dir_bytes(self.archive_path) if os.path.exists(self.archive_path) else 0
        t0 = time.perf_counter()
        write_trainer_folder(state, self.folder(step))
        blocked, done = self._archive(step, t0)
        if self.prev is not None:  # the previous raw folder served as the reference; the Trainer would rotate it
            shutil.rmtree(self.folder(self.prev), ignore_errors=True)
        self.prev = step
        return blocked, done, dir_bytes(self.archive_path) - before

    def _archive(self, step, t0):
        self.archive.add(self.folder(step), step)
        t = time.perf_counter() - t0
        self.phases = getattr(self.archive, "last_phases", None)
        return t, t

    def restore(self, step, like):
        out = os.path.join(self.dir, "restored", f"checkpoint-{step}")
        shutil.rmtree(out, ignore_errors=True)
        self.archive.restore(step, out)
        state = read_trainer_folder(out)
        shutil.rmtree(os.path.dirname(out), ignore_errors=True)
        return state

    def discard(self, steps, keep):
        pass  # one archive; removed with the method's folder


class LMCArchiveInBackground(LMCArchive):
    """The same through ``lmc.hf.LMCArchiveCallback``: the Trainer writes the folder, ``on_save`` hands it to the
    callback's worker thread; blocked until ``on_save`` returns, complete when the worker has appended it."""

    name = "lmc_archive_bg"
    asynchronous = True

    def __init__(self, root, cfg):
        from types import SimpleNamespace

        from lmc.hf import LMCArchiveCallback

        super().__init__(root, cfg)
        self.callback = LMCArchiveCallback(self.archive, keyframe_every=cfg.keyframe_every, delete_raw=False)
        self._ns = SimpleNamespace

    def _archive(self, step, t0):
        args = self._ns(output_dir=self.raw)
        st = self._ns(global_step=step, is_world_process_zero=True)
        self.callback.on_save(args, st, None)
        blocked = time.perf_counter() - t0
        self.callback.drain()
        return blocked, time.perf_counter() - t0

    def close(self):
        self.callback.close()


class LMCArchiveRecodeBehind(LMCArchive):
    """``Archive.add(..., background=True)``: blocked until the step is coded alone and committed (complete and
    durable); the previous step's re-code against it runs on a thread of the archive, complete at ``wait()``."""

    name = "lmc_archive_behind"
    asynchronous = True

    def _archive(self, step, t0):
        self.archive.add(self.folder(step), step, background=True)
        blocked = time.perf_counter() - t0
        ph = dict(getattr(self.archive, "last_phases", None) or {})
        self.archive.wait()
        ph.update({f"behind {k}": v for k, v in (getattr(self.archive, "last_recode_phases", None) or {}).items()})
        self.archive.last_recode_phases = None
        self.phases = ph or None
        return blocked, time.perf_counter() - t0


ALL = {m.name: m for m in (TorchSave, ZstdTorchSave, ZipNNPerTensor, DCP, DCPZstd, LMCArchive,
                           LMCArchiveInBackground, LMCArchiveRecodeBehind, LMCDCP, LMCDCPAsync, LMCDCPBehind)}


def unavailable(name: str) -> str | None:
    """Why a method cannot run here (its library is missing), or None."""
    try:
        if name == "zipnn":
            import zipnn  # noqa: F401
        elif name == "zstd_torch_save":
            import zstandard  # noqa: F401
        elif name == "dcp_zstd":
            from torch.distributed.checkpoint._extension import ZStandard  # noqa: F401
            if not ZStandard.is_available():
                raise ImportError("neither zstandard nor pyzstd is installed")
        elif name == "lmc_archive_bg":
            import lmc.hf  # noqa: F401 - needs transformers
        elif name.startswith("lmc"):
            import lmc.archive  # noqa: F401
            import lmc.dcp  # noqa: F401
    except (ImportError, AttributeError) as e:
        return f"{type(e).__name__}: {e}"
    return None
