"""lmc.dcp: PyTorch Distributed Checkpoint (``torch.distributed.checkpoint``) storage with every tensor LMC-coded.

>>> import torch.distributed.checkpoint as dcp
>>> from lmc.dcp import LMCStorageWriter, LMCStorageReader
>>> dcp.save(state, storage_writer=LMCStorageWriter("ckpt/step-200", reference="ckpt/step-100"))
>>> dcp.load(state, storage_reader=LMCStorageReader("ckpt/step-200"))

Each rank writes one file ``__<rank>_0.lmc`` (a header naming the save, then one blob per item); the
coordinator writes ``lmc-metadata.json`` last, atomically, so a folder without it is an incomplete save. The
metadata is JSON (nothing is unpickled to read it); each item records its file, offset, length, codec, dtype,
shape, checksum (XXH3-128) and, when it was delta-coded, the checksum of its reference item in the reference
checkpoint (whose save id and path are recorded too). The layout is described in ``DCP.md``. Needs torch (not a
dependency of ``lmc`` itself).

The package: ``_folder`` (the folder's format and its validated reader), ``_writer`` and ``_reader`` (the DCP
storage classes), ``_recode`` (re-coding a reference in place; ``prune``), ``_pool`` (items on worker threads),
``_signpost`` (the ``.metadata`` a plain DCP reader finds), ``_cli`` (``python -m lmc.dcp``). It imports the
codec, ``lmc.storage``, ``lmc.chains`` and ``lmc.formats``, never ``lmc.archive``.
"""
from ._cli import main  # noqa: F401  (python -m lmc.dcp)
from ._folder import METADATA_FILE, is_lmc_checkpoint
from ._reader import LMCStorageReader, dcp_refs, lmc_to_torch_save
from ._recode import prune, wait
from ._signpost import PlainDCPLoadError, refuse_plain_load  # noqa: F401  (the signpost's call)
from ._writer import LMCStorageWriter

__all__ = ["LMCStorageWriter", "LMCStorageReader", "METADATA_FILE", "is_lmc_checkpoint", "lmc_to_torch_save",
           "prune", "wait", "dcp_refs"]
