"""Command line: lmc-archive {add,compress,restore,ls,verify,prune}."""
import argparse
import os
import re
import sys
import time

from ._archive import Archive, step_of
from ._store import ArchiveError

PROG = "lmc-archive"


def _parser():
    p = argparse.ArgumentParser(prog=PROG, description="Lossless archive of a checkpoint "
                                "series: every tensor lmc-coded against the previous step.")
    p.add_argument("--threads", type=int, default=None, help="lmc threads (default: all cores)")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add", help="append one checkpoint folder")
    a.add_argument("archive")
    a.add_argument("checkpoint_dir")
    a.add_argument("--step", type=int, default=None, help="default: from checkpoint-<step>")
    a.add_argument("--keyframe-every", type=int, default=None, metavar="K")
    c = sub.add_parser("compress", help="append every checkpoint-<step> of a run folder")
    c.add_argument("run_dir")
    c.add_argument("archive")
    c.add_argument("--keyframe-every", type=int, default=None, metavar="K")
    r = sub.add_parser("restore", help="write OUT/checkpoint-<step>/")
    r.add_argument("archive")
    r.add_argument("out")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--step", type=int, nargs="+", default=None)
    g.add_argument("--last", action="store_true")
    ls = sub.add_parser("ls", help="list the steps")
    ls.add_argument("archive")
    v = sub.add_parser("verify", help="check every checksum and decode every tensor")
    v.add_argument("archive")
    pr = sub.add_parser("prune", help="keep only the last K steps")
    pr.add_argument("archive")
    pr.add_argument("--keep-last", type=int, required=True, metavar="K")
    return p


def _mib(n):
    return f"{n / 2**20:,.1f} MiB"


def _run(args):
    out = sys.stdout
    if args.cmd == "add":
        a = Archive(args.archive, keyframe_every=args.keyframe_every, threads=args.threads)
        t = time.perf_counter()
        s = a.add(args.checkpoint_dir, args.step)
        e = a.entries()[-1]
        print(f"step {s}: {_mib(e['bytes_in'])} -> {_mib(e['size'])} "
              f"({time.perf_counter() - t:.1f} s)", file=out)
        return 0
    if args.cmd == "compress":
        if not os.path.isdir(args.run_dir):
            raise ArchiveError(f"{args.run_dir}: not a directory")
        found = sorted((step_of(n), n) for n in os.listdir(args.run_dir)
                       if re.match(r"^checkpoint-\d+$", n)
                       and os.path.isdir(os.path.join(args.run_dir, n)))
        if not found:
            raise ArchiveError(f"{args.run_dir}: no checkpoint-<step> folders")
        a = Archive(args.archive, keyframe_every=args.keyframe_every, threads=args.threads)
        have = a.steps()
        for s, name in found:
            if s in have:
                print(f"step {s}: already in the archive", file=out)
                continue
            if have and s < have[-1]:
                print(f"step {s}: skipped (older than the archive's last step {have[-1]})",
                      file=out)
                continue
            t = time.perf_counter()
            a.add(os.path.join(args.run_dir, name), s)
            have.append(s)
            e = a.entries()[-1]
            print(f"step {s}: {_mib(e['bytes_in'])} -> {_mib(e['size'])} "
                  f"({time.perf_counter() - t:.1f} s)", file=out, flush=True)
        return 0
    if args.cmd == "restore":
        a = Archive(args.archive, threads=args.threads)
        have = a.steps()
        if not have:
            raise ArchiveError(f"{args.archive}: no such archive or no steps")
        steps = have[-1:] if args.last else (args.step or have)
        for s in steps:
            if s not in have:
                raise ArchiveError(f"step {s} is not in the archive")
        for s in steps:
            d = a.restore(s, os.path.join(args.out, f"checkpoint-{s}"))
            print(f"step {s}: restored to {d}", file=out, flush=True)
        return 0
    if args.cmd == "ls":
        a = Archive(args.archive)
        es = a.entries()
        print(f"{'step':>10} {'kind':>8} {'depends-on':>10} {'bytes in':>14} "
              f"{'bytes out':>14} {'ratio':>7}", file=out)
        tin = tout = 0
        for e in es:
            kind = "keyframe" if e["keyframe"] else ("delta" if e["depends_on"] is not None
                                                     else "full")
            dep = "-" if e["depends_on"] is None else str(e["depends_on"])
            ratio = e["bytes_in"] / e["size"] if e["size"] else 0.0
            tin += e["bytes_in"]
            tout += e["size"]
            print(f"{e['step']:>10} {kind:>8} {dep:>10} {e['bytes_in']:>14,} "
                  f"{e['size']:>14,} {ratio:>7.3f}", file=out)
        if es:
            print(f"{'total':>10} {'':>8} {'':>10} {tin:>14,} {tout:>14,} "
                  f"{tin / max(tout, 1):>7.3f}", file=out)
        return 0
    if args.cmd == "verify":
        res = Archive(args.archive, threads=args.threads).verify()
        for s in res.steps:
            if s in res.damaged:
                print(f"step {s}: DAMAGED: {res.damaged[s]}", file=out)
                if res.dependents[s]:
                    print(f"  steps that depend on step {s} (cannot be restored): "
                          + ", ".join(map(str, res.dependents[s])), file=out)
            elif s not in res.unrestorable:
                print(f"step {s}: ok", file=out)
            else:
                print(f"step {s}: depends on a damaged step", file=out)
        bad = len(res.unrestorable)
        print(f"verify: {len(res.steps) - bad} of {len(res.steps)} steps ok, "
              f"{len(res.damaged)} damaged, {bad - len(res.damaged)} depend on a damaged step",
              file=out)
        return 0 if res.ok else 1
    if args.cmd == "prune":
        a = Archive(args.archive, threads=args.threads)
        gone = a.prune(args.keep_last)
        print(f"pruned {len(gone)} step(s)" + (": " + ", ".join(map(str, gone)) if gone else ""),
              file=out)
        return 0
    raise AssertionError(args.cmd)  # pragma: no cover


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line, never a traceback (LMC_ARCHIVE_DEBUG=1 shows it)
        if os.environ.get("LMC_ARCHIVE_DEBUG"):
            raise
        msg = " ".join(str(e).split()) or type(e).__name__
        if not isinstance(e, (ArchiveError, OSError)):
            msg = f"{type(e).__name__}: {msg}"
        print(f"{PROG}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
