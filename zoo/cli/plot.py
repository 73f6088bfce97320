"""``zoo plot RUN_DIR [--output PNG]``: a run's loss, accuracy and throughput curves as a PNG.

``add_arguments(parser)`` adds the flags (argparse only: no JAX, Keras or matplotlib);
``run(args)`` draws with ``zoo.plotting.plot_run`` and returns the exit status.
"""


def add_arguments(parser):
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's folder (where its metrics.csv is: beside the saved model), or the metrics.csv")
    parser.add_argument("--output", default=None, metavar="PNG", help="where the PNG goes (default RUN_DIR/metrics.png)")


def run(args):
    """Draw the run's curves; prints the PNG's path; returns 0."""
    from zoo.plotting import plot_run

    print(f"wrote {plot_run(args.run_dir, args.output)}")
    return 0
