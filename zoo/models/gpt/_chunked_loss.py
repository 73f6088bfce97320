"""Next-token cross-entropy from hidden states, in chunks of tokens: the (B, T, V) float32
logits, their log-softmax and their gradient are never whole in memory.

``chunked_cross_entropy(hidden, head_fn, labels, sample_weight, chunk_tokens=t)`` equals
``SparseCategoricalCrossentropy(from_logits=True, reduction=...)(labels, head_fn(hidden),
sample_weight)``, forward and gradients, but runs the head ``head_fn`` (B, t, C) -> (B, t,
V) on one chunk of t positions of every row at a time, inside a ``jax.lax.scan``. Peak:
one chunk's (B, t, V) float32 logits and their gradient, instead of three (B, T, V)
buffers.

The gradient is computed in the forward scan, chunk by chunk (a ``jax.custom_vjp``): each
chunk's logits give its loss and, at once, the gradients of that loss with respect to the
chunk's hidden states and the head's weights (summed over the chunks); the backward only
scales them by the loss' cotangent. The head's matmul then runs three times per chunk
(logits, their gradient with respect to the hidden states and to the weights), not four:
a loss whose backward recomputed each chunk's logits (``jax.checkpoint``, before) ran the
forward matmul twice. The head's weights reach the custom VJP as explicit arguments
through ``jax.closure_convert`` (``head_fn`` closes over them: Keras' traced variables).
Residuals: the hidden states' gradient (B, T, C), in their dtype, and the head's.

Chunk ``i`` of ``n = ceil(T / t)`` holds the positions ``a * n + i`` (a < t), strided, not
contiguous: a sequence split over a mesh axis (the ``context`` layout's ``seq``) is split
the same way within every chunk when ``t`` is a multiple of that axis, so each device
scans its own tokens and no chunk is gathered. T not a multiple of t is padded with
weight-0 positions (zero hidden states), which add nothing.

Vocabulary-parallel under the ``tp`` layouts: the head's weights are split over V on
``model``, so each chunk's logits come out split over V; the max, the sum of exponentials
and the label's logit (a compare with an iota, not a gather) are reductions over V that
GSPMD turns into per-device partial results and an all-reduce of (B, t) values. No
(B, t, V) all-gather (tests/models/test_chunked_loss.py reads the compiled HLO).

Reductions as Keras' losses have them: ``sum``, ``sum_over_batch_size`` (the sum over the
B x T weighted losses) and ``mean_with_sample_weight`` (over the sum of the weights;
without weights, as ``sum_over_batch_size``); a zero divisor gives 0 (``divide_no_nan``).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

REDUCTIONS = ("sum", "sum_over_batch_size", "mean_with_sample_weight")


def check_chunk_tokens(chunk_tokens):
    """``chunk_tokens``: None (no chunking) or a positive int; the ``ValueError`` names it."""
    if chunk_tokens is None:
        return None
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(f"loss_chunk_size must be a positive number of tokens or None, got {chunk_tokens!r}")
    return chunk_tokens


def token_losses(logits, labels):
    """-log softmax(logits)[label] per token: f32 (..., V), int (...) -> f32 (...).

    The label's logit is picked by comparing an iota over V with the label, so logits
    split over V stay split (a gather would all-gather them)."""
    shift = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))  # (..., 1)
    log_sum = jnp.log(jnp.sum(jnp.exp(logits - shift), axis=-1)) + shift[..., 0]  # (...)
    vocabulary = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)  # (..., V)
    picked = jnp.sum(jnp.where(vocabulary == labels[..., None].astype(jnp.int32), logits, 0.0), axis=-1)  # (...)
    return log_sum - picked


def chunked_cross_entropy(
    hidden, head_fn, labels, sample_weight=None, *, chunk_tokens, reduction="mean_with_sample_weight", summed=None
):
    """The reduced cross-entropy of ``head_fn(hidden)`` against ``labels``, chunk by chunk.

    Args:
        hidden: (B, T, C) hidden states, any float dtype.
        head_fn: (B, t, C) -> (B, t, V) logits (cast to float32 here): the LM head with
            its final soft-cap, e.g. ``GPTCausalLM.logits``.
        labels: int (B, T) next-token ids.
        sample_weight: (B, T) weights (0 masks a token), or None (all 1).
        chunk_tokens: t, positions of every row per chunk.
        reduction: one of ``REDUCTIONS``.
        summed: None, or ``(hidden, labels, weights) -> f32[]`` computing ``chunk_sum``
            (with ``head_fn`` and ``chunk_tokens``) another way: the causal LM's runs it
            manual over the batch axes, so the head's gradient is reduced once per step,
            not once per chunk.

    Returns a float32 scalar.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(
            f"reduction {reduction!r} is not supported by the chunked loss; choose one of {', '.join(REDUCTIONS)}"
        )
    check_chunk_tokens(chunk_tokens)
    batch, length = labels.shape
    weights = (
        jnp.ones((batch, length), jnp.float32)
        if sample_weight is None
        else jnp.asarray(sample_weight, jnp.float32).reshape(batch, length)
    )
    if summed is None:
        total = chunk_sum(hidden, head_fn, labels, weights, chunk_tokens)
    else:
        total = summed(hidden, labels, weights)
    if reduction == "sum":
        return total
    if reduction == "mean_with_sample_weight" and sample_weight is not None:
        divisor = jnp.sum(weights)
    else:
        divisor = jnp.asarray(batch * length, jnp.float32)
    return jnp.where(divisor == 0, 0.0, total / jnp.where(divisor == 0, 1.0, divisor))


def chunk_sum(hidden, head_fn, labels, weights, chunk_tokens):
    """The weighted sum of the token losses of ``head_fn(hidden)``, t positions of every
    row at a time: (B, T, C), (B, T) int, (B, T) f32 -> f32[]."""
    batch, length = labels.shape
    chunk = min(chunk_tokens, length)
    chunks = -(-length // chunk)  # n
    padding = chunks * chunk - length
    if padding:
        hidden = jnp.pad(hidden, ((0, 0), (0, padding), (0, 0)))
        labels = jnp.pad(labels, ((0, 0), (0, padding)))
        weights = jnp.pad(weights, ((0, 0), (0, padding)))

    def strided(x):  # (B, n * t, ...) -> (n, B, t, ...): chunk i holds positions a * n + i
        return jnp.moveaxis(x.reshape(batch, chunk, chunks, *x.shape[2:]), 2, 0)

    def one_chunk(h, y, w):  # (B, t, C), (B, t), (B, t) -> f32[]
        logits = head_fn(h).astype(jnp.float32)  # (B, t, V)
        return jnp.sum(token_losses(logits, y) * w)

    hs, ys, ws = strided(hidden), strided(labels), strided(weights)  # (n, B, t, ...)
    chunk_loss, head = jax.closure_convert(one_chunk, hs[0], ys[0], ws[0])  # the head's weights, explicit
    return _fused_sum(chunk_loss, hs, ys, ws, head)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused_sum(chunk_loss, hs, ys, ws, head):
    """sum over chunks i of ``chunk_loss(hs[i], ys[i], ws[i], *head)`` -> f32[]; undifferentiated
    (evaluate, the held-out loss) no gradient is taken."""

    def body(total, xs):
        return total + chunk_loss(*xs, *head), None

    return jax.lax.scan(body, _zero_like(ws), (hs, ys, ws), reverse=True)[0]


def _zero_like(ws):
    """f32 0, typed like the weights (varying over a shard_map's manual axes, as the chunks' sums are)."""
    return jnp.sum(ws[0, :, :0])


def _scan_with_gradients(chunk_loss, hs, ys, ws, head):
    """(the sum, d sum / d hs (n, B, t, C), d sum / d head): each chunk's gradients taken as
    its loss is, the head's summed in the scan's carry."""

    def body(carry, xs):
        total, head_grad = carry
        h, y, w = xs
        loss, pullback = jax.vjp(lambda h, head: chunk_loss(h, y, w, *head), h, head)
        h_grad, chunk_head_grad = pullback(jnp.ones_like(loss))
        return (total + loss, jax.tree.map(jnp.add, head_grad, chunk_head_grad)), h_grad

    zero = _zero_like(ws)
    head_zero = jax.tree.map(lambda p: jnp.zeros(p.shape, p.dtype) + zero.astype(p.dtype), head)  # varying too
    # in reverse: the order in which a checkpointed scan's backward summed the head's gradient (the same rounding)
    (total, head_grad), hs_grad = jax.lax.scan(body, (zero, head_zero), (hs, ys, ws), reverse=True)
    return total, hs_grad, head_grad


def _fused_sum_forward(chunk_loss, hs, ys, ws, head):
    total, hs_grad, head_grad = _scan_with_gradients(chunk_loss, hs, ys, ws, head)
    return total, (hs_grad, head_grad, ys, ws)


def _fused_sum_backward(chunk_loss, residuals, cotangent):  # the loss' cotangent scales the gradients taken
    hs_grad, head_grad, ys, ws = residuals
    scale = lambda grad: (grad * cotangent).astype(grad.dtype)  # noqa: E731
    labels_zero = np.zeros(ys.shape, jax.dtypes.float0)  # integer labels: no gradient
    # the weights (sample weights, padding) are data, never trained: no gradient is taken for them
    return scale(hs_grad), labels_zero, jnp.zeros_like(ws), jax.tree.map(scale, head_grad)


_fused_sum.defvjp(_fused_sum_forward, _fused_sum_backward)
