"""The lmc package's layers, read from its source with ast (imports inside functions too): each part imports only
its own modules and the parts below it, the kernels import in their stated order, no circle anywhere, and no Python
file under codecs/lmc passes 600 lines."""
import ast
from pathlib import Path

LMC = Path(__file__).resolve().parents[1]   # codecs/lmc
PKG = LMC / "lmc"

# bottom up: (layer, part, its modules' prefixes); a module imports modules of its own part or of a lower layer
PARTS = [
    (0, "kernels", ("lmc.kernels",)),
    (1, "codec", ("lmc", "lmc.api", "lmc.zmask", "lmc.outbuf", "lmc.numcodecs_codec")),   # "lmc": the public API
    (2, "storage", ("lmc.storage",)),
    (2, "chains", ("lmc.chains",)),
    (2, "memory", ("lmc.memory",)),
    (2, "worker", ("lmc.worker",)),
    (3, "formats", ("lmc.formats",)),
    (4, "archive", ("lmc.archive",)),
    (4, "dcp", ("lmc.dcp",)),
    (5, "hf", ("lmc.hf",)),
]
# lmc.kernels bottom up: a kernel module imports only those before it (the delta encoder not its decoder)
KERNELS = ["intrinsics", "simd", "wenc", "restore", "histo", "base", "hmulti", "hfixed", "huffman", "huffenc", "rans",
           "streams", "tfuse", "tenc", "temporal", "mctx", "jmerge", "joint", "delta", "delta.fields", "delta.encode",
           "delta.decode", "chunk", "pair", "check", "drivers"]
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def imports(path: Path) -> set:
    """The lmc modules a file imports, anywhere in it (module level or inside a function), as module names."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:  # "from . import x" imports the module x where there is one
                out.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m == "lmc" or m.startswith("lmc.")}


def part_of(module: str):
    best = None
    for layer, part, prefixes in PARTS:
        for p in prefixes:
            if (module == p or (p != "lmc" and module.startswith(p + "."))) and (best is None or len(p) > best[2]):
                best = (layer, part, len(p))
    assert best is not None, f"{module}: in no part of the layer table (add it to PARTS)"
    return best[:2]


def test_every_module_has_a_part():
    assert {"lmc", "lmc.api", "lmc.kernels.chunk", "lmc.storage", "lmc.formats.dcp", "lmc.archive._manifest",
            "lmc.archive._index", "lmc.dcp._writer", "lmc.hf"} <= set(MODULES)
    for m in MODULES:
        part_of(m)


def test_arrows_only_go_down():
    bad = []
    for m, path in sorted(MODULES.items()):
        layer, part = part_of(m)
        for dep in sorted(imports(path)):
            dl, dp = part_of(dep)
            if dp != part and dl >= layer:
                bad.append(f"{m} ({part}) imports {dep} ({dp})")
    assert not bad, "\n".join(bad)


def test_the_codec_imports_nothing_of_the_product():
    for m, path in MODULES.items():
        if part_of(m)[1] in ("kernels", "codec"):
            assert {part_of(d)[1] for d in imports(path)} <= {"kernels", "codec"}, m


def test_kernels_import_in_order():
    order = {f"lmc.kernels.{k}": i for i, k in enumerate(KERNELS)}
    assert set(order) | {"lmc.kernels"} == {m for m in MODULES if m.startswith("lmc.kernels")}
    for m, i in order.items():
        deps = {d for d in imports(MODULES[m]) if d.startswith("lmc.kernels.")}
        later = sorted(d for d in deps if order.get(d, -1) >= i and not m.startswith(d + "."))
        assert not later, f"{m} imports {later}"
    enc = imports(MODULES["lmc.kernels.delta.encode"])
    assert "lmc.kernels.delta.decode" not in enc and "lmc.kernels.delta.fields" in enc


def test_no_circle():
    """Not even one hidden by an import inside a function: the graph of every import is acyclic."""
    graph = {m: {d for d in imports(p) if d in MODULES and d != m} for m, p in MODULES.items()}
    # a package's __init__ runs before its modules: "from .pkg import x" also loads lmc.pkg; ignore that edge
    # from a module to the package it lies in (a package re-exporting its modules is not a circle)
    for m in graph:
        graph[m] = {d for d in graph[m] if not m.startswith(d + ".")}
    state, path = {}, []

    def visit(m):
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                raise AssertionError("circle: " + " -> ".join(path[path.index(d):] + [d]))
            if d not in state:
                visit(d)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_the_dcp_writer_and_the_archive_share_only_what_lies_below():
    for m, path in MODULES.items():
        deps = imports(path)
        if m.startswith("lmc.dcp"):
            assert not [d for d in deps if d.startswith("lmc.archive")], m
        if m.startswith("lmc.archive"):
            assert not [d for d in deps if d.startswith("lmc.dcp")], m
        if m.startswith("lmc.formats"):
            assert not [d for d in deps if d.startswith(("lmc.dcp", "lmc.archive", "lmc.hf"))], m


def test_no_file_passes_600_lines():
    long = [f"{p.relative_to(LMC)}: {n}" for p in LMC.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, long


def test_every_package_is_in_the_wheel():
    """Each folder of lmc with an __init__.py is named in pyproject.toml's [tool.setuptools] packages."""
    import re

    text = (LMC / "pyproject.toml").read_text()
    listed = set(re.findall(r'"([^"]+)"', re.search(r"^packages = \[(.*?)\]", text, re.M | re.S).group(1)))
    assert listed == {module_name(p.parent / "__init__.py") for p in PKG.rglob("__init__.py")}
