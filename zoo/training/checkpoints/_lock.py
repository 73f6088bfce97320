"""One run at a time per checkpoint folder: ``<directory>/zoo.lock``.

The lock is an exclusive ``fcntl.flock`` on the file, held while a run has the folder open;
the file says who holds it (process id, host, start time) for the error a second run gets.
The kernel releases a ``flock`` when its process dies, however it dies: a lock file left
by a killed run is stale by construction, and the next run takes it over (saying whose it
was). Where the file system has no ``flock`` (some network mounts), the holder's process
id is checked instead, on the same host. Only process 0 of a multi-process run locks:
the others write through Orbax under its coordination. The file is opened without following
a symbolic link (``O_NOFOLLOW``): a ``zoo.lock`` that is a link is refused, its target untouched.
"""

import errno
import fcntl
import json
import os
import socket
import time

from zoo.training.checkpoints._files import CheckpointError, is_primary_process

LOCK_FILE = "zoo.lock"


class CheckpointLock:
    """The lock of one checkpoint folder; ``acquire()`` raises ``CheckpointError`` naming the holder."""

    def __init__(self, directory):
        self.directory = directory
        self.path = os.path.join(directory, LOCK_FILE)
        self.previous_holder = None  # the stale holder taken over, if any (a dict)
        self._handle = None

    def acquire(self):
        if self._handle is not None or not is_primary_process():
            return self
        os.makedirs(self.directory, exist_ok=True)
        handle = _open_lock_file(self.path)
        try:
            holder = _read_holder(handle)
            if not _locked(handle, holder):
                raise CheckpointError(
                    self.directory,
                    f"is in use by another run ({describe_holder(holder)}); wait for it to end or choose another --checkpoint-dir",
                )
            os.ftruncate(handle, 0)
            os.pwrite(handle, json.dumps(_me()).encode(), 0)
        except BaseException:
            os.close(handle)
            raise
        self.previous_holder = holder
        self._handle = handle
        return self

    def release(self):
        if self._handle is None:
            return
        os.ftruncate(self._handle, 0)  # an empty lock file: no holder
        os.close(self._handle)  # closing releases the flock
        self._handle = None


def _open_lock_file(path):
    """Open (creating) the lock file without following a symbolic link: the lock is truncated
    and rewritten, so a ``zoo.lock`` linked elsewhere would empty whatever it points to."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError:
        if not os.path.islink(path):  # ELOOP (EMLINK on some systems) for a link; anything else is not ours
            raise
        raise CheckpointError(
            path,
            f"is a symbolic link (to {os.readlink(path)!r}), not a lock file; nothing was written through it: "
            "remove the link or choose another --checkpoint-dir",
        ) from None


def _locked(handle, holder):
    """Take the flock without waiting; False if another process holds it."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as error:
        if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            raise
        return not _alive_elsewhere(holder)  # no flock here: trust a live process id on this host


def _alive_elsewhere(holder):
    if not holder or holder.get("pid") == os.getpid():
        return False
    if holder.get("host") != socket.gethostname():
        return True  # cannot tell: assume it runs
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_holder(handle):
    text = os.pread(handle, 4096, 0).decode(errors="replace").strip()
    if not text:
        return None
    try:
        holder = json.loads(text)
    except ValueError:
        return {"unreadable": text[:80]}
    return holder if isinstance(holder, dict) else {"unreadable": text[:80]}


def _me():
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}


def describe_holder(holder):
    """``process 123 on host since …``: who holds (or held) a lock, for messages."""
    if not holder:
        return "holder unknown"
    if "unreadable" in holder:
        return f"lock file says {holder['unreadable']!r}"
    return f"process {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}"
