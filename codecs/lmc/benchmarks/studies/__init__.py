"""Studies of lmc's kernels: scripts that may import lmc's private modules (see ../README.md)."""
