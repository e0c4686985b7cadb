import sys

from rlconform.cli import main

sys.exit(main())
