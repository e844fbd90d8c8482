"""The ``defs`` Dagster loads through workspace.yaml (``dagster dev`` in the repo root)."""

from __future__ import annotations

from dagster import Definitions

from kmq_dagster.defs.jobs import provision_job
from kmq_dagster.defs.resources import KmqResource

defs = Definitions(jobs=[provision_job], resources={"kmq": KmqResource()})
