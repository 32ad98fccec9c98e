"""`repdiag ...` entry points for use outside the workflow: the core's `inspect` and `validate`,
and the subcommands packages provide (:data:`repdiag.studies.COMMANDS`). Top level, above every
layer, like :mod:`repdiag.studies`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from repdiag.core.checks import resolve
from repdiag.core.errors import ConfigError, RepdiagError
from repdiag.studies import COMMANDS, register


def _inspect(args: argparse.Namespace) -> None:
    from repdiag.core.inspect import describe_store

    for path in args.stores:
        print(describe_store(path))


NO_WEIGHTS_HINT = (
    "(a config whose weights live on another machine: `repdiag validate --no-weights` checks "
    "everything else)"
)


def _validate(args: argparse.Namespace) -> None:
    """Schema and cross-key checks, architectures built on the meta device, then (unless
    ``--no-weights``) every model's weights files, hub folders and library caches."""
    from repdiag.core.checks import check_before_run
    from repdiag.core.config import load_config

    try:
        config = load_config(args.config)
    except RepdiagError:
        raise
    except (OSError, ValueError, TypeError) as err:  # not a config error: still one line, named
        raise ConfigError(f"{args.config}: {type(err).__name__}: {err}") from None
    try:
        check_before_run(config, weights=False)
    except RepdiagError as err:
        raise ConfigError(f"{args.config}: {err}") from None
    if not args.no_weights:
        try:
            check_before_run(config, build=False)
        except RepdiagError as err:
            raise ConfigError(f"{args.config}: {err} {NO_WEIGHTS_HINT}") from None
    checked = "weights not checked: --no-weights" if args.no_weights else "weights checked"
    print(f"{args.config}: valid ({len(config['models'])} models; {checked})")


WORKFLOW_CONFIG = "config/config.yaml"  # the Snakefile's `configfile:`


def config_files_of(snakemake_args: list[str]) -> list[str]:
    """The config files a Snakemake command line reads: every value of ``--configfile`` /
    ``--configfiles`` (both spellings, ``=`` or separate values), else the workflow's own."""
    files: list[str] = []
    taking = False
    for arg in snakemake_args:
        flag, _, value = arg.partition("=")
        if flag in ("--configfile", "--configfiles"):
            taking = not value
            files += [value] if value else []
        elif taking and not arg.startswith("-"):
            files.append(arg)
        else:
            taking = False
    return files or [WORKFLOW_CONFIG]


def _run(args: argparse.Namespace) -> None:
    """Read every config file the command names with repdiag's own reader (size and alias caps,
    no tags or templates, no key twice, no entry in two files), then replace this process by
    Snakemake with the same arguments. Snakemake expands a file's YAML aliases while merging it,
    before the workflow can check anything (a 5 KB file took 5.7 GB there)."""
    import os
    import shutil

    from repdiag.core.config import check_config_files
    from repdiag.core.config_files import check_repeated_entries

    files = config_files_of(args.args)
    check_config_files(files)
    check_repeated_entries(files)
    here = os.path.join(os.path.dirname(sys.executable), "snakemake")
    exe = here if os.path.exists(here) else shutil.which("snakemake")
    if exe is None:
        raise ConfigError("snakemake is not installed beside repdiag; run `make setup`")
    os.execv(exe, [exe, *args.args])


def _command(reference: str) -> Callable[[argparse.Namespace], None]:
    def run(args: argparse.Namespace) -> None:
        resolve(reference)(args.args)

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="repdiag", description="`repdiag ...` entry points for use outside the workflow."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="summarise zarr stores written by the workflow")
    inspect.add_argument("stores", nargs="+", help="paths such as results/embeddings/clip.zarr")
    inspect.set_defaults(func=_inspect)
    validate = commands.add_parser(
        "validate",
        help="check a config as a run would before its first job: schema, cross-key checks, "
        "architectures, and every model's weights files and library caches",
    )
    validate.add_argument(
        "config",
        help="a YAML config, e.g. config/paper.yaml (run in the workflow directory: relative "
        "paths in the config are read from there)",
    )
    validate.add_argument(
        "--no-weights",
        action="store_true",
        help="skip the weights files, hub folders and library caches (pretrained: true, tags, "
        "weights names) and check everything else, e.g. to plan a config whose weights live on "
        "another machine (a real run still checks them before its first job)",
    )
    validate.set_defaults(func=_validate)
    run = commands.add_parser(
        "run",
        help="check every config file a Snakemake command reads, then run it: "
        "repdiag run --cores 8 --configfile my.yaml binding",
        add_help=False,
    )
    run.add_argument("args", nargs=argparse.REMAINDER, help="snakemake's arguments")
    run.set_defaults(func=_run)
    for name, (reference, help_text) in COMMANDS.items():
        command = commands.add_parser(name, help=help_text, add_help=False)
        command.add_argument(
            "args", nargs=argparse.REMAINDER, help=f"options: repdiag {name} --help"
        )
        command.set_defaults(func=_command(reference))
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in COMMANDS:  # its options, even leading ones, are the command's
        args = argparse.Namespace(func=_command(COMMANDS[argv[0]][0]), args=argv[1:])
    elif argv and argv[0] == "run":  # every option is Snakemake's
        args = argparse.Namespace(func=_run, args=argv[1:])
    else:
        args = parser.parse_args(argv)
    register()
    try:
        args.func(args)
    except RepdiagError as err:
        text = " ".join(str(err).split()) if args.func is _validate else str(err)
        print(f"repdiag: error: {text}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
