"""The ``.metadata`` of an LMC DCP folder: a pickle that, unpickled by a plain DCP reader, raises an error naming
the reader to use (``refuse_plain_load``)."""

import functools
import logging
import pickle

# A plain DCP reader (dcp.load(checkpoint_id=...), dcp_to_torch_save, torchtitan's resume) opens ".metadata"
# and unpickles it. An LMC folder has one that says, when unpickled, which reader to use: a pickle of the call
# ``lmc.dcp.refuse_plain_load(<message>)``, which raises that message (it runs nothing else). Its presence also
# tells tools that look for ".metadata" (torchtitan finds the newest complete step that way) that the save is
# complete: it is written after lmc-metadata.json.
PLAIN_METADATA = ".metadata"
_PLAIN_LOAD_MESSAGE = ("this is an LMC DCP checkpoint folder: load it with "
                       "dcp.load(state, storage_reader=lmc.dcp.LMCStorageReader(path)), or convert it with "
                       "`python -m lmc.dcp to-torch PATH OUT.pt`")


class PlainDCPLoadError(BaseException):
    """A plain DCP reader was pointed at an LMC DCP checkpoint.

    A ``BaseException``, as DCP's own ``CheckpointException``: ``dcp.load``'s default reader catches an
    ``Exception`` from its metadata read, logs it with its traceback and tries rank-local metadata
    (``__0.metadata``, which fails with a second logged traceback) before it reports the first one. This error
    passes through that, so ``dcp.load`` fails at once with one ``CheckpointException`` whose last line is this
    message."""


_log = logging.getLogger("lmc.dcp")


def refuse_plain_load(message=_PLAIN_LOAD_MESSAGE):
    """Called by unpickling an LMC folder's ``.metadata``: logs the message (an error on ``lmc.dcp``'s logger:
    the first line a user sees, before DCP's traceback) and raises it, naming the reader to use."""
    _log.error("lmc.dcp: %s", message)
    raise PlainDCPLoadError(f"lmc.dcp: {message}")


# pickled by the name every LMC folder's .metadata has named since format 1; lmc.dcp re-exports it
refuse_plain_load.__module__ = PlainDCPLoadError.__module__ = "lmc.dcp"


class _Signpost:
    def __reduce__(self):
        return refuse_plain_load, (_PLAIN_LOAD_MESSAGE,)


@functools.lru_cache(maxsize=1)
def signpost() -> bytes:
    """The bytes of the ``.metadata`` file (pickled when first written: lmc.dcp is imported by then)."""
    return pickle.dumps(_Signpost(), protocol=2)
