"""A glob of checkpoint files (``.safetensors``, ``.pt``/``.bin`` state dicts, ``.npz``), one step per file
name, the step parsed from the name by a regular expression."""

from __future__ import annotations

import glob
import os
import re

from ..errors import ConfigError, SourceError
from . import Source, TensorEntry
from .hf_trainer import slot_names
from .readers import (flatten_tensors, npz_index, npz_load, safetensors_index, safetensors_load, torch_dtype_to_numpy, torch_load,
                      torch_to_numpy)


def kind_from_name(name: str) -> str:
    if re.search(r"exp_avg_sq", name):
        return "exp_avg_sq"
    if re.search(r"exp_avg", name):
        return "exp_avg"
    return "weight"


class FilesSource(Source):
    source_type = "files"

    def __init__(self, path=None, step_regex=r"(\d+)(?!.*\d)", **kw):
        super().__init__(**kw)
        if not path:
            raise SourceError("source=files needs source.path=GLOB (e.g. 'ckpts/step*.safetensors')")
        self.pattern = os.path.expanduser(str(path))
        try:
            self.step_regex = re.compile(step_regex)
        except re.error as e:
            raise ConfigError(f"source.step_regex: bad regular expression: {e}") from None

    def describe(self):
        return self.pattern

    def files(self) -> list[tuple[int, str]]:
        paths = sorted(glob.glob(self.pattern, recursive=True))
        if not paths:
            if os.path.exists(self.pattern):
                paths = [self.pattern]
            else:
                raise SourceError(f"{self.pattern}: no files match")
        out = []
        for p in paths:
            m = self.step_regex.search(os.path.basename(p))
            if not m:
                raise SourceError(f"{p}: no step in the file name (source.step_regex={self.step_regex.pattern!r})")
            try:
                out.append((int(m.group(1) if m.groups() else m.group(0)), p))
            except ValueError:
                raise SourceError(f"{p}: step_regex matched {m.group(0)!r}, not an integer") from None
        return out

    def _index(self):
        entries = []
        for step, p in self.files():
            if self.steps is not None and step not in self.steps:
                entries.append(TensorEntry(step, "", "weight", None, (), lambda: None, p))
                continue
            low = p.lower()
            if low.endswith(".safetensors"):
                for name, (dt, shape, b, e) in safetensors_index(p).items():
                    entries.append(TensorEntry(step, name, kind_from_name(name), dt, shape,
                                               lambda p=p, dt=dt, s=shape, b=b, e=e: safetensors_load(p, dt, s, b, e), p))
            elif low.endswith(".npz"):
                for name, (dt, shape) in npz_index(p).items():
                    entries.append(TensorEntry(step, name, kind_from_name(name), dt, shape,
                                               lambda p=p, n=name: npz_load(p, n), p))
            elif low.endswith((".pt", ".pth", ".bin")):
                entries.extend(self._torch(step, p))
            else:
                raise SourceError(f"{p}: unknown checkpoint format (expected .safetensors, .pt, .bin or .npz)")
        seen = set()
        for e in entries:
            if e.name and (e.step, e.key) in seen:
                raise SourceError(f"{e.file}: tensor {e.name!r} ({e.kind}) appears twice at step {e.step}")
            seen.add((e.step, e.key))
        return entries  # with the unopened steps' placeholders (name ''), so missing steps can be named

    def _torch(self, step, p):
        import torch

        obj = torch_load(p)
        out = []
        if isinstance(obj, dict) and isinstance(obj.get("state"), dict) and isinstance(obj.get("param_groups"), list):
            names = slot_names(obj, [], None)
            for slot, st in obj["state"].items():
                for key, t in (st.items() if isinstance(st, dict) else ()):
                    if isinstance(t, torch.Tensor) and t.dim() > 0:
                        kind = key if key in ("exp_avg", "exp_avg_sq") else "other"
                        name = names.get(slot, f"slot{slot}") + ("" if kind != "other" else f".{key}")
                        out.append(TensorEntry(step, name, kind, torch_dtype_to_numpy(t.dtype), tuple(t.shape),
                                               lambda s=slot, k=key: torch_to_numpy(torch_load(p)["state"][s][k]), p))
            return out
        if not isinstance(obj, dict):
            raise SourceError(f"{p}: expected a state dict, found {type(obj).__name__}")
        for name, t in flatten_tensors(obj).items():
            out.append(TensorEntry(step, name, kind_from_name(name), torch_dtype_to_numpy(t.dtype), tuple(t.shape),
                                   lambda n=name: torch_to_numpy(flatten_tensors(torch_load(p))[n]),
                                   p))
        return out
