import keras
import numpy as np
import pytest

from zoo.distribution import distribution_for
from zoo.distribution.parity import TrainRun, check_parity, compare
from zoo.models import SmallCNN


def test_compare_reports_largest_difference_and_tolerance():
    reference = {"a": np.array([1.0, 2.0]), "b": np.array([10.0])}
    diff = compare(reference, {"a": np.array([1.0, 2.0]), "b": np.array([10.5])}, rtol=1e-3, atol=0)
    assert diff.where == "b" and diff.max_abs == pytest.approx(0.5) and diff.max_rel == pytest.approx(0.05)
    assert not diff.within_tolerance
    assert compare(reference, {"a": np.array([1.0, 2.0]), "b": np.array([10.005])}, rtol=1e-3, atol=0).within_tolerance


def test_parity_detects_a_model_that_differs():
    """A run whose second model differs (other dropout seed) must fail the check.

    The model is the smallest with a seeded dropout (flatten, dense, dropout, dense;
    layers named so both builds have the same weight paths): check_parity does the same
    work on it as on any model, and it compiles in a fraction of SmallCNN's time."""
    builds = iter([1, 2])
    rng = np.random.default_rng(0)
    x, y = rng.random((48, 16, 16, 3), dtype=np.float32), rng.integers(0, 4, 48)

    def build():
        layers = [
            keras.Input((16, 16, 3)),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(8, name="hidden"),
            keras.layers.Dropout(0.5, seed=next(builds), name="dropout"),
            keras.layers.Dense(4, name="logits"),
        ]
        return keras.Sequential(layers, name="tiny")

    def compile_model(model):
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    report = check_parity(
        build, compile_model, distribution_for(SmallCNN, "data", "data=8"), x, y, steps=2, batch_size=16
    )
    assert not report.passed
    assert not report.differences["gradients"].within_tolerance
    assert keras.distribution.distribution() is None


def test_indivisible_batch_is_refused():
    x, y = np.zeros((40, 16, 16, 3), np.float32), np.zeros(40, np.int32)
    with pytest.raises(ValueError, match="batch size 12 is not divisible by the data-parallel size 8"):
        check_parity(
            lambda: SmallCNN(image_size=16),
            lambda m: None,
            distribution_for(SmallCNN, "data", "data=8"),
            x,
            y,
            batch_size=12,
        )


def test_a_reference_of_other_steps_or_batch_is_refused():
    x, y = np.zeros((48, 16, 16, 3), np.float32), np.zeros(48, np.int32)
    reference = TrainRun(steps=2, batch_size=16, initial=[], loss={}, gradients={}, outputs={}, weights={})
    distribution = distribution_for(SmallCNN, "data", "data=8")
    with pytest.raises(
        ValueError, match="the reference ran 2 steps of batch 16; this check asks for 3 steps of batch 16"
    ):
        check_parity(lambda: SmallCNN(image_size=16), lambda m: None, distribution, x, y, steps=3, reference=reference)
    with pytest.raises(
        ValueError, match="the reference ran 2 steps of batch 16; this check asks for 2 steps of batch 8"
    ):
        check_parity(
            lambda: SmallCNN(image_size=16),
            lambda m: None,
            distribution,
            x,
            y,
            steps=2,
            batch_size=8,
            reference=reference,
        )
