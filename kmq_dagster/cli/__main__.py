"""``python -m kmq_dagster.cli``: the ``kmq`` command."""

import sys

from kmq_dagster.cli import main

sys.exit(main())
