"""``zoo plot RUN_DIR [--output PNG]``: a run's loss, accuracy and throughput curves as a PNG.

``add_arguments(parser)`` adds the flags (argparse only: no JAX, Keras or matplotlib);
``run(args)`` draws with ``zoo.plotting.plot_run`` and returns the exit status.
"""

import os


def add_arguments(parser):
    parser.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="the run's folder (OUTPUT.run beside the job's --output, where its metrics.csv is), "
        "the metrics.csv, or the job's --output itself",
    )
    parser.add_argument(
        "--output", default=None, metavar="PNG", help="where the PNG goes (default RUN_DIR/metrics.png)"
    )


def run(args):
    """Draw the run's curves; prints the PNG's path; returns 0."""
    from zoo.plotting import plot_run

    print(f"wrote {plot_run(run_folder(args.run_dir), args.output)}")
    return 0


def run_folder(path):
    """``path``, or the run folder of a job's ``--output`` when ``path`` is one (a ``.keras``
    file, or a saved folder without a ``metrics.csv``, beside which ``OUTPUT.run`` holds it)."""
    from zoo.training.job_setup import run_dir_of
    from zoo.training.logs.run_logs import METRICS_FILE

    if os.path.isfile(os.path.join(path, METRICS_FILE)) or (os.path.isfile(path) and not path.endswith(".keras")):
        return path
    candidate = run_dir_of(path, output_is_folder=os.path.isdir(path))
    return candidate if os.path.isfile(os.path.join(candidate, METRICS_FILE)) else path
