"""``task: store`` (``lmcbench experiment=checkpoint_store``): a training run's checkpoints saved again by each way of
saving one (torch.save, zstd, ZipNN, DCP, DCP + ZStandard, the LMC archive, LMC's DCP writer, sync and async):
bytes on disk, time the loop is blocked, time to complete, restore time and bit-exactness."""

from .options import METHODS, VARIANTS, StoreConfig
from .run import run_store

__all__ = ["METHODS", "VARIANTS", "StoreConfig", "run_store"]
