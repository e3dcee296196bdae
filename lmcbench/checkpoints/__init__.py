"""Checkpoint *formats*, read and write, in one place; nothing here knows of sources, codecs or experiments.

- :mod:`.safetensors` — safetensors files: validated header, memory-mapped tensors, whole-file torch I/O.
- :mod:`.torchfile` — PyTorch files (``torch.load(..., weights_only=True, mmap=True)``), state-dict and
  optimizer indexes, torch <-> numpy tensors and dtypes.
- :mod:`.npz` — ``.npz`` archives (``allow_pickle=False``).
- :mod:`.deepspeed` — DeepSpeed ZeRO 0-2 checkpoint folders: weights, flat fp32 master partitions cut back into
  named parameters where the layout adds up, Adam moments; DeepSpeed's plain-value classes read as inert records.
- :mod:`.trainer_folder` — Hugging Face Trainer folders, read: ``checkpoint-<step>`` listing, weight files,
  optimizer slots mapped to parameter names, weight/moment triples, a folder's layout and optimizer skeleton.
- :mod:`.trainer_write` — Trainer folders, written: from a live training run, or from arrays and a record.
- :mod:`.optimizer_json` — an optimizer ``state_dict`` as moment arrays + a JSON skeleton, and back.
- :mod:`.tensors` — :class:`TensorRef` (one indexed tensor of a file) and the checked load.
- :mod:`.fileio` — one-line file checks, sha256, atomic writes.

Every reader turns a missing, empty, truncated or foreign file into one :class:`~lmcbench.errors.SourceError`
line naming the file. ``training_args.bin``, ``rng_state*.pth`` and ``scheduler.pt`` are never opened by a
reader (the tinygpt trainer reads its own ``scheduler.pt`` to resume, with ``weights_only=True``).
"""

from .tensors import KINDS, MOMENTS, TensorRef, load_checked  # noqa: F401
from .trainer_folder import (  # noqa: F401
    CHECKPOINT_RE,
    list_checkpoints,
    load_triples,
    model_order,
    read_checkpoint,
    slot_names,
)

__all__ = ["KINDS", "MOMENTS", "TensorRef", "load_checked", "CHECKPOINT_RE", "list_checkpoints", "load_triples",
           "model_order", "read_checkpoint", "slot_names"]
