"""`repdiag ...` entry points for use outside the workflow."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

from repdiag.core.errors import RepdiagError

# Subcommands that a study provides: ``name: ("module:function", help)``. The core imports no
# study, so each is resolved by name when it runs; ``function(argv)`` parses its own arguments.
STUDY_COMMANDS: dict[str, tuple[str, str]] = {
    "plan": (
        "repdiag.binding.plan:command",
        "Jacobian work, memory per pass and projected time of a config (offline, no weights)",
    ),
}


def _inspect(args: argparse.Namespace) -> None:
    from repdiag.core.inspect import describe_store

    for path in args.stores:
        print(describe_store(path))


def _validate(args: argparse.Namespace) -> None:
    from repdiag.core.config import load_config

    config = load_config(args.config)
    print(f"{args.config}: valid ({len(config['models'])} models)")


def resolve(reference: str) -> Callable:
    """The function a ``"package.module:function"`` reference names."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def _study(reference: str) -> Callable[[argparse.Namespace], None]:
    def run(args: argparse.Namespace) -> None:
        resolve(reference)(args.args)

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="repdiag", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="summarise zarr stores written by the workflow")
    inspect.add_argument("stores", nargs="+", help="paths such as results/embeddings/clip.zarr")
    inspect.set_defaults(func=_inspect)
    validate = commands.add_parser("validate", help="validate a config file against the schema")
    validate.add_argument("config", help="a YAML config, e.g. config/paper.yaml")
    validate.set_defaults(func=_validate)
    for name, (reference, help_text) in STUDY_COMMANDS.items():
        study = commands.add_parser(name, help=help_text, add_help=False)
        study.add_argument("args", nargs=argparse.REMAINDER, help=f"options: repdiag {name} --help")
        study.set_defaults(func=_study(reference))
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in STUDY_COMMANDS:  # its options, even leading ones, are the study's
        args = argparse.Namespace(func=_study(STUDY_COMMANDS[argv[0]][0]), args=argv[1:])
    else:
        args = parser.parse_args(argv)
    try:
        args.func(args)
    except RepdiagError as err:
        print(f"repdiag: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
