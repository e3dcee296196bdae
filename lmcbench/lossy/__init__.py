"""Lossy checkpoint codecs (kept apart from the lossless pipeline: their output is not bit-exact)."""

from .excp import (  # noqa: F401
    ExCPConfig,
    ExCPError,
    ExCPFormatError,
    Quantized,
    decode_checkpoint,
    dequantize,
    encode_checkpoint,
    kmeans_1d,
    pack_bits,
    prune_moment_mask,
    prune_weight_mask,
    quantize,
    unpack_bits,
)

__all__ = [
    "ExCPConfig", "ExCPError", "ExCPFormatError", "Quantized", "decode_checkpoint", "dequantize",
    "encode_checkpoint", "kmeans_1d", "pack_bits", "prune_moment_mask", "prune_weight_mask", "quantize",
    "unpack_bits",
]
