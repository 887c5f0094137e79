"""`python -m mesh.cli`: the same as the `mesh` command."""

import sys

from mesh.cli import main

sys.exit(main())
