"""What the archive and the DCP writer share about chains of checkpoints coded against the one before: the
default chain length.  It lives below both (``lmc.archive`` and ``lmc.dcp`` import it; neither imports the
other)."""

DEFAULT_KEYFRAME_EVERY = 10  # a keyframe (a step coded alone) every this many steps: the archive's keyframe_every
                             # and the DCP writer's max_chain
