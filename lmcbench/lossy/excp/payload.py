"""ExCP payload: encoding a checkpoint into sections and a JSON table of contents, and the hostile-input-safe
decoding of both (FORMAT.md, "Payload", "Modes", "Decoder obligations"); the framing is in :mod:`.container`."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .container import _check_limit, _pack_container, _unpack_container
from .config import (
    _F32,
    EXPONENT_MAX,
    EXPONENT_MIN,
    KINDS,
    MAX_PAYLOAD_BYTES,
    VERSION,
    ExCPConfig,
    ExCPError,
    ExCPFormatError,
    _short,
)
from .prune import prune_moment_mask, prune_weight_mask
from .kmeans import _centroid_table, pack_bits, quantize, unpack_bits


# ---------------------------------------------------------------------------------------- dtypes
def _dtype_table() -> dict:
    names = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
             "float16", "float32", "float64", "complex64", "complex128"]
    table = {n: np.dtype(n) for n in names}
    try:
        import ml_dtypes
        for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            if hasattr(ml_dtypes, n):
                table[n] = np.dtype(getattr(ml_dtypes, n))
    except ImportError:  # pragma: no cover - ml_dtypes is a project dependency
        pass
    return table


_DTYPES = _dtype_table()


def _dtype_name(dt: np.dtype) -> str | None:
    for name, d in _DTYPES.items():
        if d == dt or (dt.kind in "biufc" and d == dt.newbyteorder("=")):
            return name
    return None


def _le(dt: np.dtype) -> np.dtype:
    return dt.newbyteorder("<") if dt.kind in "biufc" else dt


# ------------------------------------------------------------------------------------- encoding
class _PayloadWriter:
    def __init__(self):
        self.sections: list[bytes] = []
        self.cursor = 0

    def add(self, data: bytes) -> list[int]:
        self.sections.append(data)
        ref = [self.cursor, len(data)]
        self.cursor += len(data)
        return ref


def _exact_positions(mask_flat: np.ndarray, numel: int) -> tuple[str, bytes]:
    """Smallest encoding of a set of flat positions: packed bit mask or u32/u64 index list."""
    pos = np.flatnonzero(mask_flat)
    width = 4 if numel <= 0xFFFFFFFF else 8
    if pos.size * width < (numel + 7) // 8:
        return ("u32", pos.astype("<u4").tobytes()) if width == 4 else ("u64", pos.astype("<u8").tobytes())
    return "mask", np.packbits(mask_flat).tobytes()


def _entry_raw(w: _PayloadWriter, kind: str, a: np.ndarray) -> tuple[dict, float]:
    name = _dtype_name(a.dtype)
    if name is None:
        raise ExCPError(f"{kind}: unsupported dtype {a.dtype}")
    data = np.ascontiguousarray(a).astype(_le(a.dtype), copy=False).tobytes()
    return {"kind": kind, "dtype": name, "shape": list(a.shape), "mode": "raw", "sections": [w.add(data)]}, 1.0


def _entry_lossy(w: _PayloadWriter, kind: str, shape, keep: np.ndarray, exact_src: np.ndarray,
                 qsrc: np.ndarray | None, cfg: ExCPConfig) -> tuple[dict, float]:
    """One float32 array in mode zero / exact / quant.

    ``keep``: flat bool mask of the stored positions. ``exact_src``: flat float32 values to store in exact
    mode (W_t for weights, the moment itself otherwise). ``qsrc``: flat float32 values to quantise
    (dW for weights), or None for exact storage (quantize=False)."""
    numel = keep.size
    head = {"kind": kind, "dtype": "float32", "shape": list(shape)}
    count = int(np.count_nonzero(keep))
    kept = count / numel if numel else 0.0
    if count == 0:
        return {**head, "mode": "zero", "sections": []}, kept
    if qsrc is not None:
        vals = qsrc[keep]
        if count > (1 << cfg.bits) - 1 and np.all(np.isfinite(vals)):
            q = quantize(np.where(keep, qsrc, np.float32(0)), cfg.bits, iters=cfg.kmeans_iters,
                         samples_per_centroid=cfg.samples_per_centroid, seed=cfg.seed,
                         scale_centroids=cfg.scale_centroids)
            secs = [w.add(q.centroids.astype("<f2").tobytes()), w.add(pack_bits(q.indices, cfg.bits))]
            return {**head, "mode": "quant", "bits": cfg.bits, "n_centroids": int(q.centroids.size),
                    "exponent": q.exponent, "sections": secs}, kept
    pos_kind, pos_bytes = _exact_positions(keep, numel)
    secs = [w.add(pos_bytes), w.add(exact_src[keep].astype("<f4").tobytes())]
    return {**head, "mode": "exact", "count": count, "positions": pos_kind, "sections": secs}, kept


def _as_array(x, what: str) -> np.ndarray:
    try:
        a = np.asarray(x)
    except Exception as e:  # noqa: BLE001 - anything that is not array-like
        raise ExCPError(f"{what}: not an array ({e})") from None
    if a.dtype == object or _dtype_name(a.dtype) is None:
        raise ExCPError(f"{what}: unsupported dtype {a.dtype}")
    return a


def _encode_param(w: _PayloadWriter, name: str, arrs: dict, ref, cfg: ExCPConfig) -> tuple[list, dict]:
    W = arrs["weight"]
    m, v = arrs.get("exp_avg"), arrs.get("exp_avg_sq")
    entries, kept = [], {}
    lossy = ref is not None and W.dtype == _F32 and W.size > 0
    if not lossy:
        for kind, a in (("weight", W), ("exp_avg", m), ("exp_avg_sq", v)):
            if a is not None:
                e, kept[kind] = _entry_raw(w, kind, a)
                entries.append(e)
        return entries, kept

    Wf = W.ravel()
    reff = ref.ravel()
    with np.errstate(over="ignore", invalid="ignore"):  # inf/nan residuals are handled (stored exactly)
        dW = Wf - reff  # float32
    if cfg.prune_weights and v is not None:
        wkeep = prune_weight_mask(dW, v, cfg.alpha, cfg.max_scale)
    else:  # every position whose bits changed (bit-exact in exact mode, -0.0/nan included)
        wkeep = Wf.view(np.uint32) != reff.view(np.uint32)
    if cfg.quantize:
        wkeep &= dW != 0
    e, kept["weight"] = _entry_lossy(w, "weight", W.shape, wkeep, Wf, dW if cfg.quantize else None, cfg)
    entries.append(e)

    mkeep = None
    if cfg.prune_moments and m is not None:
        mkeep = prune_moment_mask(m.ravel(), wkeep & (dW != 0), cfg.beta)
    for kind, a in (("exp_avg", m), ("exp_avg_sq", v)):
        if a is None:
            continue
        if a.dtype != _F32:
            e, kept[kind] = _entry_raw(w, kind, a)
        else:
            af = a.ravel()
            if cfg.quantize:
                keep = (af != 0) if mkeep is None else (mkeep & (af != 0))
            else:
                keep = (af.view(np.uint32) != 0) if mkeep is None else mkeep
            e, kept[kind] = _entry_lossy(w, kind, a.shape, keep, af, af if cfg.quantize else None, cfg)
        entries.append(e)
    return entries, kept


def _check_inputs(tensors, ref_weights) -> tuple[dict, dict | None]:
    if not isinstance(tensors, Mapping):
        raise ExCPError("tensors must be a mapping name -> {weight, exp_avg, exp_avg_sq}, "
                        f"got {type(tensors).__name__}")
    if ref_weights is not None and not isinstance(ref_weights, Mapping):
        raise ExCPError(f"ref_weights must be a mapping name -> array or None, got {type(ref_weights).__name__}")
    out = {}
    for name, arrs in tensors.items():
        if not isinstance(name, str):
            raise ExCPError(f"parameter names must be strings, got {name!r}")
        if not isinstance(arrs, Mapping):
            raise ExCPError(f"{name}: expected a mapping with weight / exp_avg / exp_avg_sq")
        extra = sorted(str(k) for k in arrs if k not in KINDS)
        if extra:
            raise ExCPError(f"{name}: unknown entries {', '.join(extra)} (known: {', '.join(KINDS)})")
        if arrs.get("weight") is None:
            raise ExCPError(f"{name}: no weight")
        d = {k: (None if arrs.get(k) is None else _as_array(arrs[k], f"{name}.{k}")) for k in KINDS}
        for k in ("exp_avg", "exp_avg_sq"):
            if d[k] is not None and d[k].shape != d["weight"].shape:
                raise ExCPError(f"{name}.{k}: shape {d[k].shape} differs from the weight's {d['weight'].shape}")
        out[name] = d
    refs = None
    if ref_weights is not None:
        refs = {}
        for name, d in out.items():
            r = ref_weights.get(name)
            if r is None or d["weight"].dtype != _F32:
                refs[name] = None
                continue
            r = _as_float32_ref(r, name, d["weight"].shape, ExCPError)
            refs[name] = r
    return out, refs


def _as_float32_ref(r, name: str, shape, err) -> np.ndarray:
    try:
        r = np.asarray(r, dtype=np.float32)
    except Exception:  # noqa: BLE001
        raise err(f"{name}: reference weight is not a float array") from None
    if r.shape != tuple(shape):
        raise err(f"{name}: reference weight has shape {r.shape}, the checkpoint has {tuple(shape)}")
    return r


def _rel_err(rec: np.ndarray, orig: np.ndarray) -> tuple[float, float]:
    """(||rec - orig|| / ||orig||, max |rec - orig|) in float64 over float32 arrays; bit-identical
    elements (nan and inf included) count as error 0."""
    if orig.size == 0:
        return 0.0, 0.0
    o = np.ascontiguousarray(orig, dtype=np.float32).ravel()
    r = np.ascontiguousarray(rec, dtype=np.float32).ravel()
    with np.errstate(invalid="ignore", over="ignore"):
        o64 = o.astype(np.float64)
        d = r - o64
        if not np.all(np.isfinite(d)):
            d[r.view(np.uint32) == o.view(np.uint32)] = 0.0
        num = math.sqrt(float(np.dot(d, d)))
        den = math.sqrt(float(np.dot(o64, o64)))
        mx = float(np.max(np.abs(d)))
    rel = num / den if den > 0 else (0.0 if num == 0 else math.inf)
    return rel, mx


def encode_checkpoint(tensors, ref_weights, cfg: ExCPConfig | None = None):
    """Compress one checkpoint. Returns ``(blob, recon, stats)``.

    ``tensors``: name -> {"weight": array, "exp_avg": array|None, "exp_avg_sq": array|None}.
    ``ref_weights``: name -> reconstructed previous weight (or None / absent: that parameter is stored
    lossless); ``None`` altogether = first checkpoint of a chain (everything lossless).
    ``recon``: name -> {"weight", "exp_avg", "exp_avg_sq"} exactly as :func:`decode_checkpoint` returns it.
    ``stats``: one dict per stored array: name, kind, dtype, mode, numel, kept_fraction, pruned_fraction,
    rel_l2, max_abs, payload_bytes (its sections, before the archiver), plus bits / n_centroids in
    quant mode. The caller's arrays are never modified.
    """
    cfg = ExCPConfig() if cfg is None else cfg
    if not isinstance(cfg, ExCPConfig):
        cfg = ExCPConfig.from_dict(cfg)
    params, refs = _check_inputs(tensors, ref_weights)
    w = _PayloadWriter()
    toc_params, kept_all = [], {}
    for name, arrs in params.items():
        entries, kept = _encode_param(w, name, arrs, None if refs is None else refs[name], cfg)
        toc_params.append({"name": name, "arrays": entries})
        kept_all[name] = kept
    toc = {"format": "excp", "version": VERSION, "config": cfg.to_dict(), "params": toc_params}
    payload = _build_payload(toc, w.sections)
    recon = _decode_payload(payload, refs)
    stats = []
    for p in toc_params:
        name = p["name"]
        for e in p["arrays"]:
            kind = e["kind"]
            orig, rec = params[name][kind], recon[name][kind]
            rel, mx = (0.0, 0.0) if e["mode"] == "raw" else _rel_err(rec, orig)
            k = kept_all[name][kind]
            st = {"name": name, "kind": kind, "dtype": e["dtype"], "mode": e["mode"], "numel": int(orig.size),
                  "kept_fraction": k, "pruned_fraction": 1.0 - k, "rel_l2": rel, "max_abs": mx,
                  "payload_bytes": sum(s[1] for s in e["sections"])}
            if e["mode"] == "quant":
                st.update(bits=e["bits"], n_centroids=e["n_centroids"])
            stats.append(st)
    blob = _pack_container(payload, cfg.archiver, cfg.level)
    return blob, recon, stats


def _build_payload(toc: dict, sections) -> bytes:
    t = json.dumps(toc, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return b"".join([struct.pack("<I", len(t)), t, *sections])


# ----------------------------------------------------------------------------- table of contents
def _fail(where: str, msg: str):
    raise ExCPFormatError(f"{where}: {msg}")


def _toc_int(d: dict, key: str, lo: int, hi: int, where: str) -> int:
    x = d.get(key)
    if type(x) is not int or not lo <= x <= hi:
        _fail(where, f"{key} must be an integer in [{lo}, {hi}], got {_short(x)}")
    return x


_TOC_KEYS = {"format", "version", "config", "params"}
_BASE_KEYS = {"kind", "dtype", "shape", "mode", "sections"}
_ENTRY_KEYS = {
    "raw": set(),
    "zero": set(),
    "exact": {"count", "positions"},
    "quant": {"bits", "n_centroids", "exponent"},
}
_N_SECTIONS = {"raw": 1, "zero": 0, "exact": 2, "quant": 2}
_POSITION_WIDTH = {"mask": None, "u32": 4, "u64": 8}


@dataclass(frozen=True)
class _TocEntry:
    """One array of the table of contents, every field type- and range-checked against the data region."""

    where: str
    kind: str
    mode: str
    dtype_name: str
    shape: tuple
    numel: int
    sections: tuple  # ((offset, length), ...) relative to the data region
    count: int | None = None  # exact
    positions: str | None = None  # exact
    bits: int | None = None  # quant
    n_centroids: int | None = None  # quant
    exponent: int | None = None  # quant

    @property
    def dtype(self) -> np.dtype:
        return _DTYPES[self.dtype_name]


def _parse_toc(payload) -> tuple[dict, int, memoryview]:
    """``(toc, toc_len, data)`` of a payload: the parsed table of contents (its top level checked) and a view of
    the data region. The JSON text is decoded straight from the payload buffer (no intermediate copy)."""
    mv = memoryview(payload).cast("B")
    if len(mv) < 4:
        raise ExCPFormatError(f"payload of {len(mv)} bytes is too short for its table of contents")
    (toc_len,) = struct.unpack_from("<I", mv, 0)
    if toc_len > len(mv) - 4:
        raise ExCPFormatError(f"table of contents length {toc_len} exceeds the {len(mv) - 4} payload bytes")
    try:
        toc = json.loads(str(mv[4:4 + toc_len], "utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ExCPFormatError(f"table of contents is not valid JSON ({type(e).__name__})") from None
    if not isinstance(toc, dict) or set(toc) != _TOC_KEYS:
        raise ExCPFormatError("table of contents lacks or has unexpected top-level keys")
    if not isinstance(toc["format"], str) or toc["format"] != "excp" or type(toc["version"]) is not int \
            or toc["version"] != VERSION:
        raise ExCPFormatError(f"table of contents has format {_short(toc['format'])} version {_short(toc['version'])}")
    if not isinstance(toc["config"], dict) or not isinstance(toc["params"], list):
        raise ExCPFormatError("table of contents: config must be an object and params a list")
    return toc, toc_len, mv[4 + toc_len:]


def _check_toc(toc: dict, data_len: int) -> list[tuple[str, list[_TocEntry]]]:
    """Validate every parameter and entry of a table of contents (from :func:`_parse_toc`) against a data region
    of ``data_len`` bytes: types before any use, ranges, the section layout and the section lengths each mode
    implies. Returns ``[(name, [entry, ...]), ...]``; raises :class:`ExCPFormatError`."""
    cursor = 0
    out, seen = [], set()
    for i, p in enumerate(toc["params"]):
        if not isinstance(p, dict) or set(p) != {"name", "arrays"} or not isinstance(p["name"], str) \
                or not isinstance(p["arrays"], list):
            raise ExCPFormatError(f"table of contents: parameter #{i} is malformed")
        name, arrays = p["name"], p["arrays"]
        if name in seen:
            _fail(name, "parameter listed twice")
        seen.add(name)
        if not arrays or not isinstance(arrays[0], dict) or arrays[0].get("kind") != "weight":
            _fail(name, "the weight entry must come first")
        if len(arrays) > len(KINDS):
            _fail(name, "too many arrays")
        entries, kinds, wshape = [], set(), None
        for j, e in enumerate(arrays):
            if not isinstance(e, dict):
                _fail(f"{name}[{j}]", "entry is not an object")
            kind = e.get("kind")
            if not isinstance(kind, str) or kind not in KINDS or kind in kinds:
                _fail(f"{name}[{j}]", f"unknown or repeated array kind {_short(kind)}")
            kinds.add(kind)
            where = f"{name}.{kind}"
            mode = e.get("mode")
            if not isinstance(mode, str) or mode not in _ENTRY_KEYS:
                _fail(where, f"unknown mode {_short(mode)}")
            if set(e) != _BASE_KEYS | _ENTRY_KEYS[mode]:
                _fail(where, f"unexpected fields for mode {mode}")
            shape = e["shape"]
            if not isinstance(shape, list) or len(shape) > 32 \
                    or any(type(s) is not int or s < 0 for s in shape):
                _fail(where, f"bad shape {_short(shape)}")
            numel = math.prod(shape)  # Python int: no overflow
            if math.prod(d for d in shape if d) > MAX_PAYLOAD_BYTES * 8:  # zero dims do not hide huge ones
                _fail(where, f"shape {_short(shape)} is implausibly large")
            if kind != "weight" and shape != wshape:
                _fail(where, f"shape {_short(shape)} differs from the weight's {wshape}")
            dt = e["dtype"]
            if not isinstance(dt, str) or dt not in _DTYPES:
                _fail(where, f"unknown dtype {_short(dt)}")
            if mode != "raw" and dt != "float32":
                _fail(where, f"mode {mode} needs dtype float32, got {dt}")
            secs = e["sections"]
            if not isinstance(secs, list) or len(secs) != _N_SECTIONS[mode]:
                _fail(where, f"mode {mode} needs {_N_SECTIONS[mode]} sections")
            sections = []
            for s in secs:
                if not isinstance(s, list) or len(s) != 2 or any(type(x) is not int for x in s):
                    _fail(where, f"bad section {_short(s)}")
                off, ln = s
                if off != cursor or ln < 0 or off + ln > data_len:
                    _fail(where, f"section [{off}, {ln}] is out of place (expected offset {cursor}, "
                                 f"{data_len} data bytes)")
                sections.append((off, ln))
                cursor = off + ln
            fields = {}
            if mode == "raw":
                need = numel * _DTYPES[dt].itemsize
                if sections[0][1] != need:
                    _fail(where, f"raw section holds {sections[0][1]} bytes, shape {shape} of {dt} needs {need}")
            elif mode == "exact":
                count = _toc_int(e, "count", 1, numel, where)
                pk = e["positions"]
                if not isinstance(pk, str) or pk not in _POSITION_WIDTH:
                    _fail(where, f"unknown positions encoding {_short(pk)}")
                width = _POSITION_WIDTH[pk]
                need = (numel + 7) // 8 if width is None else count * width
                if sections[0][1] != need:
                    what = f"{numel} positions" if width is None else f"{count} {pk} positions"
                    _fail(where, f"position {'mask' if width is None else 'list'} holds {sections[0][1]} bytes, "
                                 f"{what} need {need}")
                if sections[1][1] != 4 * count:
                    _fail(where, f"value section holds {sections[1][1]} bytes, {count} float32 values need "
                                 f"{4 * count}")
                fields = {"count": count, "positions": pk}
            elif mode == "quant":
                bits = _toc_int(e, "bits", 2, 8, where)
                k = _toc_int(e, "n_centroids", 1, (1 << bits) - 1, where)
                exponent = _toc_int(e, "exponent", EXPONENT_MIN, EXPONENT_MAX, where)
                if sections[0][1] != 2 * k:
                    _fail(where, f"centroid section holds {sections[0][1]} bytes, {k} float16 centroids need {2 * k}")
                need = (numel * bits + 7) // 8
                if sections[1][1] != need:
                    _fail(where, f"index section holds {sections[1][1]} bytes, {numel} indices of {bits} bits "
                                 f"need {need}")
                fields = {"bits": bits, "n_centroids": k, "exponent": exponent}
            entries.append(_TocEntry(where, kind, mode, dt, tuple(shape), numel, tuple(sections), **fields))
            if kind == "weight":
                wshape = shape
        out.append((name, entries))
    if cursor != data_len:
        raise ExCPFormatError(f"{data_len - cursor} unaccounted bytes after the last section")
    return out


# ------------------------------------------------------------------------------------- decoding
def _decode_payload(payload, refs) -> dict:
    """Parse and validate a payload; ``refs``: name -> float32 reference (or None) / None for no refs."""
    toc, _, data = _parse_toc(payload)
    params = _check_toc(toc, len(data))
    out = {}
    for name, entries in params:
        arrays = {k: None for k in KINDS}
        for e in entries:
            base = None
            if e.mode != "raw" and e.kind == "weight":
                r = None if refs is None else refs.get(name)
                if r is None:
                    _fail(name, "stored as a residual but no reference weight was given")
                base = _as_float32_ref(r, name, e.shape, ExCPFormatError)
            arrays[e.kind] = _decode_entry(e, [data[off:off + ln] for off, ln in e.sections], base)
        out[name] = arrays
    return out


def _decode_entry(e: _TocEntry, views: list, base) -> np.ndarray:
    """One array from its checked TOC entry and section views (``base``: the float32 reference of a weight)."""
    where, shape, numel, dt = e.where, e.shape, e.numel, e.dtype
    if e.mode == "raw":
        a = np.frombuffer(views[0], dtype=_le(dt)).astype(dt).reshape(shape)
        if dt == np.bool_ and numel and np.frombuffer(views[0], np.uint8).max() > 1:
            _fail(where, "bool array holds bytes other than 0 and 1")
        return a
    # base is the float32 reference for weights, None (zeros) for moments; its shape was checked
    out = base.ravel().copy() if base is not None else None
    if e.mode == "zero":
        return (out if out is not None else np.zeros(numel, np.float32)).reshape(shape)
    if e.mode == "exact":
        pbuf, vbuf = views
        if e.positions == "mask":
            bits = np.unpackbits(np.frombuffer(pbuf, np.uint8))
            if bits[numel:].any():
                _fail(where, "non-zero pad bits after the position mask")
            pos = np.flatnonzero(bits[:numel])
            if pos.size != e.count:
                _fail(where, f"position mask marks {pos.size} positions, count says {e.count}")
        else:
            pos = np.frombuffer(pbuf, "<u4" if e.positions == "u32" else "<u8")
            if pos.size and (np.any(pos[1:] <= pos[:-1]) or int(pos[-1]) >= numel):
                _fail(where, "positions are not strictly increasing within the array")
            pos = pos.astype(np.intp)
        if out is None:
            out = np.zeros(numel, np.float32)
        out[pos] = np.frombuffer(vbuf, "<f4")
        return out.reshape(shape)
    # quant
    cbuf, ibuf = views
    c16 = np.frombuffer(cbuf, "<f2").astype(np.float16)
    table = _centroid_table(c16, e.exponent)  # [0, c_1 * 2**e, ...], over/underflow left to the check below
    if not np.all(np.isfinite(table)) or np.any(table[2:] <= table[1:-1]):
        _fail(where, f"centroids are not finite and strictly increasing (after scaling by 2**{e.exponent})")
    try:
        idx = unpack_bits(ibuf, e.bits, numel)
    except ExCPFormatError as err:
        _fail(where, str(err))
    if idx.size and int(idx.max()) > e.n_centroids:
        _fail(where, f"quantisation index {int(idx.max())} points past the {e.n_centroids}-entry centroid table")
    vals = table[idx]
    if out is None:
        return vals.reshape(shape)
    # W_ref + dequant(dW) only where the index is non-zero (a pruned position keeps W_ref's exact bits);
    # the float32 sum of a finite reference and a finite centroid may round to inf: that is the value
    with np.errstate(over="ignore", invalid="ignore"):
        np.add(out, vals, out=out, where=idx != 0)
    return out.reshape(shape)


def decode_checkpoint(blob, ref_weights=None, *, max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> dict:
    """Decode a blob from :func:`encode_checkpoint`; returns name -> {"weight", "exp_avg", "exp_avg_sq"}.

    ``ref_weights`` must hold the same reference weights the encoder was given (name -> array) for every
    parameter stored as a residual; wrong shapes or a missing reference raise :class:`ExCPFormatError`,
    as does anything wrong with the blob. ``max_payload_bytes`` bounds what the blob may expand to: a blob
    that declares a larger payload is refused before anything is allocated (default
    :data:`MAX_PAYLOAD_BYTES`, 32 GiB; a value that is not a non-negative integer raises :class:`ExCPError`).
    """
    limit = _check_limit(max_payload_bytes)
    if ref_weights is not None and not isinstance(ref_weights, Mapping):
        raise ExCPFormatError(f"ref_weights must be a mapping name -> array, got {type(ref_weights).__name__}")
    payload, _ = _unpack_container(blob, limit)
    return _decode_payload(payload, ref_weights)
