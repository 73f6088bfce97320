"""Check that every process of a multi-host job sees the same devices and configuration.

The facts travel through the JAX coordinator's key-value store, not through device
collectives, so the check works (and fails clearly) exactly when a collective would not:
when the processes' device counts differ.
"""

import hashlib
import json

import jax

from zoo._compat import jax_distributed_client
from zoo.distribution._process_setup import MultihostError

AGREE_TIMEOUT_S = 60  # how long check_processes_agree waits for the slowest process


class ProcessMismatchError(MultihostError):
    """The processes disagree on facts that must be equal (device counts, config)."""


def fingerprint(value):
    """A short, stable hash of a JSON-able value (dict key order does not matter)."""
    text = json.dumps(value, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def local_facts(**facts):
    """This process's facts: its devices plus ``facts`` (JSON-able, or hashed by ``repr``)."""
    devices = jax.local_devices()
    ours = {
        "local_device_count": len(devices),
        "device_kind": "/".join(sorted({d.device_kind for d in devices})),
        "platform": devices[0].platform,
    }
    extra = {name: json.loads(json.dumps(value, default=repr)) for name, value in facts.items()}
    return {**ours, **extra}


def describe_mismatches(facts_per_process):
    """Lines naming each process that disagrees with process 0, and the values."""
    reference = facts_per_process[0]
    lines = []
    for index, facts in enumerate(facts_per_process[1:], start=1):
        differences = [
            f"{name} {facts.get(name)!r} (process 0: {reference.get(name)!r})"
            for name in sorted(set(reference) | set(facts))
            if facts.get(name) != reference.get(name)
        ]
        if differences:
            lines.append(f"process {index} disagrees with process 0 on " + "; ".join(differences))
    return lines


_agree_calls = [0]  # every process calls check_processes_agree in the same order


def check_processes_agree(*, timeout_s=AGREE_TIMEOUT_S, **facts):
    """Exchange every process's facts and raise unless they are all equal.

    Always compares each process's local device count, device kind and platform, plus
    the given ``facts`` (e.g. ``config=fingerprint(config)``, ``mesh="data=2,model=4"``).
    The exchange goes through the JAX coordinator's key-value store, not through device
    collectives, so it works even when the device counts differ (when a collective
    would hang). Every process must call it, the same number of times.

    Returns:
        The facts of every process, in process order.

    Raises:
        ProcessMismatchError: naming each process that disagrees with process 0, and
            the differing values.
        MultihostError: a process did not publish its facts within ``timeout_s``.
    """
    mine = local_facts(**facts)
    if jax.process_count() == 1:
        return [mine]
    client = _distributed_client()
    _agree_calls[0] += 1
    prefix = f"zoo/agree/{_agree_calls[0]}"
    client.key_value_set(f"{prefix}/{jax.process_index()}", json.dumps(mine, sort_keys=True))
    everyone = [_get_facts(client, f"{prefix}/{index}", index, timeout_s) for index in range(jax.process_count())]
    mismatches = describe_mismatches(everyone)
    if mismatches:
        raise ProcessMismatchError(
            "the processes of this job do not match: " + "; ".join(mismatches) + ". Every process must see "
            "the same number and kind of devices (XLA_FLAGS, CUDA_VISIBLE_DEVICES, local_device_ids) "
            "and run the same configuration."
        )
    return everyone


def _get_facts(client, key, index, timeout_s):
    try:
        return json.loads(client.blocking_key_value_get(key, int(timeout_s * 1000)))
    except jax.errors.JaxRuntimeError as error:  # DEADLINE_EXCEEDED
        raise MultihostError(
            f"process {index} did not publish its facts within {timeout_s:g} s; every process must "
            f"call check_processes_agree the same number of times ({error})"
        ) from None


def _distributed_client():
    client = jax_distributed_client()
    if client is None:
        raise MultihostError("JAX runs several processes but has no distributed client; call initialize() first")
    return client
