"""The embedded default series as a source: the tinygpt run (:mod:`lmcbench.tinygpt`), a Hugging Face Trainer
folder cached under ``cache_dir`` keyed by a hash of the training options and the corpus, trained when missing
and reused when complete (:mod:`lmcbench.tinygpt.series`)."""

from __future__ import annotations

from ..tinygpt.corpus import corpus_id
from ..tinygpt.series import FORMAT_VERSION, Series, default_cache_dir, ensure_series  # noqa: F401
from .hf_trainer import HFTrainerSource


class TinyGPTSource(HFTrainerSource):
    source_type = "tinygpt"

    def __init__(self, cache_dir=None, train=None, path=None, **kw):
        series = Series.from_options(cache_dir=cache_dir, train=train, path=path)
        self.train_opts = series.train_opts
        super().__init__(path=series.path, **kw)

    def describe(self):
        return f"tinygpt series at {self.path} (corpus {corpus_id()})"

    def _index(self):
        ensure_series(self.path, self.train_opts)
        return super()._index()
