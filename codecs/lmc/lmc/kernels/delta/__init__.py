"""lmc.kernels.delta: the delta chunk mode of format v6 - ``fields`` (the packed fields and their escapes, what
the encoder and decoder share), ``encode`` (the plan, the streams, the writer) and ``decode`` (the structural
check and the decoder).  FORMAT.md, "Delta chunk"."""
