"""Private files: kmq's home folder (``~/.kmq``) and the files in it that hold message data.

Dead letters carry whole message values and headers, often personal data or credentials, so
the folders kmq creates are ``0700`` and the SQLite audit store ``0600`` (its WAL and
shared-memory files take its mode). A folder that exists already is the operator's choice and
is not changed, but one that exposes the store gets a warning (once per process):

* kmq's home (``~/.kmq``) if other users can read it: besides the store it holds console users
  and command logs, which are private because the folder is;
* any other folder holding the store (``KMQ_AUDIT_URL=sqlite:///$PWD/audit.db``) if other users
  can write it: they could replace the store or plant its journal before SQLite creates it.
  Reading it shows them file names only, as the files themselves are ``0600``; a folder's group
  that is its owner's own (a user private group) is not "other users".
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import pwd
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
    ``holds_data`` (it holds the audit store) it gets a warning if it exposes it
    (:func:`warn_if_shared`).

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
    _tighten(path)
    return path


def private_if_present(path: Path) -> None:
    """Make ``path`` ``0600`` as :func:`private_file` does, but only if it exists, and never
    create it: for files another process may delete at any moment, such as SQLite's WAL and
    shared-memory files, which go when the last connection to the store closes. One that goes
    while it is checked is no error."""
    with contextlib.suppress(FileNotFoundError):
        _tighten(path)


def _tighten(path: Path) -> None:
    found = path.stat()
    mode = stat.S_IMODE(found.st_mode)
    if mode & 0o077 and found.st_uid == os.getuid():
        log.warning(
            "%s was readable by other users (mode %o); made it %o", path, mode, PRIVATE_FILE_MODE
        )
        os.chmod(path, PRIVATE_FILE_MODE)


def warn_if_shared(folder: Path) -> None:
    """Warn (once per folder and process) if ``folder`` exposes the audit store kept in it:
    kmq's home if others can read it, any other folder if others can write it (see above)."""
    if folder in _warned:
        return
    status = folder.stat()
    mode = stat.S_IMODE(status.st_mode)
    if _is_kmq_home(folder):
        if mode & 0o077:
            _warned.add(folder)
            log.warning(
                "%s is readable by other users (mode %o): the audit store in it holds message "
                "values and headers; run chmod 700 %s",
                folder,
                mode,
                folder,
            )
        return
    if mode & 0o002 or (mode & 0o020 and not _owners_own_group(status)):
        _warned.add(folder)
        log.warning(
            "%s is writable by other users (mode %o): they could replace the audit store in it "
            "(message values and headers) or its journal; run chmod go-w %s, or keep the store "
            "elsewhere",
            folder,
            mode,
            folder,
        )


def _is_kmq_home(folder: Path) -> bool:
    try:
        return folder.resolve() == kmq_home().resolve()
    except (OSError, RuntimeError):  # no home directory to compare with
        return False


def _owners_own_group(status: os.stat_result) -> bool:
    """Whether the group of a file is its owner's private group (named after the owner, its
    primary group, with no other listed members), as many systems give each user."""
    try:
        group = grp.getgrgid(status.st_gid)
        owner = pwd.getpwuid(status.st_uid)
    except KeyError:
        return False
    return group.gr_name == owner.pw_name and owner.pw_gid == status.st_gid and not group.gr_mem
