"""Multi-host start-up: settings, bounded waits, agreement checks, and real multi-process training.

The acceptance test starts two real processes x 4 simulated CPU devices joined by
``jax.distributed`` over 127.0.0.1 (gloo CPU collectives), each feeding only its slice of
every global batch, and checks they train to the same per-step losses as this pytest
process (1 process x 8 devices) does on the same global batches.
"""

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.distribution import _multihost_worker as worker
from zoo.distribution import multihost
from zoo.distribution.multihost import CoordinatorUnreachableError, MultihostError, ProcessSetup

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = "tests.distribution._multihost_worker"
WAIT_S = 240  # the longest a group of worker processes may run (they take ~20 s on 2 idle cores)


# ---- settings -----------------------------------------------------------------------------


def test_nothing_set_is_one_process():
    assert multihost.resolve_setup(environ={}, cluster=None) == ProcessSetup(None, 1, 0, "single process")


def test_one_process_needs_no_coordinator():
    assert multihost.resolve_setup(num_processes=1, environ={}, cluster=None).is_single_process


def test_initialize_single_process_is_a_no_op():
    setup = multihost.initialize(num_processes=1, process_id=0)
    assert setup.is_single_process
    assert not multihost.jax.distributed.is_initialized()


def test_arguments_win_over_the_environment():
    environ = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    setup = multihost.resolve_setup(process_id=2, environ=environ, cluster=None)
    assert setup == ProcessSetup("10.0.0.1:1234", 4, 2, "JAX_* environment + arguments")


def test_keras_variables_are_read_and_the_first_job_address_is_the_coordinator():
    environ = {
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": "10.0.0.1:1234,10.0.0.2:2345",
        "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
        "KERAS_DISTRIBUTION_PROCESS_ID": "1",
    }
    setup = multihost.resolve_setup(environ=environ, cluster=None)
    assert setup == ProcessSetup("10.0.0.1:1234", 2, 1, "KERAS_DISTRIBUTION_* environment")


def test_jax_variables_win_over_keras_variables():
    environ = {
        "JAX_PROCESS_ID": "0",
        "KERAS_DISTRIBUTION_PROCESS_ID": "1",
        "JAX_NUM_PROCESSES": "2",
        "JAX_COORDINATOR_ADDRESS": "h:1",
    }
    assert multihost.resolve_setup(environ=environ, cluster=None).process_id == 0


def test_a_cluster_fills_in_what_is_missing():
    setup = multihost.resolve_setup(environ={}, cluster="slurm")
    assert setup == ProcessSetup(None, None, None, "slurm auto-detection")
    assert not setup.is_single_process


@pytest.mark.parametrize(
    "kwargs, environ, message",
    [
        (
            {"num_processes": 2, "process_id": 2, "coordinator_address": "h:1"},
            {},
            "process_id 2 is out of range for 2 processes (valid: 0..1)",
        ),
        ({"num_processes": 1, "process_id": 3}, {}, "process_id 3 is out of range for 1 processes"),
        ({"num_processes": 2, "process_id": -1}, {}, "process_id must be non-negative, got -1"),
        ({"num_processes": 2, "process_id": 1}, {}, "num_processes=2 but no coordinator address"),
        ({"num_processes": 2, "coordinator_address": "h:1"}, {}, "num_processes=2 but no process_id"),
        ({"coordinator_address": "h:1", "process_id": 0}, {}, "'h:1' / process_id 0 given but no number of processes"),
        (
            {"num_processes": 2, "process_id": 0, "coordinator_address": "nohost"},
            {},
            "'nohost' is not of the form host:port",
        ),
        (
            {"num_processes": 2, "process_id": 0, "coordinator_address": "h:99999"},
            {},
            "'h:99999' is not of the form host:port",
        ),
        ({"num_processes": "2", "process_id": 0}, {}, "num_processes must be an integer, got '2'"),
        ({}, {"JAX_NUM_PROCESSES": "two"}, "JAX_NUM_PROCESSES='two' is not an integer"),
        (
            {},
            {"KERAS_DISTRIBUTION_JOB_ADDRESSES": "a:1,b:2,c:3", "KERAS_DISTRIBUTION_NUM_PROCESSES": "2"},
            "lists 3 addresses but KERAS_DISTRIBUTION_NUM_PROCESSES=2",
        ),
    ],
)
def test_inconsistent_settings_are_named(kwargs, environ, message):
    with pytest.raises(MultihostError, match=re.escape(message)):
        multihost.resolve_setup(**kwargs, environ=environ, cluster=None)


def test_initialize_rejects_a_bad_timeout():
    with pytest.raises(MultihostError, match="timeout_s must be positive, got 0"):
        multihost.initialize(timeout_s=0)


def test_initialize_after_jax_started_names_the_problem():
    multihost.jax.devices()  # the pytest process has started JAX single-process
    with pytest.raises(MultihostError, match="must run before anything touches JAX devices"):
        multihost.initialize("127.0.0.1:1", 2, 1, timeout_s=1)


# ---- bounded waits ------------------------------------------------------------------------


def test_waiting_for_a_silent_coordinator_is_bounded_and_names_the_address():
    port = _free_port()
    start = time.monotonic()
    with pytest.raises(
        CoordinatorUnreachableError,
        match=re.escape(f"process 1 of 2 could not reach the JAX coordinator at 127.0.0.1:{port} within 0.5 s"),
    ):
        multihost.wait_for_coordinator(f"127.0.0.1:{port}", 0.5, 1, 2)
    assert time.monotonic() - start < 5


def test_waiting_for_a_listening_coordinator_returns():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        start = time.monotonic()
        # raises CoordinatorUnreachableError after 5 s if it cannot connect
        assert multihost.wait_for_coordinator(f"127.0.0.1:{server.getsockname()[1]}", 5) is None
        assert time.monotonic() - start < 4  # it connected, rather than waiting out its timeout


def test_a_taken_coordinator_port_is_named():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        with pytest.raises(MultihostError, match=re.escape(f"process 0 cannot start the JAX coordinator on {address}")):
            multihost.check_port_free(address)


# ---- agreement ----------------------------------------------------------------------------


def test_mismatches_name_the_process_and_the_values():
    facts = [
        {"local_device_count": 4, "config": "a"},
        {"local_device_count": 4, "config": "a"},
        {"local_device_count": 3, "config": "b"},
    ]
    assert multihost.describe_mismatches(facts) == [
        "process 2 disagrees with process 0 on config 'b' (process 0: 'a'); local_device_count 3 (process 0: 4)"
    ]
    assert multihost.describe_mismatches(facts[:2]) == []


def test_single_process_agrees_with_itself():
    (facts,) = multihost.check_processes_agree(config=multihost.fingerprint({"a": 1}), mesh="data=8")
    assert facts["local_device_count"] == 8 and facts["platform"] == "cpu" and facts["mesh"] == "data=8"


def test_fingerprint_ignores_key_order_and_sees_values():
    assert multihost.fingerprint({"a": 1, "b": [2]}) == multihost.fingerprint({"b": [2], "a": 1})
    assert multihost.fingerprint({"a": 1}) != multihost.fingerprint({"a": 2})


def test_process_zero_is_primary():
    assert multihost.is_primary()


# ---- real processes -----------------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path):
    """2 processes x 4 devices, each feeding its half of every batch, under DataParallel
    (data=8) and tensor parallelism (data=2,model=4): the per-step losses equal those of
    1 process x 8 devices on the same global batches."""
    port = _free_port()
    outs = [tmp_path / f"results-{index}.json" for index in range(2)]
    group = _start(tmp_path, [_worker_args(port, index, "--out", str(outs[index])) for index in range(2)])
    try:
        x, y = worker.reference_data(process_count=2)  # computed while the workers run
        expected = {layout: worker.train(layout, x, y, worker.GLOBAL_BATCH) for layout in worker.LAYOUTS}
        results = _wait(group, WAIT_S)
    finally:
        _kill(group)
    for result in results:
        assert result["rc"] == 0, _explain(results)
    assert outs[0].exists() and not outs[1].exists(), "only process 0 writes the results file"
    written = json.loads(outs[0].read_text())
    for layout, losses in expected.items():
        assert len(losses) == worker.STEPS and len(set(np.round(losses, 4))) == worker.STEPS  # the loss moves
        np.testing.assert_allclose(written[layout], losses, rtol=1e-5, atol=1e-6, err_msg=layout)
        for result in results:  # every process saw the same (global) losses
            printed = [r["loss"] for r in _json_lines(result["stdout"]) if r.get("layout") == layout]
            np.testing.assert_allclose(printed, written[layout], rtol=1e-6, err_msg=_explain(results))


@pytest.mark.slow
def test_unreachable_coordinator_fails_clearly_within_bounded_time(tmp_path):
    port = _free_port()  # nothing listens there
    start = time.monotonic()
    group = _start(tmp_path, [_worker_args(port, 1, "--timeout", "3")])
    try:
        (result,) = _wait(group, 60)
    finally:
        _kill(group)
    assert time.monotonic() - start < 30
    assert result["rc"] != 0
    assert (
        f"CoordinatorUnreachableError: process 1 of 2 could not reach the JAX coordinator at 127.0.0.1:{port} within 3 s"
        in result["stderr"]
    ), _explain([result])


@pytest.mark.slow
def test_a_coordinator_whose_peers_never_come_fails_within_bounded_time(tmp_path):
    """Process 0 alone: JAX aborts it (SIGABRT, no Python exception) once registration
    times out; the line printed just before names the coordinator and the wait."""
    port = _free_port()
    start = time.monotonic()
    group = _start(tmp_path, [_worker_args(port, 0, "--timeout", "2", "--mode", "agree")])
    try:
        (result,) = _wait(group, 60)
    finally:
        _kill(group)
    assert time.monotonic() - start < 30
    assert result["rc"] != 0
    assert (
        f"process 0 of 2 has waited 1.9 s for all processes to register with the JAX coordinator at 127.0.0.1:{port}"
        in result["stderr"]
    ), _explain([result])


@pytest.mark.slow
@pytest.mark.parametrize(
    "device_counts, tags, message",
    [
        ((4, 3), ("", ""), "process 1 disagrees with process 0 on local_device_count 3 (process 0: 4)"),
        ((4, 4), ("", "changed"), "process 1 disagrees with process 0 on config '"),
    ],
    ids=["device-counts", "config"],
)
def test_disagreeing_processes_get_a_clear_error(tmp_path, device_counts, tags, message):
    port = _free_port()
    args = [_worker_args(port, index, "--mode", "agree", "--config-tag", tag) for index, tag in enumerate(tags)]
    group = _start(tmp_path, args, device_counts)
    try:
        results = _wait(group, 120)
    finally:
        _kill(group)
    for result in results:
        assert result["rc"] != 0, _explain(results)
        assert "ProcessMismatchError: the processes of this job do not match: " + message in result["stderr"], _explain(
            results
        )


# ---- helpers ------------------------------------------------------------------------------


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _worker_args(port, index, *extra):
    address = f"127.0.0.1:{port}"
    return ["--coordinator", address, "--bind", address, "--num-processes", "2", "--process-id", str(index), *extra]


def _worker_env(device_count):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env.update(
        KERAS_BACKEND="jax",
        JAX_PLATFORMS="cpu",
        JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
        # the session's XLA flags (fast compiles, collective timeouts) with this worker's device count
        XLA_FLAGS=" ".join(
            [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
            + [f"--xla_force_host_platform_device_count={device_count}"]
        ),
    )
    return env


def _start(tmp_path, args_per_process, device_counts=(4, 4)):
    """Start one worker per entry of ``args_per_process``; output goes to files (no pipe can fill)."""
    group = []
    for index, (args, count) in enumerate(zip(args_per_process, device_counts)):
        stdout, stderr = tmp_path / f"stdout-{index}.txt", tmp_path / f"stderr-{index}.txt"
        with open(stdout, "w") as out, open(stderr, "w") as err:
            process = subprocess.Popen(
                [sys.executable, "-m", WORKER, *args], cwd=ROOT, env=_worker_env(count), stdout=out, stderr=err
            )
        group.append({"process": process, "stdout_path": stdout, "stderr_path": stderr})
    return group


def _wait(group, timeout_s):
    """Wait for every process (all within ``timeout_s`` in total); return rc and output of each."""
    deadline = time.monotonic() + timeout_s
    for member in group:
        try:
            member["process"].wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill(group)
            pytest.fail(f"worker processes still running after {timeout_s} s:\n{_explain(_collect(group))}")
    return _collect(group)


def _collect(group):
    return [
        {"rc": m["process"].returncode, "stdout": m["stdout_path"].read_text(), "stderr": m["stderr_path"].read_text()}
        for m in group
    ]


def _kill(group):
    for member in group:
        if member["process"].poll() is None:
            member["process"].kill()
            member["process"].wait(timeout=10)


def _json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _explain(results):
    parts = []
    for index, result in enumerate(results):
        stderr = "\n".join(line for line in result["stderr"].splitlines() if not line.startswith("[Gloo]"))
        parts.append(
            f"--- process {index}: exit code {result['rc']}\nstdout:\n{result['stdout'][-2000:]}\nstderr:\n{stderr[-4000:]}"
        )
    return "\n".join(parts)
