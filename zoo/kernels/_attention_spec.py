"""The records of the attention seam (``zoo.kernels.attention_seam``): what a local call
computes, what a kernel is asked before it is chosen, and what a kernel is.

Kept apart from the seam so each kernel's module can build its own ``LocalKernel`` without
importing the registry that lists it.
"""

import dataclasses
from collections.abc import Callable

from zoo.kernels.collective_matmul import _varying_axes

__all__ = ["AttentionSpec", "KernelQuery", "LocalKernel"]


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """A local attention call's options, fixed before any array: every kernel reads them here.

    ``causal``; ``scale`` (None: D**-0.5); ``sliding_window`` W (keys p - W + 1 .. p) or None;
    ``softcap`` (scores c * tanh(s / c)) or None; ``block_size``: the tiled kernel's tile edge.
    """

    causal: bool = False
    scale: float | None = None
    sliding_window: int | None = None
    softcap: float | None = None
    block_size: int = 512

    def options(self):
        """The spec as the kernels' keyword arguments (``local_attention``, ``ring_attention``,
        ``gather_kv_attention``, ``ulysses_attention``, ``blockwise_attention``)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class KernelQuery:
    """What a kernel's ``supports`` reads: the platform, the call's shapes and which options
    and arrays it has. ``natural_order``: no positions given (tokens 0..T-1, queries and keys
    alike); ``pallas``: False where GSPMD partitions the call over several devices (it cannot
    split a Pallas call) and inside a ``shard_map`` (``of_call``: q varies over mesh axes),
    where JAX refuses its Pallas TPU kernels' calls (their output shapes name no varying
    axes; docs/attention.md, "Inside a shard_map"); ``sequence_split``: GSPMD may split T itself, which only the tiled
    kernel takes (cuDNN's partitioner refuses it); ``inference``: no gradient is taken (a
    cached decoding step); ``windowed``: a sliding window limits the keys."""

    platform: str
    dtype: str
    head_dim: int
    causal: bool = False
    q_len: int | None = None
    kv_len: int | None = None
    natural_order: bool = True
    key_masked: bool = False
    segmented: bool = False
    softcapped: bool = False
    pallas: bool = True
    sequence_split: bool = False
    inference: bool = False
    windowed: bool = False

    @classmethod
    def of_call(cls, spec, q, k, *, key_mask, segment_ids, natural_order, platform, pallas, sequence_split, inference):
        """The query of one call: q [B, T, H, D], k [B, S, K, D] under ``spec``."""
        return cls(
            platform=platform,
            dtype=str(q.dtype),
            head_dim=q.shape[-1],
            causal=spec.causal,
            q_len=q.shape[1],
            kv_len=k.shape[1],
            natural_order=natural_order,
            key_masked=key_mask is not None,
            segmented=segment_ids is not None,
            softcapped=spec.softcap is not None,
            pallas=pallas and not _varying_axes(q),  # inside a shard_map: no Pallas kernel (class docstring)
            sequence_split=sequence_split,
            inference=inference,
            windowed=spec.sliding_window is not None,
        )


@dataclasses.dataclass(frozen=True)
class LocalKernel:
    """One local attention kernel, as the seam's registry lists it.

    ``supports(query) -> bool``: whether it runs this call (``KernelQuery``).
    ``run(q, k, v, spec, *, key_mask, q_positions, k_positions, segment_ids, kv_segment_ids)``:
    q [B, T, H, D], k, v [B, S, K, D] -> [B, T, H, D], as ``blockwise_attention`` computes it.
    ``describe(query, block_size) -> str``: the kernel in words, e.g. ``"splash (blocks 1024)"``.
    """

    name: str
    supports: Callable
    run: Callable
    describe: Callable
