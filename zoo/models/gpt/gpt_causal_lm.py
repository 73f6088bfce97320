"""``GPTCausalLM``: a ``GPTBackbone`` with a language-model head, and KV-cache generation."""

import contextlib
import functools
import os

import jax.numpy as jnp
import keras

from zoo.distribution.axes import DATA, MODEL
from zoo.layers import kernel_variable, lm_head_gather
from zoo.layers.batch_rows import batch_rows_plan, sum_over_batch_rows
from zoo.layers.lm_head_gather import LMHeadGather
from zoo.layers.logit_softcap import LogitSoftcap
from zoo.models.dtype_policy import dtype_policy_scope
from zoo.models.gpt import _chunked_loss, _generation, _gpt_layouts, _hf_save, _sampling, hf_checkpoints
from zoo.models.gpt._block_form import copy_block_form_weights
from zoo.models.gpt.gpt_backbone import GPTBackbone
from zoo.models.gpt.gpt_configs import GPT_CONFIGS, backbone_config, with_depth_pattern
from zoo.models.zoo_model import ZooModel
from zoo.presets import hf_hub


@keras.saving.register_keras_serializable(package="zoo")
class GPTCausalLM(ZooModel):
    """Decoder-only language model: ``token_ids (B, T) int32 -> logits (B, T, V)``.

    keras-hub's ``CausalLM`` shape: a ``GPTBackbone`` followed by the LM head:
    ``lm_head``, a bias-free Dense C -> V, or with the backbone's
    ``tie_word_embeddings=True`` the token embedding used in reverse (``x @ E^T`` with
    the (V, C) table ``E``; no extra weights). The head runs in the compute dtype and the
    logits are cast to float32 (layer ``logits``), as mixed precision wants. Train with
    ``SparseCategoricalCrossentropy(from_logits=True)`` on labels shifted one token left.

    Args:
        backbone: a ``GPTBackbone``; every size is its (``model.backbone.num_layers``, ...).
        preprocessor: kept and saved with the model (``zoo.data.ByteTokenizer``, say), or None;
            the model itself takes token ids.
        loss_chunk_size: None (the loss from the whole logits), or t: ``fit`` and
            ``evaluate`` compute the compiled cross-entropy from the backbone's hidden
            states, the head applied to t positions of every row at a time
            (``_chunked_loss``), so the (B, T, V) float32 logits and their gradient are
            never whole in memory. ``predict``, ``generate`` and calling the model still
            give whole logits. Needs ``SparseCategoricalCrossentropy(from_logits=True)``
            and no compiled metrics.

    Named sizes: ``GPTCausalLM.from_config_name("gpt_tiny", num_layers=4)`` builds
    ``GPTCausalLM(backbone=GPTBackbone(**GPT_CONFIGS["gpt_tiny"], num_layers=4))``.
    """

    CONFIGS = GPT_CONFIGS

    def __init__(self, backbone, preprocessor=None, loss_chunk_size=None, name="gpt_causal_lm", **kwargs):
        token_ids = backbone.input  # (B, T)
        hidden = backbone(token_ids)  # (B, T, C)
        if backbone.tie_word_embeddings:
            logits = backbone.token_embedding(hidden, reverse=True)  # (B, T, V)
        else:
            logits = keras.layers.Dense(backbone.vocabulary_size, use_bias=False, name="lm_head")(hidden)  # (B, T, V)
        logits = _float32_logits(backbone.final_logit_softcap)(logits)  # (B, T, V) float32 under any dtype policy
        super().__init__(inputs=token_ids, outputs=logits, name=name, **kwargs)
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.loss_chunk_size = loss_chunk_size
        self._loss_from_hidden = False  # True while fit / evaluate trace a step with loss_chunk_size set

    def train_step(self, state, data):
        """Keras' JAX ``train_step``, and for a Mixture-of-Experts model the step's router
        statistics in ``logs``: ``router_max_load`` (the busiest expert's share of the
        assignments over the mean share, averaged over the sparse blocks; 1.0 is
        balanced) and ``router_dropped_fraction`` (assignments the capacity dropped)."""
        with self._chunked_loss_step():
            logs, state = super().train_step(state, data)
        statistics = [index for index, variable in enumerate(self.non_trainable_variables)
                      if variable.path.endswith("/router_statistics")]  # fmt: skip
        if statistics:  # one f32[2] per sparse block (a stack's: f32[R, L/R, 2]): their mean
            values = jnp.concatenate([jnp.reshape(state[1][index], (-1, 2)) for index in statistics]).mean(axis=0)
            logs = {**logs, "router_max_load": values[0], "router_dropped_fraction": values[1]}
        return logs, state

    def test_step(self, state, data):
        """Keras' JAX ``test_step``; with ``loss_chunk_size`` the loss in chunks, as in ``train_step``."""
        with self._chunked_loss_step():
            return super().test_step(state, data)

    # --- the loss in chunks (loss_chunk_size) ----------------------------------------------

    @property
    def loss_chunk_size(self):
        """None, or t: ``fit`` and ``evaluate`` compute the loss in chunks of t positions
        (settable before compiling; checked: a positive int)."""
        return self._loss_chunk_size

    @loss_chunk_size.setter
    def loss_chunk_size(self, value):
        self._loss_chunk_size = _chunked_loss.check_chunk_tokens(value)

    @contextlib.contextmanager
    def _chunked_loss_step(self):
        """While fit / evaluate trace a step with ``loss_chunk_size`` set: ``call`` returns
        the backbone's hidden states and ``compute_loss`` applies the head in chunks."""
        if self.loss_chunk_size is None:
            yield
            return
        self._chunked_loss_reduction()  # refuse a loss or metrics the chunked path cannot compute, before tracing
        self._loss_from_hidden = True
        try:
            yield
        finally:
            self._loss_from_hidden = False

    def _chunked_loss_reduction(self):
        """The compiled loss' reduction, checked: the chunked path computes only
        ``SparseCategoricalCrossentropy(from_logits=True)`` and no compiled metrics (they
        would see hidden states)."""
        loss = self.loss
        config = loss.get_config() if isinstance(loss, keras.losses.SparseCategoricalCrossentropy) else {}
        reduction = config.get("reduction")
        if (
            not config.get("from_logits")
            or config.get("ignore_class") is not None
            or reduction not in _chunked_loss.REDUCTIONS
        ):
            raise ValueError(
                f"loss_chunk_size={self.loss_chunk_size} computes SparseCategoricalCrossentropy(from_logits=True, ignore_class=None) "
                f"with reduction one of {', '.join(_chunked_loss.REDUCTIONS)}; this model is compiled with {loss!r} {config}"
            )
        if any(metric.name == "compile_metrics" for metric in self.metrics):
            raise ValueError(
                f"loss_chunk_size={self.loss_chunk_size} does not compute compiled metrics (they would need the whole logits); compile without metrics"
            )
        return reduction

    def call(self, inputs, training=None, mask=None, **kwargs):
        """The backbone, then the head (``logits``) with its gather chosen by size under
        FSDP (``lm_head_gather``): the functional graph's layers, called in its order."""
        hidden = self.backbone(inputs, training=training)  # (B, T, C)
        if self._loss_from_hidden:
            return hidden  # compute_loss applies the head
        return self._head(hidden)  # (B, T, V)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """Keras' ``compute_loss``; inside a chunked step (``loss_chunk_size``) ``y_pred`` is
        the hidden states (B, T, C) and the compiled cross-entropy is computed from them in
        chunks of ``loss_chunk_size`` tokens (``_chunked_loss``), plus the model's ``losses``
        (a Mixture-of-Experts router's auxiliary losses) as Keras adds them."""
        if not self._loss_from_hidden:
            return super().compute_loss(x, y, y_pred, sample_weight, training=training)
        gather = self.lm_head_gather(*y_pred.shape[:2])
        plan = None if gather.choice is not None else batch_rows_plan(y_pred.shape[0])
        summed = None if plan is None else functools.partial(sum_over_batch_rows, plan, _HeadChunkSum(self))
        if gather.choice is not None:  # fsdp: what the head gathers, gathered once, not per chunk and in its recompute
            y_pred = lm_head_gather.constrain_input(y_pred, gather)  # (B, T, C)
        total = _chunked_loss.chunked_cross_entropy(
            y_pred, self._head, y, sample_weight, chunk_tokens=self.loss_chunk_size,
            reduction=self._chunked_loss_reduction(), summed=summed,
        )  # fmt: skip
        for loss in self.losses:
            total = total + keras.ops.cast(keras.ops.sum(loss), "float32")
        return total

    def logits(self, hidden, gather=None):
        """The LM head on hidden states (B, T, C) -> float32 logits (B, T, V); with
        ``gather`` (an ``LMHeadGather``) its input and output pinned to that choice."""
        gather = LMHeadGather() if gather is None else gather
        hidden = lm_head_gather.constrain_input(hidden, gather)  # (B, T, C)
        if self.backbone.tie_word_embeddings:
            logits = self.backbone.token_embedding(hidden, reverse=True)
        else:
            logits = self.get_layer("lm_head")(hidden)
        return lm_head_gather.constrain_logits(self.get_layer("logits")(logits), gather)  # (B, T, V) float32

    def _head(self, hidden):
        """``logits`` with the gather chosen for the tokens it is applied to at once: all
        (B, T) of them, or one chunk's (B, t) in the chunked loss (under fsdp; elsewhere
        the chunks run manual over the batch axes, ``compute_loss``)."""
        return self.logits(hidden, gather=self.lm_head_gather(*hidden.shape[:2]))  # (B, T, V)

    def lm_head_gather(self, batch_size, sequence_length):
        """What the LM head gathers under the current distribution for a global batch of
        ``batch_size`` x ``sequence_length`` tokens: an ``LMHeadGather`` (``choice``
        ``"table"`` or ``"activations"`` under ``fsdp``, whichever moves fewer elements; None
        elsewhere; ``describe()`` says it in words). See ``zoo/layers/lm_head_gather.py``."""
        if self.backbone.tie_word_embeddings:
            weight, vocabulary_dim = self.backbone.token_embedding.embeddings, 0  # (V, C)
        else:  # the kernel variable, which carries the layout: with LoRA ``.kernel`` is the merged tensor
            weight, vocabulary_dim = kernel_variable(self.get_layer("lm_head")), 1  # (C, V)
        if batch_size is None or sequence_length is None:
            return LMHeadGather()
        return lm_head_gather.lm_head_gather(
            weight, batch_size=int(batch_size), sequence_length=int(sequence_length), vocabulary_dim=vocabulary_dim
        )

    def call_with_cache(self, token_ids, caches, cache_index, start_positions=None):
        """``GPTBackbone.call_with_cache`` and the head: ``(logits (B, T, V), new caches)``."""
        hidden, caches = self.backbone.call_with_cache(token_ids, caches, cache_index, start_positions)  # (B, T, C)
        return self.logits(hidden), caches

    def generate(
        self, prompts=None, max_new_tokens=None, sampler="greedy", temperature=1.0, top_k=None, top_p=None, seed=None,
        stop_token_ids=None, stream=None, return_padding_mask=False, messages=None,
    ):  # fmt: skip
        """Continue each prompt by up to ``max_new_tokens`` tokens, using a KV cache.

        Args:
            prompts: token ids: an int array (B, P) or a list of B token-id lists of any
                lengths >= 1, left-padded to the longest (P); or, when the model has a
                ``preprocessor``, text: a string or a list of strings.
            max_new_tokens: N >= 1; P + N must not exceed ``max_sequence_length``.
            sampler: ``"greedy"`` (argmax), ``"top_k"`` (sample among the ``top_k``
                likeliest) or ``"top_p"`` (nucleus: the likeliest tokens holding ``top_p``
                of the probability).
            temperature: divides the logits before top-k/top-p sampling (> 0).
            seed: seeds ``jax.random``: the same seed gives the same tokens. None draws
                one from NumPy's global generator (``keras.utils.set_random_seed`` fixes it).
            stop_token_ids: ids that end a row: the row keeps its stop token and holds the
                pad id after it; the loop ends once every row has stopped. None: the
                preprocessor's ``tokenizer.stop_token_ids`` (none without a preprocessor);
                ``()``: never stop early.
            stream: called as tokens come out. With token-id prompts ``stream(new_ids)``
                once per step: one list per row, the id it just produced (empty once the
                row has stopped). With text prompts ``stream(pieces)`` whenever a row has
                new text: one string per row, the text added since the last call (a
                character waits until all its bytes are out; the tokenizer's stop tokens
                are not shown), so the pieces add up to the returned continuation. An
                exception it raises ends generation and is raised here.
            return_padding_mask: token-id prompts only; also return the padding mask.
            messages: instead of ``prompts``, a conversation (a list of ``{"role",
                "content"}`` messages) or a list of B conversations: each goes through the
                preprocessor tokenizer's chat template with the generation prompt, as
                transformers' ``apply_chat_template(messages, add_generation_prompt=True)``
                renders and tokenizes it (no start token added besides the template's), and
                the assistant's reply is generated; ``stream`` as for text prompts.

        Returns:
            Token-id prompts: int32 numpy array (B, P + N): each row's prompt, left-padded,
            its new tokens, then the pad id after a stop token (the pad id: the
            preprocessor tokenizer's ``pad_token_id``, else 0). With
            ``return_padding_mask``, ``(token_ids, padding_mask)``: bool (B, P + N), True
            on each row's prompt and new tokens (its stop token included), so row b is
            ``token_ids[b][padding_mask[b]]`` and ``padding_mask[:, P:].sum(1)`` counts the
            new tokens. Text prompts: prompt + continuation as keras-hub's ``generate``
            returns it (``preprocessor.generate_postprocess``: tokenizer stop tokens and
            padding dropped): a string for a string, a list for a list. ``messages``: the
            reply alone (the new tokens, cut before the stop token, decoded): a string for
            a conversation, a list for a list of them.

        One ``jax.jit`` per (B, P, N, sampler, streaming or not) runs the prefill of the P
        prompt columns into per-block caches of length P + N (``start_positions``: each
        row's padding masked, its rotary positions counted from its first token, so a
        padded row computes what its prompt alone computes), then a ``while_loop`` of at
        most N - 1 decode steps; the model's variables are its arguments, so it sees the
        current weights (a pipelined backbone's stacked blocks are sliced into layers
        inside the program: ``_generation.LayerByLayer``). Streaming is an ordered host callback
        (``jax.experimental.io_callback``) inside that same loop rather than a Python
        loop over a jitted step: one code path, and a program without ``stream`` holds no
        callback, so it runs as fast as before; with one, each step waits for the host.
        """
        vocabulary_size = self.backbone.vocabulary_size
        _sampling.check_sampler(
            sampler, temperature=temperature, top_k=top_k, top_p=top_p, vocabulary_size=vocabulary_size
        )
        tokenizer = getattr(self.preprocessor, "tokenizer", None)
        if stop_token_ids is None:
            stop_token_ids = () if tokenizer is None else tokenizer.stop_token_ids
        stop_ids = _generation.stop_mask(stop_token_ids, vocabulary_size)  # bool[V]
        pad_id = 0 if getattr(tokenizer, "pad_token_id", None) is None else tokenizer.pad_token_id
        _generation.check_prompts_or_messages(prompts, messages, max_new_tokens)
        chat = messages is not None
        text = chat or _generation.is_text(prompts)
        if text and return_padding_mask:
            raise ValueError("return_padding_mask is for token-id prompts; text prompts and messages return text")
        if chat:
            token_ids, starts = _generation.tokenize_conversations(
                self, messages, vocabulary_size, pad_id
            )  # (B, P), (B,)
        elif text:
            token_ids, starts = _generation.tokenize_prompts(self, prompts)  # (B, P), (B,)
        else:
            token_ids, starts = _generation.as_prompts(prompts, vocabulary_size, pad_id)  # (B, P), (B,)
        batch, prompt_length = token_ids.shape
        _generation.check_lengths(prompt_length, max_new_tokens, self.backbone.max_sequence_length)
        if stream is not None and not callable(stream):
            raise ValueError(f"stream must be callable, got {type(stream).__name__}")
        host_stream = (
            None
            if stream is None
            else _generation.TextStream(tokenizer, batch, stream)
            if text
            else _generation.token_stream(stream)
        )
        tokens, lengths = _generation.generate(
            self, token_ids, starts, max_new_tokens=int(max_new_tokens), sampler=sampler, temperature=temperature,
            top_k=top_k, top_p=top_p, seed=seed, stop_ids=stop_ids, pad_id=pad_id, stream=host_stream,
        )  # fmt: skip
        if text:
            if stream is not None:
                host_stream.flush()
            if chat:  # the replies alone
                replies = [
                    self.preprocessor.generate_postprocess(row[prompt_length : prompt_length + n], 0)
                    for row, n in zip(tokens, lengths)
                ]
                return replies if _generation.is_conversation_list(messages) else replies[0]
            texts = [
                self.preprocessor.generate_postprocess(row[: prompt_length + n], prompt_length)
                for row, n in zip(tokens, lengths)
            ]
            return texts[0] if isinstance(prompts, str) else texts
        if return_padding_mask:
            return tokens, _generation.padding_mask(starts, lengths, prompt_length, tokens.shape[1])
        return tokens

    def check_prompt_length(self, prompts=None, max_new_tokens=None, messages=None):
        """Raises the ``ValueError`` ``generate`` would when the prompts (text or token ids)
        or ``messages`` and ``max_new_tokens`` do not fit ``max_sequence_length``, without generating."""
        _generation.check_prompts_or_messages(prompts, messages, max_new_tokens)
        if messages is not None:
            prompt_length = _generation.tokenize_conversations(self, messages, self.backbone.vocabulary_size, 0)[
                0
            ].shape[1]
        elif _generation.is_text(prompts):
            prompt_length = _generation.tokenize_prompts(self, prompts)[0].shape[1]
        else:
            prompt_length = _generation.as_prompts(prompts, self.backbone.vocabulary_size, 0)[0].shape[1]
        _generation.check_lengths(prompt_length, max_new_tokens, self.backbone.max_sequence_length)

    # --- Hugging Face checkpoints -------------------------------------------------------

    @classmethod
    def from_preset(cls, name_or_dir, *, load_weights=True, skip_layers=(), **config_overrides):
        """A zoo preset (``ZooModel.from_preset``), or a Hugging Face Llama-family folder
        (``config.json`` with ``model_type`` llama, mistral, qwen2, mixtral or qwen2_moe, safetensors, and
        optionally ``tokenizer.json``), or ``"hf://org/name"`` (downloaded once through
        ``huggingface-hub``, the ``[hf]`` extra, then cached). Built under the current
        distribution; each device reads only its shard of every weight from the files.
        ``config_overrides`` are ``GPTBackbone`` arguments (``dropout=0.1``, ...).
        See ``zoo.models.gpt.hf_checkpoints`` and docs/checkpoints-hf.md.
        """
        directory = hf_hub.local_directory(name_or_dir) if hf_hub.is_hub_name(name_or_dir) else name_or_dir
        if isinstance(directory, (str, os.PathLike)) and hf_checkpoints.is_hf_directory(os.fspath(directory)):
            if skip_layers:
                raise ValueError(f"skip_layers is not supported for a Hugging Face folder, got {list(skip_layers)}")
            return hf_checkpoints.load_causal_lm(
                cls, os.fspath(directory), load_weights=load_weights, **config_overrides
            )
        return super().from_preset(directory, load_weights=load_weights, skip_layers=skip_layers, **config_overrides)

    def save_to_hf(self, directory, *, max_file_bytes=None, dtype=None, extra_files=None, report=print):
        """Write this model as a Hugging Face folder (``_hf_save.save_to_hf``), whole
        or not at all: config.json, safetensors (LoRA merged, pipelined blocks unstacked),
        generation_config.json, the tokenizer, and what ``extra_files(folder)`` writes."""
        return _hf_save.save_to_hf(
            self, directory, max_file_bytes=max_file_bytes, dtype=dtype, extra_files=extra_files, report=report
        )

    # --- config, named sizes, layouts --------------------------------------------------

    def get_config(self):
        backbone = keras.saving.serialize_keras_object(self.backbone)
        backbone.pop("compile_config", None)  # the task is what gets compiled
        return {
            "name": self.name,
            "trainable": self.trainable,
            "backbone": backbone,
            "preprocessor": None
            if self.preprocessor is None
            else keras.saving.serialize_keras_object(self.preprocessor),
            "loss_chunk_size": self.loss_chunk_size,
        }

    def with_block_form(self, scan_layers, *, prepare=None):
        """This model in the other block form with the same weights: ``scan_layers=True``
        its blocks stacked (1, L, ...) and run by one scan, False as the layers ``block_0``
        .. (a pipelined model's blocks come out in order, whatever its repeats). A model
        saved in either form (``.keras``, a preset) loads as saved; this turns it into the
        other: ``zoo.load("lm.keras").with_block_form(scan_layers=True)``. Built under
        the current distribution; the LM head, preprocessor and loss chunks are kept.
        ``prepare(twin)`` runs on the new model before the weights are copied (LoRA enabled
        on it, so the factors have somewhere to go: ``zoo.training.lora.in_layers_form``).
        Built under this model's dtype policy: a QLoRA base's int8 / int4 kernels (a
        ``quantized_policy``) stay int8 / int4 in the other form."""
        backbone_config = self.backbone.get_config() | {"scan_layers": bool(scan_layers), "schedule": None}
        with dtype_policy_scope(self.backbone.dtype_policy):
            twin = type(self)(
                backbone=GPTBackbone.from_config(backbone_config),
                preprocessor=self.preprocessor,
                loss_chunk_size=self.loss_chunk_size,
                name=self.name,
            )
        if prepare is not None:
            prepare(twin)
        copy_block_form_weights(self, twin)
        return twin

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if "backbone" not in config:  # saved before issue 16: the backbone's arguments, flat
            task = {key: config.pop(key) for key in ("name", "trainable") if key in config}
            return cls(backbone=GPTBackbone.from_config(config), **task)
        config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
        if config.get("preprocessor") is not None:
            config["preprocessor"] = keras.saving.deserialize_keras_object(config["preprocessor"])
        return cls(**config)

    @classmethod
    def named_config(cls, name, layout=None, **overrides):
        """``ZooModel.named_config``; a ``num_layers`` override keeps the config's per-layer
        pattern, as ``GPTBackbone.named_config`` does (``gpt_configs.with_depth_pattern``)."""
        return super().named_config(name, layout, **with_depth_pattern(name, overrides))

    @classmethod
    def from_config_name(cls, name, layout=None, *, loss_chunk_size=None, **overrides):
        """``GPTCausalLM(backbone=GPTBackbone.from_config_name(name, layout, **overrides), loss_chunk_size=...)``:
        ``overrides`` are backbone arguments (``num_layers=2``, ``dropout=0.1``, ``megatron_sp=True``)."""
        return cls(backbone=GPTBackbone.from_config_name(name, layout, **overrides), loss_chunk_size=loss_chunk_size)

    @classmethod
    def get_layout_map(cls, mesh, layout="tp", config=None, *, data_axis=DATA, model_axis=MODEL):
        """``keras.distribution.LayoutMap`` for ``layout`` on ``mesh``.

        Layouts (``zoo.models._transformer_layouts``): ``data`` (no rules: use with
        ``DataParallel`` or an empty ``ModelParallel``), ``fsdp`` (weights split over
        ``data``), ``tp`` (Megatron over ``model``), ``tp+sp`` (as ``tp``; build the model
        with ``from_config_name(name, layout=TP_SP)`` or ``megatron_sp=True``),
        ``fsdp+tp`` (both, on a 2-D mesh).

        ``config``: this model's or its backbone's ``get_config()``, or a ``GPT_CONFIGS``
        entry (``gpt_configs.backbone_config``). When given, sizes are checked against
        the mesh first (``LayoutError`` naming, e.g., ``num_key_value_heads=2`` and the
        ``model`` axis of size 4), and the ``lm_head`` rule is left out for tied
        embeddings. Without it the model is assumed untied.

        Variable paths (prefix ``block_<i>/`` for block weights), shapes and layouts
        (V vocabulary, C hidden, H/K heads/KV heads, D head_dim, F intermediate):

        =====================================  =========  ==========  ===========  =============
        path                                   shape      fsdp        tp, tp+sp    fsdp+tp
        =====================================  =========  ==========  ===========  =============
        token_embedding/embeddings             (V, C)     (data, -)   (model, -)   (model, data)
        attention/query/kernel                 (C, H, D)  (data,-,-)  (-,model,-)  (data,model,-)
        attention/key/kernel, value/kernel     (C, K, D)  (data,-,-)  (-,model,-)  (data,model,-)
        attention/output/kernel                (H, D, C)  (-,-,data)  (model,-,-)  (model,-,data)
        mlp/gate/kernel, mlp/up/kernel [1]     (C, F)     (data, -)   (-, model)   (-, model)
        mlp/down/kernel                        (F, C)     (-, data)   (model, -)   (model, -)
        attention_norm/*, mlp_norm/*           (C,)       replicated  replicated   replicated
        final_norm/*                           (C,)       replicated  replicated   replicated
        lm_head/kernel (untied only)           (C, V)     (-, data)   (-, model)   (data, model)
        =====================================  =========  ==========  ===========  =============

        [1] ``mlp/gate`` only for gated MLPs (swiglu, geglu); under a model axis the
        MLP weights are placed by ``ParallelMLP`` itself. Layout ``data`` replicates
        everything. Why the vocabulary is split: see ``zoo/models/gpt/_gpt_layouts.py``.
        """
        config = None if config is None else backbone_config(config)
        with_head = config is None or not config.get("tie_word_embeddings", False)
        return _gpt_layouts.layout_map(
            mesh, layout, config, with_head=with_head, data_axis=data_axis, model_axis=model_axis
        )


class _HeadChunkSum:
    """The chunked loss' sum (``_chunked_loss.chunk_sum``) through ``model``'s LM head, for
    ``sum_over_batch_rows``: equal per model (its program is cached), with the head's
    variables (the tied table, or ``lm_head``'s kernel and any LoRA factors)."""

    def __init__(self, model):
        self.model = model

    def __eq__(self, other):
        return isinstance(other, _HeadChunkSum) and other.model is self.model

    def __hash__(self):
        return hash(id(self.model))

    @property
    def variables(self):
        if self.model.backbone.tie_word_embeddings:
            return [self.model.backbone.token_embedding.embeddings]
        return list(self.model.get_layer("lm_head").variables)

    def __call__(self, hidden, labels, weights):  # (b, T, C), (b, T), (b, T) -> f32[]
        return _chunked_loss.chunk_sum(hidden, self.model.logits, labels, weights, self.model.loss_chunk_size)


def _float32_logits(softcap=None):
    """Identity layer with a float32 policy: casts the head's output to float32; with
    ``softcap`` c (Gemma 2's final-logit soft-capping) c * tanh(logits / c) after the cast."""
    if softcap is not None:
        return LogitSoftcap(softcap, dtype="float32", name="logits")
    return keras.layers.Activation("linear", dtype="float32", name="logits")
