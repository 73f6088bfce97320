"""KV-cache generation for ``GPTCausalLM``: prompts of different lengths, stop tokens, streaming.

Prompts are left-padded to the longest (P) and each row's first real position is passed to
the cached call as ``start_positions``: its padding is masked and its rotary positions count
from its first token, so a row computes what its prompt alone computes. One ``jax.jit``
runs a prefill pass over the P prompt columns, then a ``while_loop`` of decode steps that
ends when every row has emitted a stop token or all N tokens are out. The model's variables
are the program's arguments, so it always sees the current weights. A pipelined model
(``PipelinedBlocks``, which has no KV cache) decodes through ``LayerByLayer``, a twin
with one block per layer whose weights are slices of the stacked ones.

Letters: B batch, P longest prompt, N new tokens, S = P + N cache length, V vocabulary.
"""

import contextlib
import itertools
import re
import weakref

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.experimental import io_callback

from zoo._compat import forgetting_deferred_variables
from zoo.distribution.distributions import global_distribution
from zoo.models.dtype_policy import dtype_policy_scope
from zoo.models.gpt import _sampling

# model -> {static settings: jitted program}; dropped with the model.
_PROGRAMS = weakref.WeakKeyDictionary()
# pipelined model -> its LayerByLayer twin (built once, abstractly); dropped with the model.
_TWINS = weakref.WeakKeyDictionary()
# call id -> the host side of one streaming call; the program passes the id to the callback.
_LISTENERS = {}
_CALL_IDS = itertools.count()


# --- prompts, lengths, stop ids ---------------------------------------------------------


def as_prompts(prompts, vocabulary_size, pad_id):
    """``(token_ids int32 (B, P), start_positions int32 (B,))`` from an int array (B, P)
    or a list of token-id lists of any lengths >= 1, left-padded with ``pad_id``."""
    if hasattr(prompts, "shape") and hasattr(prompts, "dtype"):  # a NumPy or JAX array
        array = np.asarray(prompts)
        if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 1:
            raise ValueError(f"prompts must be (batch, prompt length >= 1) token ids, got shape {array.shape}")
        rows = list(array)
    else:
        rows = [np.asarray(row) for row in prompts]
        if not rows:
            raise ValueError("prompts is empty: give at least one prompt")
    for index, row in enumerate(rows):
        _check_row(index, row, vocabulary_size)
    width = max(len(row) for row in rows)  # P
    token_ids = np.full((len(rows), width), pad_id, np.int32)  # (B, P)
    for index, row in enumerate(rows):
        token_ids[index, width - len(row) :] = row
    return token_ids, np.array([width - len(row) for row in rows], np.int32)


def _check_row(index, row, vocabulary_size):
    if row.ndim != 1 or row.size == 0:
        raise ValueError(f"prompt {index} must be a non-empty list of token ids, got shape {row.shape}")
    if not np.issubdtype(row.dtype, np.integer):
        raise ValueError(f"prompts must be integer token ids, got dtype {row.dtype} in prompt {index}")
    if row.min() < 0 or row.max() >= vocabulary_size:
        raise ValueError(
            f"prompt token ids must be in [0, vocabulary size {vocabulary_size}), "
            f"got range [{row.min()}, {row.max()}] in prompt {index}"
        )


def from_padding_mask(token_ids, padding_mask):
    """``(token_ids int32 (B, P), start_positions int32 (B,))`` from left-padded ids and
    their bool mask (B, P), True on real tokens (``generate_preprocess``'s output)."""
    mask = np.asarray(padding_mask, bool)
    starts = mask.shape[1] - mask.sum(axis=1)  # (B,)
    if not np.array_equal(mask, np.arange(mask.shape[1])[None, :] >= starts[:, None]):
        raise ValueError(
            "the preprocessor's padding_mask is not left padding (False ... False True ... True in every row)"
        )
    if (starts == mask.shape[1]).any():
        raise ValueError(f"prompt {int(np.argmax(starts == mask.shape[1]))} has no tokens")
    return np.asarray(token_ids, np.int32), starts.astype(np.int32)


def is_text(prompts):
    """A string, or a non-empty list or tuple of strings."""
    if isinstance(prompts, str):
        return True
    return isinstance(prompts, (list, tuple)) and len(prompts) > 0 and all(isinstance(p, str) for p in prompts)


def check_lengths(prompt_length, max_new_tokens, max_sequence_length):
    """Raises the ``ValueError`` ``GPTCausalLM.generate`` raises when ``max_new_tokens`` is no
    positive integer or the prompt and the new tokens exceed ``max_sequence_length``."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if prompt_length + max_new_tokens > max_sequence_length:
        raise ValueError(
            f"prompt length {prompt_length} + max_new_tokens {max_new_tokens} = "
            f"{prompt_length + max_new_tokens} exceeds max_sequence_length {max_sequence_length}"
        )


def stop_mask(stop_token_ids, vocabulary_size):
    """bool[V], True on the stop ids: an argument of the program, so any stop set shares it."""
    ids = [int(i) for i in stop_token_ids]
    if any(not 0 <= i < vocabulary_size for i in ids):
        raise ValueError(f"stop_token_ids must be in [0, vocabulary size {vocabulary_size}), got {tuple(ids)}")
    mask = np.zeros(vocabulary_size, bool)
    mask[ids] = True
    return mask


def padding_mask(start_positions, lengths, prompt_length, total):
    """bool (B, S): True on each row's prompt and generated tokens (a stop token included)."""
    positions = np.arange(total)[None, :]
    return (positions >= start_positions[:, None]) & (positions < prompt_length + lengths[:, None])


# --- the program --------------------------------------------------------------------------


def generate(model, token_ids, start_positions, *, max_new_tokens, sampler, temperature, top_k, top_p, seed,
             stop_ids, pad_id, stream=None):  # fmt: skip
    """``(tokens int32 (B, P + N), lengths int32 (B,))``: the left-padded prompts, each row's
    new tokens, then ``pad_id``; ``lengths`` counts each row's new tokens (its stop token
    included). ``stream(tokens int32 (B,), emitted bool (B,))`` is called once per step."""
    batch, prompt_length = token_ids.shape
    program = _program(model, batch, prompt_length, max_new_tokens, sampler, stream is not None)
    seed = np.random.randint(2**31 - 1) if seed is None else seed
    values = [variable.value for variable in model.variables]
    settings = dict(temperature=jnp.float32(temperature), top_k=jnp.int32(top_k or 1), top_p=jnp.float32(top_p or 1.0))
    with _listening(stream) as (call_id, listener):
        tokens, lengths = program(
            values, jnp.asarray(token_ids), jnp.asarray(start_positions), jax.random.key(seed), settings,
            jnp.asarray(stop_ids), jnp.int32(pad_id), jnp.int32(call_id),
        )  # fmt: skip
        tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    if listener is not None and listener.error is not None:
        raise listener.error
    return tokens, lengths


def _program(model, batch, prompt_length, max_new_tokens, sampler, streaming):
    """The jitted program for these static settings (compiled once, then reused)."""
    settings = (batch, prompt_length, max_new_tokens, sampler, streaming)
    programs = _PROGRAMS.setdefault(model, {})
    if settings not in programs:
        programs[settings] = jax.jit(_decode_fn(model, *settings))
    return programs[settings]


def _decode_fn(model, batch, prompt_length, max_new_tokens, sampler, streaming):
    total = prompt_length + max_new_tokens  # S: cache length and output length
    decoder = decoding_model(model)  # the model, or a pipelined one's layer-by-layer twin

    def choose(logits, key, position, settings):
        """Token at ``position`` from the previous position's logits f32[B, V]."""
        return _sampling.sample(logits, jax.random.fold_in(key, position), sampler=sampler, **settings)

    def emit(call_id, chosen, active):
        """bool scalar: True when the host asks to stop (its callback raised)."""
        if not streaming:
            return jnp.bool_(False)
        return io_callback(_on_host, jax.ShapeDtypeStruct((), jnp.bool_), call_id, chosen, active, ordered=True)

    def run(values, prompts, starts, key, settings, is_stop, pad, call_id):
        with keras.StatelessScope(state_mapping=decoder.state_mapping(values)):
            caches = decoder.model.backbone.empty_caches(batch, total)  # L x (B, 2, S, K, D)
            logits, caches = decoder.model.call_with_cache(prompts, caches, 0, starts)  # prefill: (B, P, V)
            tokens = jnp.full((batch, total), pad, jnp.int32).at[:, :prompt_length].set(prompts)  # (B, S)
            first = choose(logits[:, -1], key, prompt_length, settings)  # (B,)
            tokens = tokens.at[:, prompt_length].set(first)
            halt = emit(call_id, first, jnp.ones((batch,), bool))
            state = (jnp.int32(prompt_length), tokens, caches, is_stop[first], jnp.ones((batch,), jnp.int32), halt)

            def going(state):
                index, _, _, done, _, halt = state
                return (index < total - 1) & ~jnp.all(done) & ~halt

            def step(state):
                """Feed the token at ``index``, write the one at ``index + 1`` (pad in done rows)."""
                index, tokens, caches, done, lengths, _ = state
                last = jax.lax.dynamic_slice_in_dim(tokens, index, 1, axis=1)  # (B, 1)
                logits, caches = decoder.model.call_with_cache(last, caches, index, starts)  # (B, 1, V)
                chosen = jnp.where(done, pad, choose(logits[:, -1], key, index + 1, settings))  # (B,)
                tokens = jax.lax.dynamic_update_slice_in_dim(tokens, chosen[:, None], index + 1, axis=1)
                halt = emit(call_id, chosen, ~done)
                return index + 1, tokens, caches, done | is_stop[chosen], lengths + ~done, halt

            _, tokens, _, _, lengths, _ = jax.lax.while_loop(going, step, state)
        return tokens, lengths

    return run


# --- which model decodes: a pipelined one through its blocks one by one -----------------------


def decoding_model(model):
    """What runs the KV-cache loop for ``model``: ``_Itself`` (its own variables), or for a
    backbone with stacked blocks (a ``schedule`` or ``scan_layers``) its ``LayerByLayer`` twin."""
    if not model.backbone.stacked:
        return _Itself(model)
    if model not in _TWINS:
        _TWINS[model] = LayerByLayer(model)
    return _TWINS[model]


class _Itself:
    def __init__(self, model):
        self.model = model

    def state_mapping(self, values):
        return list(zip(self.model.variables, values))


class LayerByLayer:
    """The twin of a ``GPTCausalLM`` with stacked blocks (pipelined or scanned), with blocks
    ``block_0`` .. ``block_{L-1}`` (``schedule`` None, ``scan_layers`` False), which has the KV-cache path a ``PipelinedBlocks`` lacks.

    Built once, abstractly (no weight of its own is allocated: ``StatelessScope`` without
    initialisation, under no distribution), in the pipelined model's dtype policy. Its
    weights are computed from the pipelined model's inside the program
    (``state_mapping``): block i's are row i of each stacked (R, L/R, ...) weight
    reshaped to (L, ...), ``PipelinedBlocks``' order for every schedule; the embedding,
    final norm and head are the same variables; the per-block dropout seeds, which
    inference never reads, are zeros.
    """

    BLOCK = re.compile(r"block_(\d+)/(.+)")

    def __init__(self, model):
        backbone = model.backbone
        config = {**backbone.get_config(), "schedule": None, "micro_batches": 1, "repeats": 1, "scan_layers": False}
        with dtype_policy_scope(backbone.token_embedding.dtype_policy), global_distribution(None):
            with forgetting_deferred_variables(), keras.StatelessScope(initialize_variables=False):
                self.model = type(model)(backbone=type(backbone).from_config(config))
        own = {variable.path: index for index, variable in enumerate(model.variables)}
        blocks = backbone.pipelined_blocks
        stacked = {path: own[variable.path] for path, variable in blocks.stacked.items()}
        self.sources = [self._source(variable, own, stacked) for variable in self.model.variables]

    def _source(self, variable, own, stacked):
        """How the twin's ``variable`` gets its value: ("same", index), ("block", index,
        layer) or ("zeros", shape, dtype)."""
        match = self.BLOCK.fullmatch(variable.path)
        if match and match.group(2) in stacked:
            return ("block", stacked[match.group(2)], int(match.group(1)))
        if variable.path in own:
            return ("same", own[variable.path], None)
        if "seed_generator" in variable.path:
            return ("zeros", variable.shape, variable.dtype)
        raise ValueError(
            f"the layer-by-layer twin of a pipelined GPT has a weight {variable.path!r} the pipelined model lacks"
        )

    def state_mapping(self, values):
        """[(twin variable, value)] from the pipelined model's ``values`` (its ``variables``' order)."""
        mapping = []
        for variable, (kind, first, second) in zip(self.model.variables, self.sources):
            if kind == "block":
                stack = values[first]  # (R, L/R, *block shape)
                value = jnp.reshape(stack, (-1, *stack.shape[2:]))[second]  # layer i of (L, *block shape)
            elif kind == "same":
                value = values[first]
            else:
                value = jnp.zeros(first, second)
            mapping.append((variable, value))
        return mapping


# --- streaming: the host side ---------------------------------------------------------------


class _Listener:
    """Forwards one call's steps to ``stream``; keeps the first error it raises."""

    def __init__(self, stream):
        self.stream = stream
        self.error = None

    def __call__(self, chosen, active):
        if self.error is not None:
            return True
        try:
            self.stream(np.asarray(chosen, np.int32), np.asarray(active, bool))
        except BaseException as error:  # re-raised by ``generate`` once the program has stopped
            self.error = error
        return self.error is not None


def _on_host(call_id, chosen, active):
    listener = _LISTENERS.get(int(call_id))
    return np.asarray(listener is not None and listener(chosen, active), bool)


@contextlib.contextmanager
def _listening(stream):
    """``with _listening(stream) as (call_id, listener)``: ``stream`` receives the steps of the
    program call made with ``call_id`` (an int32 argument the callback passes back)."""
    call_id = next(_CALL_IDS) % (2**31 - 1)
    listener = None if stream is None else _Listener(stream)
    if listener is not None:
        _LISTENERS[call_id] = listener
    try:
        yield call_id, listener
    finally:
        _LISTENERS.pop(call_id, None)


def token_stream(callback):
    """A ``stream`` that calls ``callback(new_ids)``: one list per row, holding the id the
    row produced this step, or empty once the row has stopped."""

    def stream(chosen, active):
        callback([[token] if emitted else [] for token, emitted in zip(chosen.tolist(), active.tolist())])

    return stream


def is_conversation_list(messages):
    """Whether ``messages`` is a list of conversations (each a list of messages), not one
    conversation (a list of ``{"role", "content"}`` dicts)."""
    return (
        isinstance(messages, (list, tuple))
        and bool(messages)
        and all(isinstance(item, (list, tuple)) for item in messages)
    )


class TextStream:
    """A ``stream`` for token ids that calls ``write(pieces)``, one string per row: the text
    the row gained since the last call (called only when some row gained text).

    Each row's new ids are decoded together (``tokenizer.decode``: special tokens and
    padding skipped; the tokenizer's stop tokens left out, as ``generate_postprocess``
    leaves them out) and only the text not yet written goes out. Trailing U+FFFD (a
    character whose bytes have not all arrived) waits for the next step or ``flush``.
    """

    def __init__(self, tokenizer, batch, write):
        self.tokenizer, self.write = tokenizer, write
        self.stops = set(tokenizer.stop_token_ids)
        self.ids = [[] for _ in range(batch)]
        self.written = [0] * batch

    def __call__(self, chosen, active):
        for row, (token, emitted) in enumerate(zip(chosen.tolist(), active.tolist())):
            if emitted and token not in self.stops:
                self.ids[row].append(token)
        self._write(final=False)

    def flush(self):
        self._write(final=True)

    def _write(self, final):
        pieces = []
        for row, ids in enumerate(self.ids):
            text = self.tokenizer.decode(np.asarray(ids, np.int32)) if ids else ""
            ready = text if final else text.rstrip("\ufffd")
            pieces.append(ready[self.written[row] :])
            self.written[row] = max(self.written[row], len(ready))
        if any(pieces):
            self.write(pieces)


def check_prompts_or_messages(prompts, messages, max_new_tokens):
    """``generate`` takes ``prompts`` or ``messages`` (one of them), and ``max_new_tokens``."""
    if (prompts is None) == (messages is None):
        raise ValueError("generate takes prompts (text or token ids) or messages (a conversation), one of them; "
                         f"got {'both' if messages is not None else 'neither'}")  # fmt: skip
    if max_new_tokens is None:
        raise ValueError("generate needs max_new_tokens (N >= 1)")


def tokenize_conversations(model, messages, vocabulary_size, pad_id):
    """A conversation or a list of them -> ``(token_ids (B, P), start_positions (B,))``
    through the tokenizer's chat template with the generation prompt, left-padded."""
    tokenizer = getattr(model.preprocessor, "tokenizer", None)
    if not hasattr(tokenizer, "apply_chat_template"):
        raise ValueError(f"messages go through a chat template, and this {type(model).__name__}'s preprocessor has "
                         f"{'no tokenizer' if tokenizer is None else 'a ' + type(tokenizer).__name__} (a Hugging Face "
                         "tokenizer with a chat template has one); pass text prompts or token ids")  # fmt: skip
    conversations = messages if is_conversation_list(messages) else [messages]
    rows = [
        list(tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True))
        for conversation in conversations
    ]
    return as_prompts(rows, vocabulary_size, pad_id)


def tokenize_prompts(model, prompts):
    """Text prompts -> ``(token_ids (B, P), start_positions (B,))`` through the preprocessor."""
    if not hasattr(model.preprocessor, "generate_preprocess"):
        held = (
            "no preprocessor" if model.preprocessor is None else f"a {type(model.preprocessor).__name__} preprocessor"
        )
        raise ValueError(
            f"prompts are text, but this {type(model).__name__} has {held} to tokenize them: attach one "
            f"(model.preprocessor = GPTCausalLMPreprocessor(tokenizer, sequence_length=...)) or pass token ids"
        )
    return from_padding_mask(*model.preprocessor.generate_preprocess(prompts))  # (B, P) left-padded
