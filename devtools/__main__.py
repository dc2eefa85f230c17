"""Entry point for ``python -m devtools``."""

from devtools.cli import main

raise SystemExit(main())
