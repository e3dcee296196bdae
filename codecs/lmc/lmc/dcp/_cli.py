"""``python -m lmc.dcp``: conversions of LMC DCP checkpoints."""

from ._reader import lmc_to_torch_save


def main(argv=None) -> int:
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m lmc.dcp", description="LMC DCP checkpoints: conversions.")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("to-torch", help="one torch.save file of the whole state (like dcp_to_torch_save)")
    t.add_argument("checkpoint")
    t.add_argument("out")
    a = p.parse_args(argv)
    import warnings

    from torch.distributed.checkpoint.api import CheckpointException  # (a BaseException)

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process, on purpose

    try:
        lmc_to_torch_save(a.checkpoint, a.out)
    except (Exception, CheckpointException) as e:  # one line: the input's error (a missing folder, a damaged file)
        text = str(e).strip()
        if isinstance(e, CheckpointException) and text:
            text = text.splitlines()[-1]  # the rank's error, not DCP's traceback
        msg = " ".join(text.split()) or type(e).__name__
        print(f"lmc.dcp: error: {msg[:2000]}", file=sys.stderr)
        return 2
    print(f"{a.checkpoint} -> {a.out}")
    return 0
