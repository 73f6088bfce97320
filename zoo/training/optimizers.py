"""AdamW whose moments are stored in bfloat16: 4 bytes a parameter less optimizer state.

``AdamW(moment_dtype="bfloat16")`` keeps the weights (the master copy) in float32 and
stores the first and second moments in bfloat16. Each step reads them into float32,
updates them there exactly as ``keras.optimizers.AdamW`` does, updates the weight from the
float32 values, and writes the moments back **with stochastic rounding**.

Why stochastic rounding, not round-to-nearest: with beta_2 = 0.999 the second moment
changes by 0.1% of ``g**2 - v`` a step. bfloat16 has 8 significant bits, so half of one
unit in the last place is about 0.2% of v. Rounded to nearest, v could only grow when
``g**2`` exceeds about 3 v, and it could never decay. Rounded stochastically (up with
probability equal to the dropped fraction), its expected value follows the float32
recursion. The rounding bits come from an integer hash of each element's position, the
step and the moment's index. They use no PRNG state and no random-number kernel, only a
few integer operations fused into the update, which is bound by memory bandwidth. A run is
as reproducible as with float32 moments.

``float32`` (the default) is ``keras.optimizers.AdamW`` itself.

**bfloat16 weights** (the model built under Keras' ``"bfloat16"`` policy: precision
``bfloat16``): each update is computed in float32 from the bfloat16 weight, its weight
decay included, and written back with the same stochastic rounding. Rounded to nearest,
an update smaller than half the weight's last place (AdamW's at a learning rate of 1e-4 on
a weight of 0.1 is 1e-4, half an ulp is 2.4e-4) would be lost every step; rounded
stochastically the weight follows the float32 trajectory in expectation (Zamirai et al.,
"Revisiting BFloat16 Training", 2020). The moments stay in ``moment_dtype`` (float32 by
default), not in the weights' dtype. What it saves against float32 master weights: 2 bytes
a parameter of weights, and 4 of the 14 a parameter AdamW's update reads and writes.

``AdamW(second_moment="factored")`` keeps, for each weight of two or more dimensions
(..., n), the second moment as two float32 running means of the squared gradient: over its
last dimension (shape (...)) and over all the others (shape (n,)), as Adafactor does
(Shazeer and Stern, 2018). Their outer product over the mean of the first stands for the
(..., n) second moment: 4 bytes a parameter less state, for C + F floats per (C, F)
kernel. The update is otherwise AdamW's, the first moment kept whole (in
``moment_dtype``), the learning rate meaning what it means for AdamW: a zero-initialised
LoRA factor moves as under AdamW. Why by hand, not ``keras.optimizers.Adafactor``: Keras'
Adafactor scales every step by the weight's RMS (at least 1e-3), so a zero-initialised
LoRA factor starts 1,000 times slower, its learning rate means something else than
AdamW's, and it keeps no first moment. Weights of fewer than two dimensions (norms,
biases) keep the whole second moment.

``AdamW(state_memory="host")`` keeps every moment (and factored mean) in the host's pinned
memory between steps (JAX's memory kinds: TPU, GPU; on a CPU both kinds are the same RAM):
the device holds the weights, the gradients and the step's activations, and each update
moves a weight's moments to the device, updates them and moves them back (8 bytes a
parameter of transfers each way with float32 moments, over PCIe or the TPU host link). The
numbers are those of the same optimizer with its state on the device. MaxText's
``optimizer_memory_host_offload`` does the same for its optax state. On a TPU v5e (JAX
0.10.2) the TPU compiler's footprint of a 1B fine-tune's step did not shrink with it and the
step took 190 ms longer (docs/performance.md, "Sixth session").
"""

import math

import jax
import jax.numpy as jnp
import keras

from zoo._compat import applies_weight_decay, apply_weight_decay_except, place_variable_in_memory, variable_layout
from zoo.config.choices import FLOAT_DTYPES as MOMENT_DTYPES
from zoo.config.choices import PINNED_HOST, SECOND_MOMENTS, STATE_MEMORIES

__all__ = [
    "MOMENT_DTYPES",
    "SECOND_MOMENTS",
    "STATE_MEMORIES",
    "AdamW",
    "STATE_SETTINGS",
    "make_optimizer",
    "state_options",
    "stochastic_round_to_bfloat16",
]

_MOMENTS = ("momentum", "velocity")
_WEIGHT_SALT = 1 << 30  # the rounding bits of weight i's writes: salt 2**30 + i, apart from its moments' 2i, 2i + 1


def _rounded(value, iterations, salt):
    """float32 ``value`` rounded stochastically to bfloat16, its bits those of step ``iterations`` and ``salt``."""
    return stochastic_round_to_bfloat16(value, _hash_bits(value.shape, iterations, salt))


def _is_bfloat16(variable):
    return keras.backend.standardize_dtype(variable.dtype) == "bfloat16"


def _hash_bits(shape, step, salt):
    """uint32 bits per element of ``shape`` (a murmur3-style finaliser of the position,
    the step and ``salt``): different every step and for every moment, the same on a rerun."""
    position = jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)  # flat index, reshaped
    h = position * jnp.uint32(0x9E3779B1) + step.astype(jnp.uint32) * jnp.uint32(0x85EBCA77) + jnp.uint32(salt)
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x7FEB352D)
    h = h ^ (h >> 15)
    h = h * jnp.uint32(0x846CA68B)
    return h ^ (h >> 16)


def stochastic_round_to_bfloat16(x, bits):
    """``x`` (float32) rounded to bfloat16 up with probability equal to the dropped fraction
    of its 16 low mantissa bits, given uniform ``bits`` (uint32, same shape)."""
    raw = jax.lax.bitcast_convert_type(x, jnp.uint32)
    rounded = (raw + (bits & jnp.uint32(0xFFFF))) & jnp.uint32(0xFFFF0000)  # carry into the kept bits, or not
    rounded = jnp.where(jnp.isfinite(x), rounded, raw)  # inf and NaN unchanged
    return jax.lax.bitcast_convert_type(rounded, jnp.float32).astype(jnp.bfloat16)  # exact: low bits are 0


@keras.saving.register_keras_serializable(package="zoo")
class AdamW(keras.optimizers.AdamW):
    """``keras.optimizers.AdamW`` with ``moment_dtype`` "float32" (Keras' own) or "bfloat16",
    ``second_moment`` "full" (Keras' own) or "factored", and ``state_memory`` "device"
    (Keras' own) or "host" (the module docstring). Every other argument is Keras'."""

    def __init__(self, *args, moment_dtype="float32", second_moment="full", state_memory="device", **kwargs):
        for name, value, allowed in (
            ("moment_dtype", moment_dtype, MOMENT_DTYPES),
            ("second_moment", second_moment, SECOND_MOMENTS),
            ("state_memory", state_memory, STATE_MEMORIES),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        super().__init__(*args, **kwargs)
        self.moment_dtype, self.second_moment, self.state_memory = moment_dtype, second_moment, state_memory
        if not self._keras_own and self.amsgrad:
            raise ValueError(
                f"moment_dtype={moment_dtype!r}, second_moment={second_moment!r}, state_memory={state_memory!r} is not "
                "implemented with amsgrad=True"
            )
        self._columns = {}  # a factored weight's path -> its columns' running mean (n,); its rows' is the velocity slot

    @property
    def _keras_own(self):
        return is_keras_own(self.moment_dtype, self.second_moment, self.state_memory)

    def build(self, var_list):
        if self.amsgrad and any(_is_bfloat16(variable) for variable in var_list):
            raise ValueError("bfloat16 weights (precision bfloat16) are not implemented with amsgrad=True")
        super().build(var_list)
        for slot in self.host_slots():
            place_variable_in_memory(slot, PINNED_HOST)

    def _apply_weight_decay(self, variables):
        """Keras' decay of every weight but the bfloat16 ones: theirs is applied in float32
        inside ``update_step``, rounded stochastically with the update (Keras' own, in
        bfloat16 and rounded to nearest, would be lost)."""
        apply_weight_decay_except(self, variables, skip=_is_bfloat16)

    def host_slots(self):
        """The slots kept in host memory between steps: every moment and factored mean
        under ``state_memory="host"``, else none."""
        if self.state_memory != "host":
            return []
        return [*self._momentums, *self._velocities, *self._columns.values()]

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        if name == "velocity" and self._factored(reference_variable):
            return self._add_factors(reference_variable)
        if name not in _MOMENTS or (self.moment_dtype == "float32" and not _is_bfloat16(reference_variable)):
            return super().add_variable_from_reference(reference_variable, name, initializer)
        return self.add_variable(  # Keras' naming and layout, in moment_dtype (not a bfloat16 weight's dtype)
            shape=reference_variable.shape,
            initializer=initializer,
            dtype=self.moment_dtype,
            name=f"{reference_variable.path.replace('/', '_')}_{name}",
            layout=variable_layout(reference_variable),
        )

    def _factored(self, variable):
        return self.second_moment == "factored" and len(variable.shape) >= 2

    def _add_factors(self, reference_variable):
        """The running means of a factored weight's squared gradient, float32: over its last
        dimension (shape (...), returned: Keras' velocity slot) and over the others ((n,))."""
        prefix = reference_variable.path.replace("/", "_")
        shape = tuple(reference_variable.shape)
        rows = self.add_variable(shape=shape[:-1], initializer="zeros", dtype="float32", name=f"{prefix}_velocity_rows")
        self._columns[reference_variable.path] = self.add_variable(
            shape=shape[-1:], initializer="zeros", dtype="float32", name=f"{prefix}_velocity_columns"
        )
        return rows

    def update_step(self, gradient, variable, learning_rate):
        if self._keras_own and not _is_bfloat16(variable):
            return super().update_step(gradient, variable, learning_rate)
        dtype = "float32"  # the update's arithmetic, whatever the weight's dtype
        cast = keras.ops.cast
        gradient = cast(gradient, dtype)
        iterations = keras.ops.convert_to_tensor(self.iterations)  # int64 under x64, else int32
        step = cast(iterations + 1, dtype)
        alpha = cast(learning_rate, dtype) * jnp.sqrt(1 - self.beta_2**step) / (1 - self.beta_1**step)
        index = self._get_variable_index(variable)  # Keras' Adam's own slots (checked on Keras 3.15.1)
        m_slot = self._momentums[index]
        m = cast(self._read(m_slot), dtype)
        m = m + (gradient - m) * (1 - self.beta_1)  # Keras' AdamW, in float32
        self._store(m_slot, m, iterations, 2 * index)
        if self._factored(variable):
            v = self._factored_second_moment(self._velocities[index], self._columns[variable.path], gradient)
        else:
            v_slot = self._velocities[index]
            v = cast(self._read(v_slot), dtype)
            v = v + (gradient * gradient - v) * (1 - self.beta_2)
            self._store(v_slot, v, iterations, 2 * index + 1)
        update = m * alpha / (jnp.sqrt(v) + self.epsilon)
        if not _is_bfloat16(variable):
            self.assign_sub(variable, update)
            return
        weight = cast(variable, dtype)
        if applies_weight_decay(self, variable):  # Keras' decoupled decay, w - w * wd * lr, before the update
            weight = weight - weight * cast(self.weight_decay, dtype) * cast(learning_rate, dtype)
        weight = weight - update
        self.assign(variable, _rounded(weight, iterations, _WEIGHT_SALT + index))

    def _read(self, slot):
        """A slot's value on the device (moved there from the host's memory under "host")."""
        value = slot.value
        return jax.device_put(value, jax.memory.Space.Device) if self.state_memory == "host" else value

    def _write(self, slot, value):
        """Assign ``value`` to ``slot``, moved back to the host's memory under "host"."""
        self.assign(slot, jax.device_put(value, jax.memory.Space.Host) if self.state_memory == "host" else value)

    def _store(self, slot, value, iterations, salt):
        """Write a float32 moment into its slot: as is, or rounded stochastically to bfloat16."""
        self._write(slot, value if slot.dtype == "float32" else _rounded(value, iterations, salt))

    def _factored_second_moment(self, rows_slot, columns_slot, gradient):
        """Update the two running means from ``gradient`` (..., n) and return the second
        moment they stand for: rows (...) x columns (n,) / the rows' mean."""
        squared = gradient * gradient + 1e-30  # Adafactor's epsilon_1: no row or column of exact zeros
        rows, columns = self._read(rows_slot), self._read(columns_slot)
        rows = rows + (jnp.mean(squared, axis=-1) - rows) * (1 - self.beta_2)  # (...)
        columns = columns + (jnp.mean(squared, axis=tuple(range(gradient.ndim - 1))) - columns) * (1 - self.beta_2)
        self._write(rows_slot, rows)  # (...)
        self._write(columns_slot, columns)  # (n,)
        return rows[..., None] * columns / jnp.mean(rows)  # (..., n)

    def get_config(self):
        return {
            **super().get_config(),
            "moment_dtype": self.moment_dtype,
            "second_moment": self.second_moment,
            "state_memory": self.state_memory,
        }


STATE_SETTINGS = ("moment_dtype", "second_moment", "state_memory")  # the jobs' settings of AdamW's state


def state_options(settings):
    """``{moment_dtype, second_moment, state_memory}`` of a job's ``settings``: the keyword
    arguments of ``AdamW`` and ``make_optimizer`` that shape the optimizer's state."""
    return {name: getattr(settings, name) for name in STATE_SETTINGS}


def is_keras_own(moment_dtype, second_moment, state_memory="device"):
    """Whether these settings are Keras' own Adam(W): float32 moments, the second one whole,
    on the device."""
    return moment_dtype == "float32" and second_moment == "full" and state_memory == "device"


def make_optimizer(name, learning_rate, *, moment_dtype="float32", second_moment="full", state_memory="device"):
    """The fine-tuning jobs' optimizer: ``adam`` (``keras.optimizers.Adam`` with float32
    moments, whole, else this module's ``AdamW`` with no weight decay, the same update,
    ``moment_dtype`` and ``second_moment``) or ``sgd`` (plain ``w -= lr * g``: its steps
    are the gradients)."""
    if name == "sgd":
        if learning_rate is None:
            raise ValueError("optimizer sgd has no default learning rate; give one (--learning-rate)")
        for flag, value, default in (
            ("--moment-dtype", moment_dtype, "float32"),
            ("--second-moment", second_moment, "full"),
            ("--state-memory", state_memory, "device"),
        ):
            if value != default:
                raise ValueError(f"optimizer sgd keeps no moments; {flag} {value} needs optimizer adam")
        return keras.optimizers.SGD(learning_rate)
    if name != "adam":
        raise ValueError(f"unknown optimizer {name!r}; choose adam or sgd")
    if is_keras_own(moment_dtype, second_moment, state_memory):
        return keras.optimizers.Adam(learning_rate)
    return AdamW(
        learning_rate,
        weight_decay=0.0,
        moment_dtype=moment_dtype,
        second_moment=second_moment,
        state_memory=state_memory,
    )
