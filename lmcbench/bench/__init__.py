"""Measurement: timing and entropy (``measure``), the options of a run (``options``), the records and their
sinks (``records``), the XOR analysis (``xor``) and the grid runner (``runner``)."""
