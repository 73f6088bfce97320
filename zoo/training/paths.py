"""Where a job writes, checked before any work; and the trained model saved without loss.

Every job checks its output file, checkpoint folder and data folder first (``check_job_paths``),
before a model is built: a folder that is a file, cannot be created or cannot be written is
found in a second, not after an hour of training. The check is a real write (a probe file
created and removed, in the folder or, if it does not exist yet, in the nearest folder
above it that does), not ``os.access``, which says yes to root on any folder and knows
nothing of read-only mounts; no folder is created by the check.

A save that fails anyway (the disk filled up, the folder was removed meanwhile) never loses
the model: ``save_model_atomically`` writes it to a fallback path in the run's folders and
the error says where.
"""

import os
import tempfile
import time

from zoo.file_kinds import write_target
from zoo.presets.permissions import honour_umask


class PathError(ValueError):
    """A path given to a job (``flag`` names where it came from) that cannot be used."""

    def __init__(self, flag, path, problem):
        super().__init__(f"{flag} {path!r}: {problem}")
        self.flag = flag
        self.path = path
        self.problem = problem


class ModelSaveError(OSError):
    """The model could not be written where asked; ``rescued`` is where it was written instead."""

    def __init__(self, path, error, rescued):
        where = (
            f"the trained model was saved to {rescued} instead"
            if rescued
            else "no fallback folder could be written either"
        )
        super().__init__(f"could not write the model to {path} ({type(error).__name__}: {error}); {where}")
        self.path = path
        self.rescued = rescued


def check_job_paths(settings, output_is_folder=False):
    """Check the ``output`` (a ``.keras`` file, or a folder), ``checkpoint_dir`` and
    ``data_dir`` of a job's settings (those it has), before any work. ``settings.output``
    becomes the path the OS will write (``resolve_output``), so every line naming it names
    where the files are."""
    given = getattr(settings, "output", None)
    if given is not None:
        if not output_is_folder:
            check_model_path(given, "--output")
        resolved = resolve_output(given, "--output")
        if output_is_folder:
            check_writable_folder(resolved, "--output", named=given)
        else:
            check_output_file(resolved, "--output", named=given)
        settings.output = resolved
    if getattr(settings, "checkpoint_dir", None):
        check_writable_folder(settings.checkpoint_dir, "--checkpoint-dir")
    if hasattr(settings, "data_dir"):
        check_data_dir(settings.data_dir)


def resolve_output(path, flag="--output"):
    """``path`` as the OS will write it (``zoo.file_kinds.write_target``: folders' symlinks
    resolved before ``..``); ``PathError`` for an empty or root-like path or a symlink."""
    return write_target(path, error=lambda message: PathError(flag, path, message.split(": ", 1)[1]))


def check_model_path(path, flag="--output"):
    if not str(path).endswith(".keras"):
        raise PathError(flag, path, "a model path must end in .keras")


def check_output_file(path, flag="--output", named=None):
    """``path`` can be written as a ``.keras`` file: its folder exists or is created, and takes
    a file. Errors name ``named`` (the path as given; default ``path``)."""
    named = path if named is None else named
    check_model_path(named, flag)
    if os.path.isdir(path):
        raise PathError(flag, named, "is a folder; give a file name ending in .keras")
    check_writable_folder(os.path.dirname(os.path.abspath(path)), flag, named=named)


def check_writable_folder(folder, flag, named=None):
    """``folder`` exists and takes a file, or can be created: a real probe write in it, or
    in its nearest existing ancestor (where creating it would write). Nothing is left
    behind. Errors name ``named`` (the path the user gave; default ``folder``)."""
    folder = os.path.abspath(folder)
    named = folder if named is None else named
    blocker = _file_on_the_way(folder)
    if blocker is not None:
        raise PathError(flag, named, f"cannot be written: {blocker} is a file, not a folder")
    existing = _nearest_existing(folder)
    try:
        handle, probe = tempfile.mkstemp(dir=existing, prefix=".zoo-write-probe-")
        os.close(handle)
        os.remove(probe)
    except OSError as error:
        raise PathError(
            flag,
            named,
            f"cannot be written: {existing} is not writable ({error.strerror or error}); choose another path",
        ) from None


def _nearest_existing(folder):
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    return folder


def check_data_dir(data_dir):
    """The data folder (``--data-dir`` or the first of $ZOO_DATA_DIR, $TFDS_DATA_DIR set) is not a file."""
    from zoo.data.tfds_source import DATA_DIR_ENV_VARS, resolve_data_dir

    folder = resolve_data_dir(data_dir)
    source = (
        "--data-dir"
        if data_dir
        else next((f"${name}" for name in DATA_DIR_ENV_VARS if os.environ.get(name)), "the data folder")
    )
    blocker = _file_on_the_way(os.path.abspath(folder))
    if blocker is not None:
        raise PathError(source, folder, f"cannot be a data folder: {blocker} is a file, not a folder")
    return folder


def _file_on_the_way(folder):
    """The first path from ``folder`` up to the root that exists and is not a folder, or None."""
    path = folder
    while True:
        if os.path.exists(path):
            return None if os.path.isdir(path) else path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def save_model_atomically(model, path, fallback_folders=(), refused=None):
    """Save a ``.keras`` file so that a crash mid-write never leaves a broken file at ``path``.

    If ``path`` cannot be written, the model goes to ``<folder>/rescued-<time>-<name>`` in
    the first of ``fallback_folders`` (then the working folder, then the temporary folder)
    that takes it, and ``ModelSaveError`` names both paths. ``refused``: an error found
    before saving (``zoo train gpt``: its logits on a probe batch are not finite); then
    nothing is written at ``path``, the model goes to the rescue path for inspection (a
    diverged run is not lost), and the error, of the same type, says where.
    """
    check_model_path(path)
    write = lambda target: _save_replacing(model, target)  # noqa: E731
    if refused is not None:
        rescued = _rescue(write, path, fallback_folders)
        where = f"the model was saved to {rescued} instead, for inspection" if rescued else "nothing was saved"
        raise type(refused)(f"{refused}; {where}") from None
    write_or_rescue(write, path, fallback_folders)


def write_or_rescue(write, path, fallback_folders=()):
    """``write(path)``; if it raises ``OSError`` (or safetensors' ``SafetensorError``, which a full
    disk raises when a ``.safetensors`` file is written), ``write(<folder>/rescued-<time>-<name>)`` in
    the first of ``fallback_folders``, the working folder or the temporary folder that
    takes it, then ``ModelSaveError`` naming both paths. Returns what ``write`` returned."""
    try:
        return write(path)
    except _write_errors() as error:
        raise ModelSaveError(path, error, _rescue(write, path, fallback_folders)) from error


def _write_errors():
    """The exception types a failed write raises: ``OSError``, and ``SafetensorError`` where
    safetensors is installed (it is not an ``OSError``: ``ENOSPC`` inside its writer arrives as one)."""
    try:
        from safetensors import SafetensorError
    except ImportError:
        return (OSError,)
    return (OSError, SafetensorError)


def _save_replacing(model, path):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, partial = tempfile.mkstemp(suffix=".keras", dir=directory, prefix=".partial-")
    os.close(handle)
    try:
        model.save(partial)
        with open(partial, "rb") as written:
            os.fsync(written.fileno())  # on disk before it takes the place of the previous file
        os.replace(honour_umask(partial), path)  # mkstemp made it 0600
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _rescue(write, path, fallback_folders):
    name = f"rescued-{time.strftime('%Y%m%d-%H%M%S')}-{os.path.basename(os.path.normpath(path))}"
    for folder in (*[f for f in fallback_folders if f], os.getcwd(), tempfile.gettempdir()):
        target = os.path.join(os.path.abspath(folder), name)
        try:
            write(target)
        except _write_errors():
            continue
        return target
    return None
