#!/usr/bin/env python3
"""Start, stop or query the development Kafka broker: ``broker.py start|stop|status|fetch``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from devtools.devkafka import main

raise SystemExit(main())
