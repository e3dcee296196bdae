"""``lmcbench-excp``: ExCP lossy compression of a Hugging Face Trainer output folder, and its restore.

Commands
--------
``lmcbench-excp compress SRC OUT [codec options] [--steps 100,200] [--force]``
    SRC is a Trainer output folder (``checkpoint-<step>/`` subfolders) or one ``checkpoint-<step>`` folder.
    The checkpoints are compressed in step order as ONE chain: the first is stored whole and lossless, each
    later one as a residual against the *reconstruction* of the previous one. SRC is only read.
``lmcbench-excp restore OUT RESTORED [--steps ...] [--force]``
    Decodes the chain in order and writes ``RESTORED/checkpoint-<step>/`` folders a Trainer (and lmcbench)
    can read: the copied files, ``model.safetensors`` and ``optimizer.pt``.
``lmcbench-excp info FILE.excp [--params]``
    The container's table of contents (parameters, modes, bytes), checked as the decoder checks it; no
    reference weights needed.

Output folder layout (``OUT``)
------------------------------
``checkpoint-<step>.excp``
    The ExCP container (weights and Adam moments); written last, under a temporary name renamed into place,
    so a ``.excp`` that exists is complete.
``checkpoint-<step>.files/``
    Every file of the checkpoint folder, as is, except the weight files the container replaces (the ones the
    weights were read from: ``model.safetensors``, or the shards and the index that was used, or
    ``pytorch_model.bin``...) and ``optimizer.pt``: trainer_state.json, scheduler.pt, rng_state.pth,
    config.json, training_args.bin, tokenizer files, and any other weight file that was not read (a stale
    ``pytorch_model.bin`` next to ``model.safetensors`` comes back as it was).
``checkpoint-<step>.json``
    What the restore needs that the container does not hold: the optimizer state-dict skeleton
    (``param_groups`` as JSON with the keys that were tuples or 0-dim tensors recorded in
    ``param_group_types``; per Adam slot its index, parameter name and scalar entries such as ``step`` with
    its torch dtype), the weights file layout (files, dtype and shape of each tensor, the safetensors
    metadata), the copied files with their sha256, and the chain link (sha256 of this and the previous
    ``.excp``).
``excp_chain.json``
    Steps, the ExCP configuration, per-checkpoint and total sizes (original = weights + moments as arrays,
    compressed = the ``.excp`` files), ``"lossy": true``; rewritten after every checkpoint
    (``"complete": false`` until the last one is done).

Errors in the input (missing or unreadable folders, corrupt containers, bad options) are reported as one
line, ``lmcbench-excp: error: ...``, exit status 2; ``LMCBENCH_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import hashlib
import os
import sys

from lmc.formats.fileio import atomic_json, atomic_write, inside, install_dir, one_line, read_json, remove, tmp_name
from lmc.formats.trainer_folder import list_checkpoints, read_checkpoint, replaced_files
from lmc.formats.trainer_write import copy_files, write_checkpoint_folder
from ..errors import ConfigError, LmcbenchError, SourceError
from .chain import Chain, ChainDecoder, full_bytes, mode_counts, summarize
from .excp import ExCPConfig, ExCPFormatError

PROG = "lmcbench-excp"
CHAIN_FILE = "excp_chain.json"
CHAIN_FORMAT = "lmcbench-excp-chain"
CKPT_FORMAT = "lmcbench-excp-checkpoint"
FORMAT_VERSION = 1
# a checkpoint folder's files that the container replaces are the weight files actually read and optimizer.pt
# (lmc.formats.trainer_folder.replaced_files); everything else is copied as is
_OWN_FILES = ("checkpoint-*.excp", "checkpoint-*.json", "checkpoint-*.files", CHAIN_FILE)

_FIELD_HELP = {
    "alpha": "weight-pruning strength: keep |dW| > median(|dW|) * min(max_scale, alpha / sqrt(mean(v)))",
    "beta": "moment-pruning factor: keep m, v where |m| > beta * mean(|m|) (and the weight residual is kept)",
    "bits": "bits per quantisation index (2..8)",
    "max_scale": "upper bound of the weight-pruning scale",
    "kmeans_iters": "Lloyd iterations of the 1-D k-means",
    "samples_per_centroid": "k-means sample size per centroid",
    "seed": "k-means sampling seed",
    "archiver": "final archiver: lzma, zstd, lmc or none",
    "archiver_level": "archiver level (lzma 0..9, default 9; zstd 1..22, default 19)",
    "prune_weights": "prune the weight residuals",
    "prune_moments": "prune the Adam moments",
    "quantize": "k-means quantise the kept values (off: store them exactly)",
    "scale_centroids": "power-of-two scale on the float16 centroid tables",
}


# --------------------------------------------------------------------------------------------- errors
class UsageError(LmcbenchError):
    """A bad command line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        raise UsageError(f"{message} (see {self.prog} --help)")


def _debug() -> bool:
    return bool(os.environ.get("LMCBENCH_DEBUG"))


def _parse_steps(s: str | None) -> list[int] | None:
    if s is None:
        return None
    try:
        steps = [int(x) for x in s.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise ConfigError(f"--steps: expected comma-separated integers (e.g. 100,200), got {s!r}") from None
    if not steps:
        raise ConfigError("--steps: no step given")
    return steps


# ---------------------------------------------------------------------------------------- reading
def _list_checkpoints(src: str, steps: list[int] | None) -> list[tuple[int, str]]:
    ckpts = list_checkpoints(os.path.abspath(os.path.expanduser(str(src))))
    if steps is not None:
        have = {s for s, _ in ckpts}
        missing = sorted(set(steps) - have)
        if missing:
            raise SourceError(f"{src}: step(s) {missing} not found; available: {sorted(have)}")
        ckpts = [(s, d) for s, d in ckpts if s in set(steps)]
    return ckpts


# --------------------------------------------------------------------------------------- compress
def _config_from_args(args) -> ExCPConfig:
    opts = {f.name: getattr(args, f.name) for f in dataclasses.fields(ExCPConfig) if hasattr(args, f.name)}
    return ExCPConfig.from_dict(opts)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def cmd_compress(args, out=None) -> int:
    out = sys.stdout if out is None else out
    from tqdm import tqdm

    cfg = _config_from_args(args)
    src, dest = os.path.abspath(args.src), os.path.abspath(args.out)
    ckpts = _list_checkpoints(src, _parse_steps(args.steps))
    if inside(dest, src):
        raise ConfigError(f"{dest}: OUT is inside SRC; the source folder is never written to, choose another OUT")
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise ConfigError(f"{dest}: OUT exists and is not a folder")
    if os.path.isdir(dest):
        own = sorted(n for n in os.listdir(dest) if any(fnmatch.fnmatchcase(n, p) for p in _OWN_FILES))
        if own and not args.force:
            raise ConfigError(f"{dest}: already holds an ExCP chain ({', '.join(own[:3])}"
                              f"{', ...' if len(own) > 3 else ''}); use --force to replace it")
        for n in own + [n for n in os.listdir(dest) if n.startswith(".checkpoint-") or n.startswith(f".{CHAIN_FILE}")]:
            remove(os.path.join(dest, n))
    os.makedirs(dest, exist_ok=True)

    lossless = not (cfg.prune_weights or cfg.prune_moments or cfg.quantize)
    chain_doc = {"format": CHAIN_FORMAT, "version": FORMAT_VERSION, "lossy": True,
                 "bit_exact": lossless, "complete": False, "source": src, "steps": [],
                 "config": cfg.to_dict(), "checkpoints": [],
                 "original_bytes": 0, "compressed_bytes": 0, "ratio": None}
    chain = Chain(cfg)
    prev_sha, prev_step = None, None
    bar = tqdm(ckpts, desc="compress", unit="ckpt", disable=None, file=sys.stderr)
    for step, d in bar:
        bar.set_postfix_str(f"step {step}")
        tensors, layout, skeleton = read_checkpoint(d)
        blob, recon, stats, ct, dt, first = chain.add(tensors)
        del recon
        base = os.path.join(dest, f"checkpoint-{step}")
        # 1. the copied files, 2. the sidecar JSON, 3. the container last: a .excp that exists is complete
        tmp_files = tmp_name(base + ".files")
        try:
            files, skipped = copy_files(d, tmp_files, replaced_files(layout))
            install_dir(tmp_files, base + ".files")
        except BaseException:
            remove(tmp_files)
            raise
        sha = hashlib.sha256(blob).hexdigest()
        orig = full_bytes(tensors)
        entry = {"step": step, "excp": f"checkpoint-{step}.excp", "first": first,
                 "original_bytes": orig, "compressed_bytes": len(blob), "ratio": orig / len(blob),
                 "files_bytes": sum(f["bytes"] for f in files),
                 "compress_s": round(ct, 3), "verify_decode_s": round(dt, 3),
                 **summarize(stats)}
        side = {"format": CKPT_FORMAT, "version": FORMAT_VERSION, "step": step, "source": d,
                "excp": entry["excp"], "excp_sha256": sha, "excp_bytes": len(blob),
                "ref": None if first else {"step": prev_step, "excp_sha256": prev_sha},
                "weights": layout, "optimizer": skeleton, "files_dir": f"checkpoint-{step}.files",
                "files": files, "not_copied": skipped,
                "modes": mode_counts(stats)}
        atomic_json(base + ".json", side)
        atomic_write(base + ".excp", blob)
        chain_doc["steps"].append(step)
        chain_doc["checkpoints"].append(entry)
        chain_doc["original_bytes"] += orig
        chain_doc["compressed_bytes"] += len(blob)
        chain_doc["ratio"] = chain_doc["original_bytes"] / chain_doc["compressed_bytes"]
        chain_doc["complete"] = step == ckpts[-1][0]
        atomic_json(os.path.join(dest, CHAIN_FILE), chain_doc)
        prev_sha, prev_step = sha, step
        tag = "first, lossless" if first else ("residual, bit-exact" if lossless else "lossy residual")
        bar.write(f"step {step}: {_fmt_bytes(orig)} -> {_fmt_bytes(len(blob))} ({orig / len(blob):.2f}x, {tag}; "
                  f"weights kept {100 * entry['weight_kept']:.1f}%)", file=out)
        del tensors, blob
    bar.close()
    print(f"total: {len(ckpts)} checkpoint(s), {_fmt_bytes(chain_doc['original_bytes'])} -> "
          f"{_fmt_bytes(chain_doc['compressed_bytes'])} ({chain_doc['ratio']:.2f}x) in {dest}", file=out)
    return 0


# ---------------------------------------------------------------------------------------- restore
def cmd_restore(args, out=None) -> int:
    out = sys.stdout if out is None else out
    from tqdm import tqdm

    src, dest = os.path.abspath(args.out), os.path.abspath(args.restored)
    if not os.path.isdir(src):
        raise SourceError(f"{src}: no such folder (an lmcbench-excp compress output)")
    doc = read_json(os.path.join(src, CHAIN_FILE), "the chain description written by lmcbench-excp compress")
    if not isinstance(doc, dict) or doc.get("format") != CHAIN_FORMAT:
        raise SourceError(f"{os.path.join(src, CHAIN_FILE)}: not an lmcbench-excp chain description")
    steps = doc.get("steps")
    if not isinstance(steps, list) or not steps or any(type(s) is not int for s in steps) \
            or steps != sorted(set(steps)):
        raise SourceError(f"{os.path.join(src, CHAIN_FILE)}: bad or empty step list {steps!r}")
    want = _parse_steps(args.steps)
    if want is not None:
        missing = sorted(set(want) - set(steps))
        if missing:
            raise ConfigError(f"--steps: step(s) {missing} are not in the chain; it holds {steps}")
    targets = set(steps if want is None else want)
    needed = steps[:steps.index(max(targets)) + 1]
    # every file of every needed step must be there before anything is decoded or written
    for s in needed:
        for suffix, what in ((".excp", "the container"), (".json", "its restore record")):
            p = os.path.join(src, f"checkpoint-{s}{suffix}")
            if not os.path.isfile(p):
                later = sorted(t for t in targets if t > s)
                why = (f"; step(s) {later} are stored as residuals against it and cannot be restored without it"
                       if later else "")
                raise SourceError(f"{p}: missing ({what} of step {s} of the chain){why}")
        if s in targets and not os.path.isdir(os.path.join(src, f"checkpoint-{s}.files")):
            raise SourceError(f"{os.path.join(src, f'checkpoint-{s}.files')}: missing (the copied files of step {s})")
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise ConfigError(f"{dest}: RESTORED exists and is not a folder")
    recorded = doc.get("source")
    for s in sorted(targets):
        p = os.path.join(dest, f"checkpoint-{s}")
        if os.path.lexists(p):
            if isinstance(recorded, str) and (inside(p, recorded) or inside(recorded, p)):
                raise ConfigError(f"{p}: is (part of) the folder the chain was compressed from; restore elsewhere")
            if not args.force:
                raise ConfigError(f"{p}: already exists; use --force to replace it")
    os.makedirs(dest, exist_ok=True)
    if not doc.get("complete", True):
        print(f"note: {CHAIN_FILE} says the compress run did not finish; restoring the steps it completed",
              file=sys.stderr)

    chain, prev_sha = ChainDecoder(), None
    bar = tqdm(needed, desc="restore", unit="ckpt", disable=None, file=sys.stderr)
    for s in bar:
        bar.set_postfix_str(f"step {s}")
        p = os.path.join(src, f"checkpoint-{s}.excp")
        side = read_json(os.path.join(src, f"checkpoint-{s}.json"), f"the restore record of step {s}")
        if not isinstance(side, dict) or side.get("format") != CKPT_FORMAT or side.get("step") != s:
            raise SourceError(f"{os.path.join(src, f'checkpoint-{s}.json')}: not the restore record of step {s}")
        with open(p, "rb") as f:
            blob = f.read()
        try:
            recon = chain.decode(blob)
        except ExCPFormatError as e:
            raise ExCPFormatError(f"{p}: {one_line(e)}") from None
        sha = hashlib.sha256(blob).hexdigest()
        if sha != side.get("excp_sha256"):
            raise ExCPFormatError(f"{p}: does not match its restore record (sha256 differs: replaced or corrupt)")
        link = side.get("ref")
        if (link is None) != (prev_sha is None) or (link is not None and link.get("excp_sha256") != prev_sha):
            raise ExCPFormatError(f"{p}: is not the successor of the previous step in this chain "
                                  f"(its record links it to {link!r})")
        prev_sha = sha
        if s in targets:
            try:
                _write_restored(src, dest, s, side, recon)
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
                # the record is our own JSON, but a hand-edited or forged one must still fail in one line
                raise SourceError(f"{os.path.join(src, f'checkpoint-{s}.json')}: malformed restore record "
                                  f"({type(e).__name__}: {one_line(e)})") from None
            bar.write(f"step {s}: restored to {os.path.join(dest, f'checkpoint-{s}')}", file=out)
        del recon, blob
    bar.close()
    print(f"restored {len(targets)} checkpoint(s) into {dest} (lossy reconstruction"
          f"{', bit-exact settings' if doc.get('bit_exact') else ''})", file=out)
    return 0


def _write_restored(src: str, dest: str, step: int, side: dict, recon: dict) -> None:
    write_checkpoint_folder(os.path.join(dest, f"checkpoint-{step}"), os.path.join(src, f"checkpoint-{step}.files"),
                            side.get("files"), side.get("weights") or {}, side.get("optimizer"), recon,
                            os.path.join(src, f"checkpoint-{step}.json"), error=ExCPFormatError)


# ------------------------------------------------------------------------------------------- info
def cmd_info(args, out=None) -> int:
    out = sys.stdout if out is None else out
    from . import excp

    path = args.file
    if not os.path.isfile(path):
        raise SourceError(f"{path}: no such file")
    with open(path, "rb") as f:
        blob = f.read()
    try:
        # header, checksums, archive and the whole table of contents: the decoder's own checks
        payload, archiver = excp.container._unpack_container(blob)
        toc, toc_len, data = excp.payload._parse_toc(payload)
        params = excp.payload._check_toc(toc, len(data))
        rows = [(name, e.kind, e.mode, e.dtype_name, list(e.shape), e.numel, sum(ln for _, ln in e.sections),
                 e.bits) for name, entries in params for e in entries]
        config = ", ".join(f"{k}={v if v is None or isinstance(v, (str, int, float)) else excp.config._short(v)}"
                           for k, v in toc["config"].items())
    except ExCPFormatError as e:
        raise ExCPFormatError(f"{path}: {one_line(e)}") from None
    except (RecursionError, OverflowError, ValueError, TypeError) as e:  # not expected after the checks above
        raise ExCPFormatError(f"{path}: malformed table of contents ({type(e).__name__})") from None
    residual = any(k == "weight" and m != "raw" for _, k, m, *_ in rows)
    print(f"{path}: ExCP v{toc.get('version')}, archiver {archiver}, {len(blob)} bytes "
          f"(payload {len(payload)} bytes, table of contents {toc_len} bytes)", file=out)
    print("config: " + config, file=out)
    print(f"{len(params)} parameter(s), {len(rows)} array(s); "
          + ("a residual: decoding needs the previous checkpoint's reconstructed weights" if residual
             else "self-contained: every weight stored whole (the first checkpoint of a chain)"), file=out)
    print(f"{'kind':<11} {'mode':<6} {'arrays':>6} {'elements':>12} {'payload bytes':>14}", file=out)
    agg: dict[tuple, list[int]] = {}
    for _, k, m, _, _, n, b, _ in rows:
        a = agg.setdefault((k, m), [0, 0, 0])
        a[0] += 1
        a[1] += n
        a[2] += b
    for (k, m), (c, n, b) in sorted(agg.items()):
        print(f"{k:<11} {m:<6} {c:>6} {n:>12} {b:>14}", file=out)
    if args.params:
        print(file=out)
        for name, k, m, dt, shape, n, b, bits in rows:
            print(f"{name} {k}: {dt}{shape} {m}{'' if bits is None else f' {bits}-bit'} {b} bytes", file=out)
    return 0


# ------------------------------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="ExCP lossy compression (weight-momentum joint shrinking, Li et al. 2024) "
                "of Hugging Face Trainer checkpoints, and their restore. The result is LOSSY unless pruning and "
                "quantisation are switched off.",
                epilog="Errors are reported in one line (exit status 2); LMCBENCH_DEBUG=1 shows the traceback.")
    sub = p.add_subparsers(dest="command", metavar="{compress,restore,info}", parser_class=_Parser)
    sub.required = True

    c = sub.add_parser("compress", help="compress a Trainer output folder as one ExCP chain",
                       description="Compress the checkpoint-<step>/ folders of SRC (or one such folder) in step "
                       "order as ONE chain into OUT: checkpoint-<step>.excp (the first whole and lossless, each "
                       "later one a residual against the reconstruction of the previous one), "
                       "checkpoint-<step>.files/ (every other file of the folder, copied as is), "
                       "checkpoint-<step>.json (the optimizer skeleton and weights layout the restore needs) and "
                       "excp_chain.json (steps, configuration, sizes). SRC is never written to.")
    c.add_argument("src", metavar="SRC", help="Trainer output folder, or one checkpoint-<step> folder")
    c.add_argument("out", metavar="OUT", help="output folder (created if missing)")
    c.add_argument("--steps", metavar="S1,S2,...", help="compress only these steps (default: all)")
    c.add_argument("--force", action="store_true", help="replace an ExCP chain already in OUT")
    g = c.add_argument_group("ExCP options (defaults: the codec's)")
    for f in dataclasses.fields(ExCPConfig):
        flag = "--" + f.name.replace("_", "-")
        helptext = _FIELD_HELP.get(f.name, f.name)
        if isinstance(f.default, bool):
            g.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                           help=f"{helptext} (default: {'on' if f.default else 'off'})")
        elif f.name == "archiver_level":
            g.add_argument("--level", flag, dest=f.name, type=int, default=argparse.SUPPRESS, metavar="L",
                           help=helptext)
        else:
            typ = type(f.default)
            kw = {"choices": ["lzma", "zstd", "lmc", "none"]} if f.name == "archiver" else {}
            g.add_argument(flag, dest=f.name, type=typ, default=argparse.SUPPRESS, metavar=f.name.upper()
                           if not kw else None, help=f"{helptext} (default: {f.default})", **kw)

    r = sub.add_parser("restore", help="decode an ExCP chain into checkpoint folders",
                       description="Decode the chain in OUT in step order (each checkpoint against the previous "
                       "reconstruction) and write RESTORED/checkpoint-<step>/: the copied files, model.safetensors "
                       "(the reconstructed weights, same names and dtypes) and optimizer.pt (a torch optimizer "
                       "state_dict: the reconstructed Adam moments in the original skeleton). Sharded or "
                       ".bin weights are restored as a single model.safetensors.")
    r.add_argument("out", metavar="OUT", help="an lmcbench-excp compress output folder")
    r.add_argument("restored", metavar="RESTORED", help="folder to write checkpoint-<step>/ folders into")
    r.add_argument("--steps", metavar="S1,S2,...", help="restore only these steps (the chain up to the last of "
                   "them is decoded)")
    r.add_argument("--force", action="store_true", help="replace checkpoint folders already in RESTORED")

    i = sub.add_parser("info", help="summarise one .excp container",
                       description="Print the table of contents of an .excp container: parameters, storage "
                       "modes and bytes (no reference weights needed).")
    i.add_argument("file", metavar="FILE.excp")
    i.add_argument("--params", action="store_true", help="also list every stored array")
    return p


def main(argv=None) -> int:
    """Entry point; returns the exit status (0, or 2 for a reported error)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
        cmd = {"compress": cmd_compress, "restore": cmd_restore, "info": cmd_info}[args.command]
        return cmd(args)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except (LmcbenchError, OSError) as e:
        if _debug():
            raise
        print(f"{PROG}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if _debug():
            raise
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
