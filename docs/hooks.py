"""MkDocs hooks: the pages that are generated from the repository at build time, never copied by hand.

* The documents that live beside the code (``codecs/lmc/FORMAT.md``, ``ARCHIVE.md``, ``DCP.md``, the ExCP
  container's ``FORMAT.md``, the two changelogs) become pages under ``reference/`` and ``changelog/``.
* ``results/`` (the committed reports, their figures and small data files) becomes ``results/`` of the site.
* ``reference/config.md``: every config group and option of ``conf/``, from the YAML files and their comments.
* ``reference/cli.md``: the ``--help`` of ``lmcbench``, ``lmcbench-report``, ``lmcbench-excp`` and ``lmc-archive``
  (each subcommand too).

A relative link in an included document is rewritten to the page the target became, or, where the target is not
part of the site (a source file), to its path in the repository as code.
"""

from __future__ import annotations

import contextlib
import html
import io
import os
import posixpath
import re
import subprocess
import sys

from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# repository file -> page of the site
INCLUDED = {
    "codecs/lmc/FORMAT.md": "reference/lmc-format.md",
    "codecs/lmc/ARCHIVE.md": "reference/archive-format.md",
    "codecs/lmc/DCP.md": "reference/dcp-layout.md",
    "lmcbench/lossy/excp/FORMAT.md": "reference/excp-format.md",
    "codecs/lmc/CHANGELOG.md": "changelog/lmc.md",
    "CHANGELOG.md": "changelog/lmcbench.md",
}
RESULTS = "results"
RESULTS_MAX_BYTES = 1 << 20  # larger data files (whole records.csv) stay in the repository only
# the README files link here; on the site they are these pages
README_PAGES = {"README.md": "index.md", "codecs/lmc/README.md": "lmc/index.md"}

_LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)((?:\s+\"[^\"]*\")?)\)")
_FENCE = re.compile(r"^(\s*)(```|~~~)")


def _site_map() -> dict[str, str]:
    m = dict(INCLUDED)
    m.update(README_PAGES)
    for path in _results_files():
        m[path] = path
    return m


def _results_files() -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, RESULTS)):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in sorted(filenames):
            p = os.path.join(dirpath, f)
            if f.startswith(".") or os.path.getsize(p) > RESULTS_MAX_BYTES:
                continue
            out.append(os.path.relpath(p, ROOT).replace(os.sep, "/"))
    return out


def rewrite_links(text: str, repo_path: str, page_uri: str, site: dict[str, str]) -> str:
    """Relative links of ``text`` (the repository file ``repo_path``, published as ``page_uri``) made to work
    on the site: to the page their target became, else to the target's repository path as code."""
    base = posixpath.dirname(repo_path)

    def fix(m: re.Match) -> str:
        bang, label, target, title = m.groups()
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return m.group(0)
        path, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(base, path)) if path else repo_path
        if resolved.startswith(".."):
            return m.group(0)
        dest = site.get(resolved)
        if dest is None:
            for index in ("README.md", "report.md", "index.md"):
                dest = site.get(posixpath.join(resolved, index))
                if dest:
                    break
        if dest is None:
            return f"{label} (`{resolved}`)" if not bang else f"*{label}* (`{resolved}`)"
        rel = posixpath.relpath(dest, posixpath.dirname(page_uri) or ".")
        return f"{bang}[{label}]({rel}{'#' + anchor if anchor else ''}{title})"

    out, fenced = [], False
    for line in text.splitlines(keepends=True):
        if _FENCE.match(line):
            fenced = not fenced
            out.append(line)
            continue
        out.append(line if fenced or line.startswith("    ") else _LINK.sub(fix, line))
    return "".join(out)


# ---------------------------------------------------------------------------------------------------- config


def _header_comment(lines: list[str]) -> list[str]:
    """The comment lines at the top of a YAML file (before its first key), without the ``#``."""
    out = []
    for ln in lines:
        s = ln.strip()
        if s.startswith("# @package"):
            continue
        if s.startswith("#"):
            out.append(s[1:].strip())
        elif s:
            break
        else:
            out.append("")
    return out


def _summary(comment: list[str]) -> str:
    para = []
    for ln in comment:
        if not ln:
            if para:
                break
            continue
        if ln.lower().startswith(("usage:", "lmcbench ")):
            break
        para.append(ln)
    text = " ".join(para)
    return _escape(text) if text else ""


def _escape(text: str) -> str:
    text = html.escape(text, quote=False)
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", text)


def _defaults(config_yaml: str) -> dict[str, str]:
    """The default option of each group, from ``conf/config.yaml``'s defaults list."""
    import yaml

    out = {}
    for item in (yaml.safe_load(config_yaml) or {}).get("defaults", []):
        if isinstance(item, dict):
            for k, v in item.items():
                if not k.startswith("override "):
                    out[k] = ", ".join(v) if isinstance(v, list) else ("null" if v is None else str(v))
    return out


_GROUP_INTRO = {
    "source": "Where the checkpoint series comes from. One source per run; `source.*` sets its options.",
    "codec": "The compressors. Several at once: `'codec=[zstd,lmc]'`; `codec.<name>.<option>=...` sets one "
             "option of a selected codec. A file equals its codec's `get_config()`.",
    "pipeline": "The invertible transforms in front of the codecs. Several at once: `'pipeline=[raw,delta]'`.",
    "bench": "How each measurement is timed, sliced, sampled and analysed.",
    "report": "What is written beside `records.csv` after a run.",
    "experiment": "Presets that run a grid and render it into `results/<name>/` (`lmcbench experiment=<name>`); "
                  "the header comment of each is its command.",
}


def config_page() -> str:
    conf = os.path.join(ROOT, "conf")
    with open(os.path.join(conf, "config.yaml")) as f:
        top = f.read()
    defaults = _defaults(top)
    groups = sorted(d for d in os.listdir(conf) if os.path.isdir(os.path.join(conf, d)) and not d.startswith("_"))
    order = [g for g in ("source", "codec", "pipeline", "bench", "report", "experiment") if g in groups]
    order += [g for g in groups if g not in order]
    md = ["# Configuration reference", "",
          "Generated from `conf/` when the site is built: every config group, its options and each option's "
          "file with its comments. A run composes `conf/config.yaml` with one option per group "
          "(`group=option`, or `'group=[a,b]'` where a group takes several) and any `key=value` overrides; "
          "`lmcbench --cfg job` prints the composed configuration without running it.", "",
          "## The top level: `conf/config.yaml`", "", "```yaml title=\"conf/config.yaml\"", top.rstrip(), "```", ""]
    for g in order:
        files = sorted(f for f in os.listdir(os.path.join(conf, g)) if f.endswith(".yaml"))
        md += [f"## `{g}`", ""]
        if g in _GROUP_INTRO:
            md += [_GROUP_INTRO[g], ""]
        if g in defaults:
            md += [f"Default: `{defaults[g]}`.", ""]
        md += ["| option | what |", "|---|---|"]
        bodies = []
        for f in files:
            name = f[:-5]
            with open(os.path.join(conf, g, f)) as fh:
                body = fh.read()
            comment = _header_comment(body.splitlines())
            md.append(f"| [`{g}={name}`](#{g}-{name.replace('_', '-')}) | {_summary(comment)} |")
            bodies += [f"### `{g}={name}` {{ #{g}-{name.replace('_', '-')} }}", "",
                       f"```yaml title=\"conf/{g}/{f}\"", body.rstrip(), "```", ""]
        md += [""] + bodies
    return "\n".join(md) + "\n"


# ---------------------------------------------------------------------------------------------------- CLIs


def _argparse_help(main, argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
    return buf.getvalue().rstrip()


def _subcommands(main) -> list[str]:
    top = _argparse_help(main, ["--help"])
    m = re.search(r"\{([a-z0-9_,-]+)\}", top[top.find("positional arguments"):])
    return m.group(1).split(",") if m else []


def _hydra_help() -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(ROOT, "codecs", "lmc"), ROOT, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "lmcbench.cli", "--help"], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"lmcbench --help failed: {r.stderr.strip()[-2000:]}")
    text = r.stdout.replace("cli is powered by Hydra.", "lmcbench is powered by Hydra.")
    return text.rstrip()


def cli_page() -> str:
    os.environ.setdefault("COLUMNS", "110")
    for p in (ROOT, os.path.join(ROOT, "codecs", "lmc")):
        if p not in sys.path:
            sys.path.insert(0, p)
    from lmc.archive import main as archive_main
    from lmcbench.lossy.cli import main as excp_main
    from lmcbench.report.merge import main as report_main

    md = ["# Command-line reference", "",
          "Generated when the site is built from each program's `--help`. Every command the guides show is "
          "checked against these parsers (and against Hydra for `lmcbench`) by `tests/test_doc_commands.py`.", "",
          "## `lmcbench`", "",
          "`lmcbench [-m] [group=option ...] [key=value ...]`: one run (or, with `-m`, a sweep) of the "
          "configuration composed from `conf/`; see the [configuration reference](config.md) for every "
          "option. Errors in the input or the configuration are one line (exit status 2); `LMCBENCH_DEBUG=1` "
          "shows the traceback. Hydra's own flags work: `--cfg job` prints the composed configuration, "
          "`--info` where it came from.", "",
          "```text", _hydra_help(), "```", ""]
    for prog, main, intro in [
        ("lmcbench-report", report_main, "Merges the run folders of a sweep into one report."),
        ("lmcbench-excp", excp_main, "ExCP (lossy) on a Trainer output folder: compress, restore, info."),
        ("lmc-archive", archive_main, "The incremental checkpoint archive of the `lmc` distribution "
                                      "(also `python -m lmc.archive`)."),
    ]:
        md += [f"## `{prog}`", "", intro, "", "```text", _argparse_help(main, ["--help"]), "```", ""]
        for sub in _subcommands(main):
            md += [f"### `{prog} {sub}`", "", "```text", _argparse_help(main, [sub, "--help"]), "```", ""]
    return "\n".join(md) + "\n"


# ---------------------------------------------------------------------------------------------------- hooks


def _add(files, config, uri: str, *, content: str | None = None, abs_src_path: str | None = None) -> None:
    old = files.get_file_from_path(uri)
    if old is not None:
        files.remove(old)
    if content is not None:
        files.append(File.generated(config, uri, content=content))
    else:
        files.append(File.generated(config, uri, abs_src_path=abs_src_path))


def on_files(files, config):
    site = _site_map()
    for repo_path, uri in INCLUDED.items():
        with open(os.path.join(ROOT, repo_path), encoding="utf-8") as f:
            _add(files, config, uri, content=rewrite_links(f.read(), repo_path, uri, site))
    for path in _results_files():
        src = os.path.join(ROOT, path)
        if path.endswith(".md"):
            with open(src, encoding="utf-8") as f:
                _add(files, config, path, content=rewrite_links(f.read(), path, path, site))
        else:
            _add(files, config, path, abs_src_path=src)
    _add(files, config, "reference/config.md", content=config_page())
    _add(files, config, "reference/cli.md", content=cli_page())
    return files


# ---------------------------------------------------------------------------------------------------- results

# the loose benchmark scripts of codecs/lmc moved into codecs/lmc/benchmarks/ (same file names)
_MOVED_SCRIPT = re.compile(r"codecs/lmc/((?:bench\w*|\w+_probe|bf16_context|exp_avg_context|stream_costs|"
                           r"delta_costs)\.py)")
_CMD_LABELLED = re.compile(r"[Cc]ommand:\s*`([^`]+)`")
_CMD_INLINE = re.compile(r"`((?:[A-Z_]+=\S+ )*(?:lmcbench(?:-\w+)? |python |bash )[^`]*)`")
_CMD_BLOCK = re.compile(r"^((?:[A-Z_]+=\S+ )*(?:lmcbench(?:-\w+)? |python |bash )\S.*)$", re.M)


def report_command(text: str) -> str | None:
    """The command a committed report says made it: its ``command:`` line, else its first command."""
    for rx in (_CMD_LABELLED, _CMD_INLINE, _CMD_BLOCK):
        m = rx.search(text)
        if m:
            return m.group(1).strip()
    return None


def current_location(command: str) -> str:
    return _MOVED_SCRIPT.sub(r"codecs/lmc/benchmarks/\1", command)


def _title(text: str, fallback: str) -> str:
    for ln in text.splitlines():
        if ln.startswith("# "):
            return ln[2:].strip()
    return fallback


def results_table() -> str:
    rows = ["| report | what | command that made it |", "|---|---|---|"]
    for path in _results_files():
        if not path.endswith(".md") or path == f"{RESULTS}/README.md":
            continue
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            text = f.read()
        cmd = report_command(text)
        cell = f"`{current_location(cmd)}`".replace("|", "\\|") if cmd else "see the report"
        name = posixpath.dirname(path)[len(RESULTS) + 1:] + ("" if posixpath.basename(path) in ("README.md", "report.md")
                                                             else "/" + posixpath.basename(path))
        title = html.escape(_title(text, name), quote=False).replace("|", "\\|")
        rows.append(f"| [`{name}`]({path}) | {title} | {cell} |")
    return "\n".join(rows)


def groups_table(page_uri: str) -> str:
    """One row per config group: its options, each linked to its entry in the configuration reference."""
    conf = os.path.join(ROOT, "conf")
    with open(os.path.join(conf, "config.yaml")) as f:
        defaults = _defaults(f.read())
    ref = posixpath.relpath("reference/config.md", posixpath.dirname(page_uri) or ".")
    rows = ["| group | options | default |", "|---|---|---|"]
    for g in ("source", "codec", "pipeline", "bench", "report", "experiment"):
        names = sorted(f[:-5] for f in os.listdir(os.path.join(conf, g)) if f.endswith(".yaml"))
        opts = ", ".join(f"[`{n}`]({ref}#{g}-{n.replace('_', '-')})" for n in names)
        rows.append(f"| `{g}` | {opts} | `{defaults.get(g, 'null')}` |")
    return "\n".join(rows)


def on_page_markdown(markdown, page, config, files):
    if "<!-- results-table -->" in markdown:
        markdown = markdown.replace("<!-- results-table -->", results_table())
    if "<!-- config-groups -->" in markdown:
        markdown = markdown.replace("<!-- config-groups -->", groups_table(page.file.src_uri))
    return markdown
