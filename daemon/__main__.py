"""``python -m swarmd``: the same as the ``swarmd`` command."""

from swarmd.cli.main import main

raise SystemExit(main())
