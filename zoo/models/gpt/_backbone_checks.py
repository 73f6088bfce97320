"""The checks of ``GPTBackbone``'s arguments: each raises one line naming the offending values."""

from zoo.layers.multi_head_attention import check_sliding_window
from zoo.layers.transformer_block import check_block_options

__all__ = [
    "check_config",
    "check_moe_layers",
    "check_pipeline",
    "check_pipeline_window",
    "check_sliding_window_layers",
    "default_head_dim",
    "stacked_form",
]


def default_head_dim(hidden_dim, num_query_heads):
    if (
        isinstance(hidden_dim, int)
        and isinstance(num_query_heads, int)
        and num_query_heads > 0
        and hidden_dim % num_query_heads == 0
    ):
        return hidden_dim // num_query_heads
    raise ValueError(
        f"hidden_dim {hidden_dim} is not divisible by num_query_heads {num_query_heads}; pass head_dim explicitly"
    )


def check_moe_layers(moe_layers, num_layers, num_experts):
    """The sparse blocks' indices as a set (every block for None); raises naming a bad one."""
    if not isinstance(num_experts, int) or isinstance(num_experts, bool) or num_experts < 0:
        raise ValueError(f"num_experts must be a non-negative integer (0: dense), got {num_experts!r}")
    if moe_layers is None:
        return set(range(num_layers))
    bad = [index for index in moe_layers if not isinstance(index, int) or not 0 <= index < num_layers]
    if bad:
        raise ValueError(f"moe_layers {list(moe_layers)} names block(s) {bad} outside 0..{num_layers - 1}")
    if not num_experts:
        raise ValueError(f"moe_layers {list(moe_layers)} needs num_experts > 0")
    return set(moe_layers)


def check_sliding_window_layers(sliding_window, sliding_window_layers, num_layers):
    """The windowed blocks' indices as a set (every block for None, none without a
    window); raises naming a bad window or index."""
    check_sliding_window(sliding_window, causal=True)
    if sliding_window is None:
        if sliding_window_layers is not None:
            raise ValueError(f"sliding_window_layers {list(sliding_window_layers)} needs sliding_window (got None)")
        return set()
    if sliding_window_layers is None:
        return set(range(num_layers))
    bad = [i for i in sliding_window_layers if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < num_layers]
    if bad or not sliding_window_layers:
        raise ValueError(
            f"sliding_window_layers {list(sliding_window_layers)} must list block indices in 0..{num_layers - 1} "
            f"(at least one; None means every block){f', not {bad}' if bad else ''}"
        )
    return set(sliding_window_layers)


def stacked_form(schedule, scan_layers):
    """None (blocks as L layers), or how a stacked backbone is described in errors."""
    if schedule is not None and scan_layers:
        raise ValueError(
            f"schedule={schedule!r} and scan_layers=True: a pipelined backbone already runs its stacked blocks in a "
            f"loop; set one of them"
        )
    if schedule is not None:
        return f"pipelined, schedule={schedule!r}"
    return "scan_layers=True" if scan_layers else None


def check_pipeline_window(stacked, sliding_window, window_layers, num_layers):
    if sliding_window is not None and len(window_layers) != num_layers:
        raise ValueError(
            f"a GPTBackbone with stacked blocks ({stacked}) stacks identical blocks: sliding_window={sliding_window} "
            f"must apply to every block, not sliding_window_layers={sorted(window_layers)} of {num_layers}"
        )


def check_pipeline(stacked, *, megatron_sp, context_attention, sparse_blocks, num_layers, pipelined=True):
    """Stacked blocks are identical: all dense, or (scan_layers) all MoE; a pipeline's
    blocks (not a scanned stack's, whose loop runs the layers' own parallel kernels) are
    dense and run as plain layers inside its shard_map."""
    if sparse_blocks and (pipelined or sparse_blocks != num_layers):
        raise ValueError(
            f"a GPTBackbone with stacked blocks ({stacked}) stacks identical blocks: MoE in {sparse_blocks} of its "
            f"{num_layers} blocks (moe_layers) {'in a pipeline ' if pipelined else ''}cannot be stacked; "
            "scan_layers=True takes MoE in every block (moe_layers=None), a pipeline dense blocks only"
        )
    if pipelined and (megatron_sp or context_attention is not None):
        raise ValueError(
            f"a GPTBackbone with stacked blocks ({stacked}) runs its blocks as plain layers inside a loop: "
            f"megatron_sp={megatron_sp!r} and context_attention={context_attention!r} must be False and None "
            f"(tensor parallelism inside a pipeline comes from the 'pipeline' layout on a mesh with a 'model' axis)"
        )


def check_config(*, mlp, norm, dropout, num_query_heads, num_key_value_heads, head_dim, **sizes):
    """Raise ``ValueError`` naming the offending numbers for a bad GPT configuration."""
    sizes.update(num_query_heads=num_query_heads, num_key_value_heads=num_key_value_heads, head_dim=head_dim)
    for key, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")
    if num_query_heads % num_key_value_heads:
        raise ValueError(
            f"num_key_value_heads {num_key_value_heads} does not divide num_query_heads {num_query_heads}: "
            f"each KV head serves a whole group of query heads"
        )
    if head_dim % 2:
        raise ValueError(f"rotary embedding needs an even head_dim, got head_dim {head_dim}")
    check_block_options(mlp=mlp, norm=norm, dropout=dropout)
