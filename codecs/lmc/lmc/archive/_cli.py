"""Command line: lmc-archive {add,compress,restore,ls,verify,prune}."""
import argparse
import os
import sys
import time

from ..chains import DEFAULT_KEYFRAME_EVERY
from ._archive import Archive, step_folders
from ._manifest import ArchiveError
from ._segments import check_step_number

PROG = "lmc-archive"


def _parser():
    p = argparse.ArgumentParser(prog=PROG, description="Lossless archive of a checkpoint "
                                "series: every tensor lmc-coded against the previous step.")
    p.add_argument("--threads", type=int, default=None, help="lmc threads (default: all cores)")
    p.add_argument("--prefer", choices=("speed", "size", "fast"), default="speed",
                   help="what lmc favours where they differ for the tensors a command codes: decode speed "
                        "(default), size (rANS and the slower chunk modes wherever they are smaller) or fast "
                        "(never the temporal mode: a step against the previous one at half the alone speed or "
                        "better, somewhat larger)")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add", help="append one checkpoint folder")
    a.add_argument("archive")
    a.add_argument("checkpoint_dir")
    a.add_argument("--step", type=int, default=None,
                   help="default: from the folder's name (checkpoint-<N>, global_step<N>, step-<N>, step<N>)")
    a.add_argument("--keyframe-every", type=int, default=None, metavar="K")
    c = sub.add_parser("compress", help="append every step folder of a run folder (checkpoint-<N>, "
                       "global_step<N>, step-<N>, step<N>); exits 1 if any was skipped as older than "
                       "the archive's last step")
    c.add_argument("run_dir")
    c.add_argument("archive")
    c.add_argument("--keyframe-every", type=int, default=None, metavar="K")
    r = sub.add_parser("restore", help="write OUT/<the step's folder name>/")
    r.add_argument("archive")
    r.add_argument("out")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--step", type=int, nargs="+", default=None)
    g.add_argument("--last", action="store_true")
    ls = sub.add_parser("ls", help="list the steps, with the bytes that went in as opaque bytes")
    ls.add_argument("archive")
    ls.add_argument("--opaque", action="store_true",
                    help="per step, each file stored (partly) as plain bytes and why")
    v = sub.add_parser("verify", help="check every checksum and decode every tensor")
    v.add_argument("archive")
    rp = sub.add_parser("repair", help="rebuild a missing or damaged manifest (or one its segments "
                        "contradict; the old one is kept as damaged-lmc-archive.json) from the segments, "
                        "then verify; says what is lost")
    rp.add_argument("archive")
    rp.add_argument("--keyframe-every", type=int, default=None, metavar="K",
                    help="for steps added later (default: what the newest segment records, else "
                    f"inferred from the chains, else {DEFAULT_KEYFRAME_EVERY})")
    pr = sub.add_parser("prune", help="delete steps: keep what any --keep-* keeps (and the latest)")
    pr.add_argument("archive")
    pr.add_argument("--keep-last", type=int, default=None, metavar="K", help="the last K steps")
    pr.add_argument("--keep-every", type=int, default=None, metavar="N",
                    help="steps that are multiples of N")
    pr.add_argument("--keep-within", default=None, metavar="D",
                    help="steps written within D of the latest; D needs a unit: s, m, h, d or w "
                    "(e.g. 7d, 36h, 90m, 3600s)")
    return p


def _duration(text):
    """Seconds from a positive duration with its unit: '90m', '36h', '7d', '2w', '3600s'.  A bare
    number is refused (was it seconds or days?), and so is zero, as --keep-last 0 is."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    t = text.strip().lower()
    if t and t[-1] not in units:
        try:
            float(t)
        except ValueError:
            pass
        else:
            raise ArchiveError(f"--keep-within {text}: a duration needs a unit, one of s, m, h, d, w "
                               f"(e.g. {t}d for days, {t}h for hours)")
    try:
        v = float(t[:-1]) * units[t[-1]] if t else -1
    except (ValueError, KeyError):
        v = -1
    if not 0 < v < float("inf"):
        raise ArchiveError(f"--keep-within {text}: not a positive duration (e.g. 7d, 36h, 90m)")
    return v


def _mib(n):
    return f"{n / 2**20:,.1f} MiB"


def _opaque_note(e):
    """ ", 1.2% opaque" when a step stored more than 1% of its bytes as plain bytes."""
    if e["opaque"] is None or e["opaque"] <= e["bytes_in"] / 100:
        return ""
    return (f", {100 * e['opaque'] / max(e['bytes_in'], 1):.1f}% as opaque bytes "
            f"(lmc-archive ls --opaque says which and why)")


def _run(args):
    out = sys.stdout
    if args.cmd == "add":
        if args.step is not None:
            check_step_number(args.step)  # before anything is read or made
        a = Archive(args.archive, keyframe_every=args.keyframe_every, threads=args.threads, prefer=args.prefer)
        t = time.perf_counter()
        s = a.add(args.checkpoint_dir, args.step)
        e = a.entries()[-1]
        print(f"step {s}: {_mib(e['bytes_in'])} -> {_mib(e['size'])} "
              f"({time.perf_counter() - t:.1f} s){_opaque_note(e)}", file=out)
        return 0
    if args.cmd == "compress":
        if not os.path.isdir(args.run_dir):
            raise ArchiveError(f"{args.run_dir}: not a directory")
        found = step_folders(args.run_dir)
        if not found:
            raise ArchiveError(f"{args.run_dir}: no step folders (checkpoint-<N>, global_step<N>, "
                               "step-<N>, step<N>)")
        a = Archive(args.archive, keyframe_every=args.keyframe_every, threads=args.threads, prefer=args.prefer)
        have = a.steps()
        skipped = []
        for s, name in found:
            if s in have:
                print(f"step {s}: already in the archive", file=out)
                continue
            if have and s < have[-1]:
                print(f"step {s}: skipped (older than the archive's last step {have[-1]})",
                      file=out)
                skipped.append(s)
                continue
            t = time.perf_counter()
            a.add(os.path.join(args.run_dir, name), s)
            have.append(s)
            e = a.entries()[-1]
            print(f"step {s}: {_mib(e['bytes_in'])} -> {_mib(e['size'])} "
                  f"({time.perf_counter() - t:.1f} s){_opaque_note(e)}", file=out, flush=True)
        if skipped:  # not archived: an archive only grows forward (exit 1, the others were added)
            print(f"{PROG}: error: {len(skipped)} step folder(s) not archived, older than the archive's "
                  f"last step {have[-1]}: " + ", ".join(map(str, skipped)), file=sys.stderr)
            return 1
        return 0
    if args.cmd == "restore":
        a = Archive(args.archive, threads=args.threads, prefer=args.prefer)
        have = a.steps()
        if not have:
            raise ArchiveError(f"{args.archive}: no such archive or no steps")
        steps = have[-1:] if args.last else (args.step or have)
        for s in steps:
            if s not in have:
                raise ArchiveError(f"step {s} is not in the archive")
        names = {e["step"]: e["name"] for e in a.entries()}
        for s in steps:
            d = a.restore(s, os.path.join(args.out, names[s]))
            print(f"step {s}: restored to {d}", file=out, flush=True)
        return 0
    if args.cmd == "ls":
        a = Archive(args.archive)
        es = a.entries()
        print(f"{'step':>10} {'kind':>8} {'depends-on':>10} {'bytes in':>14} "
              f"{'bytes out':>14} {'ratio':>7} {'opaque':>14} {'opaque%':>7}  folder", file=out)
        tin = tout = top = 0
        for e in es:
            kind = "keyframe" if e["keyframe"] else ("delta" if e["depends_on"] is not None
                                                     else "full")
            dep = "-" if e["depends_on"] is None else str(e["depends_on"])
            ratio = e["bytes_in"] / e["size"] if e["size"] else 0.0
            tin += e["bytes_in"]
            tout += e["size"]
            if e["opaque"] is None:
                op = opp = "?"
            else:
                top += e["opaque"]
                op, opp = f"{e['opaque']:,}", f"{100 * e['opaque'] / max(e['bytes_in'], 1):.2f}"
            print(f"{e['step']:>10} {kind:>8} {dep:>10} {e['bytes_in']:>14,} "
                  f"{e['size']:>14,} {ratio:>7.3f} {op:>14} {opp:>7}  {e['name']}", file=out)
            if args.opaque:
                for path, n, why in a.opaque(e["step"]):
                    print(f"{'':>10}   {n:>14,}  {path}: {why}", file=out)
        if es:
            print(f"{'total':>10} {'':>8} {'':>10} {tin:>14,} {tout:>14,} "
                  f"{tin / max(tout, 1):>7.3f} {top:>14,} {100 * top / max(tin, 1):>7.2f}", file=out)
        return 0
    if args.cmd == "verify":
        res = Archive(args.archive, threads=args.threads, prefer=args.prefer).verify()
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
    if args.cmd == "repair":
        steps, bad, res = Archive(args.archive, threads=args.threads, prefer=args.prefer).repair(args.keyframe_every)
        for note in res.notes:
            print(f"repair: {note}", file=out)
        for name, why in bad:
            print(f"unreadable segment {name} (renamed damaged-{name}): {why}", file=out)
        lost = res.unrestorable
        print(f"repair: {len(steps)} step(s) in the manifest: " + (", ".join(map(str, steps)) or "none"),
              file=out)
        for s in lost:
            print(f"step {s}: LOST: {res.damaged.get(s, 'depends on a damaged step')}", file=out)
        print(f"repair: {len(steps) - len(lost)} step(s) restorable, {len(lost)} lost", file=out)
        return 0 if not lost and not bad else 1
    if args.cmd == "prune":
        a = Archive(args.archive, threads=args.threads, prefer=args.prefer)
        if args.keep_last is None and args.keep_every is None and args.keep_within is None:
            raise ArchiveError("prune: give --keep-last, --keep-every and/or --keep-within")
        within = None if args.keep_within is None else _duration(args.keep_within)
        gone = a.prune(args.keep_last, keep_every=args.keep_every, keep_within=within)
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
