"""``python -m workers.cli``: the same as ``reach``."""

from workers.cli import main

main()
