"""lmc.kernels: the codec's Numba kernels, one module per coder with its encoder, structural check and decoder.

From the bottom up: ``intrinsics`` (unaligned loads and stores, bit counts; the checked build's bounds checks),
``simd`` (the 32-state rANS decoder's rounds as AVX2 vectors, or the scalar loop without AVX2),
``base`` (constants, error codes, checksums, byte-stream splitting, the monotone map of the temporal and delta
modes), ``huffman`` and ``rans`` (the entropy coders), ``streams`` (the alone and XOR chunk modes: per-stream
coding choice, stream records), ``tfuse`` (the temporal decoder's passes as one AVX2 pass), ``tenc`` (the
temporal encoder's symbol pass as AVX2 vectors, packing bf16's raw bits), ``temporal``,
``mctx`` and ``delta`` (the reference and context chunk modes; ``delta`` is a package: its packed fields shared
by ``encode`` and ``decode``), and ``chunk`` (the chunk coder,
the structural pre-pass and the drivers over ranges of chunks).  A module imports only modules listed before
it; ``lmc.api`` is the only caller from outside.  Internal: names here may change in any release."""
