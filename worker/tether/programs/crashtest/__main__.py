"""The child of a crash test: `tether run` with a recorder."""

import sys

from .recorder import child_main

sys.exit(child_main())
