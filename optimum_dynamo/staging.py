"""Atomic output: files are written to a staging directory beside the output and moved in place only
when everything succeeded; on failure nothing is left (nor the parent directories made for it).

A staging directory holds a lock file locked (`flock`) by the run that owns it. The kernel releases the
lock when that process dies, however it dies (SIGKILL, the OOM killer), so the next export beside the
same output recognises the leftovers of dead runs and removes them, never those of a live run (a
reused pid does not matter: the lock, not the pid, says who is alive). SIGTERM is turned into an
exception while a staged export runs, so it cleans up like Ctrl-C.
"""

from __future__ import annotations

import errno
import fcntl
import os
import resource
import shutil
import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import ExportError

PREFIX = ".optimum-dynamo-"
LOCK_FILE = ".lock"
UNLOCKED_GRACE_S = 60  # a staging dir without a lock file is left alone this long (it may be being made)
_DISK_ERRORS = {errno.EFBIG, errno.ENOSPC, errno.EDQUOT, errno.EROFS}  # the disk refused our writes


class Terminated(BaseException):
    """SIGTERM arrived during a staged export (a BaseException, like KeyboardInterrupt)."""


def check_output(output: Path) -> None:
    """An output must be a directory or not exist yet."""
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise ExportError(f"output {output} exists and is not a directory")
    for parent in output.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ExportError(f"output {output}: {parent} is not a directory")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ExportError(f"output {output}: {parent} is not writable")
            break


def _lock(staging: Path) -> int:
    """Lock a new file, then rename it to the lock file's name: another run never sees the lock file
    unlocked (it would take the directory for a dead run's)."""
    new = staging / f"{LOCK_FILE}.new"
    fd = os.open(new, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, f"{os.getpid()}\n".encode())
    os.replace(new, staging / LOCK_FILE)
    return fd


def is_stale(staging: Path) -> bool:
    """True when no live process owns `staging` (its lock file can be locked, or it has none and is old)."""
    try:
        fd = os.open(staging / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        try:
            return time.time() - staging.stat().st_mtime > UNLOCKED_GRACE_S
        except FileNotFoundError:
            return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # a live run holds it
    finally:
        os.close(fd)  # closing releases the probe's lock
    return True


def remove_stale(parent: Path) -> list[Path]:
    """Remove the staging directories of dead runs in `parent`; returns what was removed."""
    removed = []
    try:
        candidates = [p for p in Path(parent).iterdir() if p.name.startswith(PREFIX) and p.is_dir()]
    except OSError:
        return removed
    for path in candidates:
        if is_stale(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated("terminated (SIGTERM)")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _move_into(staging: Path, output: Path) -> None:
    """Move the staged files in, holding a lock on the output directory: two runs writing the same output
    end with one run's complete set of files, never a mix."""
    fd = os.open(output, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for item in staging.iterdir():
            if item.name == LOCK_FILE:
                continue
            target = output / item.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            item.replace(target)
    finally:
        os.close(fd)


_NEARLY_FULL = 16 * 2**20


def _write_failure(error: BaseException, directory: Path) -> str | None:
    """Why the disk refused a write, or None for any other error. Some writers (numpy's `tofile`, used
    when saving weights) drop the errno: then a file-size limit or a full disk is named beside their message."""
    if not isinstance(error, OSError):
        return None
    if error.errno in _DISK_ERRORS:
        return os.strerror(error.errno)
    if error.errno is None:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            return f"{error} (the process's file-size limit is {limit} bytes)"
        disk = os.statvfs(directory)
        if disk.f_bavail * disk.f_frsize < _NEARLY_FULL:  # a short write leaves less than its own size
            return f"{error} ({os.strerror(errno.ENOSPC)})"
    return None


def _remove_made(parents: list[Path]) -> None:
    for parent in parents:  # directories made for the output, deepest first
        if parent.exists():
            try:
                parent.rmdir()
            except OSError:
                pass


@contextmanager
def staged(output: Path) -> Iterator[Path]:
    output = Path(output)
    check_output(output)
    created = [p for p in [output, *output.parents] if not p.exists()]
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(output.parent)
        staging = Path(tempfile.mkdtemp(prefix=PREFIX, dir=output.parent))
    except OSError as e:
        _remove_made(created[1:])
        raise ExportError(f"cannot create {output}: {e.strerror or e}") from None
    fd = _lock(staging)
    try:
        with _sigterm_raises():
            try:
                yield staging
                output.mkdir(exist_ok=True)
                _move_into(staging, output)
            except BaseException as e:
                reason = _write_failure(e, output.parent)  # before the cleanup frees the disk
                shutil.rmtree(staging, ignore_errors=True)
                if output in created and output.exists():
                    shutil.rmtree(output)
                _remove_made(created[1:])
                if reason:
                    raise ExportError(f"cannot write the export to {output.parent}: {reason}") from None
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(fd)
