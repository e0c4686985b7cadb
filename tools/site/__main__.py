"""``python -m tools.site build ...``: see :mod:`tools.site.build`."""
import sys

from tools.site.build import main

sys.exit(main())
