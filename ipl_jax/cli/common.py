"""What every ``ipl-jax`` command shares: its argument parser, its error handling and the flags' meanings.
Invocation mistakes print one line ``ipl-jax COMMAND: <what to do>`` and exit 2; malformed data records exit 1.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence

from ipl_jax import storage
from ipl_jax.configs.loader import ConfigError
from ipl_jax.data.datasets import skipped_summary
from ipl_jax.data.records import DataError
from ipl_jax.pipeline.paths import UsageError
from ipl_jax.settings import MAX_SEED, SettingsError

USAGE, DATA = 2, 1  # exit statuses: a bad invocation; bad data


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise ``UsageError`` (one line, exit 2) instead of printing the usage."""

    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)")


def command(prog: str) -> Callable:
    """Wrap a command's ``main(argv) -> int``: usage and config errors print one line and exit 2, malformed data
    records exit 1, ``--help`` returns 0. Callable in-process."""

    def wrap(fn: Callable[[list[str]], int]) -> Callable[[Sequence[str] | None], int]:
        @functools.wraps(fn)
        def main(argv: Sequence[str] | None = None) -> int:
            argv = list(sys.argv[1:] if argv is None else argv)
            try:
                return int(fn(argv) or 0)
            except (UsageError, ConfigError, SettingsError) as e:
                return fail(prog, e, USAGE)
            except DataError as e:
                return fail(prog, e, DATA)
            except SystemExit as e:  # argparse's --help / --version
                return e.code if isinstance(e.code, int) else (0 if e.code is None else fail(prog, e.code, USAGE))

        return main

    return wrap


def fail(prog: str, message, status: int) -> int:
    """Print ``prog: message`` (one line) to stderr and return ``status``."""
    text = " ".join(str(message).split())
    print(f"{prog}: {text}", file=sys.stderr)
    return status


def add_skip_bad(
    parser: argparse.ArgumentParser,
    help: str = "leave malformed dataset records out (and say how many) instead of stopping",
) -> None:
    """The ``--skip-bad`` flag of every command that reads a dataset (see ``report_skipped``)."""
    parser.add_argument("--skip-bad", action="store_true", help=help)


def require(parser: argparse.ArgumentParser, args: argparse.Namespace, dest: str, flag: str) -> None:
    """A flag that one mode of a command requires (``eval``'s ``--data`` except with ``--online``)."""
    if getattr(args, dest) is None:
        parser.error(f"the following arguments are required: {flag}")


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = nonnegative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def seed_int(text: str) -> int:
    """argparse type: a random seed, an integer in [0, 2**32 - 1]."""
    value = nonnegative_int(text)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(f"{text!r} must be at most {MAX_SEED}")
    return value


def report_skipped(prog: str, skipped: Sequence, where: str) -> None:
    """One line on stderr: how many malformed records ``--skip-bad`` left out of ``where``, and why."""
    if skipped:
        print(f"{prog}: {skipped_summary(skipped, where)}", file=sys.stderr)


def write_text(path, text: str) -> None:
    """Write an output file whole (its directory created; a URI: one upload), after ``paths.output_file`` has
    checked the path."""
    storage.write_text(path, text)
