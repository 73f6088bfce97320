"""A folder written whole or not at all: built beside its target, moved in by one ``os.rename``.

``write_folder_atomically(directory, write)`` runs ``write(folder)`` in a new
``<directory>.partial-<pid>-<random>`` beside ``directory``, flushes every file to disk,
then renames it to ``directory``. Whatever stops the process (an exception, SIGKILL, a
power cut), ``directory`` is absent or complete. An exception removes
the unfinished folder; a kill cannot, so the next write of the same ``directory``
removes what earlier ones left (``unfinished_folders``) and names each through
``report``. A process writing a folder holds an exclusive ``flock`` on it, which the
kernel drops when the process ends however it ends: a folder still locked belongs to a
live writer and is left alone.
"""

import contextlib
import os
import secrets
import shutil

from zoo.file_kinds import write_target

try:
    import fcntl  # the lock on a folder being written (POSIX)
except ImportError:  # pragma: no cover (Windows)
    fcntl = None

PARTIAL = ".partial"  # <target>.partial-<pid>-<random>: a folder being written beside its target


def write_folder_atomically(directory, write, *, report=print):
    """``write(folder)`` into a new ``<directory>.partial-<pid>-<random>`` beside
    ``directory``, every file flushed to disk, then one ``os.rename`` to ``directory``
    (which must be absent or an empty folder): a crash or a kill at any moment leaves
    ``directory`` absent or complete. An exception removes the unfinished folder; a
    kill leaves it, and the next call for the same ``directory`` removes it (naming it
    through ``report``) unless another process is still writing it (it holds a lock on
    it). Returns ``directory``."""
    directory = write_target(directory, error=FileExistsError)  # not "", the working folder or a symlink
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    _remove_unfinished(directory, report)
    partial = _new_partial(directory)
    try:
        with _writing(partial):
            write(partial)
            _flush_to_disk(partial)
            os.rename(partial, directory)  # POSIX: also replaces an empty folder at directory
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    _flush_folder(parent)
    return directory


def unfinished_folders(directory):
    """The ``<directory>.partial*`` folders beside ``directory``: saves that did not finish."""
    parent, name = os.path.split(os.path.abspath(directory))
    if not os.path.isdir(parent):
        return []
    return [
        os.path.join(parent, entry)
        for entry in sorted(os.listdir(parent))
        if entry == name + PARTIAL or entry.startswith(f"{name}{PARTIAL}-")
    ]


def _remove_unfinished(directory, report):
    for partial in unfinished_folders(directory):
        if _being_written(partial):
            report(f"left {partial}: another process is writing it now")
            continue
        _remove(partial)
        report(
            f"removed {partial}, left by a save of {os.path.basename(directory)} that did not finish (killed part-way)"
        )


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def _new_partial(directory):
    while True:
        partial = f"{directory}{PARTIAL}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.mkdir(partial)  # the umask's permissions (tempfile.mkdtemp's would be 0700)
            return partial
        except FileExistsError:
            continue


@contextlib.contextmanager
def _writing(partial):
    """Hold an exclusive ``flock`` on the folder while it is written; the kernel drops it
    when the process ends, however it ends (no lock on systems without ``fcntl``)."""
    if fcntl is None:
        yield
        return
    handle = os.open(partial, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)


def _being_written(partial):
    """Whether a live process holds the folder's lock (``_writing``)."""
    if fcntl is None or not os.path.isdir(partial) or os.path.islink(partial):
        return False
    try:
        handle = os.open(partial, os.O_RDONLY)
    except FileNotFoundError:  # its writer has just renamed it into place
        return True
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(handle)
    return False


def _flush_to_disk(folder):
    """``fsync`` every file and folder under ``folder``: on disk before the rename makes
    them the target (else a power cut could leave the new name holding empty files)."""
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb") as file:
                os.fsync(file.fileno())
        _flush_folder(root)


def _flush_folder(folder):
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
