"""What a run writes: the columns of ``records.csv``, ``streams.csv`` and ``xor.csv``, and the sink that appends
their rows as they are made."""

from __future__ import annotations

import csv

RECORD_COLUMNS = [
    "step", "tensor", "kind", "dtype", "cast", "shape", "numel", "transform", "codec", "codec_label", "codec_version",
    "threads", "orig_bytes", "comp_bytes", "ratio", "compress_s", "decompress_s", "compress_cpu_s",
    "decompress_cpu_s", "compress_s_min", "compress_s_max", "decompress_s_min", "decompress_s_max",
    "transform_s", "untransform_s", "repeats", "n_streams", "entropy_bits", "entropy_bound_bytes", "block_bound_bytes",
    "cond_bound_bytes", "ref_step",
    "verified", "error", "codec_config", "transform_config",
]
XOR_COLUMNS = ["step", "ref_step", "tensor", "kind", "dtype", "numel", "changed_elems", "changed_bytes", "changed_bits",
               "sign_flips", "exponent_flips", "mantissa_flips", "bit_flips", "lag"]
STREAM_COLUMNS = ["step", "tensor", "kind", "dtype", "transform", "stream", "ref_step", "bytes", "entropy_bits",
                  "block_bound_bytes", "cond_bound_bytes"]


class CsvAppender:
    """Rows appended and flushed as they are made, so an interrupted run keeps what it measured."""

    def __init__(self, path: str, columns: list[str]):
        self.path = path
        self._f = open(path, "w", newline="")
        self._w = csv.DictWriter(self._f, fieldnames=columns, extrasaction="ignore")
        self._w.writeheader()

    def write(self, rows):
        for r in rows:
            self._w.writerow(r)
        self._f.flush()

    def close(self):
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
