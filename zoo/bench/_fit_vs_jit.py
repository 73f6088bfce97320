"""What every "model.fit vs a hand-written ``jax.jit`` step" benchmark shares.

(a) ``model.fit`` for one epoch over host numpy arrays (``shuffle=False``, ``verbose=0``);
(b) a loop over a ``jax.jit`` train step written by hand from Keras' stateless API
    (``stateless_call`` + compiled loss + ``jax.value_and_grad`` +
    ``optimizer.stateless_apply``), the state donated, each batch placed from host
    numpy with ``jax.device_put`` on the distribution's data sharding. The next batch
    is copied while a step runs, but each step is awaited before the next is
    dispatched (XLA:CPU collectives can deadlock otherwise, see ``_await``).

Both are compiled before timing, the clock stops only once results are ready, the two
alternate ``repeats`` times and the medians are compared as a ratio fit / jit measured
side by side. Before timing, one hand-written step and one ``fit`` step from the same
weights must give the same loss, so the two loops provably do the same maths.
"""

import statistics
import time

import jax
import keras
import numpy as np

from zoo import distribution as zd
from zoo.measure.steps import model_state, stateless_train_step

# Same-maths check: |loss_jit - loss_fit| <= LOSS_ATOL + LOSS_RTOL * |loss_fit|. The two
# steps are separate XLA programs (fit's also updates metrics), so fusion may reorder
# float32 sums; anything beyond rounding means the maths differ.
LOSS_ATOL = 1e-5
LOSS_RTOL = 1e-5


class SameMathsError(AssertionError):
    """The hand-written step and Keras' own train step disagree on the loss."""


def mesh_name(distribution):
    return "-" if distribution is None else zd.describe_mesh(distribution.device_mesh)


def measure(
    label, distribution, build_model, x, y, *, batch_size, repeats, seed, unit="examples", per_example=1, report=print
):
    """One table row: median fit and jit throughput of ``build_model()`` (compiled) under
    ``distribution`` (None: one device), over host arrays x, y of N = steps * B rows.

    Throughput is in ``unit``/s, ``per_example`` units per row (e.g. T tokens)."""
    mesh = mesh_name(distribution)
    report(f"{label} ({mesh}): compiling and checking ...")
    keras.utils.set_random_seed(seed)
    model = zd.build_distributed(build_model, distribution)

    # Warm-up: compiles fit's train step and builds the optimizer and metrics.
    fit_rate(model, x[: 2 * batch_size], y[: 2 * batch_size], batch_size)
    step = make_jit_step(model, distribution)
    shardings = data_shardings(distribution, x[:batch_size], y[:batch_size])
    loss_gap, state = check_same_maths(model, step, x[:batch_size], y[:batch_size], shardings)
    state, _ = jit_rate(step, state, x[: 2 * batch_size], y[: 2 * batch_size], batch_size, shardings)

    fit_runs, jit_runs = [], []
    for _ in range(repeats):  # alternate, so drifts in machine load hit both alike
        fit_runs.append(per_example * fit_rate(model, x, y, batch_size))
        state, rate = jit_rate(step, state, x, y, batch_size, shardings)
        jit_runs.append(per_example * rate)
    fit, jit = statistics.median(fit_runs), statistics.median(jit_runs)
    pairs = [f / j for f, j in zip(fit_runs, jit_runs)]  # spread of the ratio within this run
    report(
        f"  fit {fit:,.1f} {unit}/s, jit {jit:,.1f} {unit}/s, ratio {fit / jit:.3f} "
        f"(per-repeat {min(pairs):.3f}..{max(pairs):.3f}), loss gap {loss_gap:.1e}"
    )
    return {
        "layout": label,
        "mesh": mesh,
        "fit_per_s": fit,
        "jit_per_s": jit,
        "ratio": fit / jit,
        "fit_runs": fit_runs,
        "jit_runs": jit_runs,
        "loss_gap": loss_gap,
    }


def fit_rate(model, x, y, batch_size):
    """Rows/s of one ``model.fit`` epoch over host arrays x, y of N rows."""
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
    jax.block_until_ready([v.value for v in model.variables])
    return len(x) / (time.perf_counter() - start)


def jit_rate(step, state, x, y, batch_size, shardings):
    """Rows/s of the hand-written loop over host arrays x, y; returns (state, rate).

    The next batch is sliced and copied to the devices while the current step runs;
    the step itself is awaited before the next one is dispatched (see ``_await``).
    """
    starts = range(0, len(x) - batch_size + 1, batch_size)
    start = time.perf_counter()
    batch = put_batch(x, y, starts[0], batch_size, shardings)
    for index in range(len(starts)):
        loss, state = step(state, *batch)
        if index + 1 < len(starts):
            batch = put_batch(x, y, starts[index + 1], batch_size, shardings)
        _await(loss, state)
    return state, len(starts) * batch_size / (time.perf_counter() - start)


def put_batch(x, y, begin, batch_size, shardings):
    """Host numpy rows [begin, begin + B) of x and y onto the data sharding."""
    x_sharding, y_sharding = shardings
    xb = jax.device_put(x[begin : begin + batch_size], x_sharding)
    yb = jax.device_put(y[begin : begin + batch_size], y_sharding)
    return xb, yb


def _await(loss, state):
    """Wait for one step, so at most one sharded step is ever executing.

    XLA:CPU runs each simulated device's share of a program on a shared pool of one
    thread per device, and a collective blocks its thread until every device arrives.
    With two steps in flight, devices already in step k+1 can hold threads that a
    device still in step k needs: the all-reduce then deadlocks (7 of 8 participants
    arrive and XLA aborts the process after 40 s). Unbounded dispatch of a sharded
    step reproduces this on the 2-core CI machine; a plain ``jax.jit`` sum over 8
    simulated devices called 200 times in a row does too. ``model.fit`` dispatches
    without a bound and is exposed as well (seen with 100-step epochs of 16-pixel
    images); its short per-step Python work makes it rarer there.
    """
    jax.block_until_ready((loss, state))


def make_jit_step(model, distribution):
    """``zoo.measure.steps.stateless_train_step`` jitted as ``fit`` jits its step: the
    state donated; under a distribution its output shardings pinned to the variables'
    own (as Keras does), so step k+1 reuses step k's program."""
    out_shardings = None
    if distribution is not None:
        out_shardings = (None, jax.tree.map(lambda a: a.sharding, model_state(model)))
    return jax.jit(stateless_train_step(model), donate_argnums=0, out_shardings=out_shardings)


def copy_state(state):
    """Fresh device copies (same shardings), safe to donate without touching the model."""
    return jax.tree.map(lambda a: jax.device_put(a, a.sharding, may_alias=False), state)


def data_shardings(distribution, x, y):
    """Where a batch goes: the distribution's data layout, or the default device."""
    if distribution is None:
        return None, None
    return tuple(distribution.get_data_layout(a.shape).backend_layout for a in (x, y))


def check_same_maths(model, step, x, y, shardings):
    """One hand-written step and one Keras step from the same weights; compare losses.

    x, y: one batch. The Keras step is a one-batch
    ``model.fit``: the very program that is timed (``train_on_batch`` would feed
    ``(x, y, None)`` instead of fit's ``(x, y)`` and compile a second program).
    Raises ``SameMathsError`` when the losses differ beyond rounding. Returns
    ``(|loss gap|, state after the hand-written step)``; the model has taken its step.
    """
    state = copy_state(model_state(model))
    xb, yb = (jax.device_put(a, s) for a, s in zip((x, y), shardings))
    jit_loss, state = step(state, xb, yb)
    fit_loss = fit_one_step_loss(model, x, y)
    return compare_losses(float(jit_loss), fit_loss), state


def fit_one_step_loss(model, x, y):
    """The loss of one ``model.fit`` step on the single batch (x, y)."""
    history = model.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    return float(history.history["loss"][0])


def compare_losses(jit_loss, fit_loss, atol=LOSS_ATOL, rtol=LOSS_RTOL):
    """``|jit_loss - fit_loss|``, or ``SameMathsError`` if beyond ``atol + rtol * |fit_loss|``."""
    gap = abs(jit_loss - fit_loss)
    if not np.isfinite(gap) or gap > atol + rtol * abs(fit_loss):
        raise SameMathsError(
            f"hand-written step loss {jit_loss:.8f} != model.fit step loss {fit_loss:.8f} "
            f"(gap {gap:.2e} > {atol:g} + {rtol:g} * |loss|): the two loops do different maths"
        )
    return gap
