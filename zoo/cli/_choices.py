"""Argparse types the subcommands share."""

import argparse


def comma_separated(choices):
    """An argparse ``type``: ``"a,b"`` -> ``("a", "b")``, each one of ``choices``."""

    def parse(text):
        names = tuple(name.strip() for name in text.split(",") if name.strip())
        unknown = [name for name in names if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown section(s) {unknown}; choose from {','.join(choices)}")
        return names

    return parse
