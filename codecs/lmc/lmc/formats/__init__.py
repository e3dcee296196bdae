"""lmc.formats: every checkpoint format lmc reads or writes, in one place.

Nothing here imports lmcbench (lmc never does); torch, safetensors and friends are imported on use, so
``import lmc.formats`` needs only numpy and ml_dtypes.

- :mod:`.dtypes` - the one dtype table (torch, safetensors, pickled storage, numpy and coding names).
- :mod:`.torchzip` - torch's zip files (``torch.save``), and files that are several of them end to end (DCP's
  ``.distcp`` shards): where each tensor storage lies, and its dtype, read from the zip directory and the
  pickle's opcodes without unpickling anything.
"""
