"""`python -m lockstep_cli ...`: the same as the `lockstep` command."""

import sys

from lockstep_cli.main import main

sys.exit(main())
