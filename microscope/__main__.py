"""``python -m microscope ...``: the same command line as the ``microscope`` script."""

from microscope.cli import main

raise SystemExit(main())
