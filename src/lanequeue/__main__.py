"""``python -m lanequeue``: the ``lanequeue`` command (see :mod:`lanequeue.cli`)."""

from lanequeue.cli import main

raise SystemExit(main())
