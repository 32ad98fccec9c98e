"""`repdiag ...` entry points for use outside the workflow."""

from __future__ import annotations

import argparse
import sys

from repdiag.core.errors import RepdiagError


def _inspect(args: argparse.Namespace) -> None:
    from repdiag.core.inspect import describe_store

    for path in args.stores:
        print(describe_store(path))


def _validate(args: argparse.Namespace) -> None:
    from repdiag.core.config import load_config

    config = load_config(args.config)
    print(f"{args.config}: valid ({len(config['models'])} models)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="repdiag", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="summarise zarr stores written by the workflow")
    inspect.add_argument("stores", nargs="+", help="paths such as results/embeddings/clip.zarr")
    inspect.set_defaults(func=_inspect)
    validate = commands.add_parser("validate", help="validate a config file against the schema")
    validate.add_argument("config", help="a YAML config, e.g. config/paper.yaml")
    validate.set_defaults(func=_validate)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except RepdiagError as err:
        print(f"repdiag: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
