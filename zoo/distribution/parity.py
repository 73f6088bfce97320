"""Parity: does a model train to the same numbers under a distribution as on one device?

Keep a single-device gold reference. ``check_parity`` builds the model twice from the
same initial weights, once with no distribution and once under the one given, trains
both for ``steps`` steps of ``model.fit`` on the same batches, and reports the largest
differences in per-step loss, gradients (first batch, initial weights), outputs (after
training) and final weights.
"""

import dataclasses

import jax
import keras
import numpy as np

from zoo.distribution.distributions import build_distributed, data_parallel_size, place_batch

# float32 tolerances: reductions split across devices are summed in another order.
DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5


@dataclasses.dataclass
class Difference:
    """Largest difference between two sets of arrays, and where it is."""

    max_abs: float  # max |distributed - reference|
    max_rel: float  # max_abs relative to the reference's largest magnitude there
    where: str  # name of the array holding max_abs
    within_tolerance: bool  # every element satisfies |d - r| <= atol + rtol * |r|


@dataclasses.dataclass
class ParityReport:
    """What ``check_parity`` measured. ``passed`` is True when every quantity is within tolerance."""

    steps: int
    reference_losses: list
    distributed_losses: list
    differences: dict  # quantity name -> Difference
    rtol: float
    atol: float

    @property
    def passed(self):
        return all(d.within_tolerance for d in self.differences.values())

    def format(self):
        """A small table, one row per quantity."""
        lines = [f"{'quantity':<10} {'max abs diff':>13} {'max rel diff':>13}  {'ok':<3} worst at"]
        for name, d in self.differences.items():
            ok = "yes" if d.within_tolerance else "NO"
            lines.append(f"{name:<10} {d.max_abs:>13.3e} {d.max_rel:>13.3e}  {ok:<3} {d.where}")
        lines.append(f"tolerance: |d - r| <= {self.atol:g} + {self.rtol:g} * |r|, elementwise")
        return lines


def compare(reference, distributed, *, rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL):
    """``Difference`` between two dicts of same-shaped arrays (keyed alike)."""
    rows = [_difference(name, ref, distributed[name], rtol, atol) for name, ref in reference.items()]
    worst = max(rows, key=lambda row: row.max_abs)
    worst.within_tolerance = all(row.within_tolerance for row in rows)
    return worst


def _difference(name, reference, distributed, rtol, atol):
    ref = np.asarray(reference, dtype=np.float64)
    got = np.asarray(distributed, dtype=np.float64)
    if ref.shape != got.shape:
        raise ValueError(f"{name}: reference shape {ref.shape} != distributed shape {got.shape}")
    gap = np.abs(got - ref)
    max_abs = float(gap.max(initial=0.0))
    scale = float(np.abs(ref).max(initial=0.0))
    ok = bool(np.all(gap <= atol + rtol * np.abs(ref)))
    return Difference(max_abs, max_abs / scale if scale else max_abs, name, ok)


def check_parity(
    build_model,
    compile_model,
    distribution,
    x,
    y,
    *,
    steps=3,
    batch_size=None,
    seed=0,
    rtol=DEFAULT_RTOL,
    atol=DEFAULT_ATOL,
    reference=None,
):
    """Train on one device and under ``distribution`` from the same weights; compare.

    Args:
        build_model: ``() -> keras.Model``, called once per run (deterministic config).
        compile_model: ``(model) -> None``, compiles with loss and optimizer.
        distribution: the ``keras.distribution.Distribution`` under test.
        x, y: training arrays; the first ``steps * batch_size`` examples are used.
        steps: number of optimizer steps.
        batch_size: global batch size (divisible by the data-parallel size); defaults
            to the reference's, else 4 examples per data-parallel replica.
        seed: seeds Keras, NumPy and Python before the reference model is built, so a
            report is reproducible (max-pooling and ReLU make rare near-ties flip).
        reference: a ``TrainRun`` from ``reference_run`` on the same model, data, steps
            and batch size, shared by several checks so the single-device program is
            compiled and trained once; None runs it here.

    The global distribution is None on return.
    """
    batch_size = batch_size or (reference.batch_size if reference else 4 * data_parallel_size(distribution))
    _check_batch(distribution, batch_size, steps, len(x))
    if reference is None:
        reference = reference_run(build_model, compile_model, x, y, steps=steps, batch_size=batch_size, seed=seed)
    elif (reference.steps, reference.batch_size) != (steps, batch_size):
        raise ValueError(
            f"the reference ran {reference.steps} steps of batch {reference.batch_size}; "
            f"this check asks for {steps} steps of batch {batch_size}"
        )
    x, y = x[: steps * batch_size], y[: steps * batch_size]
    try:
        distributed = _train_run(build_model, compile_model, distribution, x, y, batch_size, reference.initial)
    finally:
        keras.distribution.set_distribution(None)
    return compare_runs(reference, distributed, rtol=rtol, atol=atol)


def reference_run(build_model, compile_model, x, y, *, steps=3, batch_size, seed=0):
    """The single-device half of ``check_parity``, to share between several checks.

    Seeds Keras, NumPy and Python with ``seed``, builds the model with no distribution,
    records first-batch gradients, trains ``steps`` steps of ``batch_size`` and records
    outputs and weights. Returns a ``TrainRun``.
    """
    _check_batch(None, batch_size, steps, len(x))
    x, y = x[: steps * batch_size], y[: steps * batch_size]
    keras.utils.set_random_seed(seed)
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        return _train_run(build_model, compile_model, None, x, y, batch_size, None)
    finally:
        keras.distribution.set_distribution(previous)


def compare_runs(reference, distributed, *, rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL):
    """``ParityReport`` of two ``TrainRun``s: per-step losses, gradients, outputs, weights."""
    differences = {
        name: compare(getattr(reference, name), getattr(distributed, name), rtol=rtol, atol=atol)
        for name in ("loss", "gradients", "outputs", "weights")
    }
    losses = [list(run.loss.values()) for run in (reference, distributed)]
    return ParityReport(reference.steps, *losses, differences, rtol, atol)


def _check_batch(distribution, batch_size, steps, num_examples):
    replicas = data_parallel_size(distribution)
    if batch_size % replicas:
        raise ValueError(f"batch size {batch_size} is not divisible by the data-parallel size {replicas}")
    if steps * batch_size > num_examples:
        raise ValueError(f"{steps} steps of batch {batch_size} need {steps * batch_size} examples, got {num_examples}")


@dataclasses.dataclass
class TrainRun:
    """What one run of ``check_parity`` recorded (``reference_run`` returns one)."""

    steps: int
    batch_size: int
    initial: list  # initial weights (numpy), given to the other run
    loss: dict  # "step i" -> that step's loss
    gradients: dict  # weight path -> d(loss)/d(weight) on the first batch, initial weights
    outputs: dict  # "logits" -> outputs on the first batch after training
    weights: dict  # weight path -> final value


def _train_run(build_model, compile_model, distribution, x, y, batch_size, initial_weights):
    """One run: gradients at the start, then ``fit``, then outputs and weights."""
    model = build_distributed(build_model, distribution)
    compile_model(model)
    if initial_weights is not None:
        model.set_weights(initial_weights)
    initial = model.get_weights()
    probe = _probe(model, distribution, x[:batch_size], y[:batch_size])
    gradients, _ = probe()
    step_losses = StepLosses()
    model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0, callbacks=[step_losses])
    _, outputs = probe()
    return TrainRun(
        steps=len(x) // batch_size,
        batch_size=batch_size,
        initial=initial,
        loss={f"step {i + 1}": loss for i, loss in enumerate(step_losses.losses)},
        gradients=gradients,
        outputs={"logits": outputs},
        weights={v.path: np.asarray(v.numpy()) for v in model.weights},
    )


def _probe(model, distribution, x, y):
    """``probe()`` -> ``({weight path: d(loss)/d(weight)}, outputs)`` on one batch at the
    model's current weights: gradients in training mode (nothing updated), outputs in
    inference mode (what ``predict`` returns). One compiled program serves both reads:
    before ``fit`` for the gradients, after it for the outputs."""
    x, y = place_batch(distribution, x, y)

    def loss_fn(trainable_values, non_trainable_values, x, y):
        logits, _ = model.stateless_call(trainable_values, non_trainable_values, x, training=True)
        return model.loss(y, logits)

    def gradients_and_outputs(trainable_values, non_trainable_values, x, y):
        outputs, _ = model.stateless_call(trainable_values, non_trainable_values, x, training=False)
        return jax.grad(loss_fn)(trainable_values, non_trainable_values, x, y), outputs

    step = jax.jit(gradients_and_outputs)

    def probe():
        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        grads, outputs = step(trainable, non_trainable, x, y)
        return {v.path: np.asarray(g) for v, g in zip(model.trainable_variables, grads)}, np.asarray(outputs)

    return probe


class StepLosses(keras.callbacks.Callback):
    """Records each step's own loss during ``fit``.

    Keras logs a running mean; the step's loss is recovered from consecutive means
    (all steps here have the same batch size).
    """

    def __init__(self):
        super().__init__()
        self.losses = []
        self._previous_mean = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._previous_mean = 0.0

    def on_train_batch_end(self, batch, logs=None):
        mean = float(logs["loss"])
        count = batch + 1
        self.losses.append(mean * count - self._previous_mean * (count - 1))
        self._previous_mean = mean
