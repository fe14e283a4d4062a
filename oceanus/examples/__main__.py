"""``python -m oceanus.examples DIR [--models a,b,...]``: write the example repository."""

from __future__ import annotations

import argparse
import sys

from .repository import EXAMPLE_MODELS, write_example_repository


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m oceanus.examples",
        description="Write Oceanus's example Triton model repository into DIR.",
    )
    parser.add_argument("directory", metavar="DIR", help="repository directory to write")
    parser.add_argument(
        "--models",
        help="comma-separated model names (default: all): " + ", ".join(EXAMPLE_MODELS),
    )
    args = parser.parse_args(argv)
    models = None
    if args.models is not None:
        models = [name.strip() for name in args.models.split(",") if name.strip()]
    try:
        root = write_example_repository(args.directory, models)
    except ValueError as exc:
        parser.error(str(exc))  # exits with status 2 and the usage line
    count = len(EXAMPLE_MODELS) if models is None else len(set(models))
    print(f"wrote {count} model(s) to {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
