"""Who this process is in a multi-host job: settings from arguments, environment or cluster.

Each setting comes from the first of: the argument, the ``JAX_*`` variable, the
``KERAS_DISTRIBUTION_*`` variable (see ``zoo.distribution.multihost``); what is still
missing is left to JAX's cluster auto-detection when JAX recognises a managed cluster.
"""

import dataclasses
import os

from zoo._compat import detected_jax_cluster

# (coordinator address, number of processes, process id) variables, in order of preference.
ENV_VARIABLES = (
    ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"),
    ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID"),
)


class MultihostError(RuntimeError):
    """The processes of a multi-host job cannot be joined, or do not match."""


@dataclasses.dataclass(frozen=True)
class ProcessSetup:
    """Who this process is in the job, and where that was read from."""

    coordinator_address: str | None  # "host:port" of process 0; None for one process
    num_processes: int | None  # None: left to JAX's cluster auto-detection
    process_id: int | None  # None: left to JAX's cluster auto-detection
    source: str  # "arguments", "JAX_* environment", "slurm auto-detection", ... or "single process"

    @property
    def is_single_process(self):
        return self.num_processes == 1


_DETECT = object()  # resolve_setup's default: ask detect_cluster() when settings are missing
ENV_LABELS = ("JAX_* environment", "KERAS_DISTRIBUTION_* environment")


def resolve_setup(coordinator_address=None, num_processes=None, process_id=None, *, environ=None, cluster=_DETECT):
    """The ``ProcessSetup`` from arguments, then the environment, then the cluster.

    ``cluster``: the name of the managed cluster JAX will auto-detect, or None for
    none; by default ``detect_cluster()`` is asked, only when a setting is missing.
    Settings the cluster fills in may be missing. Raises ``MultihostError`` naming the
    values when they are inconsistent.
    """
    environ = os.environ if environ is None else environ
    values, sources = [coordinator_address, num_processes, process_id], ["arguments"] * 3
    for names, label in zip(ENV_VARIABLES, ENV_LABELS):
        for index, name in enumerate(names):
            if values[index] is None and environ.get(name, "").strip():
                values[index], sources[index] = _parse_env(name, environ, names), label
    address, count, index = values[0], _as_int("num_processes", values[1]), _as_int("process_id", values[2])
    _check_counts(count, index)
    if count == 1 and index in (None, 0):
        return ProcessSetup(None, 1, 0, "single process")
    given = [source for value, source in zip((address, count, index), sources) if value is not None]
    if None in (address, count, index):
        cluster = detect_cluster() if cluster is _DETECT else cluster
        if cluster is None and not given:
            return ProcessSetup(None, 1, 0, "single process")
        if cluster is None:
            _raise_incomplete(address, count, index)
        given.append(f"{cluster} auto-detection")
    if address is not None:
        split_address(address)
    return ProcessSetup(address, count, index, " + ".join(dict.fromkeys(given)))


def _parse_env(name, environ, names):
    text = environ[name].strip()
    if name.endswith("JOB_ADDRESSES"):  # Keras' form: every job's address, coordinator first
        addresses = [a.strip() for a in text.split(",") if a.strip()]
        count = environ.get(names[1], "").strip()
        if count.isdigit() and len(addresses) > 1 and int(count) != len(addresses):
            raise MultihostError(f"{name}={text!r} lists {len(addresses)} addresses but {names[1]}={count}")
        return addresses[0]
    if name.endswith("ADDRESS"):
        return text
    try:
        return int(text)
    except ValueError:
        raise MultihostError(f"environment variable {name}={text!r} is not an integer") from None


def _as_int(name, value):
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise MultihostError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")


def _raise_incomplete(address, count, index):
    if count is None:
        raise MultihostError(
            f"coordinator address {address!r} / process_id {index!r} given but no number of processes: "
            f"pass num_processes or set JAX_NUM_PROCESSES"
        )
    if address is None:
        raise MultihostError(
            f"num_processes={count} but no coordinator address: pass coordinator_address='host:port' "
            f"(process 0's address, the same on every process) or set JAX_COORDINATOR_ADDRESS"
        )
    raise MultihostError(
        f"num_processes={count} but no process_id for this process: pass process_id or set JAX_PROCESS_ID"
    )


def _check_counts(count, index):
    if count is not None and count < 1:
        raise MultihostError(f"num_processes must be at least 1, got {count}")
    if index is not None and index < 0:
        raise MultihostError(f"process_id must be non-negative, got {index}")
    if index is not None and count is not None and index >= count:
        raise MultihostError(f"process_id {index} is out of range for {count} processes (valid: 0..{count - 1})")


def split_address(address):
    """``("10.0.0.1", 1234)`` from ``"10.0.0.1:1234"`` (``"[::1]:1234"`` for IPv6)."""
    host, sep, port = str(address).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise MultihostError(f"coordinator address {address!r} is not of the form host:port (port 1..65535)")
    return host, int(port)


def detect_cluster():
    """The name JAX gives the managed cluster this process runs in (``"slurm"``,
    ``"ompi"``, ``"gcetpu"``, ``"gketpu"``, ``"k8s"``), or None."""
    return detected_jax_cluster()
