"""Entry point for ``python -m bridge``."""

from bridge.cli import main

raise SystemExit(main())
