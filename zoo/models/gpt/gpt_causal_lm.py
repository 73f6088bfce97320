"""``GPTCausalLM``: a ``GPTBackbone`` with a language-model head, and KV-cache generation."""

import keras

from zoo.distribution.axes import DATA, MODEL
from zoo.models import _transformer_layouts
from zoo.models.gpt import _generation, _gpt_layouts, _sampling
from zoo.models.gpt.gpt_backbone import GPTBackbone
from zoo.models.gpt.gpt_configs import config_by_name

# GPTCausalLM arguments handed to its GPTBackbone, in signature order.
BACKBONE_ARGS = (
    "vocabulary_size", "num_layers", "num_heads", "hidden_dim", "intermediate_dim", "num_kv_heads", "head_dim",
    "mlp", "norm", "norm_epsilon", "dropout", "max_sequence_length", "rotary_base", "seed",
    "tp_sequence_parallel", "sequence_parallel", "remat",
)  # fmt: skip


@keras.saving.register_keras_serializable(package="zoo")
class GPTCausalLM(keras.Model):
    """Decoder-only language model: ``token_ids (B, T) int32 -> logits (B, T, V)``.

    The backbone (``gpt_backbone``, a ``GPTBackbone`` built from the same arguments)
    followed by the LM head: ``lm_head``, a bias-free Dense C -> V, or with
    ``tie_embeddings=True`` the token embedding used in reverse (``x @ E^T`` with the
    (V, C) table ``E``; no extra weights). The head runs in the compute dtype and the
    logits are cast to float32 (layer ``logits``), as mixed precision wants. Train with
    ``SparseCategoricalCrossentropy(from_logits=True)`` on labels shifted one token left.

    Args: those of ``GPTBackbone`` (vocabulary_size, num_layers, num_heads,
    hidden_dim, intermediate_dim, num_kv_heads, head_dim, mlp, norm, norm_epsilon,
    dropout, max_sequence_length, rotary_base, seed, tp_sequence_parallel,
    sequence_parallel, remat), and ``tie_embeddings``.

    Named sizes: ``GPTCausalLM.from_config_name("gpt_tiny")`` (``gpt_configs.GPT_CONFIGS``).
    """

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        num_kv_heads=None,
        head_dim=None,
        mlp="swiglu",
        norm="rms",
        norm_epsilon=1e-5,
        dropout=0.0,
        max_sequence_length=1024,
        rotary_base=10000.0,
        seed=None,
        tp_sequence_parallel=False,
        sequence_parallel=None,
        remat="none",
        tie_embeddings=False,
        name="gpt_causal_lm",
        **kwargs,
    ):
        arguments = locals()  # this call's arguments by name; the backbone takes BACKBONE_ARGS
        backbone = GPTBackbone(**{key: arguments[key] for key in BACKBONE_ARGS}, name="gpt_backbone")
        token_ids = backbone.input  # (B, T)
        hidden = backbone(token_ids)  # (B, T, C)
        if tie_embeddings:
            logits = backbone.token_embedding(hidden, reverse=True)  # (B, T, V)
        else:
            logits = keras.layers.Dense(vocabulary_size, use_bias=False, name="lm_head")(hidden)  # (B, T, V)
        logits = _float32_logits()(logits)  # (B, T, V) float32 under any dtype policy
        super().__init__(inputs=token_ids, outputs=logits, name=name, **kwargs)
        for key, value in backbone.get_config().items():
            if key in BACKBONE_ARGS:
                setattr(self, key, value)  # normalised by the backbone (num_kv_heads, head_dim)
        self.tie_embeddings = bool(tie_embeddings)

    @property
    def backbone(self):
        return self.get_layer("gpt_backbone")

    def logits(self, hidden):
        """The LM head on hidden states (B, T, C) -> float32 logits (B, T, V)."""
        if self.tie_embeddings:
            logits = self.backbone.token_embedding(hidden, reverse=True)
        else:
            logits = self.get_layer("lm_head")(hidden)
        return self.get_layer("logits")(logits)

    def call_with_cache(self, token_ids, caches, cache_index):
        """``GPTBackbone.call_with_cache`` and the head: ``(logits (B, T, V), new caches)``."""
        hidden, caches = self.backbone.call_with_cache(token_ids, caches, cache_index)  # (B, T, C)
        return self.logits(hidden), caches

    def generate(self, prompts, max_new_tokens, sampler="greedy", temperature=1.0, top_k=None, top_p=None, seed=None):
        """Extend each prompt by ``max_new_tokens`` tokens using a KV cache.

        Args:
            prompts: token ids (B, P), an int array or a list of equal-length lists (all
                prompts share one length P: there is no padding mask).
            max_new_tokens: N >= 1; P + N must not exceed ``max_sequence_length``.
            sampler: ``"greedy"`` (argmax), ``"top_k"`` (sample among the ``top_k``
                likeliest) or ``"top_p"`` (nucleus: the likeliest tokens holding ``top_p``
                of the probability).
            temperature: divides the logits before top-k/top-p sampling (> 0).
            seed: seeds ``jax.random``: the same seed gives the same tokens. None draws
                one from NumPy's global generator (``keras.utils.set_random_seed`` fixes it).

        Returns:
            int32 numpy array (B, P + N): the prompts, then the generated tokens.

        One ``jax.jit`` per (B, P, N, sampler) runs the prefill of the P prompt
        tokens into per-block caches of length P + N and a ``fori_loop`` of N - 1 decode
        steps; the model's variables are its arguments, so it sees the current weights.
        """
        _sampling.check_sampler(sampler, temperature=temperature, top_k=top_k, top_p=top_p, vocabulary_size=self.vocabulary_size)
        prompts = _generation.as_prompts(prompts, self.vocabulary_size)  # (B, P)
        _generation.check_lengths(prompts.shape[1], max_new_tokens, self.max_sequence_length)
        return _generation.generate(
            self, prompts, max_new_tokens=int(max_new_tokens), sampler=sampler, temperature=temperature,
            top_k=top_k, top_p=top_p, seed=seed,
        )  # fmt: skip

    # --- config, named sizes, layouts --------------------------------------------------

    def get_config(self):
        config = {"name": self.name, "trainable": self.trainable}
        config.update({key: getattr(self, key) for key in BACKBONE_ARGS})
        config["tie_embeddings"] = self.tie_embeddings
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    @classmethod
    def from_config_name(cls, name, strategy=None, **overrides):
        """Build a named size (``GPT_CONFIGS``), e.g. ``from_config_name("gpt_tiny", dropout=0.1)``.

        ``strategy``: a layout strategy whose config entries are applied too (``"tp+sp"``
        sets ``tp_sequence_parallel=True``). An unknown name raises listing the known ones.
        """
        config = config_by_name(name)
        config.update(overrides)
        if strategy is not None:
            config = cls.config_for_strategy(strategy, config)
        return cls(**config)

    @staticmethod
    def config_for_strategy(strategy, config):
        """A copy of ``config`` with the entries ``strategy`` needs (see ``config_overrides``)."""
        return {**config, **_transformer_layouts.config_overrides(strategy)}

    @classmethod
    def get_layout_map(cls, mesh, strategy="tp", config=None, *, data_axis=DATA, model_axis=MODEL):
        """``keras.distribution.LayoutMap`` for ``strategy`` on ``mesh``.

        Strategies (``zoo.models._transformer_layouts``): ``data`` (no rules: use with
        ``DataParallel`` or an empty ``ModelParallel``), ``fsdp`` (weights split over
        ``data``), ``tp`` (Megatron over ``model``), ``tp+sp`` (as ``tp``; build the model
        with ``config_for_strategy("tp+sp", ...)``), ``fsdp+tp`` (both, on a 2-D mesh).

        ``config``: a ``get_config()``-like dict. When given, sizes are checked against
        the mesh first (``LayoutError`` naming, e.g., ``num_kv_heads=2`` and the ``model``
        axis of size 4), and the ``lm_head`` rule is left out for tied embeddings. Without
        it the model is assumed untied.

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
        lm_head/kernel (untied only)           (C, V)     (data, -)   (-, model)   (data, model)
        =====================================  =========  ==========  ===========  =============

        [1] ``mlp/gate`` only for gated MLPs (swiglu, geglu); under a model axis the
        MLP weights are placed by ``ParallelMLP`` itself. Strategy ``data`` replicates
        everything. Why the vocabulary is split: see ``zoo/models/gpt/_gpt_layouts.py``.
        """
        with_head = config is None or not config.get("tie_embeddings", False)
        return _gpt_layouts.layout_map(
            mesh, strategy, config, with_head=with_head, data_axis=data_axis, model_axis=model_axis
        )


def _float32_logits():
    """Identity layer with a float32 policy: casts the head's output to float32."""
    return keras.layers.Activation("linear", dtype="float32", name="logits")
