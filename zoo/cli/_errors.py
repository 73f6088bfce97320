"""The command line's error contract (docs/cli.md#exit-status-and-errors).

- usage error (a flag's value, a file given, a combination that cannot work: argparse's
  errors and ``ValueError``, which ``PathError``, ``MeshError``, ``RecipeError`` and
  ``UnicodeDecodeError`` are): exit status 2;
- runtime failure (``OSError``, ``RuntimeError`` such as ``CheckpointError``, anything
  else): exit status 1;
- training stopped by SIGINT / SIGTERM (``TrainingInterrupted``): 130 / 143 and the line
  saying where the checkpoint is and the command that resumes; any other Ctrl-C: 130.

Each prints exactly one line on stderr, ``zoo: error: ...``, and no traceback; ``--debug``
or ``ZOO_DEBUG=1`` prints the traceback before that line.
"""

import argparse
import difflib
import os
import re
import shlex
import sys
import traceback

USAGE = 2
RUNTIME = 1
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it
# the note JAX adds to an exception raised while tracing (jit): about a traceback the line does not show
JAX_TRACEBACK_NOTE = "JAX has removed its internal frames"


# flag of an earlier release -> the flags that replaced it, in order of preference (a flag
# and the value it needs where that is what replaced it): the first this (sub)command has is named (docs/cli.md, "Renamed flags"; the recipe keys' table is
# zoo.training.recipes._schema.RENAMED_KEYS). --strategy was zoo finetune's "what trains".
RENAMED_FLAGS = {
    "--distribution": ("--layout",),
    "--strategy": ("--method", "--layout"),
    "--seq-len": ("--sequence-length",),
    "--sequence-parallel": ("--megatron-sp", "--layout tp+sp"),  # Megatron sequence parallelism: a flag or a layout
    "--attention": ("--context-attention",),  # the kernel under the context layout
}


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` whose errors are one line, ``zoo: error: <message> (see <prog> --help)``,
    with exit status 2 (argparse's own prints the usage block first). Subparsers made by
    ``add_subparsers`` are of this class too, so each (sub)command answers a renamed flag
    (``RENAMED_FLAGS``) with the flag that replaced it, where it has that flag, and a word
    it does not know with its own help and the nearest flag it has. A flag is never
    abbreviated (``--epoch`` is not ``--epochs``): a flag added later could change what
    an abbreviation meant."""

    def __init__(self, *args, allow_abbrev=False, **kwargs):
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)

    def error(self, message):
        self.exit(USAGE, f"zoo: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        # argparse parses a subcommand's words with the subparser's parse_known_args
        renamed = renamed_flag(self, sys.argv[1:] if args is None else args)
        if renamed:
            self.error(renamed)
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:  # here, not in the top-level parser: the message names this (sub)command
            self.error(unknown_words(self, extras))
        return namespace, extras


def renamed_flag(parser, words):
    """``"--seq-len was renamed --sequence-length"`` for the first old flag in ``words``
    (before a ``--``) whose new flag ``parser`` has; None if there is none."""
    options = None
    for word in words:
        if word == "--":
            break
        old = str(word).split("=", 1)[0]
        if old not in RENAMED_FLAGS:
            continue
        options = options if options is not None else _option_words(parser)
        new = next((flag for flag in RENAMED_FLAGS[old] if flag.split()[0] in options), None)
        if new and old not in options:
            return f"{old} was renamed {new}"
    return None


def unknown_words(parser, words):
    """``"unrecognized argument --epcohs (did you mean --epochs?)"`` for the first word of
    ``words``; the nearest of ``parser``'s flags where one is near, every word named."""
    first = str(words[0]).split("=", 1)[0]
    near = (
        difflib.get_close_matches(first, sorted(_option_words(parser)), n=1, cutoff=0.75)
        if first.startswith("-")
        else []
    )
    hint = f" (did you mean {near[0]}?)" if near else ""
    noun = "argument" if len(words) == 1 else "arguments"
    return f"unrecognized {noun}: {' '.join(map(str, words))}{hint}"


def _option_words(parser):
    """The option strings ``parser``'s usage line shows (argparse keeps no public list)."""
    return set(re.findall(r"(?<![\w-])--?[\w][\w-]*", parser.format_usage()))


def parse(parser, argv):
    """``(args, None)``, or ``(None, exit status)`` when argparse exits (an error: 2;
    ``--help``, ``--version``: 0)."""
    try:
        return parser.parse_args(argv), None
    except SystemExit as stop:
        return None, stop.code if isinstance(stop.code, int) else (0 if stop.code is None else USAGE)


def debug_requested(flag=False):
    """``--debug`` given, or ``ZOO_DEBUG`` set to anything but empty or 0."""
    return bool(flag) or os.environ.get("ZOO_DEBUG", "").strip() not in ("", "0")


def exit_status(error):
    """2 for a usage error (``ValueError`` and its subclasses), 1 for anything else."""
    return USAGE if isinstance(error, ValueError) else RUNTIME


def one_line(error):
    """The error's message as one line, its notes (``add_note``) appended, but for JAX's
    note on its filtered traceback."""
    if isinstance(error, UnicodeDecodeError):
        message = f"cannot read text that is not UTF-8 ({error.reason} at byte {error.start}: {error.object[error.start : error.end]!r}); save it as UTF-8"
    else:
        message = str(error) or type(error).__name__
        if not isinstance(error, (ValueError, OSError, RuntimeError, ImportError)):  # a bug, most likely
            message = f"{type(error).__name__}: {message} (zoo --debug ... shows the traceback)"
    notes = [note for note in getattr(error, "__notes__", ()) if JAX_TRACEBACK_NOTE not in note]
    parts = [message, *notes]
    return "; ".join(" ".join(line.strip() for line in part.splitlines() if line.strip()) for part in parts)


def resume_command(words):
    """The command that resumes ``words`` (``["zoo", ...]``): with ``--resume``, or for
    ``zoo recipe run`` with ``--set checkpoint.resume=true``."""
    words = list(words)
    if [word for word in words if word != "--debug"][1:3] == ["recipe", "run"]:
        if not any(word.startswith("checkpoint.resume=") for word in words):
            words += ["--set", "checkpoint.resume=true"]
    elif "--resume" not in words:
        words.append("--resume")
    return shlex.join(words)


def run_guarded(work, words, debug=False):
    """``work()``'s exit status; an exception becomes one line on stderr and its status.

    Args:
        work: a function of no arguments returning an exit status (None: 0).
        words: the command as typed (``["zoo", "train", ...]``), for the resume line.
        debug: print the traceback too (``--debug``; ``ZOO_DEBUG=1`` works without it).
    """
    from zoo.training.interrupts import TrainingInterrupted

    debug = debug_requested(debug)
    try:
        return work() or 0
    except TrainingInterrupted as error:
        if debug:
            traceback.print_exc()
        print(f"zoo: {error.describe(resume_command(words))}", file=sys.stderr, flush=True)
        return error.exit_code
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("zoo: interrupted", file=sys.stderr, flush=True)
        return INTERRUPTED
    except Exception as error:  # noqa: BLE001 (the contract: every failure is one line)
        if debug:
            traceback.print_exc()
        sys.stdout.flush()
        print(f"zoo: error: {one_line(error)}", file=sys.stderr, flush=True)
        return exit_status(error)


def standalone_main(prog, description, add_arguments, run, argv=None):
    """``python -m zoo.cli.<module>``: its own parser (plus ``--simulate-devices``), the
    devices prepared as ``zoo`` prepares them, and this error contract; returns the exit status."""
    from zoo.cli.devices import add_simulate_flag

    parser = ArgumentParser(prog=prog, description=description)
    add_simulate_flag(parser)
    add_arguments(parser)
    argv = sys.argv[1:] if argv is None else list(argv)
    args, status = parse(parser, argv)
    return status if args is None else run_guarded(lambda: _prepare_and_run(run, args), [prog, *argv])


def _prepare_and_run(run, args):
    from zoo.cli.devices import prepare_devices

    message = prepare_devices(args.simulate_devices)
    if message:
        print(message, flush=True)
    return run(args)
