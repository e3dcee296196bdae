"""Measurement: timing, entropy, the grid runner and the records it writes."""
