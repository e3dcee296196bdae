"""The options of a run (the ``bench`` config group): defaults here, mirrored by ``conf/bench/default.yaml``
(``tests/test_config.py`` checks that the two agree)."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field

from ..errors import ConfigError


@dataclass
class BenchOptions:
    warmup: int = 1  # untimed calls the first time a codec or transform meets a dtype in a run
    repeats: int = 3
    budget_s: float = 0.3
    chunk_mib: float = 16.0
    entropy_block_kib: int = 64  # block size of the per-block order-0 entropy bound
    xor_analysis: bool = True  # xor.csv: which bits change between consecutive steps of each tensor
    xor_lags: list = field(default_factory=lambda: [1])  # ... and between steps this many checkpoints apart
    cond_bound: bool = True  # cond_bound_bytes: the byte planes coded with the reference as context
    verify: bool = True
    progress: bool = True
    # sampled measurement (lmcbench/bench/sample.py): 1.0 = every byte; a fraction < 1 measures that share of the
    # slices of sample_slice_kib in each stratum (kind x dtype x tensor role, at least 2), chosen by sample_seed;
    # sample_slice_kib 0 = the run's own slices (chunk_mib), so a sample measures exactly what a full run measures
    sample: float = 1.0
    sample_seed: int = 0
    sample_slice_kib: int = 0

    @property
    def sample_unit_kib(self) -> int:
        """The sampling unit in KiB: ``sample_slice_kib``, or the run's slice (``chunk_mib``) where that is 0."""
        return self.sample_slice_kib or max(1, int(self.chunk_mib * 1024))

    @classmethod
    def from_config(cls, cfg) -> "BenchOptions":
        cfg = dict(cfg or {})
        known = {k: cfg.pop(k) for k in list(cfg) if k in cls.__dataclass_fields__}
        if cfg:
            raise ConfigError(f"bench: unknown option(s) {', '.join(sorted(cfg))}")
        for k, v in known.items():
            f = cls.__dataclass_fields__[k]
            want = type(f.default_factory()) if f.default is MISSING else type(f.default)
            if want is float and isinstance(v, int) and not isinstance(v, bool):
                known[k] = v = float(v)
            if not isinstance(v, want) or (want is int and isinstance(v, bool)):
                raise ConfigError(f"bench.{k}: expected {want.__name__}, got {v!r}")
        opts = cls(**known)
        if not opts.xor_lags or any(isinstance(g, bool) or not isinstance(g, int) or g < 1 for g in opts.xor_lags):
            raise ConfigError(f"bench.xor_lags: expected a list of positive integers, got {opts.xor_lags!r}")
        if opts.repeats < 1 or opts.warmup < 0 or opts.chunk_mib <= 0 or opts.entropy_block_kib <= 0:
            raise ConfigError("bench: need repeats >= 1, warmup >= 0, chunk_mib > 0, entropy_block_kib > 0")
        if not 0.0 < opts.sample <= 1.0:  # also refuses NaN
            raise ConfigError(f"bench.sample: expected a fraction in (0, 1] (1.0 = measure everything), "
                              f"got {opts.sample!r}")
        if opts.sample_seed < 0 or opts.sample_slice_kib < 0:
            raise ConfigError(f"bench: need sample_seed >= 0 and sample_slice_kib >= 0, got {opts.sample_seed} "
                              f"and {opts.sample_slice_kib}")
        return opts
