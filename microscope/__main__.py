"""``python -m microscope ...``: the same command line as the ``microscope`` script."""

from microscope.cli import console_main

raise SystemExit(console_main())
