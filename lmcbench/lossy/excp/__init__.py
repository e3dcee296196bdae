"""ExCP: lossy checkpoint compression by weight-momentum joint shrinking (Li et al., ICML 2024).

Pure numpy re-implementation of the codec as the authors run it, for one checkpoint of a chain of
checkpoints. ``W`` is a weight (float32), ``m`` its Adam ``exp_avg`` and ``v`` its ``exp_avg_sq``.

Algorithm (per parameter tensor)
--------------------------------
1. Residual against the *reconstructed* previous checkpoint: ``dW = W_t - W_ref`` (float32). The caller
   passes ``W_ref``; in a chain it must be the ``recon`` that encoding the previous checkpoint returned.
2. Weight pruning: ``s = min(max_scale, alpha / sqrt(mean(v)))`` (one scalar per tensor; ``s = max_scale``
   when ``mean(v)`` is 0 or not finite); keep ``dW`` where ``|dW| > median(|dW|) * s``.
   The median of an even count is the mean of the two middle values, computed in float64.
3. Moment pruning: keep ``m`` and ``v`` where ``|m| > beta * mean(|m|)`` AND the pruned ``dW`` is
   non-zero (one mask for both moments); zero elsewhere.
4. Non-uniform quantisation of the pruned ``dW``, ``m`` and ``v`` (each on its own): 1-D k-means on the
   non-zero values with ``2**bits - 1`` centroids; index 0 means zero, indices ``1..2**bits-1`` point
   into the centroid table. k-means runs on a seeded random subset of at most
   ``samples_per_centroid`` points per centroid, is initialised at the sample's quantiles
   ``(i + 0.5) / K``, re-seeds empty clusters at the sample points farthest from their centroid, and stops
   after ``kmeans_iters`` Lloyd iterations or earlier when nothing moves. Lloyd's local optima (two
   centroids sharing a cluster while two clusters share a centroid) are then repaired by deterministic
   merge-one-pair / split-one-cluster swaps, each followed by another Lloyd run and kept only when the
   squared error drops by more than 0.01 %. Centroids are stored as float16;
   every non-zero is then assigned to the nearest *stored* centroid (sorted table, ``np.searchsorted`` on
   the midpoints), so encoder and decoder agree bit for bit.

   Centroid scale (``scale_centroids``, default on; a deviation from "plain float16"): Adam's ``v`` is
   typically 1e-12..1e-6, below float16's smallest subnormal (6e-8), so plain float16 centroids would
   flush it to zero. With ``scale_centroids`` each table carries a power-of-two exponent ``e``
   (``max|x| * 2**-e`` lies in [2**14, 2**15)) and a centroid decodes to ``float32(c16) * 2**e``
   (``np.ldexp``): float16 precision, float32 range. ``e`` lies in [-163, 113] (``EXPONENT_MIN``,
   ``EXPONENT_MAX``: from the smallest float32 subnormal to the largest float32); at ``e = 113`` (values
   within 0.03 % of float32's maximum) centroids are clipped to +-32752 so that no scaled centroid rounds
   to inf. ``scale_centroids=False`` stores plain float16 (values clipped to +-65504) and decodes
   ``float32(c16)``.
5. Final archiver over the whole packed payload: ``lzma`` (xz, the 7-Zip stand-in), ``zstd`` (one frame
   with its content size), ``lmc`` (our lossless codec, on the payload as a uint8 array) or ``none``.
6. Reconstruction: ``W_t = W_ref + dequant(dW)`` (float32 add, only where the index is non-zero, so a
   pruned position keeps the exact bits of ``W_ref``; a sum beyond float32's range is inf, silently);
   moments are the dequantised ``m`` and ``v``.

Special cases
-------------
* First checkpoint of a chain (``ref_weights is None``), or a parameter absent from ``ref_weights``: every
  array of that parameter is stored whole and lossless (mode ``raw``).
* Arrays that are not float32 (integer buffers, bf16/fp16 weights, ...) and empty arrays: ``raw``.
  A parameter whose *weight* is not float32 is stored ``raw`` entirely (moment pruning needs the weight
  mask).
* A weight without ``exp_avg_sq`` cannot be weight-pruned: its residual is kept wherever it changed and
  then quantised like any other. Without ``exp_avg`` the moments are not pruned (``v`` is quantised
  unpruned).
* "Kept as is": a tensor with at most ``2**bits - 1`` non-zeros after pruning, or whose non-zeros are not
  all finite (k-means cannot place inf/nan), is stored ``exact``: positions + float32 values, no table.
* Exact values of a *weight* are the values of ``W_t`` itself, not of ``dW``: float32 ``W_ref + (W_t -
  W_ref)`` is not always ``W_t`` (``ref=1e8, W=1`` gives 0), so storing ``W_t`` at the kept positions is
  what makes the exact mode bit-exact. The reconstruction is ``W_ref`` with those positions replaced.
* ``quantize=False`` stores every kept value exactly (mode ``exact``). With pruning off as well, the kept
  set is "every position whose bits differ from ``W_ref``" for weights and "every position whose bits are
  not +0.0" for moments, so ``W``, ``m`` and ``v`` come back bit-exact (-0.0, subnormals, inf and nan
  payloads included).

Layout
------
The container (header, table of contents, sections, packing, archivers, checksums and what a decoder must
reject) is specified, frozen, in ``FORMAT.md`` beside this file; ``tests/vectors/excp/`` holds blobs that
every version must decode. Modules (each imports only those above it):

* :mod:`.config` -- :class:`ExCPConfig` (every option, checked), the errors, the format constants;
* :mod:`.prune` -- the weight and moment masks (steps 2 and 3);
* :mod:`.kmeans` -- k-means and quantisation, centroid tables with their power-of-two scale, index packing (step 4);
* :mod:`.container` -- the framing: the header, both checksums and the archivers around the payload (step 5);
* :mod:`.payload` -- the payload: sections and JSON table of contents, :func:`encode_checkpoint` and the
  hostile-input-safe :func:`decode_checkpoint` (step 6).
"""

# The public API is __all__ (and the format's constants); private names are imported from the module that
# defines them (config, container, payload, prune, kmeans). The k-means module is ``kmeans``, not ``quantize``,
# so that no submodule is shadowed by the function of the same name.
from . import config, container, kmeans, payload, prune  # noqa: F401 - the submodules, as attributes
from .config import (EXPONENT_MAX, EXPONENT_MIN, HEADER_SIZE, KINDS, LZMA_MEMLIMIT, MAGIC,  # noqa: F401
                     MAX_PAYLOAD_BYTES, VERSION, ExCPConfig, ExCPError, ExCPFormatError)
from .kmeans import Quantized, dequantize, kmeans_1d, pack_bits, quantize, unpack_bits
from .payload import decode_checkpoint, encode_checkpoint
from .prune import prune_moment_mask, prune_weight_mask

__all__ = [
    "ExCPConfig", "ExCPError", "ExCPFormatError", "Quantized",
    "prune_weight_mask", "prune_moment_mask", "kmeans_1d", "quantize", "dequantize",
    "pack_bits", "unpack_bits", "encode_checkpoint", "decode_checkpoint",
]
