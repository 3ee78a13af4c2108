"""``python -m kerneltriage``: the command line, as the ``kerneltriage`` script runs it."""

from kerneltriage.cli import main

main()
