import sys

from dpinfer.cli import main

sys.exit(main())
