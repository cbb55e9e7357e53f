"""Writing weight files so that a crash never costs what was learned.

`write_atomic` writes to a temporary file in the same folder, flushes it to the disk
(fsync), renames it over the target (atomic on POSIX and on Windows' ReplaceFile path
that os.replace uses), then syncs the folder so the rename itself survives a power cut.
A process killed at any point leaves either the previous file or the new one, whole
(and perhaps a temporary file, which a later successful save removes).
"""
from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

STALE_SECONDS = 60  # a temporary file this old is a crashed save's, not a concurrent one's


def write_atomic(path, data: bytes) -> None:
    path = Path(os.path.realpath(path))  # through a symlink: replace its target, keep the link
    folder = path.parent
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _sync_folder(folder)
    _remove_stale(folder, path.name)


def _mode_for(path: Path) -> int:
    """The replaced file's permissions, or what a plain open() would give (mkstemp's 0600 otherwise)."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _remove_stale(folder: Path, name: str) -> None:
    mine = re.compile(rf"^\.{re.escape(name)}\.[A-Za-z0-9_]{{8}}\.tmp$")  # mkstemp's names for this file only
    now = time.time()
    for entry in os.scandir(folder):
        if mine.match(entry.name):
            try:
                if now - entry.stat().st_mtime > STALE_SECONDS:
                    os.unlink(entry.path)
            except OSError:
                pass


def _sync_folder(folder: Path) -> None:
    if os.name != "posix":  # Windows cannot open a folder for fsync; its rename is journaled
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def safetensors_bytes(tensors: dict) -> bytes:
    from safetensors.numpy import save

    return save(dict(tensors))
