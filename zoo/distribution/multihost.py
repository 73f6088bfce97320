"""Multi-host start-up: join JAX's multi-controller runtime, then check the processes agree.

Every process of a multi-host job runs the same program. ``initialize`` makes them one
JAX runtime (``jax.distributed.initialize``, which is what ``keras.distribution.initialize``
calls on the JAX backend): afterwards ``jax.devices()`` lists the devices of *all*
processes, a ``keras.distribution`` mesh spans them, and each process feeds only its own
devices (see ``zoo.data.process_shard``).

Where the settings come from, first found wins, field by field:

======================  ===============================  =================================
setting                 argument                         environment
======================  ===============================  =================================
coordinator address     ``coordinator_address``          ``JAX_COORDINATOR_ADDRESS``, else the
                                                         first entry of
                                                         ``KERAS_DISTRIBUTION_JOB_ADDRESSES``
number of processes     ``num_processes``                ``JAX_NUM_PROCESSES``, else
                                                         ``KERAS_DISTRIBUTION_NUM_PROCESSES``
this process's id       ``process_id``                   ``JAX_PROCESS_ID``, else
                                                         ``KERAS_DISTRIBUTION_PROCESS_ID``
======================  ===============================  =================================

When a setting is still missing and JAX recognises a managed cluster (SLURM, Open MPI,
Cloud TPU VMs and GKE TPU slices, Kubernetes JobSets), JAX fills it in; with nothing set
and no cluster it is one process and ``initialize`` does nothing. JAX itself also reads
``JAX_COORDINATOR_BIND_ADDRESS``, ``JAX_COORDINATOR_PORT`` (auto-detected clusters),
``JAX_LOCAL_DEVICE_IDS`` and ``JAX_PARTITION_INDEX``.

Failure modes are bounded and named: JAX aborts the whole process (a C++ fatal error, no
Python exception) when it cannot register with the coordinator in time, so processes
other than 0 first wait for the coordinator's port to accept connections and raise
``CoordinatorUnreachableError`` naming the address if it does not within ``timeout_s``.
When registration itself stalls (process 0 waiting for a process that never came), a
line on stderr names the coordinator and the wait just before JAX aborts.
"""

import contextlib
import dataclasses
import errno
import socket
import sys
import threading
import time

import jax

from zoo._compat import PrivateAPIError, initialize_keras_rng
from zoo.distribution._process_agreement import (
    AGREE_TIMEOUT_S,
    ProcessMismatchError,
    check_processes_agree,
    describe_mismatches,
    fingerprint,
    local_facts,
)
from zoo.distribution._process_setup import (
    ENV_VARIABLES,
    MultihostError,
    ProcessSetup,
    detect_cluster,
    resolve_setup,
    split_address,
)

__all__ = [
    "AGREE_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "ENV_VARIABLES",
    "CoordinatorUnreachableError",
    "MultihostError",
    "ProcessMismatchError",
    "ProcessSetup",
    "check_port_free",
    "check_processes_agree",
    "describe_mismatches",
    "detect_cluster",
    "feed_process_local_data",
    "fingerprint",
    "initialize",
    "is_primary",
    "local_facts",
    "resolve_setup",
    "split_address",
    "wait_for_coordinator",
]

DEFAULT_TIMEOUT_S = 300  # JAX's own default for registering with the coordinator
_POLL_S = 0.25  # between attempts to reach the coordinator's port


class CoordinatorUnreachableError(MultihostError):
    """A process could not reach the coordinator (process 0) within the time allowed."""


def initialize(
    coordinator_address=None,
    num_processes=None,
    process_id=None,
    *,
    timeout_s=DEFAULT_TIMEOUT_S,
    bind_address=None,
    local_device_ids=None,
):
    """Join this process to the multi-host job (a no-op for one process).

    Call it first, before anything touches ``jax.devices()``. Settings come from the
    arguments, the environment or cluster auto-detection (see the module docstring).
    For more than one process it calls ``jax.distributed.initialize`` with
    ``initialization_timeout=timeout_s``, checks that every process sees the same
    number and kind of devices (``check_processes_agree``: a collective over uneven
    processes would fail obscurely or hang), then synchronises Keras' global seed
    across processes as ``keras.distribution.initialize`` does.

    Args:
        coordinator_address: ``"host:port"`` of process 0, the same on every process.
        num_processes, process_id: the job's size and this process's index in it.
        timeout_s: how long a process waits for the coordinator (and JAX for all
            processes to register) before failing.
        bind_address: where process 0's coordinator listens (JAX's default:
            every interface on the coordinator's port).
        local_device_ids: the local accelerators this process uses (JAX's default:
            all of them; one per process under SLURM/Open MPI on GPUs).

    Returns:
        The ``ProcessSetup`` in force, with the counts JAX settled on.

    Raises:
        MultihostError: inconsistent settings, or JAX already started.
        CoordinatorUnreachableError: nothing accepted connections at the coordinator
            address within ``timeout_s``.
        ProcessMismatchError: the processes' device counts or kinds differ.
    """
    if not timeout_s > 0:
        raise MultihostError(f"timeout_s must be positive, got {timeout_s!r}")
    setup = resolve_setup(coordinator_address, num_processes, process_id)
    if jax.distributed.is_initialized():
        return _already_initialized(setup)
    if setup.is_single_process:
        return setup
    _check_backends_not_started()
    _prefer_gloo_on_cpu()
    if setup.process_id == 0:
        check_port_free(bind_address or _default_bind(setup.coordinator_address))
    elif setup.coordinator_address is not None:
        wait_for_coordinator(setup.coordinator_address, timeout_s, setup.process_id, setup.num_processes)
    with _registration_watchdog(setup, timeout_s):
        jax.distributed.initialize(
            coordinator_address=setup.coordinator_address,
            num_processes=setup.num_processes,
            process_id=setup.process_id,
            local_device_ids=local_device_ids,
            initialization_timeout=int(max(1, round(timeout_s))),
            coordinator_bind_address=bind_address,
        )
    check_processes_agree()  # device counts first: the seed exchange below is a collective
    _synchronise_keras_seed()
    return dataclasses.replace(setup, num_processes=jax.process_count(), process_id=jax.process_index())


@contextlib.contextmanager
def _registration_watchdog(setup, timeout_s):
    """Say, on stderr, why JAX is about to abort this process if registration with the
    coordinator is still pending near ``timeout_s`` (JAX's own message only says
    ``DEADLINE_EXCEEDED``; on process 0 it means some process never registered)."""
    who = f"process {setup.process_id} of {setup.num_processes}" if setup.process_id is not None else "this process"
    where = setup.coordinator_address or "the auto-detected coordinator"
    delay = max(0.5, 0.95 * timeout_s)
    message = (
        f"zoo.distribution.multihost: {who} has waited {delay:.3g} s for all processes to register "
        f"with the JAX coordinator at {where}; JAX aborts the process when its timeout passes. "
        f"Check that every process started, with the same coordinator address and number of processes.\n"
    )
    timer = threading.Timer(delay, lambda: (sys.stderr.write(message), sys.stderr.flush()))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _already_initialized(setup):
    count, index = jax.process_count(), jax.process_index()
    if not setup.is_single_process and (setup.num_processes, setup.process_id) not in ((count, index), (None, None)):
        raise MultihostError(
            f"JAX is already initialized as process {index} of {count}; cannot re-initialize as "
            f"process {setup.process_id} of {setup.num_processes}"
        )
    return dataclasses.replace(setup, num_processes=count, process_id=index, source="already initialized")


def _check_backends_not_started():
    from zoo.distribution.devices import backends_started

    if backends_started():
        raise MultihostError(
            "initialize() must run before anything touches JAX devices (jax.devices(), a "
            "computation, a Keras model): JAX has already started single-process"
        )


def _prefer_gloo_on_cpu():
    """Cross-process collectives on CPU devices use gloo (JAX >= 0.5's default; older
    versions had none and hang at the first cross-process collective)."""
    try:
        if jax.config.jax_cpu_collectives_implementation is None:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except AttributeError:  # the option was renamed: rely on JAX's default
        pass


def _default_bind(address):
    return f"[::]:{split_address(address)[1]}"  # what JAX binds by default


def check_port_free(bind_address):
    """Raise ``MultihostError`` if process 0 cannot listen on ``bind_address``."""
    host, port = split_address(bind_address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno not in (errno.EADDRINUSE, errno.EACCES):
                return  # e.g. no IPv6 for JAX's default "[::]": leave the binding to JAX
            raise MultihostError(
                f"process 0 cannot start the JAX coordinator on {bind_address}: {error}; "
                f"choose a free port for the coordinator address"
            ) from None


def wait_for_coordinator(address, timeout_s, process_id=None, num_processes=None):
    """Return once ``address`` accepts TCP connections; raise after ``timeout_s``.

    Raises:
        CoordinatorUnreachableError: naming the address, the time waited and the
            last connection error.
    """
    host, port = split_address(address)
    deadline = time.monotonic() + timeout_s
    last_error = None
    while True:
        remaining = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(2.0, remaining))):
                return
        except OSError as error:
            last_error = error
        if remaining <= 0:
            break
        time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))
    who = "this process" if process_id is None else f"process {process_id} of {num_processes}"
    raise CoordinatorUnreachableError(
        f"{who} could not reach the JAX coordinator at {address} within {timeout_s:g} s "
        f"(last error: {last_error}); check that process 0 is running with the same "
        f"coordinator address, that {host!r} resolves to it and that port {port} is open"
    )


def _synchronise_keras_seed():
    """What ``keras.distribution.initialize`` does after ``jax.distributed.initialize``:
    one global seed for all processes (unless ``keras.utils.set_random_seed`` set one)."""
    try:
        initialize_keras_rng()
    except PrivateAPIError as error:
        raise MultihostError(
            f"cannot share one seed across processes: {error}; call keras.distribution.initialize() "
            f"instead of zoo's initialize()"
        ) from None


def is_primary():
    """True on process 0, the one that writes logs and checkpoint metadata."""
    return jax.process_index() == 0


def feed_process_local_data(distribution):
    """Tell ``distribution`` that each process already feeds only its own slice.

    Keras' multi-process ``fit`` otherwise wants a ``tf.data.Dataset`` to shard itself
    and rejects NumPy arrays and ``PyDataset`` batches ("auto-sharding enabled"). With
    this set, each process passes its part (``zoo.data.process_shard.process_rows``) in
    batches of global_batch / num_processes, and Keras assembles global arrays with
    ``jax.make_array_from_process_local_data``. Returns ``distribution`` (None stays None).
    """
    if distribution is not None:
        distribution.auto_shard_dataset = False
    return distribution
