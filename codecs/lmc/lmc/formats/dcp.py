"""PyTorch Distributed Checkpoint (DCP) folders, read one tensor at a time.

Two kinds of folder: plain ones written by ``torch.distributed.checkpoint.FileSystemWriter`` (``.metadata`` and
``__<rank>_<i>.distcp`` files, with or without stream extensions such as ``ZStandard``) and LMC-coded ones
written by :class:`lmc.dcp.LMCStorageWriter` (``lmc-metadata.json`` and ``__<rank>_0.lmc``; read with the
reader the caller passes, :func:`lmc.dcp.dcp_refs` passes ``lmc.dcp.LMCStorageReader``: this module sits below
``lmc.dcp`` and imports nothing of it). The index comes
from the metadata alone; a tensor is read by ``dcp.load`` into one tensor of its full size, so sharded tensors
are reassembled and memory stays bounded by the largest tensor. Bytes items (pickled Python objects) are never
loaded.

A plain ``.metadata`` is a pickle: it is read with an unpickler that admits only DCP's metadata classes,
torch dtypes and sizes and paths, so a file that needs anything else is refused. LMC metadata is JSON.

Kinds from FQNs: ``<optim…>.state.<param>.exp_avg`` / ``exp_avg_sq`` are the moments named after their
parameter; other optimizer state is ``other`` named ``<param>.<key>`` (0-dim ``step`` counters are left out,
as for ``optimizer.pt``); any other floating tensor is a ``weight`` (a leading ``model.`` dropped from its
name, so that weights and moments share names), and any other tensor is ``other``.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings

import numpy as np

from .errors import SourceError
from .fileio import one_line
from .tensors import MOMENTS, TensorRef
from .torchfile import torch_dtype_to_numpy, torch_to_numpy

PLAIN_METADATA = ".metadata"
LMC_METADATA = "lmc-metadata.json"  # lmc.dcp.METADATA_FILE (lmc.dcp is a layer above)

_OPTIM_RE = re.compile(r"^(?:[^.]*optim[^.]*\.)?state\.(?P<param>.+)\.(?P<key>[^.]+)$", re.IGNORECASE)
_MAX_METADATA = 1 << 30

_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "TensorStorageMetadata", "TensorProperties",
                                              "ChunkStorageMetadata", "BytesStorageMetadata", "MetadataIndex",
                                              "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset"},
}


def dcp_format(d: str) -> str | None:
    """``"lmc"``, ``"plain"`` or None (not a complete DCP checkpoint folder)."""
    if os.path.isfile(os.path.join(d, LMC_METADATA)):
        return "lmc"
    if os.path.isfile(os.path.join(d, PLAIN_METADATA)):
        return "plain"
    return None


def dcp_kind(fqn: str, floating: bool, ndim: int) -> tuple[str, str] | None:
    """``(kind, name)`` of a tensor FQN, or None for one that is left out (an optimizer's 0-dim counters)."""
    m = _OPTIM_RE.match(fqn)
    if m:
        if ndim == 0:
            return None
        key = m.group("key")
        return (key, m.group("param")) if key in MOMENTS else ("other", f"{m.group('param')}.{key}")
    name = fqn[len("model."):] if fqn.startswith("model.") else fqn
    return ("weight" if floating and ndim > 0 else "other"), name


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        import torch

        if module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)):
            return getattr(torch, name)
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused: the metadata needs {module}.{name}")


def plain_metadata(d: str):
    """The ``Metadata`` of a plain DCP folder, unpickled with the restricted unpickler."""
    from torch.distributed.checkpoint.metadata import Metadata

    path = os.path.join(d, PLAIN_METADATA)
    try:
        if os.path.getsize(path) > _MAX_METADATA:
            raise SourceError(f"{path}: metadata file too large")
        with open(path, "rb") as f:
            md = _MetadataUnpickler(f).load()
    except SourceError:
        raise
    except Exception as e:  # noqa: BLE001 - a truncated, foreign or hostile pickle ends here
        raise SourceError(f"{path}: not readable DCP metadata ({one_line(e)})") from None
    if not isinstance(md, Metadata) or not isinstance(md.state_dict_metadata, dict) \
            or not isinstance(md.storage_data, dict):
        raise SourceError(f"{path}: not DCP metadata")
    return md


def _reader(d: str, fmt: str, lmc_reader=None):
    """A StorageReader for the folder whose ``read_metadata`` is safe (restricted unpickler or JSON);
    ``lmc_reader``: the class that reads an LMC folder (``lmc.dcp.LMCStorageReader``)."""
    if fmt == "lmc":
        if lmc_reader is None:
            raise SourceError(f"{d}: an LMC DCP checkpoint: read it with lmc.dcp.dcp_refs")
        return lmc_reader(d)
    from torch.distributed.checkpoint import FileSystemReader

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            if kwargs.get("rank") is not None:
                raise FileNotFoundError("no rank-local metadata")
            md = plain_metadata(d)
            from torch.distributed.checkpoint.metadata import StorageMeta

            if getattr(md, "storage_meta", None) is None:
                md.storage_meta = StorageMeta()
            md.storage_meta.load_id = self.load_id
            return md

    return SafeReader(d)


def _metadata(d: str, fmt: str, lmc_reader=None):
    if fmt == "plain":
        return plain_metadata(d)
    try:
        return _reader(d, fmt, lmc_reader).read_metadata()
    except SourceError:
        raise
    except Exception as e:  # noqa: BLE001 - lmc.FormatError, a missing file: one line naming the folder
        raise SourceError(f"{d}: not a readable LMC DCP checkpoint ({one_line(e)})") from None


def dcp_load(d: str, fmt: str, fqn: str, tdtype, size: tuple, lmc_reader=None) -> np.ndarray:
    """One whole tensor of a DCP folder (every chunk of it, from every rank's file) as a numpy array."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    target = {fqn: torch.empty(size, dtype=tdtype)}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(target, storage_reader=_reader(d, fmt, lmc_reader), no_dist=True)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - CheckpointException is a BaseException
        msg = str(e)
        if isinstance(e, CheckpointException):  # the rank's exception, its last line
            lines = [ln for ln in msg.strip().splitlines() if ln.strip()]
            msg = lines[-1] if lines else type(e).__name__
        raise SourceError(f"{d}: cannot read tensor {fqn!r} ({' '.join(msg.split())})") from None
    return torch_to_numpy(target[fqn])


def dcp_refs(d: str, lmc_reader=None) -> list[TensorRef]:
    """Every tensor of a DCP checkpoint folder (kinds and names from the FQNs), from its metadata alone.
    ``lmc_reader``: the StorageReader class for an LMC-coded folder (without it such a folder is a
    :class:`SourceError`); :func:`lmc.dcp.dcp_refs` passes ``lmc.dcp.LMCStorageReader``."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    fmt = dcp_format(d)
    if fmt is None:
        raise SourceError(f"{d}: not a complete DCP checkpoint (no {PLAIN_METADATA} or {LMC_METADATA})")
    md = _metadata(d, fmt, lmc_reader)
    out = []
    for fqn, m in md.state_dict_metadata.items():
        if not isinstance(m, TensorStorageMetadata):
            continue  # bytes items: pickled objects, never opened
        tdt, size = m.properties.dtype, tuple(int(s) for s in m.size)
        try:
            npdt = torch_dtype_to_numpy(tdt)
        except (TypeError, RuntimeError):
            continue  # a dtype numpy has no equivalent for (e.g. complex32)
        kn = dcp_kind(fqn, tdt.is_floating_point, len(size))
        if kn is None:
            continue
        kind, name = kn
        out.append(TensorRef(name, kind, npdt, size,
                             lambda f=fqn, t=tdt, s=size: dcp_load(d, fmt, f, t, s, lmc_reader), d))
    return out
