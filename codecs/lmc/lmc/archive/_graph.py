"""The archive's dependency graph of steps (each manifest entry's depends_on): the root each
chain ends at, whether the last step may be re-coded, chain depths, a dependency order."""


def _roots(m):
    """{step: the step its dependency chain ends at (a step coded alone)}."""
    dep = {e["step"]: e["depends_on"] for e in m["steps"]}
    out = {}
    for s in dep:
        c = s
        while dep[c] is not None:
            c = dep[c]
        out[s] = c
    return out


def _may_recode(m, step):
    """Whether `step` (the last) may be re-coded against a new step: nothing older than itself
    may come to decode through more than keyframe_every versions, and no step may depend on it
    in a way a re-code would break (a forward step's dependents are newer: there are none)."""
    roots = _roots(m)
    e = next(e for e in m["steps"] if e["step"] == step)
    if e["depends_on"] is not None:   # coded forward against an older step: nothing depends on it
        return not any(x["depends_on"] == step for x in m["steps"])
    group = sum(1 for r in roots.values() if r == step)  # steps whose chain ends at `step`
    return group < m["keyframe_every"]


def _set_depths(m):
    dep = {e["step"]: e["depends_on"] for e in m["steps"]}
    for e in m["steps"]:
        n, c = 0, e["depends_on"]
        while c is not None:
            n, c = n + 1, dep[c]
        e["depth"] = n


def _topo(m):
    """Steps in an order where each comes after the step it depends on."""
    dep = {e["step"]: e["depends_on"] for e in m["steps"]}
    done, out = set(), []
    for s in dep:
        path = []
        c = s
        while c is not None and c not in done:
            path.append(c)
            c = dep[c]
        for x in reversed(path):
            done.add(x)
            out.append(x)
    return out


def _may_join(m, step, target):
    """Whether `step`, coded alone, may be re-coded against `target` (a newer step): every step whose chain
    ends at `step` then decodes through `target`'s chain too, so the two groups together must hold at most
    keyframe_every steps."""
    roots = _roots(m)
    if roots.get(step) != step or target not in roots:
        return False
    r = roots[target]
    if r == step:
        return False
    return sum(1 for x in roots.values() if x in (step, r)) <= m["keyframe_every"]
