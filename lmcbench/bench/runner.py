"""The grid runner: pipelines x codecs over every selected tensor of every step, each tensor loaded once.

Memory: the source yields tensors tensor-major, so a temporal pipeline keeps only the previous step of the
tensor it works on (a step-major source, one checkpoint at a time, makes it keep every tensor's: a checkpoint's
worth per step of lag). A tensor larger than ``chunk_mib`` is measured in independent slices of that size
(every transform here is elementwise, and parallel codecs chunk their input the same way), so the working
set is the tensor, its reference and a few slices: about twice the largest tensor plus a fixed overhead.

With ``bench.sample < 1`` only the slices a :class:`~.sample.SamplePlan` chose are measured, each as a tensor of
its own (one row per slice), against the same slice of the previous step; tensors with no sampled slice are
not read (unless the XOR analysis needs them).

The options are in :mod:`.options`, the columns and the CSV sink in :mod:`.records`, the XOR analysis in
:mod:`.xor`, the sample plan in :mod:`.sample`; this module is the loop. A pipeline undoes itself (:meth:`Pipeline.decode` with the same
reference), so verifying a measurement is decoding the codec's output through it and comparing.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ..dtypes import dtype_name
from ..errors import NotApplicable
from ..sources import Source, TensorRecord
from ..transforms import Pipeline, Stream
from .measure import ZERO, adaptive_bits, block_bound_bytes, byte_histogram, entropy_bits, plane_context_counts, timed
from .options import BenchOptions
from .records import RECORD_COLUMNS, STREAM_COLUMNS, CsvAppender
from .sample import PLAN_COLUMNS, SAMPLE_COLUMNS, SamplePlan
from .xor import XorAnalysis

__all__ = ["BenchOptions", "RECORD_COLUMNS", "STREAM_COLUMNS", "CsvAppender", "measure_tensor", "run"]


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
        log=print, restrict: dict | None = None, every_slice: bool = False) -> dict:
    """Measure the grid, writing ``records.csv`` and ``streams.csv`` into ``out_dir``. Returns a summary.

    A sampled run (``opts.sample < 1``) also writes ``sample.csv`` (every unit, and whether it was measured) and
    adds the :data:`~.sample.SAMPLE_COLUMNS` to the records; a run that measures everything writes what it
    always wrote. ``every_slice`` measures every unit of the sample's frame the way a sample measures its own
    (each slice on its own, one row per slice): the population a sample is drawn from."""
    os.makedirs(out_dir, exist_ok=True)
    entries = source.entries()
    frac = 1.0 if every_slice else opts.sample
    shard = getattr(source, "sharding", None)
    scope = f"shard{shard['index']}of{shard['count']}:" if shard else ""
    plan = SamplePlan(entries, frac, opts.sample_seed, opts.sample_unit_kib, scope) \
        if frac < 1 or every_slice else None
    records = CsvAppender(os.path.join(out_dir, "records.csv"), RECORD_COLUMNS + (SAMPLE_COLUMNS if plan else []))
    streams_out = CsvAppender(os.path.join(out_dir, "streams.csv"),
                              STREAM_COLUMNS + (["slice", "sample_weight"] if plan else []))
    if plan is not None:
        with CsvAppender(os.path.join(out_dir, "sample.csv"), PLAN_COLUMNS) as f:
            f.write(plan.plan_rows())
    xor = XorAnalysis(os.path.join(out_dir, "xor.csv"), opts.xor_lags, int(opts.chunk_mib * 2**20)) \
        if opts.xor_analysis else None
    total_bytes = sum(e.nbytes for e in entries)
    measured = {e.key: sum(u.nbytes for u in plan.units(e.key)) for e in entries} if plan else {}
    skipped: dict[tuple, str] = {}
    n_rows = n_fail = 0
    # tensor key -> that tensor's references: {pipeline: [(step, decoded array)]} of its last ``pipeline.lag``
    # steps (sampled: {slice: {pipeline: ...}}); only the current tensor's when tensor-major, every tensor's (a
    # checkpoint's worth per step of lag) when step-major
    held: dict[tuple, dict] = {}
    step_major = source.step_major
    warmed: set = set()  # (codec or pipeline, dtype) pairs that had their warm-up calls
    bar = None
    if opts.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=sum(measured.get(e.key, 0) for e in entries) if plan else total_bytes, unit="B",
                   unit_scale=True, unit_divisor=1024, desc="measuring (sampled)" if plan else "measuring",
                   dynamic_ncols=True, disable=None)
    try:
        for e in entries:
            if e.key not in held and not step_major:
                held.clear()  # tensor-major: only the previous steps of *this* tensor are ever kept
                if xor is not None:
                    xor.new_tensor()
            if plan is not None and not plan.units(e.key) and xor is None:
                continue  # nothing of this tensor is sampled
            rec = source.load(e)
            if xor is not None:
                xor.add(rec, e.key)
            if bar is not None:
                bar.set_postfix_str(f"step {e.step} {e.name[-40:]} ({e.kind})")
            if plan is None:
                rows, srows, held[e.key] = measure_tensor(rec, pipelines, codecs, opts, held.get(e.key, {}),
                                                          skipped, warmed, restrict)
            else:
                rows, srows = _measure_sampled(rec, plan, plan.units(e.key), held.setdefault(e.key, {}), pipelines,
                                               codecs, opts, skipped, warmed, restrict)
            records.write(rows)
            streams_out.write(srows)
            n_rows += len(rows)
            n_fail += sum(1 for r in rows if not r["verified"])
            if bar is not None:
                bar.update(measured.get(e.key, 0) if plan else e.nbytes)
            del rec
        source.finish()
    finally:
        if bar is not None:
            bar.close()
        records.close()
        streams_out.close()
        if xor is not None:
            xor.close()
    by_codec: dict[str, list] = {}
    for (codec, transform, dt), why in sorted(skipped.items()):
        by_codec.setdefault(codec, []).append(f"{transform}/{dt}")
    for codec, where in by_codec.items():
        why = next(v for k, v in skipped.items() if k[0] == codec)
        log(f"note: {codec} does not apply to {', '.join(where)} ({why})")
    summary = {"rows": n_rows, "failed": n_fail, "tensors": len(entries), "bytes": total_bytes,
               "largest_tensor_mib": max((e.nbytes for e in entries), default=0) / 2**20,
               "skipped": [list(k) + [v] for k, v in sorted(skipped.items())]}
    if plan is not None:
        summary["sample"] = plan.describe()
    return summary


def _measure_sampled(rec, plan: SamplePlan, units, slice_refs: dict, pipelines, codecs, opts, skipped, warmed,
                     restrict):
    """The sampled slices of one tensor, each measured as a tensor of its own against the same slice of the
    previous steps (``slice_refs``: slice -> that slice's references). Rows keep the tensor's shape and carry the
    sample columns; a slice is copied out (read-only) so that only sampled bytes are kept as references."""
    flat = np.asarray(rec.array).reshape(-1)
    shape = "x".join(map(str, rec.shape))
    rows, srows = [], []
    for u in units:
        if u.start >= flat.size:  # this step's tensor is shorter than the largest one
            continue
        part = flat[u.start:u.end].copy()
        part.flags.writeable = False
        one = TensorRecord(rec.step, rec.name, rec.kind, rec.dtype, part.shape, part, rec.cast)
        r, sr, slice_refs[u.index] = measure_tensor(one, pipelines, codecs, opts, slice_refs.get(u.index, {}),
                                                    skipped, warmed, restrict)
        extra = plan.row_fields(u)
        rows += [{**x, "shape": shape, **extra} for x in r]
        srows += [{**x, "slice": u.index, "sample_weight": extra["sample_weight"]} for x in sr]
    return rows, srows


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
    cond_planes: dict = {}  # reference step -> per-plane counts, then bytes (the bound given the reference)
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
        want_cond = opts.cond_bound and ref_flat is not None and ref_step not in cond_planes
        if want_cond:
            cond_planes[ref_step] = None  # per byte plane: (context, byte) counts given this reference
        ttime = utime = ZERO
        broken = None  # a decoded copy, made only if some slice fails to round-trip
        for b, end in _slices(n, chunk_elems):
            xs = x[b:end]
            rs = None if ref_flat is None else ref_flat[b:end]
            wu = warmup(("pipeline", pname, dt))
            streams, tt = timed(lambda: pipe.encode(xs, rs), wu, opts.repeats, opts.budget_s)
            ttime = ttime + tt
            for s in streams:
                h = byte_histogram(s.data)
                hists[s.name] = hists.get(s.name, 0) + h
                sbytes[s.name] = sbytes.get(s.name, 0) + s.nbytes
                sblock[s.name] = sblock.get(s.name, 0.0) + block_bound_bytes(s.data, opts.entropy_block_kib * 1024)
            if want_cond:  # once per reference, whatever the pipelines that use it
                counts = plane_context_counts(xs, rs)
                prev = cond_planes[ref_step]
                cond_planes[ref_step] = counts if prev is None else [a + c for a, c in zip(prev, counts)]
            ut = timed(lambda: pipe.decode(streams, rs, rec.dtype, xs.shape), wu, opts.repeats, opts.budget_s)[1]
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
                row = rec.shape[-1] if len(rec.shape) >= 2 and rec.shape[-1] and b % rec.shape[-1] == 0 else 0
                dec = _measure_codec(codec, streams, opts, acc, warmup(sig), row)
                if dec is not None and opts.verify:
                    y = _verify(pipe, dec, rs, rec.dtype, xs, acc)
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
        planes = _plane_bounds(cond_planes, ref_step) if opts.cond_bound and ref_flat is not None else None
        cond_bound = round(sum(planes), 1) if planes else ""
        cond = _per_stream(planes, list(hists)) if planes else {}
        for sname, h in hists.items():
            srows.append({"step": rec.step, "tensor": rec.name, "kind": rec.kind, "dtype": dt, "transform": pname,
                          "stream": sname, "ref_step": "" if ref_step is None else ref_step, "bytes": sbytes[sname],
                          "block_bound_bytes": round(sblock[sname], 1),
                          "cond_bound_bytes": round(cond[sname], 1) if sname in cond else "",
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
                "block_bound_bytes": round(blk_bound, 1), "cond_bound_bytes": cond_bound,
                "ref_step": "" if ref_step is None else ref_step, "verified": bool(acc.verified and not acc.error),
                "error": acc.error, "codec_config": json.dumps(codec.get_config(), sort_keys=True),
                "transform_config": json.dumps(pipe.get_config()),
            })
    return rows, srows, new_refs


def _plane_bounds(cond_planes: dict, ref_step) -> list[float]:
    """Bytes per byte plane of the bound given the reference: each plane's adaptive code length under its
    context (or the adaptive order-0 one, if smaller: a coder may ignore the reference), cached per reference."""
    counts = cond_planes[ref_step]
    if counts and not isinstance(counts[0], float):
        cond_planes[ref_step] = counts = [min(adaptive_bits(c), adaptive_bits(c.sum(axis=0))) / 8 for c in counts]
    return counts


def _per_stream(planes: list[float], names: list[str]) -> dict:
    """The bound given the reference per stream, where the streams say what part of the tensor they hold: the
    byte planes ``b<j>`` (a delta then byte-grouping) get their plane's, a single stream the whole bound."""
    if len(names) == 1:
        return {names[0]: sum(planes)}
    if sorted(names) == sorted(f"b{j}" for j in range(len(planes))):
        return {f"b{j}": v for j, v in enumerate(planes)}
    return {}


def _verify(pipe, dec, ref, dtype, xs, acc: _Acc):
    """Undo the transform on the codec's output and compare with the original, byte for byte. Returns the
    decoded slice (flat, as the tensor's dtype) or None."""
    try:
        y = pipe.decode(dec, ref, dtype, xs.shape).reshape(-1)
    except Exception as ex:  # noqa: BLE001 - a failed round trip is a recorded error
        acc.verified, acc.error = False, f"decode of the transform failed: {type(ex).__name__}: {ex}"
        return None
    if y.dtype != xs.dtype or not np.array_equal(y.view(np.uint8), xs.view(np.uint8)):
        acc.verified, acc.error = False, "round trip is not bit-exact"
    return y


def _measure_codec(codec, streams: list[Stream], opts: BenchOptions, acc: _Acc, warmup: int, row: int = 0):
    """Compress every stream, then decompress; time both. Returns the decoded streams or None on error.
    ``row``: the tensor's row length when the slice holds whole rows (0: unknown); a codec that takes rows
    (``takes_rows``: LMC, whose predicted-exponent mode uses the element above) sees a stream of one value per
    element as a (rows, row) array, as it would see the tensor itself."""
    inputs = [s.as_typed() for s in streams]
    refs = [s.ref_typed() for s in streams]
    if row and codec.takes_rows:
        def rows(a):
            return a.reshape(-1, row) if a is not None and a.ndim == 1 and a.size and a.size % row == 0 else a
        inputs, refs = [rows(a) for a in inputs], [rows(r) for r in refs]
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
