"""``.npz`` archives: member headers read without loading data, never unpickling (``allow_pickle=False``)."""

from __future__ import annotations

import zipfile

import numpy as np

from .errors import SourceError
from .fileio import check_file


def npz_index(path: str) -> dict[str, tuple[np.dtype, tuple]]:
    check_file(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {}
            for k in z.files:
                # read only the .npy header of each member
                with z.zip.open(k + ".npy" if k + ".npy" in z.zip.namelist() else k) as f:
                    version = np.lib.format.read_magic(f)
                    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                            else np.lib.format.read_array_header_2_0)
                    shape, fortran, dtype = read(f)
                out[k] = (np.dtype(dtype), tuple(shape))
            return out
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise SourceError(f"{path}: not a readable .npz file ({e})") from None


def npz_load(path: str, name: str) -> np.ndarray:
    with np.load(path, allow_pickle=False) as z:
        return np.array(z[name], copy=True)
