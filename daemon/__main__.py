"""``python -m swarmd``: the same as the ``swarmd`` command."""

from swarmd.cli import main

raise SystemExit(main())
