"""`python -m tensorpool ...` runs the `tensorpool` command."""

import sys

from tensorpool.cli import main

sys.exit(main())
