"""A checkpoint write that fails (a full disk, a quota, a removed folder): its reason in a
few words, and Orbax's own noise about it kept off the terminal.

A failed write inside Orbax arrives as an ``OSError`` (its JSON and metadata files) or as
TensorStore's ``ValueError`` (the arrays), whose text carries the OS error code:
``RESOURCE_EXHAUSTED: Error writing "optimizer.18/0" in OCDBT database at local file ...:
Failed to write 1031377 bytes to file 15: No space left on device [os_error_code='28']``.
Its background writes fail too, each one logged with a traceback by ``asyncio`` or ``absl``
(75 of them at one periodic save of the 1B GPT), some only when Python collects their
futures, long after the save returned. ``OrbaxNoise`` holds those records while a save runs
and drops them if the save failed to write; ``FailedWrites`` drops the late ones that name
a step directory already reported as not saved.
"""

import contextlib
import errno
import logging
import os
import re
import sys
import warnings

from zoo.training.checkpoints._files import CheckpointError

_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")  # TensorStore's status text: [os_error_code='28']
_WRITE_FAILED = re.compile(r"\b(Error|Failed) writing\b")
NOISY_LOGGERS = ("absl", "asyncio")  # where Orbax's failed background writes are logged


def write_failure(error):
    """The reason, in a few words, when ``error`` is a failed write, else None.

    ``No space left on device (ENOSPC)``; a ``CheckpointError`` (a refused step) is not one."""
    if isinstance(error, CheckpointError):
        return None
    code = _os_error_code(error)
    if isinstance(error, OSError):
        words = error.strerror or str(error)
    elif code is not None:
        words = os.strerror(code)
    elif _WRITE_FAILED.search(str(error)):
        words = " ".join(str(error).split())[:200]
    else:
        return None
    name = errno.errorcode.get(code) if code is not None else None
    return f"{words} ({name})" if name else words


class FailedWrites(logging.Filter):
    """Drops ``asyncio`` and ``absl`` records about a write that failed and was reported
    (``add``): those that name its step directory (the futures of its abandoned writes,
    logged when collected), and Orbax's background threads' one-line reports of the same
    OS error, which name no path (``_SignalingThread.run() raised an exception: [Errno 28]
    No space left on device``, seen once in a tier-1 run).

    One per process (``FailedWrites.instance()``), installed on those loggers at its first
    ``add``; any other record passes unchanged."""

    _instance = None

    def __init__(self):
        super().__init__()
        self.paths, self.thread_reports = set(), set()

    @classmethod
    def instance(cls):
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def add(self, path, error=None):
        """``path``: the failed step's directory; ``error``: the exception its save raised."""
        if not self.paths:
            for name in NOISY_LOGGERS:
                logging.getLogger(name).addFilter(self)
        self.paths.add(path)
        code = _os_error_code(error)
        if code is not None:
            self.thread_reports.add(f"raised an exception: [Errno {code}]")

    def filter(self, record):
        text = _record_text(record)
        return not any(part in text for part in (*self.paths, *self.thread_reports))


def _os_error_code(error):
    """The OS error number behind a failed write, or None."""
    if isinstance(error, OSError):
        return error.errno
    found = _OS_ERROR_CODE.search(str(error)) if error is not None else None
    return int(found.group(1)) if found else None


def _record_text(record):
    text = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
        text += f"\n{record.exc_info[1]}"
    return text


def _is_closed_loop_callback(unraisable):
    """An asyncio callback scheduled on an event loop already closed (``RuntimeError:
    Event loop is closed`` from ``_check_closed``): Orbax's TensorStore reads finishing on
    their own thread after the save or restore that started them has returned or failed.
    Nothing is lost then: the operation already has its result, or its one error."""
    error = unraisable.exc_value
    if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
        return False
    frames, tb = set(), unraisable.exc_traceback
    while tb is not None:
        frames.add(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return "_check_closed" in frames


class _ClosedLoopFilter:
    """An unraisable hook that drops ``_is_closed_loop_callback`` and passes everything else on."""

    def __init__(self, hook):
        self.hook = hook

    def __call__(self, unraisable):
        if not _is_closed_loop_callback(unraisable):
            self.hook(unraisable)


def drop_closed_loop_callbacks():
    """Install ``_ClosedLoopFilter`` around ``sys.unraisablehook`` for the rest of the
    process, once (a checkpoint's reads may end after any block that could hold them:
    without it Python prints their tracebacks, at random, in a later step or test)."""
    if not isinstance(sys.unraisablehook, _ClosedLoopFilter):
        sys.unraisablehook = _ClosedLoopFilter(sys.unraisablehook)


class OrbaxNoise(contextlib.AbstractContextManager):
    """Holds what Orbax and asyncio print while a save runs: the ``absl`` and ``asyncio`` log
    records, unraisable exceptions (its abandoned coroutines closing on a closed event loop)
    and "coroutine ... was never awaited" warnings. ``drop()`` (the save failed to write, and
    one line says so) discards them; otherwise they are passed on unchanged when the block ends.
    """

    def __enter__(self):
        drop_closed_loop_callbacks()
        self._records, self._unraisable, self._dropped = [], [], False
        self._previous_hook = sys.unraisablehook
        self._warnings = warnings.catch_warnings(record=True)
        self._caught = self._warnings.__enter__()
        warnings.simplefilter("always", RuntimeWarning)
        sys.unraisablehook = self._unraisable.append
        for name in NOISY_LOGGERS:
            logging.getLogger(name).addFilter(self._hold)
        return self

    def drop(self):
        self._dropped = True

    def _hold(self, record):
        self._records.append(record)
        return False

    def __exit__(self, *exc_info):
        for name in NOISY_LOGGERS:
            logging.getLogger(name).removeFilter(self._hold)
        sys.unraisablehook = self._previous_hook
        self._warnings.__exit__(None, None, None)
        if self._dropped:
            return False
        for record in self._records:
            logging.getLogger(record.name).handle(record)
        for unraisable in self._unraisable:
            self._previous_hook(unraisable)
        for caught in self._caught:
            warnings.warn_explicit(caught.message, caught.category, caught.filename, caught.lineno)
        return False
