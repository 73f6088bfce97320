"""Config checks shared by the encoder-style classifiers; every error names the numbers."""

from zoo.config.choices import POOLINGS


def check_common(sizes, pooling, dropout):
    """``sizes`` ({name: value}, including hidden_dim and num_query_heads) are positive integers,
    the heads split the width evenly, ``pooling`` is known and ``dropout`` in [0, 1)."""
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if sizes["hidden_dim"] % sizes["num_query_heads"]:
        raise ValueError(
            f"hidden_dim={sizes['hidden_dim']} is not divisible by num_query_heads={sizes['num_query_heads']} "
            f"(head_dim = hidden_dim / num_query_heads)"
        )
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {list(POOLINGS)}, got {pooling!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
