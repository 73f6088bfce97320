"""The one place keras-zoo talks to TensorFlow Datasets (TFDS).

Reading works without TensorFlow: data are prepared as ``array_record`` and read
through ``builder.as_data_source`` (random access, numpy values). Nothing here
downloads unless asked (``download=True`` or ``prepare``); a dataset that is not
prepared fails at once with ``DatasetNotPreparedError``, which says how to prepare
it. Preparedness is checked on local files only (``dataset_info.json`` and
``features.json`` in ``<data_dir>/<name>/<config>/<version>/``), before anything
that could reach the network: with ``download=True`` TFDS would retry an offline
download for minutes before failing, so a download first checks, within seconds, that
the dataset's host answers (``DatasetUnreachableError`` otherwise).

The embedded datasets (``zoo_shapes``, ``zoo_digits``, ``zoo_python_docs``) are
TFDS builders whose data ship with keras-zoo or Python; they are prepared into the
data dir on first use, offline.

Data prepared as TFRECORD (e.g. by ``tfds build`` with TensorFlow) are read through
``builder.as_dataset`` when TensorFlow is installed, else the error says what to do.
"""

import contextlib
import importlib.util
import io
import logging
import os
import shlex
import socket
import threading
import urllib.parse
import urllib.request

import numpy as np
import tensorflow_datasets as tfds

from zoo.data.builders import EMBEDDED_BUILDERS

ARRAY_RECORD = "array_record"  # the format we write: random access without TensorFlow
TFRECORD = "tfrecord"  # TFDS's default format; reading it needs TensorFlow
DEFAULT_DATA_DIR = "~/tensorflow_datasets"  # TFDS's own default
DATA_DIR_ENV_VARS = ("ZOO_DATA_DIR", "TFDS_DATA_DIR")  # checked in this order
TENSORFLOW_INSTALL = 'pip install "keras-zoo[tensorflow]"'
# Where each public dataset's files come from (the URLs in TFDS's builder code), checked
# before a download; a builder not listed goes straight to TFDS.
DOWNLOAD_HOSTS = {
    "mnist": "https://storage.googleapis.com",
    "cifar10": "https://www.cs.toronto.edu",
    "imdb_reviews": "http://ai.stanford.edu",
    "tiny_shakespeare": "https://raw.githubusercontent.com",
}
REACH_TIMEOUT_S = 5.0  # a host that has not answered by then is taken as unreachable


class DatasetNotPreparedError(RuntimeError):
    """A dataset is not prepared in the data dir and downloading was not allowed."""

    def __init__(self, name, data_dir, found_versions=()):
        self.name = name
        self.data_dir = data_dir
        message = (
            f"Dataset {name!r} is not prepared in data dir {data_dir!r}. Prepare it with "
            f"`zoo data prepare {name} --data-dir {shlex.quote(data_dir)}` (public datasets need a "
            "machine with internet; copy the data dir here afterwards), or pass "
            "download=True to download and prepare it now."
        )
        if found_versions:
            message += (
                f" Other versions are prepared there: {', '.join(found_versions)}; "
                f"ask for one as '{name.split(':')[0]}:VERSION'."
            )
        super().__init__(message)


class DatasetUnreachableError(ConnectionError):
    """A dataset must be downloaded and its host does not answer (offline, or blocked)."""

    def __init__(self, name, address, why, data_dir):
        builder = str(tfds.core.naming.parse_builder_name_kwargs(name)[0])
        super().__init__(
            f"Dataset {name!r} is not reachable: {address} did not answer ({why}). Prepare it on a machine "
            f"with internet (`zoo data prepare {builder} --data-dir DIR`), then copy DIR/{builder} to "
            f"{os.path.join(data_dir, builder)} here."
        )


def resolve_data_dir(data_dir=None):
    """The data dir: ``data_dir``, else $ZOO_DATA_DIR, else $TFDS_DATA_DIR, else ~/tensorflow_datasets."""
    if data_dir is None or os.fspath(data_dir) == "":
        data_dir = next((os.environ[v] for v in DATA_DIR_ENV_VARS if os.environ.get(v)), DEFAULT_DATA_DIR)
    return os.path.expanduser(os.fspath(data_dir))


def get_builder(name, data_dir=None):
    """A ``tfds.core.DatasetBuilder`` for ``name`` ("mnist", "imdb_reviews/plain_text:1.0.0", "zoo_digits").

    Constructing it reads local files only: it restores ``dataset_info.json`` when the
    dataset is prepared, else uses the builder's code (TFDS's GCS look-up is off).
    """
    data_dir = resolve_data_dir(data_dir)
    dataset_name, kwargs = tfds.core.naming.parse_builder_name_kwargs(name)
    embedded = EMBEDDED_BUILDERS.get(str(dataset_name))
    if embedded is not None:
        return embedded(data_dir=data_dir, **kwargs)
    return tfds.builder(name, data_dir=data_dir)


def is_embedded(name):
    """Whether ``name`` is one of keras-zoo's offline datasets (prepared without network)."""
    return str(tfds.core.naming.parse_builder_name_kwargs(name)[0]) in EMBEDDED_BUILDERS


def is_prepared(name, data_dir=None):
    """Whether ``name`` is prepared in the data dir (in any file format; see ``prepared_file_format``)."""
    return prepared_file_format(name, data_dir) is not None


def prepared_file_format(name, data_dir=None):
    """``"array_record"``, ``"tfrecord"`` (or another TFDS format) when prepared, else None."""
    return _prepared_file_format(get_builder(name, data_dir))


def prepare(name, data_dir=None, download=True):
    """Prepare ``name`` as array_record in the data dir (a no-op when already prepared); returns the builder.

    Public datasets are downloaded only with ``download=True``; otherwise an unprepared
    one raises ``DatasetNotPreparedError``. Embedded datasets never need the network.
    """
    builder, _ = _ensure_prepared(name, get_builder(name, data_dir), download)
    return builder


def read_split(name, split, data_dir=None, download=False):
    """Random-access examples (dicts of numpy values) of ``split`` ("train", "test[:10%]", ...).

    Returns a sequence with ``len`` and ``[i]``: TFDS's array_record data source, or a
    list of example dicts for data prepared as TFRECORD (read with TensorFlow).

    Raises:
        DatasetNotPreparedError: not prepared and ``download=False`` (embedded datasets
            are prepared instead); raised before anything that could reach the network.
        ImportError: prepared only as TFRECORD and TensorFlow is not installed.
    """
    builder = get_builder(name, data_dir)
    if _tfds_is_mocked():
        # Under tfds.testing.mock_data nothing is on disk: the mock serves every split.
        return builder.as_data_source(split=split)
    builder, file_format = _ensure_prepared(name, builder, download)
    if file_format == ARRAY_RECORD:
        return builder.as_data_source(split=split, file_format=ARRAY_RECORD)
    if file_format == TFRECORD:
        return _read_tfrecord(name, builder, split)
    raise RuntimeError(
        f"Dataset {name!r} is prepared at {builder.data_dir} as {file_format!r}, which keras-zoo "
        f"does not read; delete that folder and run `zoo data prepare {name} --data-dir "
        f"{shlex.quote(os.fspath(builder.data_dir_root))}` to prepare it as array_record."
    )


def to_numpy(source, keys):
    """One array per key, in the order of ``keys``: feature ``key`` of every example, stacked.

    ``images, labels = to_numpy(source, ["image", "label"])``. Numeric features become
    ``(N, ...)`` arrays (0-d labels give ``(N,)``); text, whether it comes back as
    ``str`` or ``bytes``, becomes an ``(N,)`` object array of ``str``.
    """
    keys = [keys] if isinstance(keys, str) else list(keys)
    columns = {key: [] for key in keys}
    for index in range(len(source)):
        # One example at a time: batched ``__getitems__`` reads are only ~1.3x faster
        # and break under tfds.testing.mock_data in TFDS 4.9.10.
        example = source[index]
        for key in keys:
            columns[key].append(example[key])
    return tuple(_stack(columns[key]) for key in keys)


def _prepared_file_format(builder):
    """The format ``builder``'s data are prepared in, from local files only; None if not prepared."""
    if not builder.data_path.exists() or not builder.is_prepared():
        return None
    formats = {f.value for f in builder.info.available_file_formats()}
    if ARRAY_RECORD in formats:
        return ARRAY_RECORD
    # An empty format field in dataset_info.json means TFRECORD (TFDS's default).
    return builder.info.file_format.value if builder.info.file_format else TFRECORD


def _ensure_prepared(name, builder, download):
    """``(builder, file format)`` of prepared data; prepares only if allowed, else raises."""
    file_format = _prepared_file_format(builder)
    if file_format is not None:
        return builder, file_format
    if not download and not is_embedded(name):
        raise _not_prepared(name, builder)
    if not is_embedded(name) and not _tfds_is_mocked():
        check_reachable(name, os.fspath(builder.data_dir_root))
    return _download_and_prepare(name, builder), ARRAY_RECORD


def check_reachable(name, data_dir, timeout=None):
    """Raise ``DatasetUnreachableError`` unless the host ``name`` downloads from (through
    the proxy the environment sets, if any) takes a connection within ``timeout`` seconds
    (default ``REACH_TIMEOUT_S``); a dataset not in ``DOWNLOAD_HOSTS`` is not checked."""
    url = DOWNLOAD_HOSTS.get(str(tfds.core.naming.parse_builder_name_kwargs(name)[0]))
    if url is None:
        return
    parts = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(parts.hostname):
        parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    address = (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    why = _connect(address, REACH_TIMEOUT_S if timeout is None else timeout)
    if why is not None:
        raise DatasetUnreachableError(name, f"{address[0]}:{address[1]}", why, data_dir)


def _connect(address, timeout):
    """None if a TCP connection to ``address`` opens within ``timeout`` s, name look-up
    included (in a thread: the look-up ignores socket timeouts), else why not."""
    outcome = []

    def attempt():
        try:
            socket.create_connection(address, timeout=timeout).close()
            outcome.append(None)
        except OSError as error:
            outcome.append(str(error) or type(error).__name__)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"no answer within {timeout:g} s"


def _download_and_prepare(name, builder):
    """Prepare as array_record; returns a builder for the prepared data."""
    quiet = _quiet_tfds() if is_embedded(name) else contextlib.nullcontext()
    try:
        with quiet:
            builder.download_and_prepare(
                file_format=ARRAY_RECORD,
                # GCS-hosted copies are TFRECORD only; we want array_record, built locally.
                download_config=tfds.download.DownloadConfig(try_download_gcs=False),
            )
    except OSError:
        # Another process (e.g. a second host on a shared data dir) may have won the
        # race: TFDS writes to a temporary folder and renames it, which then fails.
        fresh = get_builder(name, builder.data_dir_root)
        if _prepared_file_format(fresh) is None:
            raise
        return fresh
    return builder


@contextlib.contextmanager
def _quiet_tfds():
    """No TFDS chatter while an embedded (offline) dataset is prepared: TFDS prints
    "Downloading and preparing dataset ..." and "... downloaded and prepared" to stdout,
    draws progress bars and logs INFO lines, none of which means anything for data
    that ship with keras-zoo. Scoped to the call: stdout captured (and replayed if the
    preparation fails), progress bars off (back on after: TFDS's default), the
    ``absl`` logger TFDS logs through at WARNING."""
    captured = io.StringIO()
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    tfds.display_progress_bar(False)
    try:
        with contextlib.redirect_stdout(captured):
            yield
    except BaseException:
        print(captured.getvalue(), end="")
        raise
    finally:
        tfds.display_progress_bar(True)
        logger.setLevel(level)


def _not_prepared(name, builder):
    # <data_dir>/<name>/[<config>/]<version>/: name versions prepared next to the missing one.
    versions_dir = builder.data_path.parent
    candidates = sorted(versions_dir.iterdir()) if versions_dir.is_dir() else []
    found = [p.name for p in candidates if tfds.core.Version.is_valid(p.name) and (p / "dataset_info.json").exists()]
    return DatasetNotPreparedError(name, os.fspath(builder.data_dir_root), found)


def _tfds_is_mocked():
    """Whether ``tfds.testing.mock_data`` is active (it swaps in its own no-op download_and_prepare)."""
    patched = tfds.core.DatasetBuilder.download_and_prepare
    return getattr(patched, "__module__", "") == "tensorflow_datasets.testing.mocking"


def _tensorflow_available():
    return importlib.util.find_spec("tensorflow") is not None


def _read_tfrecord(name, builder, split):
    if not _tensorflow_available():
        raise ImportError(
            f"Dataset {name!r} is prepared at {builder.data_dir} as TFRECORD, which needs "
            f"TensorFlow to read. Install it with `{TENSORFLOW_INSTALL}`, or re-prepare the "
            f"dataset as array_record (delete that folder, then `zoo data prepare {name} "
            f"--data-dir {shlex.quote(os.fspath(builder.data_dir_root))}`)."
        )
    return list(tfds.as_numpy(builder.as_dataset(split=split)))


def _stack(values):
    if not values:
        return np.empty((0,))
    if _is_text(values[0]):
        return np.array([_as_str(v) for v in values], dtype=object)  # (N,) of str
    return np.stack([np.asarray(v) for v in values])


def _is_text(value):
    if isinstance(value, np.ndarray):
        return value.ndim == 0 and value.dtype.kind in "OSU"
    return isinstance(value, (str, bytes))


def _as_str(value):
    if isinstance(value, np.ndarray):
        value = value.item()
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
