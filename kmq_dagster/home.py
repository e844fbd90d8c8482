"""Private files: kmq's home folder (``~/.kmq``) and the files in it that hold message data.

Dead letters carry whole message values and headers, often personal data or credentials, so
the folders kmq creates are ``0700`` and the SQLite audit store ``0600``. A folder that exists
already is the operator's choice and is not changed, but one that other users can read gets
a warning (once per process).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

#: Modes of what kmq creates for one user only.
PRIVATE_FOLDER_MODE = 0o700
PRIVATE_FILE_MODE = 0o600

_warned: set[Path] = set()


def kmq_home() -> Path:
    """``~/.kmq``: the audit store, console users and command logs live here by default."""
    return Path.home() / ".kmq"


def private_folder(path: Path, *, holds_data: bool = False) -> Path:
    """Create ``path`` (and missing parents) ``0700``. An existing one is left as it is; with
    ``holds_data`` (it holds the audit store) it gets a warning if others can read it.

    Returns:
        ``path``.
    """
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=PRIVATE_FOLDER_MODE, exist_ok=True)
        os.chmod(folder, PRIVATE_FOLDER_MODE)  # mkdir's mode is cut by the umask
    if not missing and holds_data:
        warn_if_shared(path)
    return path


def private_file(path: Path) -> Path:
    """Create ``path`` empty with mode ``0600`` if missing; make an existing one of ours ``0600``
    (with a warning: it was readable by others until now).

    Returns:
        ``path``.
    """
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_FILE_MODE))
        return path
    except FileExistsError:
        pass
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077 and path.stat().st_uid == os.getuid():
        log.warning(
            "%s was readable by other users (mode %o); made it %o", path, mode, PRIVATE_FILE_MODE
        )
        os.chmod(path, PRIVATE_FILE_MODE)
    return path


def warn_if_shared(folder: Path) -> None:
    """Warn (once per folder and process) if users other than its owner can read ``folder``."""
    mode = stat.S_IMODE(folder.stat().st_mode)
    if mode & 0o077 and folder not in _warned:
        _warned.add(folder)
        log.warning(
            "%s is readable by other users (mode %o): the audit store in it holds message "
            "values and headers; run chmod 700 %s",
            folder,
            mode,
            folder,
        )
