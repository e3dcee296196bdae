"""``python -m lmcbench.lossy``: the ``lmcbench-excp`` command line (see :mod:`lmcbench.lossy.cli`)."""

import sys

from .cli import main

sys.exit(main())
