"""prefer="size" reaches every writer: the archive (API and lmc-archive --prefer) and the DCP storage writer,
for the tensors they code and those they re-code; bad values are refused; what they write restores bit-exact."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import lmc  # noqa: E402
import lmc.archive._add  # noqa: E402
import lmc.archive._archive  # noqa: E402
import lmc.archive._recoder  # noqa: E402
import lmc.dcp._recode  # noqa: E402
import lmc.dcp._writer  # noqa: E402
from lmc.archive import Archive  # noqa: E402
from lmc.dcp import LMCStorageWriter  # noqa: E402
from test_archive import assert_same_folder, cli, make_series  # noqa: E402
from test_dcp import assert_same, load, save, snapshot, train_state  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

ARCHIVE_MODULES = (lmc.archive._add, lmc.archive._archive, lmc.archive._recoder)
DCP_MODULES = (lmc.dcp._writer, lmc.dcp._recode)


@pytest.fixture
def spy(monkeypatch):
    """Records the prefer= of every lmc.compress call the writers make (the real compress still runs), and in
    install.modes the chunk modes of each blob it returned."""
    calls = []

    def install(modules):
        for mod in modules:
            real = mod.compress

            def wrapped(*a, _real=real, _mod=mod.__name__, **kw):
                calls.append((_mod, kw.get("prefer", "speed")))
                blob = _real(*a, **kw)
                install.modes.append(lmc.info(blob)["chunk_modes"])
                return blob
            monkeypatch.setattr(mod, "compress", wrapped)
        return calls
    install.modes = []
    return install


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("run"))
    return make_series(root, steps=(2, 4, 6), bf16=True)


def _archive_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def test_archive_prefer_size_reaches_every_coding(series, tmp_path, spy):
    calls = spy(ARCHIVE_MODULES)
    a = Archive(tmp_path / "size.lmca", prefer="size")
    for d in series:
        a.add(d)
    # steps added (coded alone) and the previous step re-coded against the new one: all with prefer="size"
    mods = {m for m, _ in calls}
    assert {"lmc.archive._add", "lmc.archive._recoder"} <= mods, mods
    assert calls and {p for _, p in calls} == {"size"}
    # bf16 tensors get format 5's mantissa-context mode there (prefer="size" only), and restore bit-exact below
    assert any("mantissa-context" in m for m in spy.modes), spy.modes
    for s, d in zip(a.steps(), series):
        a.restore(s, tmp_path / f"r{s}")
        assert_same_folder(d, tmp_path / f"r{s}")
    # the default archive of the same steps is never smaller
    calls.clear()
    spy.modes.clear()
    b = Archive(tmp_path / "speed.lmca")
    for d in series:
        b.add(d)
    assert {p for _, p in calls} == {"speed"}
    assert spy.modes and not any("mantissa-context" in m for m in spy.modes)
    assert _archive_bytes(tmp_path / "size.lmca") <= _archive_bytes(tmp_path / "speed.lmca")


def test_archive_prefer_is_checked(tmp_path):
    with pytest.raises(ValueError, match="prefer must be one of 'speed', 'size', 'fast', got 'fastest'"):
        Archive(tmp_path / "a.lmca", prefer="fastest")


def test_cli_prefer(series, tmp_path, spy):
    calls = spy(ARCHIVE_MODULES)
    run = os.path.dirname(series[0])
    cli("--prefer", "size", "compress", run, str(tmp_path / "a.lmca"))
    assert calls and {p for _, p in calls} == {"size"}
    cli("restore", str(tmp_path / "a.lmca"), str(tmp_path / "out"), "--last")
    assert_same_folder(series[-1], tmp_path / "out" / os.path.basename(series[-1]))
    with pytest.raises(SystemExit):
        cli("--prefer", "smallest", "ls", str(tmp_path / "a.lmca"))


def test_dcp_writer_prefer_size(tmp_path, spy):
    calls = spy(DCP_MODULES)
    m, opt, step = train_state()
    s1 = snapshot(m, opt, {"bf16": m[0].weight.detach().bfloat16()})
    save(s1, tmp_path / "step-1", prefer="size")
    step()
    s2 = snapshot(m, opt, {"bf16": m[0].weight.detach().bfloat16()})
    save(s2, tmp_path / "step-2", reference=tmp_path / "step-1", prefer="size")
    # this save's tensors (lmc.dcp._writer) and the reference's, re-coded against them (lmc.dcp._recode)
    assert {m for m, _ in calls} == {"lmc.dcp._writer", "lmc.dcp._recode"}
    assert {p for _, p in calls} == {"size"}
    assert_same(s1, load(s1, tmp_path / "step-1"))
    assert_same(s2, load(s2, tmp_path / "step-2"))
    with pytest.raises(ValueError, match="prefer must be one of"):
        LMCStorageWriter(tmp_path / "x", prefer="small")


def test_dcp_prune_prefer_size(tmp_path, spy):
    """prune's re-coding of a kept checkpoint whose reference goes takes prefer too."""
    from lmc.dcp import prune
    from test_dcp import save_series

    states = save_series(tmp_path, 4, max_chain=4)  # one group: 1 -> 2 -> 3 -> 4
    calls = spy(DCP_MODULES)
    gone = prune(tmp_path, keep_every=2, prefer="size")  # step-2 loses step-3: re-coded against step-4
    assert sorted(os.path.basename(p) for p in gone) == ["step-1", "step-3"]
    assert calls and {m for m, _ in calls} == {"lmc.dcp._recode"} and {p for _, p in calls} == {"size"}
    for i in (2, 4):
        assert_same(states[i], load(states[i], tmp_path / f"step-{i}"))
    with pytest.raises(ValueError, match="prefer must be one of"):
        prune(tmp_path, keep_last=1, prefer="tiny")


def test_archive_prefer_fast_never_takes_the_temporal_mode(series, tmp_path, spy):
    """prefer="fast" reaches the archive's codings: the previous step re-coded against the new one never takes
    the temporal mode (float tensors against their reference: the delta mode, alone or XOR), and restores
    bit-exact."""
    calls = spy(ARCHIVE_MODULES)
    a = Archive(tmp_path / "fast.lmca", prefer="fast")
    for d in series:
        a.add(d)
    assert calls and {p for _, p in calls} == {"fast"}
    assert spy.modes and not any("temporal" in m for m in spy.modes), spy.modes
    assert any("delta" in m for m in spy.modes), spy.modes
    for s, d in zip(a.steps(), series):
        a.restore(s, tmp_path / f"r{s}")
        assert_same_folder(d, tmp_path / f"r{s}")
