"""Writing weight files so that a crash never costs what was learned.

`write_atomic` writes to a temporary file in the same folder, flushes it to the disk
(fsync), renames it over the target (atomic on POSIX and on Windows' ReplaceFile path
that os.replace uses), then syncs the folder so the rename itself survives a power cut.
A process killed at any point leaves either the previous file or the new one, whole
(and perhaps a temporary file, which the next successful save removes).
"""
from __future__ import annotations

import glob
import os
import tempfile
from pathlib import Path


def write_atomic(path, data: bytes) -> None:
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _sync_folder(folder)
    for stale in folder.glob(f".{glob.escape(path.name)}.*.tmp"):  # left by an earlier crash
        try:
            stale.unlink()
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

    return save({k: v for k, v in tensors.items()})
