"""``python -m dpinfer.cli``: the same entry point as ``dpinfer``."""

import sys

from dpinfer.cli import main

sys.exit(main())
