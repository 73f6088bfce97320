"""Files and folders the zoo writes get the permissions the user's umask allows.

Atomic writes go through a temporary file or folder created by ``tempfile`` (0600 / 0700
whatever the umask, for its own safety) or by the ``safetensors`` library (0600), then
renamed into place: without this, a ``.keras`` file, an adapter or a checkpoint's
safetensors would be readable by their owner only, while the files beside them are
0644. ``honour_umask`` sets what ``open`` / ``os.mkdir`` would have given: 0666 / 0777
less the umask (0644 / 0755 under umask 022).
"""

import os
import threading

__all__ = ["current_umask", "honour_umask"]

_LOCK = threading.Lock()


def current_umask():
    """The process' umask (read by setting it and putting it back, under a lock: Python
    has no call that only reads it)."""
    with _LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def honour_umask(path):
    """Give the file or folder ``path`` the mode a plain ``open`` (0666) or ``os.mkdir``
    (0777) would have given it under the current umask; returns ``path``."""
    base = 0o777 if os.path.isdir(path) else 0o666
    os.chmod(path, base & ~current_umask())
    return path
