"""How ``zoo bench peers`` talks to its worker processes (pure Python: no JAX, no Keras).

A worker is a separate process (the zoo's in this repository's environment, MaxText's in
its own virtual environment: ``recipes/peers/maxtext_worker.py``) that speaks one line
protocol on stdout / stdin:

- every result is one stdout line ``PEERS {json}``; anything else it prints is ignored;
- ``compile`` workers print one result and exit;
- ``serve`` workers build, compile and warm up their step, print ``PEERS {"ready": {...}}``,
  then answer each stdin line ``run N`` (N steps, blocked on) with
  ``PEERS {"wall": seconds, "cpu": process CPU seconds}`` and ``profile DIR`` (one step
  under the JAX profiler, its trace written under DIR) with ``PEERS {"profile": DIR}``;
  ``quit`` stops them.

``run_worker`` runs a compile worker; ``Worker`` keeps a serve worker; ``interleave``
alternates ``run N`` between serve workers (A, B, A, B ...). A worker that fails raises
``WorkerError`` with the last lines of its stderr.
"""

import collections
import json
import os
import subprocess
import sys
import tempfile
import time

PREFIX = "PEERS "
STDERR_LINES = 20  # lines of a failed worker's stderr quoted in the error


class WorkerError(RuntimeError):
    """A worker exited or answered without a result; names it and quotes its stderr."""


def reply(values):
    """A worker's result line."""
    print(PREFIX + json.dumps(values), flush=True)


def serve(run_steps, ready):
    """A serve worker's loop: print ``ready``, then answer ``run N`` lines from stdin with
    ``{"wall", "cpu"}`` seconds of ``run_steps(N)`` (which must block until done) and
    ``profile DIR`` lines with ``{"profile": DIR}`` (``profile_steps``)."""
    reply({"ready": ready})
    for line in sys.stdin:
        command = line.split(maxsplit=1)
        if not command or command[0] == "quit":
            break
        if command[0] == "profile":
            reply({"profile": profile_steps(run_steps, command[1].strip())})
            continue
        cpu, wall = time.process_time(), time.perf_counter()
        run_steps(int(command[1]))
        reply({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu})


def profile_steps(run_steps, trace_dir, steps=1):
    """``run_steps(steps)`` under the JAX profiler, a perfetto trace written under
    ``trace_dir`` (``zoo.bench._step_profile`` reads it); returns ``trace_dir``. JAX is
    imported here, in the worker, never by the driver."""
    import jax

    options = jax.profiler.ProfileOptions()
    # No Python tracer, as zoo.training.logs.profile.trace_options (which imports Keras; a
    # worker may not): with it, this module's own trace test spun for minutes in a tier-1 run
    options.python_tracer_level = 0
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True, profiler_options=options):
        run_steps(steps)
    return trace_dir


def _stderr_tail(path, lines=STDERR_LINES):
    with open(path, errors="replace") as handle:
        return "".join(collections.deque(handle, maxlen=lines)).rstrip()


def _failure(name, command, returncode, stderr_path):
    return WorkerError(
        f"the {name} worker failed (exit status {returncode}): {' '.join(command[:2])} ...; last lines of its stderr:\n"
        f"{_stderr_tail(stderr_path)}"
    )


def _result(line):
    return json.loads(line[len(PREFIX) :]) if line.startswith(PREFIX) else None


def run_worker(name, command, env=None, timeout=None):
    """Run a compile worker to the end; its one result (a dict)."""
    with tempfile.NamedTemporaryFile("w+", suffix=".stderr", delete=False) as stderr:
        try:
            done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=timeout)
            results = [r for r in map(_result, done.stdout.splitlines()) if r is not None]
            if done.returncode or not results:
                raise _failure(name, command, done.returncode, stderr.name)
            return results[-1]
        finally:
            os.unlink(stderr.name)


class Worker:
    """A serve worker: started (``Worker(...)`` returns at once, so several build side by
    side), ``wait_ready()``, then driven by ``run(steps)``; ``close()`` stops it."""

    def __init__(self, name, command, env=None):
        self.name, self.command = name, command
        self._stderr = tempfile.NamedTemporaryFile("w+", suffix=".stderr", delete=False)
        self.process = subprocess.Popen(
            command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True
        )
        self.ready = None

    def wait_ready(self):
        """The worker's ready values (e.g. ``{"parameters": ...}``), once it has warmed up."""
        if self.ready is None:
            self.ready = self._read()["ready"]
        return self.ready

    def _read(self):
        """The next result line (other output skipped); ``WorkerError`` if it exits first."""
        for line in self.process.stdout:
            result = _result(line)
            if result is not None:
                return result
        self.process.wait()
        raise _failure(self.name, self.command, self.process.returncode, self._stderr.name)

    def run(self, steps):
        """``(wall s, CPU s)`` of ``steps`` steps."""
        self.process.stdin.write(f"run {steps}\n")
        self.process.stdin.flush()
        result = self._read()
        return result["wall"], result["cpu"]

    def profile(self, trace_dir):
        """One step under the JAX profiler, its trace under ``trace_dir``."""
        self.process.stdin.write(f"profile {trace_dir}\n")
        self.process.stdin.flush()
        return self._read()["profile"]

    def close(self):
        if self.process.poll() is None:
            try:
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
                self.process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self._stderr.close()
        os.unlink(self._stderr.name)


def interleave(workers, steps, repeats):
    """``{name: [(wall s, CPU s), ...]}``: ``repeats`` rounds, each worker in turn running
    ``steps`` steps (A, B, A, B ...), so a slow spell of the machine falls on both."""
    times = {worker.name: [] for worker in workers}
    for _ in range(repeats):
        for worker in workers:
            times[worker.name].append(worker.run(steps))
    return times
