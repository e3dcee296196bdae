"""The grid runner: pipelines x codecs over every selected tensor of every step, each tensor loaded once.

Memory: the source yields tensors tensor-major, so a temporal pipeline keeps only the previous step of the
tensor it works on. A tensor larger than ``chunk_mib`` is measured in independent slices of that size
(every transform here is elementwise, and parallel codecs chunk their input the same way), so the working
set is the tensor, its reference and a few slices: about twice the largest tensor plus a fixed overhead.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import MISSING, dataclass, field

import numpy as np

from ..dtypes import dtype_name
from ..errors import NotApplicable
from ..sources import Source
from ..transforms import Pipeline, Stream
from .measure import ZERO, block_bound_bytes, byte_histogram, entropy_bits, timed

RECORD_COLUMNS = [
    "step", "tensor", "kind", "dtype", "cast", "shape", "numel", "transform", "codec", "codec_label", "codec_version",
    "threads", "orig_bytes", "comp_bytes", "ratio", "compress_s", "decompress_s", "compress_cpu_s",
    "decompress_cpu_s", "compress_s_min", "compress_s_max", "decompress_s_min", "decompress_s_max",
    "transform_s", "untransform_s", "repeats", "n_streams", "entropy_bits", "entropy_bound_bytes", "block_bound_bytes", "ref_step",
    "verified", "error", "codec_config", "transform_config",
]
XOR_COLUMNS = ["step", "ref_step", "tensor", "kind", "dtype", "numel", "changed_elems", "changed_bytes", "changed_bits",
               "sign_flips", "exponent_flips", "mantissa_flips", "bit_flips", "lag"]
STREAM_COLUMNS = ["step", "tensor", "kind", "dtype", "transform", "stream", "ref_step", "bytes", "entropy_bits",
                  "block_bound_bytes"]


@dataclass
class BenchOptions:
    warmup: int = 1  # untimed calls the first time a codec or transform meets a dtype in a run
    repeats: int = 3
    budget_s: float = 0.3
    chunk_mib: float = 16.0
    entropy_block_kib: int = 64  # block size of the per-block order-0 entropy bound
    xor_analysis: bool = True  # xor.csv: which bits change between consecutive steps of each tensor
    xor_lags: list = field(default_factory=lambda: [1])  # ... and between steps this many checkpoints apart
    verify: bool = True
    progress: bool = True
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg) -> "BenchOptions":
        from ..errors import ConfigError

        cfg = dict(cfg or {})
        known = {k: cfg.pop(k) for k in list(cfg) if k in cls.__dataclass_fields__}
        if cfg:
            raise ConfigError(f"bench: unknown option(s) {', '.join(sorted(cfg))}")
        for k, v in known.items():
            f = cls.__dataclass_fields__[k]
            want = type(f.default_factory()) if f.default is MISSING else type(f.default)
            if want is float and isinstance(v, int) and not isinstance(v, bool):
                known[k] = v = float(v)
            if want is not dict and not isinstance(v, want) or (want is int and isinstance(v, bool)):
                raise ConfigError(f"bench.{k}: expected {want.__name__}, got {v!r}")
        opts = cls(**known)
        if not opts.xor_lags or any(isinstance(g, bool) or not isinstance(g, int) or g < 1 for g in opts.xor_lags):
            raise ConfigError(f"bench.xor_lags: expected a list of positive integers, got {opts.xor_lags!r}")
        if opts.repeats < 1 or opts.warmup < 0 or opts.chunk_mib <= 0 or opts.entropy_block_kib <= 0:
            raise ConfigError("bench: need repeats >= 1, warmup >= 0, chunk_mib > 0, entropy_block_kib > 0")
        return opts


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


def _slices(n: int, chunk_elems: int):
    if n == 0:
        yield 0, 0
        return
    for b in range(0, n, chunk_elems):
        yield b, min(n, b + chunk_elems)


class _Acc:
    """Accumulates one (pipeline, codec) measurement over the slices of a tensor."""

    def __init__(self):
        self.comp = 0
        self.ctime = ZERO
        self.dtime = ZERO
        self.verified = True
        self.error = ""
        self.skipped = ""


def run(source: Source, pipelines: dict[str, Pipeline], codecs: dict, opts: BenchOptions, out_dir: str,
        log=print, restrict: dict | None = None) -> dict:
    """Measure the grid, writing ``records.csv`` and ``streams.csv`` into ``out_dir``. Returns a summary."""
    os.makedirs(out_dir, exist_ok=True)
    records = CsvAppender(os.path.join(out_dir, "records.csv"), RECORD_COLUMNS)
    streams_out = CsvAppender(os.path.join(out_dir, "streams.csv"), STREAM_COLUMNS)
    xor_out = CsvAppender(os.path.join(out_dir, "xor.csv"), XOR_COLUMNS) if opts.xor_analysis else None
    prev: list = []  # (step, array) of the previous steps of the current tensor, for the XOR analysis
    xor_keep = max(opts.xor_lags)
    entries = source.entries()
    total_bytes = sum(e.nbytes for e in entries)
    skipped: dict[tuple, str] = {}
    n_rows = n_fail = 0
    # pipeline -> [(step, decoded array)] of the current tensor's last ``pipeline.lag`` steps
    refs: dict[str, list[tuple[int, np.ndarray]]] = {}
    current_key = None
    warmed: set = set()  # (codec or pipeline, dtype) pairs that had their warm-up calls
    bar = None
    if opts.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc="measuring",
                   dynamic_ncols=True, disable=None)
    try:
        for e in entries:
            if e.key != current_key:
                refs.clear()  # only the previous steps of *this* tensor are ever kept
                prev = []
                current_key = e.key
            rec = source.load(e)
            if xor_out is not None:
                for lag in sorted(set(opts.xor_lags)):
                    if len(prev) >= lag:
                        pstep, parr = prev[-lag]
                        if parr.shape == rec.array.shape and parr.dtype == rec.array.dtype:
                            xor_out.write([{**xor_row(rec, pstep, parr, int(opts.chunk_mib * 2**20)), "lag": lag}])
                prev = (prev + [(rec.step, rec.array)])[-xor_keep:]
            if bar is not None:
                bar.set_postfix_str(f"step {e.step} {e.name[-40:]} ({e.kind})")
            rows, srows, new_refs = measure_tensor(rec, pipelines, codecs, opts, refs, skipped, warmed, restrict)
            refs = new_refs
            records.write(rows)
            streams_out.write(srows)
            n_rows += len(rows)
            n_fail += sum(1 for r in rows if not r["verified"])
            if bar is not None:
                bar.update(e.nbytes)
            del rec
    finally:
        if bar is not None:
            bar.close()
        records.close()
        streams_out.close()
        if xor_out is not None:
            xor_out.close()
    by_codec: dict[str, list] = {}
    for (codec, transform, dt), why in sorted(skipped.items()):
        by_codec.setdefault(codec, []).append(f"{transform}/{dt}")
    for codec, where in by_codec.items():
        why = next(v for k, v in skipped.items() if k[0] == codec)
        log(f"note: {codec} does not apply to {', '.join(where)} ({why})")
    return {"rows": n_rows, "failed": n_fail, "tensors": len(entries), "bytes": total_bytes,
            "largest_tensor_mib": max((e.nbytes for e in entries), default=0) / 2**20,
            "skipped": [list(k) + [v] for k, v in sorted(skipped.items())]}


def measure_tensor(rec, pipelines: dict[str, Pipeline], codecs: dict, opts: BenchOptions, refs: dict,
                   skipped: dict, warmed: set | None = None, restrict: dict | None = None):
    """All (pipeline, codec) measurements of one tensor. Returns rows, stream rows and the next references.

    ``refs`` maps a temporal pipeline to the decoded earlier steps of this tensor, oldest first, as a list
    of ``(step, array)`` (a single tuple is taken as a list of one); the returned references keep the last
    ``pipeline.lag`` of them, this step included.

    Warm-up calls (Numba compiles, contexts are allocated on first use) are made the first time a codec or a
    pipeline meets a stream dtype in the run, tracked in ``warmed``; every later measurement is timed at once.
    ``restrict`` maps a codec name to the only pipelines it is measured with (the others are left out)."""
    warmed = set() if warmed is None else warmed
    restrict = restrict or {}

    def warmup(key):
        if key in warmed:
            return 0
        warmed.add(key)
        return opts.warmup

    x = np.ascontiguousarray(rec.array).reshape(-1)
    n = x.size
    chunk_elems = max(1, int(opts.chunk_mib * 2**20) // max(1, x.itemsize))
    dt = dtype_name(rec.dtype)
    rows, srows, new_refs = [], [], {}
    for pname, pipe in pipelines.items():
        hist = refs.get(pname) or []
        hist = [hist] if isinstance(hist, tuple) else list(hist)
        ref_step, ref = hist[-pipe.lag] if pipe.temporal and len(hist) >= pipe.lag else (None, None)
        ref_flat = None if ref is None else ref.reshape(-1)
        pcodecs = {c: v for c, v in codecs.items() if c not in restrict or pname in restrict[c]}
        accs = {cname: _Acc() for cname in pcodecs}
        hists: dict[str, np.ndarray] = {}
        sbytes: dict[str, int] = {}
        sblock: dict[str, float] = {}  # per-block order-0 bound (bytes) of each stream
        ttime = utime = ZERO
        broken = None  # a decoded copy, made only if some slice fails to round-trip
        for b, end in _slices(n, chunk_elems):
            xs = x[b:end]
            rs = None if ref_flat is None else ref_flat[b:end]
            wu = warmup(("pipeline", pname, dt))
            (streams, stages), tt = timed(lambda: pipe.encode(xs, rs), wu, opts.repeats, opts.budget_s)
            ttime = ttime + tt
            for s in streams:
                h = byte_histogram(s.data)
                hists[s.name] = hists.get(s.name, 0) + h
                sbytes[s.name] = sbytes.get(s.name, 0) + s.nbytes
                sblock[s.name] = sblock.get(s.name, 0.0) + block_bound_bytes(s.data, opts.entropy_block_kib * 1024)
            ut = timed(lambda: pipe.decode(streams, stages, rs, rec.dtype, xs.shape), wu, opts.repeats,
                       opts.budget_s)[1]
            utime = utime + ut
            first = True
            for cname, codec in pcodecs.items():
                acc = accs[cname]
                if acc.skipped or not acc.verified:
                    continue
                try:
                    if pipe.codec_reference and not codec.supports_reference:
                        raise NotApplicable("it takes no reference (the 'reference' pipeline is for codecs that "
                                            "delta themselves, such as lmc)")
                    for s in streams:
                        codec.check_applicable(s.as_typed())
                except NotApplicable as why:
                    acc.skipped = str(why)
                    continue
                sig = (cname, pname) + tuple(str(st.as_typed().dtype) for st in streams)
                dec = _measure_codec(codec, streams, opts, acc, warmup(sig))
                if dec is not None and opts.verify:
                    y = _verify(pipe, dec, stages, rs, rec.dtype, xs, acc)
                    # the first codec's decoded output is the next step's reference; copy x only if it differs
                    if first and pipe.temporal and not acc.verified and y is not None:
                        if broken is None:
                            broken = x.copy()
                        broken[b:end] = y
                    del y
                del dec
                first = False
            del streams
        # the reference for the next step is the *decoded* tensor (bit-identical to x unless a round trip failed)
        if pipe.temporal:
            new_refs[pname] = (hist + [(rec.step, (broken if broken is not None else x).reshape(rec.shape))])[-pipe.lag:]
        ent_bound = sum(entropy_bits(h) * int(h.sum()) / 8 for h in hists.values())
        blk_bound = sum(sblock.values())
        tot_stream = sum(sbytes.values())
        ent_avg = (sum(entropy_bits(h) * int(h.sum()) for h in hists.values()) / tot_stream) if tot_stream else 0.0
        for sname, h in hists.items():
            srows.append({"step": rec.step, "tensor": rec.name, "kind": rec.kind, "dtype": dt, "transform": pname,
                          "stream": sname, "ref_step": "" if ref_step is None else ref_step, "bytes": sbytes[sname],
                          "block_bound_bytes": round(sblock[sname], 1),
                          "entropy_bits": round(entropy_bits(h), 6)})
        for cname, codec in pcodecs.items():
            acc = accs[cname]
            if acc.skipped:
                skipped[(codec.label, pname, dt)] = acc.skipped
                continue
            orig = int(x.nbytes)
            comp_s = acc.ctime.median + ttime.median
            dec_s = acc.dtime.median + utime.median
            rows.append({
                "step": rec.step, "tensor": rec.name, "kind": rec.kind, "dtype": dt, "cast": rec.cast,
                "shape": "x".join(map(str, rec.shape)), "numel": n, "transform": pname, "codec": cname,
                "codec_label": codec.label, "codec_version": codec.version, "threads": codec.threads,
                "orig_bytes": orig, "comp_bytes": acc.comp if acc.verified or acc.comp else "",
                "ratio": (orig / acc.comp) if acc.comp else "",
                "compress_s": comp_s, "decompress_s": dec_s,
                "compress_cpu_s": acc.ctime.cpu + ttime.cpu, "decompress_cpu_s": acc.dtime.cpu + utime.cpu,
                "compress_s_min": acc.ctime.min + ttime.min, "compress_s_max": acc.ctime.max + ttime.max,
                "decompress_s_min": acc.dtime.min + utime.min, "decompress_s_max": acc.dtime.max + utime.max,
                "transform_s": ttime.median, "untransform_s": utime.median, "repeats": acc.ctime.repeats,
                "n_streams": len(hists), "entropy_bits": round(ent_avg, 6), "entropy_bound_bytes": round(ent_bound, 1),
                "block_bound_bytes": round(blk_bound, 1),
                "ref_step": "" if ref_step is None else ref_step, "verified": bool(acc.verified and not acc.error),
                "error": acc.error, "codec_config": json.dumps(codec.get_config(), sort_keys=True),
                "transform_config": json.dumps(pipe.get_config()),
            })
    return rows, srows, new_refs


def xor_row(rec, ref_step: int, ref: np.ndarray, slice_bytes: int) -> dict:
    """What changed between a tensor and its previous step: elements, bytes and bits, by field of the float
    (sign, exponent, mantissa) and per bit position (``bit_flips``: counts from the most significant bit down,
    separated by ``/``)."""
    from ..dtypes import FLOAT_LAYOUT, bits

    x, r = bits(rec.array), bits(ref)
    width = x.dtype.itemsize * 8
    flips = np.zeros(width, np.int64)
    changed_elems = changed_bytes = 0
    step = max(1, slice_bytes // x.dtype.itemsize)
    for b in range(0, x.size, step):
        d = np.bitwise_xor(x[b:b + step], r[b:b + step])
        changed_elems += int(np.count_nonzero(d))
        changed_bytes += int(np.count_nonzero(d.view(np.uint8)))
        for k in range(width):
            flips[width - 1 - k] += int(np.count_nonzero(d & np.array(1 << k, d.dtype)))
    ebits, mbits = FLOAT_LAYOUT.get(np.dtype(rec.dtype), (0, width))
    sign = int(flips[0]) if ebits else 0
    return {"step": rec.step, "ref_step": ref_step, "tensor": rec.name, "kind": rec.kind,
            "dtype": dtype_name(rec.dtype), "numel": int(x.size), "changed_elems": changed_elems,
            "changed_bytes": changed_bytes, "changed_bits": int(flips.sum()), "sign_flips": sign,
            "exponent_flips": int(flips[1:1 + ebits].sum()) if ebits else 0,
            "mantissa_flips": int(flips[width - mbits:].sum()) if ebits else int(flips.sum()),
            "bit_flips": "/".join(str(int(v)) for v in flips)}


def _verify(pipe, dec, stages, ref, dtype, xs, acc: _Acc):
    """Undo the transform on the codec's output and compare with the original, byte for byte. Returns the
    decoded slice (flat, as the tensor's dtype) or None."""
    try:
        y = pipe.decode(dec, stages, ref, dtype, xs.shape).reshape(-1)
    except Exception as ex:  # noqa: BLE001 - a failed round trip is a recorded error
        acc.verified, acc.error = False, f"decode of the transform failed: {type(ex).__name__}: {ex}"
        return None
    if y.dtype != xs.dtype or not np.array_equal(y.view(np.uint8), xs.view(np.uint8)):
        acc.verified, acc.error = False, "round trip is not bit-exact"
    return y


def _measure_codec(codec, streams: list[Stream], opts: BenchOptions, acc: _Acc, warmup: int):
    """Compress every stream, then decompress; time both. Returns the decoded streams or None on error."""
    inputs = [s.as_typed() for s in streams]
    refs = [s.ref_typed() for s in streams]
    try:
        blobs, ct = timed(lambda: [codec.encode(a) if r is None else codec.encode_ref(a, r)
                                   for a, r in zip(inputs, refs)], warmup, opts.repeats, opts.budget_s)
    except Exception as ex:  # noqa: BLE001 - a codec failure is a recorded error, never a crash of the run
        acc.verified, acc.error = False, f"encode failed: {type(ex).__name__}: {ex}"
        return None
    try:
        outs, dt = timed(lambda: [codec.decode(bl) if r is None else codec.decode_ref(bl, r)
                                  for bl, r in zip(blobs, refs)], warmup, opts.repeats, opts.budget_s)
    except Exception as ex:  # noqa: BLE001
        acc.verified, acc.error = False, f"decode failed: {type(ex).__name__}: {ex}"
        return None
    acc.comp += sum(memoryview(bl).nbytes for bl in blobs)
    acc.ctime = acc.ctime + ct
    acc.dtime = acc.dtime + dt
    dec = []
    for s, o in zip(streams, outs):
        raw = np.asarray(o).reshape(-1).view(np.uint8)
        if raw.nbytes != s.nbytes:
            acc.verified, acc.error = False, f"decoded {raw.nbytes} bytes, expected {s.nbytes}"
            return None
        dec.append(Stream(s.name, raw.view(s.data.dtype).reshape(s.data.shape), s.typed))
    return dec
