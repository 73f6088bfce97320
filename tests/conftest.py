"""Test session set-up: 8 simulated CPU devices and the JAX backend, before JAX starts."""

import os
import tempfile

os.environ["KERAS_BACKEND"] = "jax"
# Set here, not through zoo, so no zoo import happens before the flags are in place.
os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f and "collective" not in f]
    + [
        "--xla_force_host_platform_device_count=8",
        # 8 simulated devices share 2 cores: give slow collectives 2 minutes, not 40 s
        # (bounded: a true XLA:CPU deadlock must fail, not hang; see docs/distribution.md).
        "--xla_cpu_collective_timeout_seconds=120",
        "--xla_cpu_collective_call_terminate_timeout_seconds=120",
    ]
)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Embedded datasets are prepared on first use: into a folder of this test session, never
# into the user's ~/tensorflow_datasets.
os.environ["ZOO_DATA_DIR"] = tempfile.mkdtemp(prefix="zoo-test-data-")

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def no_distribution_leaks():
    """Every test starts and ends with no global Keras distribution."""
    keras.distribution.set_distribution(None)
    yield
    keras.distribution.set_distribution(None)
