"""Per-process slicing for multi-host training: each process reads only its part.

Under JAX's multi-controller runtime every process feeds its own devices: with P
processes and a global batch B, each process's ``fit`` sees batches of B / P examples
drawn from its own 1/P of the data, and every process must run the same number of steps.
"""

import jax


def current_process():
    """``(process_index, process_count)`` of this JAX process."""
    return jax.process_index(), jax.process_count()


def process_rows(num_examples, process_index=None, process_count=None):
    """The rows ``range(start, stop)`` process ``process_index`` of ``process_count`` reads.

    Contiguous, and the same length ``N // P`` for every process (so all run the same
    number of steps); the last ``N % P`` examples are left out. Defaults: this process.
    """
    if process_index is None or process_count is None:
        process_index, process_count = current_process()
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} is not in [0, {process_count})")
    per_process = num_examples // process_count
    if per_process == 0:
        raise ValueError(f"{num_examples} examples cannot be shared by {process_count} processes")
    start = process_index * per_process
    return range(start, start + per_process)


def local_batching(batch_size, multiple_of, process_count=None):
    """Per-process ``(batch_size, multiple_of)`` from the global ones.

    ``batch_size`` is the global batch; ``multiple_of`` the global data-parallel size.
    Both must divide by the number of processes.
    """
    if process_count is None:
        process_count = jax.process_count()
    for name, value in (("global batch size", batch_size), ("data-parallel size", multiple_of)):
        if value % process_count:
            raise ValueError(f"{name} {value} is not divisible by the {process_count} processes")
    return batch_size // process_count, multiple_of // process_count
