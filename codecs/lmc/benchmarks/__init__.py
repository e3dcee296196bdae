"""lmc's benchmark scripts: each is run by its path, ``python codecs/lmc/benchmarks/<name>.py`` (see README.md).

Not part of the installed ``lmc`` distribution; they use lmc's public API only (``studies/`` may use its
internals), and never lmcbench.
"""
