"""``MoEFeedForward``: a sparse Mixture-of-Experts SwiGLU feed-forward, expert-parallel."""

import jax
import jax.numpy as jnp
import keras
from jax.sharding import PartitionSpec as P

from zoo.distribution.axes import MODEL
from zoo.kernels import moe
from zoo.kernels.collective_matmul import vary_over
from zoo.layers._parallel_plan import resolve_plan, run_sharded
from zoo.layers.parallel_mlp import ParallelMLP

# router_statistics[i]: what each entry of the layer's per-step statistics variable holds
ROUTER_STATISTICS = ("max_load", "dropped_fraction")
EXPERT_WEIGHTS = ("expert_gate", "expert_up", "expert_down")


@keras.saving.register_keras_serializable(package="zoo")
class MoEFeedForward(keras.layers.Layer):
    """``sum_j w_j * expert_{e_j}(x)`` over each token's k routed experts (+ a shared expert).

    A router (C -> E logits, float32) picks each token's ``num_experts_per_token`` experts
    (softmax, top k, renormalised when ``normalize_router_weights``); each expert is a
    SwiGLU MLP ``down(silu(gate(x)) * up(x))`` of width F = ``intermediate_dim``; only the
    chosen ones run (``zoo.kernels.moe``: tokens sorted by expert, a grouped matmul).
    With ``shared_expert_dim`` > 0 a dense SwiGLU MLP of that width runs on every token
    too, scaled by ``sigmoid(x @ shared_expert_gate)`` (Qwen2-MoE).

    Under a distribution (``zoo.layers._parallel_plan``) the layer runs one
    ``shard_map`` over the mesh: tokens split as the batch is, the experts' (E, C, F)
    weights split on E over the ``expert`` axis (``ExpertParallel``: each device holds
    E / N_e experts and tokens travel to their experts' devices and back in two
    ``all_to_all``s), on F over ``model`` when the mesh has one (the outputs summed over
    it), and on C over the distribution's ``weight_shard_axis`` (FSDP; gathered in the
    body). Without an expert axis every device runs all E experts on its own tokens.
    A batch that does not divide the batch split (decoding a few prompts) is split over
    the batch axes it divides (``ParallelPlan.for_batch``) and whole over the others;
    whole over ``expert``, each device runs its own experts on every token and the
    outputs are summed over the axis (no exchange).

    Training adds, through ``add_loss``, ``router_aux_loss_coefficient`` times the
    Switch / Mixtral load-balancing loss and ``router_z_loss_coefficient`` times the
    router z-loss, and records the step's ``router_statistics``: the busiest expert's
    share of the assignments over the mean share (1.0 is perfectly balanced) and the
    fraction of assignments the capacity dropped (0 when dropless). ``GPTCausalLM``
    puts them in Keras' ``logs``.

    Args:
        num_experts: E.
        num_experts_per_token: k.
        intermediate_dim: F, each expert's hidden width.
        shared_expert_dim: the shared expert's hidden width (0: none).
        normalize_router_weights: renormalise the k weights to sum 1 (Mixtral: True).
        router_aux_loss_coefficient, router_z_loss_coefficient: the losses' weights.
        capacity_factor: None (dropless) or the capacity of the exchange per device
            pair, as a multiple of the balanced load (see ``zoo.kernels.moe``).
        expert_exchange: ``"all_to_all"`` (padded buffers, any backend) or ``"ragged"``
            (``jax.lax.ragged_all_to_all``: exactly the routed rows, dropless; GPU and
            TPU only: XLA:CPU cannot run it).
        grouped_matmul: None (the platform's: ``"megablox"`` on a TPU outside the expert
            layouts' shard_map, ``"ragged_dot"`` there and on GPU, ``"blocks"`` on CPU;
            ``zoo.kernels.grouped_matmul``) or one of ``zoo.kernels.moe.GROUPED_MATMULS``.
        model_axis: the mesh axis tensor parallelism splits F (and the shared expert) over.
        kernel_initializer: for the router, experts and shared expert.

    Shapes: (B, T, C) -> (B, T, C). Weights (C width, E experts, F, Fs shared width):

    ===============================  =========  ===========================
    path                             shape      layout (``expert`` layouts)
    ===============================  =========  ===========================
    <name>/router/kernel             (C, E)     replicated
    <name>/expert_gate, expert_up    (E, C, F)  (expert, [data], [model])
    <name>/expert_down               (E, F, C)  (expert, [model], [data])
    <name>/shared_expert/...         as ParallelMLP (gate, up, down)
    <name>/shared_expert_gate/kernel (C, 1)     replicated
    <name>/router_statistics         (2,)       non-trainable, replicated
    ===============================  =========  ===========================
    """

    def __init__(
        self,
        num_experts,
        num_experts_per_token,
        intermediate_dim,
        shared_expert_dim=0,
        normalize_router_weights=True,
        router_aux_loss_coefficient=0.0,
        router_z_loss_coefficient=0.0,
        capacity_factor=None,
        expert_exchange="all_to_all",
        grouped_matmul=None,
        model_axis=MODEL,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_moe_config(
            num_experts=num_experts,
            num_experts_per_token=num_experts_per_token,
            intermediate_dim=intermediate_dim,
            shared_expert_dim=shared_expert_dim,
            capacity_factor=capacity_factor,
            router_aux_loss_coefficient=router_aux_loss_coefficient,
            router_z_loss_coefficient=router_z_loss_coefficient,
        )
        if expert_exchange not in moe.EXCHANGES:
            raise ValueError(f"expert_exchange must be one of {moe.EXCHANGES}, got {expert_exchange!r}")
        if expert_exchange == "ragged" and capacity_factor is not None:
            raise ValueError(
                f"expert_exchange 'ragged' sends exactly the routed rows and drops none; capacity_factor="
                f"{capacity_factor!r} is for the 'all_to_all' exchange (leave it None)"
            )
        if grouped_matmul not in (None, *moe.GROUPED_MATMULS):
            raise ValueError(f"grouped_matmul must be None or one of {moe.GROUPED_MATMULS}, got {grouped_matmul!r}")
        self.num_experts = num_experts
        self.num_experts_per_token = num_experts_per_token
        self.intermediate_dim = intermediate_dim
        self.shared_expert_dim = shared_expert_dim or 0
        self.normalize_router_weights = bool(normalize_router_weights)
        self.router_aux_loss_coefficient = float(router_aux_loss_coefficient)
        self.router_z_loss_coefficient = float(router_z_loss_coefficient)
        self.capacity_factor = capacity_factor
        self.expert_exchange = expert_exchange
        self.grouped_matmul = grouped_matmul
        self.model_axis = model_axis
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def _initializer(self):
        return keras.initializers.get(keras.initializers.serialize(self.kernel_initializer))

    def build(self, input_shape):
        width = input_shape[-1]
        e, f = self.num_experts, self.intermediate_dim
        dense = dict(use_bias=False, kernel_initializer=self._initializer(), dtype=self.dtype_policy)
        self.router = keras.layers.Dense(e, name="router", **dense)
        self.router.build(input_shape)
        shapes = {"expert_gate": (e, width, f), "expert_up": (e, width, f), "expert_down": (e, f, width)}
        for name, shape in shapes.items():
            setattr(self, name, self.add_weight(name=name, shape=shape, initializer=self._initializer()))
        self.shared_expert = self.shared_expert_gate = None
        if self.shared_expert_dim:
            self.shared_expert = ParallelMLP(
                self.shared_expert_dim,
                activation="silu",
                gated=True,
                use_bias=False,
                model_axis=self.model_axis,
                kernel_initializer=self._initializer(),
                dtype=self.dtype_policy,
                name="shared_expert",
            )
            self.shared_expert.build(input_shape)
            self.shared_expert_gate = keras.layers.Dense(1, name="shared_expert_gate", **dense)
            self.shared_expert_gate.build(input_shape)
        self.router_statistics = self.add_weight(
            name="router_statistics",
            shape=(len(ROUTER_STATISTICS),),
            initializer="zeros",
            trainable=False,
            dtype="float32",
        )

    # --- the computation -----------------------------------------------------------------

    def call(self, x, training=None):
        y, aux = self.forward(x)
        if training:
            self.record(aux)
        return y

    def forward(self, x):
        """x (B, T, C) -> (y (B, T, C), aux): the computation alone, assigning no variable
        (``TransformerBlock`` runs it under ``jax.checkpoint``); ``record(aux)`` adds the
        losses and statistics afterwards."""
        plan = resolve_plan(model_axis=self.model_axis)
        if plan.expert_axis is not None and self.expert_exchange == "ragged" and jax.default_backend() == "cpu":
            raise ValueError(
                f"MoEFeedForward {self.name!r}: expert_exchange 'ragged' needs jax.lax.ragged_all_to_all, which XLA:CPU "
                f"cannot run; use expert_exchange 'all_to_all' on CPU"
            )
        weights = {"router": self.router.kernel, **{name: getattr(self, name) for name in EXPERT_WEIGHTS}}
        weights = {name: keras.ops.convert_to_tensor(value) for name, value in weights.items()}  # arrays, not Variables
        if plan.mesh is None:
            y, aux = self._local(x, weights, plan=plan)
        else:
            # (B, T, C) split as the batch is; a batch that does not divide the split (decoding
            # a few prompts) is split over the batch axes it divides and whole over the others,
            # the experts' C then split over the FSDP axis only where the tokens are too
            plan = plan.for_batch(x.shape[0]).weights_whole_unless_tokens_split()
            token_spec = P(plan.batch_axis, plan.sequence_axis if len(x.shape) >= 3 else None)
            y, aux = run_sharded(
                plan, self._local, (x, weights), (token_spec, self._weight_specs(plan)), (token_spec, P()), plan=plan
            )
        if self.shared_expert is not None:
            gate = jax.nn.sigmoid(self.shared_expert_gate(x))  # (B, T, 1)
            y = y + gate * self.shared_expert(x)  # (B, T, C)
        return y, aux

    def _weight_specs(self, plan):
        """The experts split E over ``expert``, F over ``model`` and C over the FSDP axis (which
        the plan names only where the tokens are split over it too: ``call``)."""
        e, m, d = plan.expert_axis, plan.model_axis, plan.weight_shard_axis
        return {"router": P(), "expert_gate": P(e, d, m), "expert_up": P(e, d, m), "expert_down": P(e, m, d)}

    def _local(self, x, weights, plan):
        """One shard: x [B_l, T_l, C] -> ([B_l, T_l, C], aux of replicated statistics).
        Tokens whole over the expert axis (a batch that does not split over it) take the
        replicated path: each device runs its own experts on all of them, no exchange."""
        token_axes = plan.token_axes
        replicated = plan.expert_axis is not None and plan.expert_axis not in token_axes
        tokens = x.reshape(-1, x.shape[-1])  # [N, C]
        logits = tokens.astype(jnp.float32) @ weights["router"].astype(jnp.float32)  # f32[N, E]
        routing, expert_ids, probabilities = moe.route(
            logits, num_experts_per_token=self.num_experts_per_token, normalize=self.normalize_router_weights
        )  # f32[N, k], i32[N, k], f32[N, E]
        experts = {
            name: self._gathered(weights[name], plan, axis=1 if name != "expert_down" else 2) for name in EXPERT_WEIGHTS
        }
        experts = {name: value.astype(x.dtype) for name, value in experts.items()}
        if token_axes:  # cast once to vary with the tokens: the backward all-reduces each expert gradient once,
            experts = {name: vary_over(value, token_axes) for name, value in experts.items()}  # not per row block
        if replicated:
            y = moe.replicated_expert_parallel_moe(
                tokens,
                routing,
                expert_ids,
                **experts,
                axis_name=plan.expert_axis,
                axis_size=plan.expert_size,
                num_experts=self.num_experts,
                implementation=self.grouped_matmul,
            )
            dropped = jnp.int32(0)
        elif plan.expert_axis is not None and self.expert_exchange == "ragged":
            y, dropped = moe.ragged_expert_parallel_moe(
                tokens,
                routing,
                expert_ids,
                **experts,
                axis_name=plan.expert_axis,
                axis_size=plan.expert_size,
                num_experts=self.num_experts,
                implementation=self.grouped_matmul,
            )
        elif plan.expert_axis is not None:
            y, dropped = moe.expert_parallel_moe(
                tokens,
                routing,
                expert_ids,
                **experts,
                axis_name=plan.expert_axis,
                axis_size=plan.expert_size,
                num_experts=self.num_experts,
                capacity_factor=self.capacity_factor,
                implementation=self.grouped_matmul,
            )
        else:
            y, dropped = (
                moe.sparse_moe(tokens, routing, expert_ids, **experts, implementation=self.grouped_matmul),
                jnp.int32(0),
            )
        if plan.model_axis is not None:  # the experts' F split over model: partial sums
            y = jax.lax.psum(y, plan.model_axis)
        aux = _statistics(logits, probabilities, expert_ids, dropped, num_experts=self.num_experts)
        return y.reshape(x.shape), _mean_over(aux, token_axes)

    def _gathered(self, weight, plan, *, axis):
        """An expert weight whole on its C dimension: all-gathered over the FSDP axis (when
        it arrives split over it, ``_weight_specs``)."""
        if plan.weight_shard_axis is None:
            return weight
        return jax.lax.all_gather(weight, plan.weight_shard_axis, axis=axis, tiled=True)

    def record(self, aux):
        """Add the auxiliary losses and store the step's router statistics (training only)."""
        for loss in self.router_losses(aux):
            self.add_loss(loss)
        self.router_statistics.assign(router_statistics(aux))

    def router_losses(self, aux):
        """The weighted auxiliary losses to add (those with a nonzero coefficient), each a
        scalar: ``aux``'s, summed over any leading dimensions (a stack of blocks' aux (L, ...))."""
        weighted = (
            (self.router_aux_loss_coefficient, aux["load_balance_loss"]),
            (self.router_z_loss_coefficient, aux["router_z_loss"]),
        )
        return [coefficient * jnp.sum(loss) for coefficient, loss in weighted if coefficient]

    def statistics(self):
        """{name: value} of the last training step's router statistics."""
        return dict(zip(ROUTER_STATISTICS, self.router_statistics.value))

    # --- Keras plumbing ---------------------------------------------------------------------

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def compute_output_spec(self, x, training=None):
        return keras.KerasTensor(tuple(x.shape), dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_experts=self.num_experts,
            num_experts_per_token=self.num_experts_per_token,
            intermediate_dim=self.intermediate_dim,
            shared_expert_dim=self.shared_expert_dim,
            normalize_router_weights=self.normalize_router_weights,
            router_aux_loss_coefficient=self.router_aux_loss_coefficient,
            router_z_loss_coefficient=self.router_z_loss_coefficient,
            capacity_factor=self.capacity_factor,
            expert_exchange=self.expert_exchange,
            grouped_matmul=self.grouped_matmul,
            model_axis=self.model_axis,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config

    def describe_parallelism(self):
        """What a call runs under the current distribution, in words (``zoo.distribution.describe``)."""
        plan = resolve_plan(model_axis=self.model_axis)
        drops = "dropless" if self.capacity_factor is None else f"capacity factor {self.capacity_factor}"
        drops += ", ragged exchange" if self.expert_exchange == "ragged" else ""
        split = (
            (
                f", {self.intermediate_dim // plan.model_size} of {self.intermediate_dim} expert features per device "
                f"over {plan.model_axis!r} (an all-reduce of the output)"
            )
            if plan.model_axis
            else ""
        )
        if plan.expert_axis is None:
            where = "every expert on every device" if plan.mesh is not None else "one device"
            return f"sparse MoE ({self.num_experts} experts, top {self.num_experts_per_token}), {where}{split}"
        local = self.num_experts // plan.expert_size
        return (
            f"expert-parallel MoE: {local} of {self.num_experts} experts per device over {plan.expert_axis!r} "
            f"(size {plan.expert_size}), top {self.num_experts_per_token}, two all-to-alls per call, {drops}{split}"
        )


def _statistics(logits, probabilities, expert_ids, dropped, *, num_experts):
    """This shard's router losses and load, each a mean over its tokens (f32 scalars) but
    ``assigned`` (the [E] share of assignments per expert) and ``dropped_fraction``."""
    assigned = jnp.mean(jax.nn.one_hot(expert_ids, num_experts, dtype=jnp.float32), axis=0)  # [k, E]
    return {
        "fraction": assigned,  # [k, E]
        "mean_probability": jnp.mean(probabilities, axis=0),  # [E]
        "router_z_loss": moe.router_z_loss(logits),
        "dropped_fraction": dropped.astype(jnp.float32) / expert_ids.size,
    }


def router_statistics(aux):
    """f32[..., 2]: ``ROUTER_STATISTICS`` from ``aux`` (a stack of blocks' aux: one row each)."""
    return jnp.stack([aux["max_load"], aux["dropped_fraction"]], axis=-1).astype("float32")


def _mean_over(aux, axes):
    """The per-shard means made global (every shard holds as many tokens), and the
    losses and load computed from them."""
    if axes:
        aux = jax.tree.map(lambda value: jax.lax.pmean(value, axes), aux)
    num_experts = aux["mean_probability"].shape[0]
    share = jnp.sum(aux["fraction"], axis=0)  # [E], sums to k
    return {
        "load_balance_loss": num_experts * jnp.sum(aux["fraction"] * aux["mean_probability"][None, :]),
        "router_z_loss": aux["router_z_loss"],
        "max_load": jnp.max(share) / jnp.mean(share),
        "dropped_fraction": aux["dropped_fraction"],
    }


def check_moe_config(
    *,
    num_experts,
    num_experts_per_token,
    intermediate_dim,
    shared_expert_dim,
    capacity_factor,
    router_aux_loss_coefficient,
    router_z_loss_coefficient,
):
    """Raise ``ValueError`` naming the value for a bad MoE configuration."""
    for key, value in (
        ("num_experts", num_experts),
        ("num_experts_per_token", num_experts_per_token),
        ("intermediate_dim", intermediate_dim),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")
    if num_experts_per_token > num_experts:
        raise ValueError(f"num_experts_per_token {num_experts_per_token} exceeds num_experts {num_experts}")
    if shared_expert_dim is not None and (not isinstance(shared_expert_dim, int) or shared_expert_dim < 0):
        raise ValueError(f"shared_expert_dim must be a non-negative integer (0: none), got {shared_expert_dim!r}")
    if capacity_factor is not None and not (isinstance(capacity_factor, (int, float)) and capacity_factor > 0):
        raise ValueError(f"capacity_factor must be a positive number or None (dropless), got {capacity_factor!r}")
    for key, value in (
        ("router_aux_loss_coefficient", router_aux_loss_coefficient),
        ("router_z_loss_coefficient", router_z_loss_coefficient),
    ):
        if not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{key} must be a non-negative number, got {value!r}")
