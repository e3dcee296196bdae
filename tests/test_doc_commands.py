"""Every command the documentation shows still works as written.

Commands are taken from the README files, the pages under ``docs/`` (code blocks, and inline code that starts
with a program's name), the changelogs and the comments of ``conf/**/*.yaml``:

* ``lmcbench ...``: composed with Hydra as ``lmcbench`` composes it (``lmcbench.cli``), without running it: every
  override must parse and name a known option (``hydra.*`` overrides included); a sweep (``-m``) has each of its
  points composed.
* ``lmc-archive ...``, ``lmcbench-excp ...``, ``lmcbench-report ...``: every option must be one that the
  subcommand's ``--help`` lists (a renamed or removed option fails).

Placeholders. A value written in angle brackets (``<date>``), in capitals (``DIR``, ``URL``) or as ``...`` is a
placeholder. Paths do not matter to composition, so such a value is replaced by a real temporary folder, except
an element of a list becomes 0 (``'source.steps=[STEP]'``), and where a placeholder stands for a config option itself (``experiment=<name>``) or for the whole rest of the
command (``lmcbench ...``): those show syntax, not a command, and are skipped (``SKIPPED`` lists them, and a
test checks that no other command is skipped).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from lmcbench_testlib import REPO

PROGRAMS = ("lmcbench", "lmcbench-report", "lmcbench-excp", "lmc-archive")
GROUPS = {d.name for d in (REPO / "conf").iterdir() if d.is_dir() and not d.name.startswith("_")}
PLACEHOLDER = re.compile(r"<[^<>]*>|\.\.\.|…|\b[A-Z][A-Z0-9_]*[A-Z0-9]\b")
ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# commands that show syntax with a placeholder for an option or for everything else (see the module docstring)
SKIPPED = {shlex.join(shlex.split(c)) for c in ("lmcbench experiment=<name>", "lmcbench ...")}


def doc_files() -> list[Path]:
    files = [REPO / "README.md", REPO / "codecs" / "lmc" / "README.md", REPO / "CHANGELOG.md",
             REPO / "codecs" / "lmc" / "CHANGELOG.md"]
    files += sorted((REPO / "docs").rglob("*.md"))
    return [f for f in files if f.is_file()]


def _blocks(text: str):
    """(code, is_block) pieces of a Markdown text: fenced and indented code blocks, and inline code spans."""
    lines, i, fence, buf = text.splitlines(), 0, None, []
    prose = []
    while i < len(lines):
        ln = lines[i]
        m = re.match(r"^\s*(```|~~~)", ln)
        if fence is None and m:
            fence, buf = m.group(1), []
        elif fence is not None and ln.strip().startswith(fence):
            yield "\n".join(buf), True
            fence = None
        elif fence is not None:
            buf.append(ln)
        elif ln.startswith("    ") and (not prose or not prose[-1].strip()) and ln.strip():
            block = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                block.append(lines[i][4:])
                i += 1
            yield "\n".join(block), True
            prose.append("")
            continue
        else:
            prose.append(ln)
        i += 1
    for span in re.findall(r"`([^`\n]+)`", "\n".join(prose).replace("\n", " ")):
        yield span, False


def _commands_in(code: str) -> list[str]:
    """The commands of a shell snippet: continuation lines joined, split at ``&&``, ``;`` and ``|``, comments and
    leading ``VAR=value`` assignments dropped, only those that start with one of PROGRAMS."""
    code = re.sub(r"\\\n\s*", " ", code)
    out = []
    for line in code.splitlines():
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue
        cmd: list[str] = []
        for t in tokens + ["&&"]:
            if t in ("&&", ";", "|", "||"):
                while cmd and ENV_ASSIGN.match(cmd[0]):
                    cmd.pop(0)
                if cmd and cmd[0] in PROGRAMS:
                    out.append(shlex.join(cmd))
                cmd = []
            else:
                cmd.append(t)
    return out


def doc_commands() -> list[tuple[str, str]]:
    """(where, command) for every command in the documentation and in the comments of conf/."""
    found: dict[str, str] = {}
    for f in doc_files():
        for code, is_block in _blocks(f.read_text(encoding="utf-8")):
            if not is_block and not code.startswith(tuple(p + " " for p in PROGRAMS)):
                continue
            for cmd in _commands_in(code):
                found.setdefault(cmd, str(f.relative_to(REPO)))
    for f in sorted((REPO / "conf").rglob("*.yaml")):
        for ln in f.read_text().splitlines():
            s = ln.strip()
            if s.startswith("#"):
                body = re.sub(r"^#\s*(?:[A-Za-z ]+:\s*)?", "", s)
                if body.startswith(tuple(p + " " for p in PROGRAMS)):
                    for cmd in _commands_in(body):
                        found.setdefault(cmd, str(f.relative_to(REPO)))
    return sorted((where, cmd) for cmd, where in found.items())


COMMANDS = doc_commands()


def _is_skipped(cmd: str) -> bool:
    return cmd in SKIPPED


def test_commands_found():
    progs = {shlex.split(c)[0] for _, c in COMMANDS}
    assert set(PROGRAMS) <= progs, f"no command of {set(PROGRAMS) - progs} found in the docs"
    assert len(COMMANDS) > 40
    assert {c for _, c in COMMANDS if _is_skipped(c)} <= SKIPPED


def test_readme_quickstart_is_what_ci_runs():
    """The README's test command is the one .ci/run runs (its install, then pytest)."""
    ci = (REPO / ".ci" / "run").read_text()
    line = next(ln for ln in ci.splitlines() if ln.startswith("python3 -m venv"))
    readme = (REPO / "README.md").read_text()
    assert line in readme, f".ci/run's command is not in the README: {line}"
    assert line.replace("python -m pytest", "lmcbench") in readme


def _substitute(token: str, tmp: Path) -> str:
    return PLACEHOLDER.sub(lambda m: str(tmp / "x"), token)


def _lmcbench_overrides(args: list[str], tmp: Path) -> tuple[bool, list[str]]:
    multirun = any(a in ("-m", "--multirun") for a in args)
    out = []
    for a in args:
        if a in ("-m", "--multirun") or a.startswith("--"):  # Hydra's flags (--cfg job, --help, ...)
            continue
        key, sep, value = a.partition("=")
        if sep and PLACEHOLDER.search(value) and not key.startswith("hydra") and key.lstrip("+~") not in GROUPS:
            # a path becomes a temporary folder; an element of a list (steps=[STEP]) becomes 0
            value = PLACEHOLDER.sub("0", value) if value.startswith("[") else _substitute(value, tmp)
        out.append(key + sep + value if sep else a)
    return multirun, out


def _compose_all(overrides: list[str], multirun: bool):
    from hydra import compose, initialize_config_dir

    from lmcbench.cli import _sweep_points
    from lmcbench.paths import CONF_DIR

    points = _sweep_points(overrides) if multirun else [overrides]
    assert points, f"the sweep cannot be expanded: {overrides}"
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for point in points:
            compose(config_name="config", overrides=point, return_hydra_config=True)


LMCBENCH = [(w, c) for w, c in COMMANDS if shlex.split(c)[0] == "lmcbench"]
OTHERS = [(w, c) for w, c in COMMANDS if shlex.split(c)[0] != "lmcbench"]


def check_lmcbench(cmd: str, tmp: Path) -> None:
    """Compose ``cmd`` (an ``lmcbench`` command) as lmcbench would, every sweep point of it; raises if it does not."""
    multirun, overrides = _lmcbench_overrides(shlex.split(cmd)[1:], tmp)
    _compose_all(overrides, multirun)


@pytest.mark.parametrize("where,cmd", LMCBENCH, ids=[c for _, c in LMCBENCH])
def test_lmcbench_command_composes(where, cmd, tmp_path):
    if _is_skipped(cmd):
        pytest.skip("a placeholder for an option: syntax, not a command")
    try:
        check_lmcbench(cmd, tmp_path)
    except Exception as e:  # noqa: BLE001 - the message is the point
        pytest.fail(f"{where}: `{cmd}` does not compose: {type(e).__name__}: {str(e).splitlines()[0]}")


def _main(prog: str):
    if prog == "lmc-archive":
        from lmc.archive import main
    elif prog == "lmcbench-excp":
        from lmcbench.lossy.cli import main
    else:
        from lmcbench.report.merge import main
    return main


def _help(prog: str, argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        try:
            _main(prog)(argv)
        except SystemExit:
            pass
    return buf.getvalue()


def _subcommands(prog: str) -> list[str]:
    text = _help(prog, ["--help"])
    m = re.search(r"\{([a-z0-9_,-]+)\}", text[text.find("positional arguments"):])
    return m.group(1).split(",") if m else []


def check_cli(cmd: str, where: str = "") -> None:
    """Every option of ``cmd`` (an lmc-archive, lmcbench-excp or lmcbench-report command) is one its subcommand's
    ``--help`` lists, and the command names a subcommand; raises AssertionError if not."""
    tokens = [t.strip("[]") for t in shlex.split(cmd)]
    prog, args = tokens[0], [t for t in tokens[1:] if t and t != "|"]
    subs = _subcommands(prog)
    sub = next((a for a in args if a in subs), None)
    if subs and sub is None:  # a fragment that shows a global option (`lmc-archive --prefer size ...`)
        loose = [a for i, a in enumerate(args) if not a.startswith("-") and not PLACEHOLDER.fullmatch(a)
                 and not (i and args[i - 1].startswith("-"))]
        assert not loose, f"{where}: `{cmd}` names no subcommand of {prog} ({', '.join(subs)})"
    top = _help(prog, ["--help"])
    text = top + (_help(prog, [sub, "--help"]) if sub else "")
    assert "usage:" in text
    for a in args:
        if a.startswith("-") and a not in ("-", "--"):
            opt = a.split("=", 1)[0]
            assert re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text), \
                f"{where}: `{cmd}`: {prog} {sub or ''} has no option {opt}"


@pytest.mark.parametrize("where,cmd", OTHERS, ids=[c for _, c in OTHERS])
def test_cli_command_options_exist(where, cmd):
    check_cli(cmd, where)


def test_the_checks_catch_what_they_should(tmp_path):
    """The known ways a documented command breaks are caught: a regex override without its inner quotes, an
    unknown option, a renamed flag, a misspelt subcommand."""
    check_lmcbench(r"""lmcbench source=dcp source.path=/x 'source.step_regex="step-(\d+)"'""", tmp_path)
    for bad in (r"lmcbench source=dcp source.path=/x 'source.step_regex=step-(\d+)'", "lmcbench source.pathh=/x",
                "lmcbench -m 'codec=zstd,nosuchcodec'", "lmcbench -m hydra.launcher.partitionx=cpu"):
        with pytest.raises(Exception):
            check_lmcbench(bad, tmp_path)
    check_cli("lmc-archive prune run.lmca --keep-last 3")
    for bad in ("lmc-archive prune run.lmca --keep-lastt 3", "lmc-archive prunee run.lmca",
                "lmcbench-excp compress a b --archiverr lzma", "lmcbench-report --outt x"):
        with pytest.raises(AssertionError):
            check_cli(bad)
