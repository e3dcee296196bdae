"""The lossy method interface: what every lossy checkpoint method gives the chain and the resumed-training judge.

A *method* compresses one checkpoint of a chain given the *reconstruction* of the previous one (None for the
first checkpoint of a chain) and decodes it again from the same reconstruction:

* ``encode(triples, prev) -> (blob, recon, stats)``: ``triples`` is the checkpoint, a dict
  ``name -> {"weight", "exp_avg", "exp_avg_sq"}`` of numpy arrays (a moment may be None); ``prev`` the previous
  reconstruction in the same shape (or None). ``blob`` is the bytes stored, ``recon`` exactly what ``decode``
  returns for it, ``stats`` one dict per stored array (at least ``name``, ``kind``, ``mode``, ``numel``,
  ``kept_fraction``, ``rel_l2``).
* ``decode(blob, prev) -> recon``: hostile-input safe; a bad blob raises the method's format error with a
  one-line message.
* ``name`` (e.g. ``excp``, ``adam8bit``), ``setting`` (a short label of its options, e.g. ``alpha=5e-05``) and
  ``lossy`` (False when the method is configured bit-exact).

Because ``prev`` is the previous *reconstruction*, whatever one checkpoint drops is still in the next residual
(the error is fed back, not accumulated). :class:`~lmcbench.lossy.chain.Chain` drives a method over a series
and checks that decoding gives the encoder's reconstruction; :mod:`lmcbench.lossy.judge` resumes training from
the reconstructions. Methods are built from config dicts by :func:`make_method` (``{"method": "excp", ...}``).
"""

from __future__ import annotations

from ..errors import ConfigError
from .excp import ExCPConfig, decode_checkpoint, encode_checkpoint


def weights_of(triples: dict | None) -> dict | None:
    """``name -> weight`` of a checkpoint (None stays None)."""
    return None if triples is None else {n: t["weight"] for n, t in triples.items()}


class Method:
    """Base class of a lossy method (see the module docstring)."""

    name = "method"

    @property
    def setting(self) -> str:
        return ""

    @property
    def lossy(self) -> bool:
        return True

    def encode(self, triples: dict, prev: dict | None):  # pragma: no cover - interface
        raise NotImplementedError

    def decode(self, blob, prev: dict | None) -> dict:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def label(self) -> str:
        return f"{self.name} {self.setting}".strip()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label}>"


class ExCPMethod(Method):
    """ExCP (:mod:`lmcbench.lossy.excp`) as a method: the residual of the weights against the previous
    reconstruction's weights; the moments stored on their own."""

    name = "excp"

    def __init__(self, cfg: ExCPConfig | None = None):
        self.cfg = ExCPConfig() if cfg is None else cfg
        if not isinstance(self.cfg, ExCPConfig):
            raise ConfigError(f"excp: expected an ExCPConfig, got {type(self.cfg).__name__}")

    @classmethod
    def from_dict(cls, d: dict) -> "ExCPMethod":
        return cls(ExCPConfig.from_dict(d))

    @property
    def setting(self) -> str:
        c = self.cfg
        if not self.lossy:
            return "lossless (control)"
        return f"alpha={c.alpha:g},beta={c.beta:g},bits={c.bits}"

    @property
    def lossy(self) -> bool:
        c = self.cfg
        return bool(c.prune_weights or c.prune_moments or c.quantize)

    def encode(self, triples, prev):
        return encode_checkpoint(triples, weights_of(prev), self.cfg)

    def decode(self, blob, prev):
        return decode_checkpoint(blob, weights_of(prev))


def as_method(m) -> Method:
    """A :class:`Method` as is; an :class:`ExCPConfig` as :class:`ExCPMethod` (the chain's old signature)."""
    if isinstance(m, Method):
        return m
    if isinstance(m, ExCPConfig):
        return ExCPMethod(m)
    raise ConfigError(f"expected a lossy method or an ExCPConfig, got {type(m).__name__}")


def make_method(spec: dict) -> Method:
    """The method a config dict names: ``{"method": NAME, **options}``; NAME is ``excp`` or one of
    :data:`lmcbench.lossy.methods.METHODS`. Unknown names or options raise :class:`ConfigError`."""
    if not isinstance(spec, dict) or "method" not in spec:
        raise ConfigError(f"lossy: a method is a mapping with a 'method' key, got {spec!r}")
    opts = {k: v for k, v in spec.items() if k != "method"}
    name = spec["method"]
    if name == "excp":
        return ExCPMethod.from_dict(opts)
    from .methods import METHODS

    if name not in METHODS:
        raise ConfigError(f"lossy: unknown method {name!r}; known: excp, {', '.join(sorted(METHODS))}")
    return METHODS[name].from_dict(opts)
