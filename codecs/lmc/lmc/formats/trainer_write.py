"""Hugging Face Trainer checkpoint folders, written: from a live model, optimizer and scheduler (what a
training run saves), or from arrays and the JSON record of a folder read earlier (what a restore gives back).
Both write folders the Trainer, :mod:`lmc.formats.trainer_folder` and the tinygpt trainer load."""

from __future__ import annotations

import json
import os
import shutil

from .dtypes import dtype_name
from .errors import SourceError
from .fileio import install_dir, remove, sha256_file, tmp_name
from .optimizer_json import rebuild_optimizer
from .safetensors import save_torch_weights
from .torchfile import numpy_to_torch
from .trainer_folder import OPTIMIZER_FILE


def write_training_checkpoint(out_dir: str, step: int, model, opt, sched, trainer_state: dict, config: dict) -> str:
    """Write ``out_dir/checkpoint-<step>/`` as a training run saves it: ``model.safetensors`` (the model's
    ``state_dict``), ``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth`` (Python, numpy and torch CPU
    generators), ``trainer_state.json`` and ``config.json``; returns its path."""
    import random

    import numpy as np
    import torch

    d = os.path.join(out_dir, f"checkpoint-{step}")
    os.makedirs(d, exist_ok=True)
    save_torch_weights({k: v.detach().contiguous() for k, v in model.state_dict().items()},
                       os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    torch.save(opt.state_dict(), os.path.join(d, OPTIMIZER_FILE))
    torch.save(sched.state_dict(), os.path.join(d, "scheduler.pt"))
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()},
               os.path.join(d, "rng_state.pth"))
    with open(os.path.join(d, "trainer_state.json"), "w") as f:
        json.dump(trainer_state, f, indent=1)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return d


def copy_files(d: str, dest: str, exclude) -> tuple[list[dict], list[str]]:
    """Copy every file of ``d`` except the names in ``exclude`` (see
    :func:`~lmc.formats.trainer_folder.replaced_files`) into ``dest``; returns (copied files with
    size and sha256, names left out)."""
    os.makedirs(dest)
    skipped = []
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        if name in exclude:
            skipped.append(name)
        elif os.path.isdir(p):
            shutil.copytree(p, os.path.join(dest, name))
        elif os.path.isfile(p):
            shutil.copy2(p, os.path.join(dest, name))
        else:
            skipped.append(name)
    files = []
    for root, _, fs in os.walk(dest):
        for f in sorted(fs):
            p = os.path.join(root, f)
            files.append({"path": os.path.relpath(p, dest).replace(os.sep, "/"), "bytes": os.path.getsize(p),
                          "sha256": sha256_file(p)})
    return sorted(files, key=lambda x: x["path"]), skipped


def write_checkpoint_folder(final: str, files_dir: str, files: list, layout: dict, skeleton: dict | None,
                            arrays: dict, rec: str, error=SourceError) -> None:
    """Write ``final/`` from what :func:`~lmc.formats.trainer_folder.read_checkpoint` and
    :func:`copy_files` kept: the copied files (each checked against its sha256), ``model.safetensors`` with
    ``arrays[name]["weight"]`` for every tensor of ``layout`` (same names, dtypes and shapes; sharded or
    ``.bin`` weights come back as one safetensors file) and ``optimizer.pt`` rebuilt from ``skeleton`` with
    the moments in ``arrays``. Written under a temporary name and moved into place when complete; a record
    that does not fit the arrays is one ``error`` naming ``rec``, the record's file."""
    import torch

    tmp = tmp_name(final)
    try:
        shutil.copytree(files_dir, tmp)
        for fi in files or []:
            p = os.path.join(tmp, *str(fi["path"]).split("/"))
            if not os.path.isfile(p) or sha256_file(p) != fi.get("sha256"):
                raise SourceError(f"{os.path.join(files_dir, fi['path'])}: missing or changed since compress "
                                  "(sha256 differs)")
        tensors = {}
        for name, info in (layout.get("tensors") or {}).items():
            if name not in arrays:
                raise error(f"{rec}: tensor {name!r} is not in the container")
            a = arrays[name]["weight"]
            if dtype_name(a.dtype) != info.get("dtype") or list(a.shape) != info.get("shape"):
                raise error(f"{rec}: {name} decodes as {dtype_name(a.dtype)}{list(a.shape)}, "
                            f"saved as {info.get('dtype')}{info.get('shape')}")
            tensors[name] = numpy_to_torch(a)
        md = layout.get("metadata")
        md = {**(md if isinstance(md, dict) and all(isinstance(v, str) for v in md.values()) else {}),
              "format": "pt"}
        save_torch_weights(tensors, os.path.join(tmp, "model.safetensors"), metadata=md)
        del tensors
        if skeleton is not None:
            torch.save(rebuild_optimizer(skeleton, arrays, rec, error), os.path.join(tmp, OPTIMIZER_FILE))
        install_dir(tmp, final)
    except BaseException:
        remove(tmp)
        raise
