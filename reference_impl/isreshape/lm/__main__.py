import sys

from reference_impl.isreshape.lm.trainer import cli

sys.exit(cli(sys.argv[1:]))
