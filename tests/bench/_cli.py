"""What the benchmark tests share: ``zoo bench NAME`` flags parsed as the command line parses them."""

import argparse

from zoo.cli import bench as bench_cli


def parse_bench_args(name, argv):
    """``argv`` parsed by ``zoo bench NAME``'s own subparser (flags generated from its settings)."""
    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    return parser.parse_args([name, *argv])
