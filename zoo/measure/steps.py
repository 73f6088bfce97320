"""The one hand-written train step: Keras' ``train_step`` without the metric updates.

``stateless_train_step(model)`` is ``step(state, x, y) -> (loss, state)`` with
``state = (trainable, non_trainable, optimizer)`` (``model_state``): forward in training
mode (batch-norm statistics updated), ``model.compute_loss``, gradients,
``optimizer.stateless_apply``. Pure, so it can be jitted, lowered and read
(``zoo.measure.comms_report.train_step``) or timed against ``fit``
(``zoo.bench._fit_vs_jit``). The exact step ``fit`` runs, metrics included, is
``zoo.measure.compiled_step.compile_fit_step``.
"""

import jax

__all__ = ["model_state", "stateless_train_step"]


def stateless_train_step(model):
    """``step(state, x, y) -> (loss, state)`` of a compiled Keras model (see the module docstring)."""
    if getattr(model, "optimizer", None) is None:
        raise ValueError(f"model {model.name!r} is not compiled: call model.compile(optimizer=..., loss=...) first")
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)

    def loss_and_updates(trainable, non_trainable, x, y):
        y_pred, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
        loss = model.compute_loss(x=x, y=y, y_pred=y_pred, training=True)  # f32[]
        return loss, non_trainable

    def step(state, x, y):
        trainable, non_trainable, optimizer = state
        grad_fn = jax.value_and_grad(loss_and_updates, has_aux=True)
        (loss, non_trainable), grads = grad_fn(trainable, non_trainable, x, y)
        trainable, optimizer = model.optimizer.stateless_apply(optimizer, grads, trainable)
        return loss, (trainable, non_trainable, optimizer)

    return step


def model_state(model):
    """The model's current values as ``(trainable, non_trainable, optimizer)`` lists of arrays."""
    return (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in model.optimizer.variables],
    )
