"""``python -m shoal.cli``: the same as the ``shoal`` command."""

from shoal.cli import main

main()
