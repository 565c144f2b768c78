"""``python -m dbos_agent``: the ``dbos-agent`` command line (see :mod:`dbos_agent.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
