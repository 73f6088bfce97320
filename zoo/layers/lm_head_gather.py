"""``LMHeadGather``: under FSDP, whether the language-model head gathers its weight or the
activations, chosen by which moves fewer bytes.

Under the ``fsdp`` layout the head's weight (the (V, C) token table of a tied head, the
(C, V) kernel of an untied one) is split on V over the axis the batch is split over
(``data``, N devices). The logits ``x @ W`` (B, T, V) of the hidden states x (B/N, T, C)
can be computed two ways, and GSPMD, left alone, does not pick by size:

===========  ===============================================  ==========================
gather       collectives over the batch axis                  elements one device sends
===========  ===============================================  ==========================
activations  forward: all-gather of x (B, T, C); the logits   2 (N-1)/N x B T C
             come out (B, T, V/N), split on V; backward:
             reduce-scatter of the input gradient (B, T, C)
table        forward: all-gather of W (V x C); the logits     2 (N-1)/N x V C
             come out (B/N, T, V), split on the batch;
             backward: reduce-scatter of W's gradient
===========  ===============================================  ==========================

B is the *global* batch: at a fixed batch per device the activations grow with N, the
table does not, so the activations win on a few devices and the table on many
(Llama-3.2-1B, T = 2048, one sequence per device: V = 128,256 > B T from N = 63 on).
Both gathers move the head's operands in the compute dtype, so the choice compares
elements: ``table`` when V x C < B x T x C, else ``activations`` (a tie keeps the
activations, what GSPMD does by itself). ``lm_head_gather`` makes the choice from the
shapes of a call and the current distribution; ``constrain_input`` / ``constrain_logits``
pin it with sharding constraints on the head's input (B, T, C) and output (B, T, V).

Nothing is chosen (``choice`` None, no constraint) unless the weight is split on V alone,
over the batch's one axis, and the sequence is whole: under ``tp`` the vocabulary is
split over ``model`` (vocab-parallel, no gather), under ``fsdp+tp`` and ``context`` the
other splits decide.
"""

import dataclasses

import keras

from zoo.layers._parallel_plan import resolve_plan, weight_axes

TABLE = "table"
ACTIVATIONS = "activations"


@dataclasses.dataclass(frozen=True)
class LMHeadGather:
    """What the LM head gathers for one call shape; sizes in elements, per step."""

    choice: str | None = None  # TABLE, ACTIVATIONS, or None: nothing to choose (no constraint)
    axis: str | None = None  # the mesh axis the batch and the weight's V are split over
    axis_size: int = 1  # N
    activation_elements: int = 0  # B x T x C: the global batch's hidden states
    table_elements: int = 0  # V x C: the head's weight
    keras_mesh: object = dataclasses.field(default=None, repr=False, compare=False)

    def describe(self):
        """One line: the choice and the two sizes it was made from."""
        if self.choice is None:
            return "lm_head: no choice to make (its weight is not split on V over the batch's axis alone)"
        sizes = f"activations B*T*C = {self.activation_elements:,} vs table V*C = {self.table_elements:,} elements"
        return f"lm_head: gathers the {self.choice} over {self.axis} ({self.axis_size}): {sizes}"


def lm_head_gather(weight, *, batch_size, sequence_length, vocabulary_dim):
    """The ``LMHeadGather`` of a head with ``weight`` (a Keras variable, V on dimension
    ``vocabulary_dim``: 0 for a (V, C) table, 1 for a (C, V) kernel) applied to hidden
    states of ``batch_size`` (global) x ``sequence_length`` tokens, under the current
    distribution."""
    plan = resolve_plan()
    axes = weight_axes(weight)
    axis = plan.batch_axis
    if axes is None or axis is None or isinstance(axis, tuple) or plan.sequence_axis is not None:
        return LMHeadGather()
    if axes != tuple(axis if dim == vocabulary_dim else None for dim in range(len(axes))):
        return LMHeadGather()
    vocabulary, hidden = weight.shape[vocabulary_dim], weight.shape[1 - vocabulary_dim]
    activations, table = batch_size * sequence_length * hidden, vocabulary * hidden
    return LMHeadGather(
        choice=TABLE if table < activations else ACTIVATIONS,
        axis=axis,
        axis_size=plan.batch_size,
        activation_elements=activations,
        table_elements=table,
        keras_mesh=plan.keras_mesh,
    )


def constrain_input(x, gather):
    """x (B, T, C) as the head takes it under ``gather``: split on the batch (``table``) or
    whole on every device (``activations``: the all-gather); as it is without a choice."""
    if gather.choice is None:
        return x
    return _constrain(x, (gather.axis if gather.choice == TABLE else None, None, None), gather)


def constrain_logits(logits, gather):
    """The logits (B, T, V) as the head gives them under ``gather``: split on the batch
    (``table``) or on V (``activations``); as they are without a choice."""
    if gather.choice is None:
        return logits
    axes = (gather.axis, None, None) if gather.choice == TABLE else (None, None, gather.axis)
    return _constrain(logits, axes, gather)


def _constrain(x, axes, gather):
    return keras.distribution.distribute_tensor(x, keras.distribution.TensorLayout(axes, gather.keras_mesh))
