"""lmc.formats: every checkpoint format lmc reads or writes, once, for the product (the archive, the DCP writer,
the Trainer callback) and for lmcbench's sources alike.

Nothing here imports lmcbench (lmc never does); torch, safetensors and friends are imported on use, so
``import lmc.formats`` needs only numpy and ml_dtypes.

- :mod:`.dtypes` - the one dtype table (torch, safetensors, pickled storage, numpy and coding names).
- :mod:`.errors` - one-line errors (``SourceError``: a file or folder that cannot be read; ``ConfigError``).
- :mod:`.torchzip` - torch's zip files (``torch.save``), and files that are several of them end to end (DCP's
  ``.distcp`` shards): where each tensor storage lies, and its dtype, read from the zip directory and the
  pickle's opcodes without unpickling anything (the archive codes them tensor by tensor).
- :mod:`.safetensors` - safetensors files: validated header, memory-mapped tensors, whole-file torch I/O.
- :mod:`.torchfile` - PyTorch files (``torch.load(..., weights_only=True, mmap=True)``), state-dict and
  optimizer indexes, torch <-> numpy tensors and dtypes.
- :mod:`.deepspeed` - DeepSpeed ZeRO 0-3 checkpoint folders: weights, fp32 master partitions cut back into named
  parameters where the layout adds up, Adam moments; DeepSpeed's plain-value classes read as inert records.
- :mod:`.dcp` - PyTorch Distributed Checkpoint folders (plain, ZStandard, LMC), read one tensor at a time.
- :mod:`.trainer_folder` - Hugging Face Trainer ``checkpoint-<step>/`` folders, read: weight files, optimizer
  slots mapped to parameter names, weight/moment triples, a folder's layout and optimizer skeleton.
- :mod:`.trainer_write` - Trainer folders, written: from a live training run, or from arrays and a record.
- :mod:`.optimizer_json` - an optimizer ``state_dict`` as moment arrays + a JSON skeleton, and back.
- :mod:`.npz` - ``.npz`` archives (``allow_pickle=False``).
- :mod:`.tensors` - ``TensorRef`` (one indexed tensor of a file) and the checked load.
- :mod:`.fileio` - one-line file checks, sha256, strict JSON (atomic writes: :mod:`lmc.storage`).

Every reader turns a missing, empty, truncated or foreign file into one ``SourceError`` line naming the file.
"""
