"""``python -m tools.experiments study NAME``: run a results study and write its page."""
from __future__ import annotations

import sys

from tools.experiments.study import main

if __name__ == "__main__":
    sys.exit(main())
