"""A glob of checkpoint files (``.safetensors``, ``.pt``/``.bin`` state dicts, ``.npz``), one step per file
name, the step parsed from the name by a regular expression."""

from __future__ import annotations

import glob
import os
import re

from lmc.formats.npz import npz_index, npz_load
from lmc.formats.safetensors import safetensors_refs
from lmc.formats.tensors import TensorRef
from lmc.formats.torchfile import is_optimizer_state, optimizer_refs, state_dict_refs, torch_load
from lmc.formats.trainer_folder import slot_names
from ..errors import SourceError
from .pattern import PatternSource


def kind_from_name(name: str) -> str:
    if re.search(r"exp_avg_sq", name):
        return "exp_avg_sq"
    if re.search(r"exp_avg", name):
        return "exp_avg"
    return "weight"


class FilesSource(PatternSource):
    source_type = "files"

    usage = "source.path=GLOB (e.g. 'ckpts/step*.safetensors')"

    def files(self) -> list[tuple[int, str]]:
        paths = sorted(glob.glob(self.pattern, recursive=True))
        if not paths:
            if os.path.exists(self.pattern):
                paths = [self.pattern]
            else:
                raise SourceError(f"{self.pattern}: no files match")
        return [(self.step_of(p), p) for p in paths]

    def _index(self):
        entries = self._index_steps(self.files(), self._refs)
        seen = set()
        for e in entries:
            if e.name and (e.step, e.key) in seen:
                raise SourceError(f"{e.file}: tensor {e.name!r} ({e.kind}) appears twice at step {e.step}")
            seen.add((e.step, e.key))
        return entries  # with the unopened steps' placeholders (name ''), so missing steps can be named

    @staticmethod
    def _refs(p):
        low = p.lower()
        if low.endswith(".safetensors"):
            return safetensors_refs([p], kind_from_name)
        if low.endswith(".npz"):
            return [TensorRef(name, kind_from_name(name), dt, shape, lambda p=p, n=name: npz_load(p, n), p)
                    for name, (dt, shape) in npz_index(p).items()]
        if low.endswith((".pt", ".pth", ".bin")):
            obj = torch_load(p)
            return optimizer_refs(p, obj, slot_names(obj, [], None)) if is_optimizer_state(obj) \
                else state_dict_refs(p, kind_from_name, obj)
        raise SourceError(f"{p}: unknown checkpoint format (expected .safetensors, .pt, .bin or .npz)")
