"""Array modes of the LMCL container (``LOSSY_FORMAT.md``, "Modes"): how one stored array becomes sections
and how a decoder turns them back into the array, given the previous reconstruction's array (``ref``).

Every encoder here returns ``(mode, args, [(section array, coding)], recon)``; ``recon`` is bit for bit what
:func:`decode` gives for it. Arithmetic that a decoder repeats is float32 numpy (or a float64 table rounded to
float32 once), so encoder and decoder agree.
"""

from __future__ import annotations

import math

import numpy as np

from .container import LossyError, LossyFormatError, code_section

F32 = np.dtype(np.float32)
LOG_CODES = 255  # a log code k in 1..255 is max * 2**(-(255 - k) / steps_per_octave); 0 is zero


def encode_array(mode: str, x: np.ndarray, ref, **kw):
    """Dispatch to the mode's encoder; returns ``(entry fields, [(coding, stored bytes)...], recon)``. A lossy
    mode's reconstruction is its decoder's output on the sections it made: what a reader will get."""
    out = _ENCODERS[mode](x, ref, **kw)
    m, args, secs = out[:3]
    recon = out[3] if len(out) == 4 else _DECODERS[m](args, [a for a, _ in secs], x.shape, ref)
    descs, stored = [], []
    for arr, coding in secs:
        d, b = code_section(arr, coding)
        descs.append(d)
        stored.append(b)
    entry = {"dtype": x.dtype.name, "shape": list(x.shape), "mode": m, "args": args, "sections": descs}
    return entry, stored, recon


# -------------------------------------------------------------------------------------- lossless
def enc_lossless(x, ref, **_):
    """``raw`` (any dtype) or ``lmc`` (float32; against ``ref`` when it has the same shape)."""
    if x.dtype != F32 or x.size == 0:
        return "raw", {}, [(np.frombuffer(np.ascontiguousarray(x).tobytes(), np.uint8), "auto")], x.copy()
    import lmc

    use_ref = ref is not None and ref.dtype == F32 and ref.shape == x.shape
    blob = lmc.compress(np.ascontiguousarray(x).reshape(-1), threads=1,
                        reference=np.ascontiguousarray(ref).reshape(-1) if use_ref else None)
    return "lmc", {"ref": use_ref}, [(np.frombuffer(blob, np.uint8), "raw")], x.copy()


def enc_zero(x, ref, **_):
    return "zero", {}, [], np.zeros(x.shape, F32)


# ------------------------------------------------------------------------------- blockwise codes
def _blocks(x: np.ndarray, block: int) -> tuple[np.ndarray, int]:
    flat = x.reshape(-1)
    nb = -(-flat.size // block)
    pad = np.zeros(nb * block, F32)
    pad[:flat.size] = flat
    return pad.reshape(nb, block), nb


def enc_absmax(x, ref, block=256, bits=8, residual=False, **_):
    """Blockwise absmax: ``code = rint(x / scale * qmax)`` in int8, ``qmax = 2**(bits-1) - 1``, one float32
    scale (the block's max |x|) per block; decoded ``code * (scale / qmax)`` (float32)."""
    d = (x - ref if residual else x).astype(F32)
    qmax = (1 << (bits - 1)) - 1
    b, nb = _blocks(d, block)
    scale = np.abs(b).max(axis=1).astype(F32)
    safe = np.where(scale > 0, scale, np.float32(1))
    codes = np.clip(np.rint(b / safe[:, None] * qmax), -qmax, qmax).astype(np.int8).reshape(-1)[:x.size]
    return "absmax", {"block": block, "bits": bits, "residual": residual}, [(scale, "auto"), (codes, "auto")]


def _dec_absmax(args, secs, shape, ref):
    scale, codes = secs
    n = math.prod(shape)
    block, bits = args["block"], args["bits"]
    if scale.dtype != F32 or codes.dtype != np.int8 or codes.size != n or scale.size != -(-n // block):
        raise LossyFormatError("absmax sections do not fit the array")
    step = (scale / np.float32((1 << (bits - 1)) - 1)).astype(F32)
    out = (codes.astype(F32) * np.repeat(step, block)[:n]).reshape(shape)
    return _add_ref(out, ref, args["residual"])


def _log_table(spo: int) -> np.ndarray:
    k = np.arange(LOG_CODES + 1, dtype=np.float64)
    t = np.exp2(-(LOG_CODES - k) / spo).astype(F32)
    t[0] = 0
    return t


def _log_codes(vals: np.ndarray, vmax: np.ndarray, spo: int) -> np.ndarray:
    """Nearest log code (in the log domain) of non-negative ``vals`` against their ``vmax``; a positive value
    below the table's range gets code 1 (never zero: a zero second moment would blow Adam's update up)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(vmax > 0, vals / np.where(vmax > 0, vmax, 1), 0)
        k = LOG_CODES + np.rint(np.log2(np.where(r > 0, r, 1)) * spo)
    k = np.clip(k, 1, LOG_CODES)
    return np.where(vals > 0, k, 0).astype(np.uint8)


def enc_logblock(x, ref, block=256, spo=8, per_element=True, **_):
    """A companded 8-bit code for a non-negative array (Adam's ``exp_avg_sq``), ``max * 2**(-(255-k)/spo)``
    for a code k in 1..255, 0 = zero. ``per_element``: one float32 max per block and a code per element (the
    8-bit optimizers' kind); otherwise one float32 max for the whole array and one code per block, the
    block's geometric mean (a coarse second moment: a resumed run re-estimates it within a few steps)."""
    if x.dtype != F32 or x.size == 0 or not np.all(np.isfinite(x)) or np.any(x < 0):
        return enc_lossless(x, ref)
    b, nb = _blocks(x, block)
    if per_element:
        vmax = b.max(axis=1).astype(F32)
        codes = _log_codes(b, vmax[:, None], spo).reshape(-1)[:x.size]
    else:
        pos = b > 0
        with np.errstate(divide="ignore"):
            lg = np.where(pos, np.log2(np.where(pos, b, 1)), 0).sum(axis=1) / np.maximum(pos.sum(axis=1), 1)
        gm = np.where(pos.any(axis=1), np.exp2(lg), 0)
        vmax = np.array([gm.max(initial=0)], F32)
        codes = _log_codes(gm, vmax.astype(np.float64), spo)
    return "logblock", {"block": block, "spo": spo, "per_element": per_element}, [(vmax, "auto"), (codes, "auto")]


def _dec_logblock(args, secs, shape, ref):
    vmax, codes = secs
    n = math.prod(shape)
    block, spo, per = args["block"], args["spo"], args["per_element"]
    nb = -(-n // block)
    if not isinstance(spo, int) or isinstance(spo, bool) or not 1 <= spo <= 64 or not isinstance(per, bool) \
            or vmax.dtype != F32 or codes.dtype != np.uint8 or vmax.size != (nb if per else 1) \
            or codes.size != (n if per else nb):
        raise LossyFormatError("logblock sections do not fit the array")
    t = _log_table(spo)[codes]
    if per:
        return (t * np.repeat(vmax, block)[:n]).astype(F32).reshape(shape)
    return np.repeat((t * vmax[0]).astype(F32), block)[:n].reshape(shape)


# ------------------------------------------------------------------------------ residual coders
def _add_ref(d, ref, residual):
    if not residual:
        return d.astype(F32)
    if ref is None:
        raise LossyFormatError("a residual array without its previous reconstruction")
    with np.errstate(over="ignore", invalid="ignore"):
        return (ref + d).astype(F32)


def _rows(shape) -> int:
    """The rows the ``ctxq`` coder reads an array as: its first dimension (1 for a 0-D or 1-D array)."""
    return int(shape[0]) if len(shape) >= 2 and math.prod(shape) else 1


def enc_uniform(x, ref, step=1e-3, ctx=False, table="mid", **_):
    """Uniform scalar quantisation of the residual against ``ref``: ``code = rint((x - ref) / step)`` (int8,
    int16 when a code passes 127), decoded ``ref + code * step`` (float32). ``step`` is stored as float32.
    ``ctx``: mode ``ctxq`` (LMCL version 2) instead: the same codes coded by the context coder
    (:mod:`.ctxcode`), decoded as ``uniform`` decodes them (``table="mid"``: an empty table), to the mean
    residual of their bin (``"mean"``, :func:`_centroids`) or to ``s * code * step`` with the gain ``s`` that
    keeps the residual's component along itself (``"gain"``, :func:`_gained`); ``uniform`` only where the
    context coder would need more than 2 bytes a code."""
    step = float(np.float32(step))
    if not step > 0 or not math.isfinite(step):
        raise LossyError(f"uniform: step must be a positive float32, got {step}")
    d = (x - ref).astype(np.float64) / step
    big = np.abs(d).max(initial=0) >= 127.5
    codes = np.rint(np.clip(d, -32767, 32767)).astype(np.int16 if big else np.int8).reshape(-1)
    args = {"step": step, "residual": True}
    if ctx and codes.size:
        from . import ctxcode

        rows = _rows(x.shape)
        stream = ctxcode.encode(codes.astype(np.int32), rows, codes.size // rows)
        if stream.size:
            t = {"mid": lambda: np.zeros(0, F32), "mean": lambda: _centroids(codes, x - ref, step),
                 "gain": lambda: _gained(codes, x - ref, step)}[table]()
            return "ctxq", {"step": step, "rows": rows}, [(stream, "raw"), (t, "raw")]
    return "uniform", args, [(codes, "auto")]


CENTROIDS = 16  # ctxq: a decoded magnitude per |code| 1..16 at most; larger codes decode to code * step


def _centroids(codes, d, step) -> np.ndarray:
    """The ``ctxq`` table: for |code| = 1 .. min(max |code|, 16), the mean |residual| of the elements with that
    code (float32), ``|code| * step`` where no element has it: the decoder's value for a code is the
    conditional mean of its bin (the least squares reconstruction; a residual is peaked at 0, so the mean of
    a bin lies nearer 0 than its middle)."""
    a = np.abs(codes.astype(np.int64))
    k = int(min(a.max(initial=0), CENTROIDS))
    mag = np.abs(d.astype(np.float64).reshape(-1))
    sums = np.bincount(np.minimum(a, k + 1), weights=mag, minlength=k + 2)[1:k + 1]
    cnts = np.bincount(np.minimum(a, k + 1), minlength=k + 2)[1:k + 1]
    lev = np.arange(1, k + 1, dtype=np.float64) * step
    return np.where(cnts > 0, sums / np.maximum(cnts, 1), lev).astype(F32)


def _gained(codes, d, step) -> np.ndarray:
    """The ``ctxq`` table ``s * k * step`` (k = 1 .. min(max |code|, 16)) with ``s = <d, d> / <d, code * step>``:
    the reconstructed residual r = s * code * step then has ``<r, d> = <d, d>``: the update a checkpoint made
    is kept along its own direction (a descent direction, so what the zero codes drop costs loss to first
    order; a bin's mean keeps the squared error least but shrinks the update, and costs more loss once
    training resumes). ``s`` is kept in [1, 2]."""
    a = np.abs(codes.astype(np.int64))
    k = int(min(a.max(initial=0), CENTROIDS))
    dd = d.astype(np.float64).reshape(-1)
    dot = float(np.dot(codes.astype(np.float64), dd)) * step
    s = min(2.0, max(1.0, float(np.dot(dd, dd)) / dot)) if dot > 0 else 1.0
    return (np.arange(1, k + 1, dtype=np.float64) * step * s).astype(F32)


def _dec_ctxq(args, secs, shape, ref):
    from . import ctxcode

    stream, table = secs
    n = math.prod(shape)
    rows = args["rows"]
    if table.dtype != F32 or table.size > CENTROIDS or not np.all(np.isfinite(table)):
        raise LossyFormatError("ctxq centroid table is not at most 16 finite float32 values")
    if stream.dtype != np.uint8 or not isinstance(args["step"], float) or not isinstance(rows, int) \
            or isinstance(rows, bool) or rows != _rows(shape) or n == 0:
        raise LossyFormatError("ctxq sections do not fit the array")
    if n > 1024 * stream.size:  # a code costs at least 1/91 bit: more codes than that is a forged shape
        raise LossyFormatError(f"ctxq stream of {stream.size} bytes cannot hold {n} codes")
    if stream.size < 5 or stream[0] != 0:
        raise LossyFormatError("ctxq stream does not start with its zero byte")
    codes, used = ctxcode.decode(np.ascontiguousarray(stream), rows, n // rows)
    if used != stream.size:
        raise LossyFormatError(f"ctxq stream of {stream.size} bytes, its codes need {used}")
    if codes.size and int(np.abs(codes).max()) > 32767:
        raise LossyFormatError("ctxq code past the int16 range")
    a = np.abs(codes)
    mag = codes.astype(F32) * np.float32(args["step"])
    if table.size:
        lut = np.concatenate([np.zeros(1, F32), table])
        inside = a <= table.size
        mag = np.where(inside, np.where(codes < 0, -lut[np.minimum(a, table.size)], lut[np.minimum(a, table.size)]),
                       mag).astype(F32)
    return _add_ref(mag.reshape(shape), ref, True)


def _dec_uniform(args, secs, shape, ref):
    (codes,) = secs
    if codes.dtype not in (np.int8, np.int16) or codes.size != math.prod(shape) or not isinstance(args["step"], float):
        raise LossyFormatError("uniform sections do not fit the array")
    return _add_ref((codes.astype(F32) * np.float32(args["step"])).reshape(shape), ref, True)


def enc_bitmask(x, ref, keep=0.1, **_):
    """Bitmask sparsification: keep the ``keep`` fraction of largest |x - ref| (at least the positions whose
    bits changed when keep >= 1); a bitmask (``np.packbits``, big bit order) and the kept values of ``x``
    itself (float32, exact); elsewhere the reconstruction is ``ref``."""
    d = np.abs(x.astype(np.float64) - ref).reshape(-1)
    n = d.size
    k = min(n, max(1, int(round(keep * n))))
    if k >= n:
        mask = x.reshape(-1).view(np.uint32) != ref.reshape(-1).view(np.uint32)
    else:
        thr = np.partition(d, n - k)[n - k]
        mask = d >= thr
        mask &= d > 0
    vals = x.reshape(-1)[mask].astype(F32)
    bits = np.packbits(mask)
    args = {"count": int(mask.sum())}
    return "bitmask", args, [(bits, "auto"), (vals, "auto")]


def _dec_bitmask(args, secs, shape, ref):
    bits, vals = secs
    n = math.prod(shape)
    if ref is None:
        raise LossyFormatError("a bitmask array without its previous reconstruction")
    if bits.dtype != np.uint8 or bits.size != -(-n // 8) or vals.dtype != F32 or vals.size != args.get("count"):
        raise LossyFormatError("bitmask sections do not fit the array")
    mask = np.unpackbits(bits, count=n).astype(bool)
    if int(mask.sum()) != vals.size or (n % 8 and np.unpackbits(bits)[n:].any()):
        raise LossyFormatError("bitmask does not match its count of kept values")
    out = np.array(ref, F32, copy=True).reshape(-1)
    out[mask] = vals
    return out.reshape(shape)


def enc_cluster(x, ref, bits=4, log=False, iters=12, sample=16384, seed=0, **_):
    """Cluster-based quantisation (1-D k-means, ``2**bits - 1`` centroids, index 0 = zero): centroids
    float32 (found in the log domain for ``log``, for a non-negative array), indices uint8."""
    flat = x.reshape(-1).astype(np.float64)
    nz = flat[flat != 0]
    if x.dtype != F32 or not np.all(np.isfinite(flat)) or (log and np.any(flat < 0)):
        return enc_lossless(x, ref)
    k = (1 << bits) - 1
    dom = (lambda v: np.log(v)) if log else (lambda v: v)
    if nz.size == 0:
        cent = np.zeros(0, F32)
    else:
        s = dom(np.random.default_rng(seed).choice(nz, min(sample, nz.size), replace=False))
        c = np.quantile(s, (np.arange(k) + 0.5) / k)
        for _ in range(iters):
            c = np.unique(c)
            a = np.abs(s[:, None] - c[None, :]).argmin(axis=1)
            c = np.array([s[a == j].mean() if np.any(a == j) else c[j] for j in range(c.size)])
        cent = np.unique((np.exp(c) if log else c).astype(F32))
    idx = np.zeros(flat.size, np.uint8)
    if cent.size and nz.size:
        mids = (cent[1:].astype(np.float64) + cent[:-1]) / 2
        pos = np.searchsorted(mids, flat)
        idx = np.where(flat != 0, pos + 1, 0).astype(np.uint8)
    args = {"bits": bits}
    return "cluster", args, [(cent, "raw"), (idx, "auto")]


def _dec_cluster(args, secs, shape, ref):
    cent, idx = secs
    if cent.dtype != F32 or idx.dtype != np.uint8 or idx.size != math.prod(shape) or cent.size > 255:
        raise LossyFormatError("cluster sections do not fit the array")
    if idx.size and int(idx.max(initial=0)) > cent.size:
        raise LossyFormatError("cluster index past its centroid table")
    table = np.concatenate([np.zeros(1, F32), cent])
    return table[idx].reshape(shape)


def enc_sz3(x, ref, eb=1e-3, floor0=False, **_):
    """SZ3 (``pysz``) on the residual against ``ref`` (or the array itself without one), absolute error bound
    ``eb``; ``floor0`` clamps the reconstruction at 0 (a second moment)."""
    import pysz

    d = np.ascontiguousarray((x - ref) if ref is not None else x, F32).reshape(-1)
    eb = float(np.float32(eb))
    if not eb > 0:
        return enc_lossless(x, ref)
    cfg = pysz.szConfig()
    cfg.errorBoundMode = pysz.szErrorBoundMode.ABS
    cfg.absErrorBound = eb
    blob, _ = pysz.sz.compress(d, cfg)
    args = {"eb": eb, "residual": ref is not None, "floor0": floor0}
    return "sz3", args, [(np.asarray(blob, np.uint8), "raw")]


def _dec_sz3(args, secs, shape, ref):
    import pysz

    (blob,) = secs
    n = math.prod(shape)
    try:
        d, _ = pysz.sz.decompress(np.asarray(blob, np.uint8), np.float32, (n,))
    except Exception as e:  # noqa: BLE001 - the decompressor raises anything on hostile input
        raise LossyFormatError(f"sz3 section is corrupt ({str(e).splitlines()[0] if str(e) else type(e).__name__})") \
            from None
    out = _add_ref(np.asarray(d, F32).reshape(shape), ref, args["residual"])
    return np.maximum(out, np.float32(0)) if args["floor0"] else out


def enc_zfp(x, ref, tol=1e-3, floor0=False, **_):
    """ZFP (``zfpy``, fixed-accuracy mode, tolerance ``tol``) on the residual against ``ref``."""
    import zfpy

    d = np.ascontiguousarray((x - ref) if ref is not None else x, F32).reshape(-1)
    tol = float(np.float32(tol))
    if not tol > 0 or d.size == 0:
        return enc_lossless(x, ref)
    blob = zfpy.compress_numpy(d, tolerance=tol)
    args = {"tol": tol, "residual": ref is not None, "floor0": floor0}
    arr = np.frombuffer(blob, np.uint8)
    return "zfp", args, [(arr, "raw")]


def _dec_zfp(args, secs, shape, ref):
    import zfpy

    (blob,) = secs
    n = math.prod(shape)
    try:
        d = zfpy.decompress_numpy(bytes(np.asarray(blob, np.uint8)))
    except Exception as e:  # noqa: BLE001
        raise LossyFormatError(f"zfp section is corrupt ({str(e).splitlines()[0] if str(e) else type(e).__name__})") \
            from None
    if d.dtype != F32 or d.size != n:
        raise LossyFormatError(f"zfp section holds {d.dtype} of {d.size} values, the TOC says float32 of {n}")
    out = _add_ref(np.asarray(d, F32).reshape(shape), ref, args["residual"])
    return np.maximum(out, np.float32(0)) if args["floor0"] else out


_ENCODERS = {"lossless": enc_lossless, "zero": enc_zero, "absmax": enc_absmax, "logblock": enc_logblock,
             "uniform": enc_uniform, "bitmask": enc_bitmask, "cluster": enc_cluster, "sz3": enc_sz3, "zfp": enc_zfp}
_ARGS = {"raw": set(), "lmc": {"ref"}, "zero": set(), "absmax": {"block", "bits", "residual"},
         "logblock": {"block", "spo", "per_element"}, "uniform": {"step", "residual"}, "ctxq": {"step", "rows"}, "bitmask": {"count"},
         "cluster": {"bits"}, "sz3": {"eb", "residual", "floor0"}, "zfp": {"tol", "residual", "floor0"}}
_NSECT = {"raw": 1, "lmc": 1, "zero": 0, "absmax": 2, "logblock": 2, "uniform": 1, "ctxq": 2, "bitmask": 2, "cluster": 2,
          "sz3": 1, "zfp": 1}


def decode_array(entry: dict, secs: list, ref) -> np.ndarray:
    """One array of a checked TOC entry from its section arrays (:func:`~.container.decode_section`) and the
    previous reconstruction's array (None where there is none)."""
    mode, args, shape = entry["mode"], entry["args"], tuple(entry["shape"])
    if mode not in _ARGS:
        raise LossyFormatError(f"unknown mode {mode[:30]!r}")
    if set(args) != _ARGS[mode] or len(secs) != _NSECT[mode]:
        raise LossyFormatError(f"mode {mode}: arguments {sorted(args)[:6]} or {len(secs)} sections do not fit")
    for k in ("block", "bits"):
        if k in args and (not isinstance(args[k], int) or isinstance(args[k], bool) or not 1 <= args[k] <= 1 << 30
                          or (k == "bits" and args[k] > 8)):
            raise LossyFormatError(f"mode {mode}: bad {k}")
    if mode != "raw" and entry["dtype"] != "float32":
        raise LossyFormatError(f"mode {mode} stores float32 arrays, not {entry['dtype']}")
    if ref is not None and (ref.shape != shape or ref.dtype != F32):
        if mode in ("lmc", "raw", "zero", "logblock", "cluster") or (mode in ("absmax", "sz3", "zfp")
                                                                      and not args["residual"]):
            ref = None
        else:
            raise LossyFormatError(f"the previous reconstruction's array ({ref.dtype} {ref.shape}) does not fit {shape}")
    if mode == "raw":
        dt = _np_dtype(entry["dtype"])
        raw = secs[0].view(np.uint8)
        if raw.size != math.prod(shape) * dt.itemsize:
            raise LossyFormatError("raw section does not fit the array")
        return raw.view(dt).reshape(shape).copy()
    if mode == "zero":
        return np.zeros(shape, F32)
    if mode == "lmc":
        return _dec_lmc(args, secs[0], shape, ref)
    if (mode in ("absmax", "uniform", "sz3", "zfp") and args.get("residual") or mode == "ctxq") and ref is None:
        raise LossyFormatError(f"mode {mode}: a residual array without its previous reconstruction")
    return _DECODERS[mode](args, secs, shape, ref)


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _dec_lmc(args, blob, shape, ref):
    import lmc

    if not isinstance(args["ref"], bool) or (args["ref"] and ref is None):
        raise LossyFormatError("lmc array coded against a previous reconstruction that is not there")
    n = math.prod(shape)
    try:
        info = lmc.info(blob)
        if np.dtype(info["dtype"]) != F32 or tuple(info["shape"]) != (n,) or bool(info.get("has_reference")) != args["ref"]:
            raise LossyFormatError(f"lmc array holds {info['dtype']} {tuple(info['shape'])}, the TOC says float32 ({n},)")
        out = lmc.decompress(blob, threads=1, max_output_bytes=4 * n,
                             reference=np.ascontiguousarray(ref).reshape(-1) if args["ref"] else None)
    except LossyFormatError:
        raise
    except Exception as e:  # noqa: BLE001 - lmc's FormatError and anything else on hostile input
        raise LossyFormatError(f"lmc array is corrupt ({str(e).splitlines()[0] if str(e) else type(e).__name__})") \
            from None
    return np.asarray(out, F32).reshape(shape)


_DECODERS = {"absmax": _dec_absmax, "logblock": _dec_logblock, "uniform": _dec_uniform, "ctxq": _dec_ctxq, "bitmask": _dec_bitmask,
             "cluster": _dec_cluster, "sz3": _dec_sz3, "zfp": _dec_zfp}
