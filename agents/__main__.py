"""`python -m agents ...`: see agents.cli."""

import sys

from agents.cli import main

sys.exit(main())
