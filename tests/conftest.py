"""Test session set-up: 8 simulated CPU devices and the JAX backend, before JAX starts."""

import os

os.environ["KERAS_BACKEND"] = "jax"
os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    + ["--xla_force_host_platform_device_count=8"]
)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def no_distribution_leaks():
    """Every test starts and ends with no global Keras distribution."""
    keras.distribution.set_distribution(None)
    yield
    keras.distribution.set_distribution(None)
