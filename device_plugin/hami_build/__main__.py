"""``python -m device_plugin.hami_build SOURCE INTO [CHANGE ...]``: a copy of HAMi-core's exported source at INTO
with the named changes made, in the order they build on each other (none: a stock copy), as Dockerfile.plugin's
HAMi-core stage runs it. A change the source cannot take (its code moved) or an unknown name exits 2 naming
it, before anything is compiled."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from device_plugin.hami_build.changes import CHANGES, DESCRIBED, in_order, with_changes
from device_plugin.hami_build.edit import ChangeError


def main(argv: Sequence[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="python -m device_plugin.hami_build", description=__doc__)
    cli.add_argument("source", type=Path, help="HAMi-core's exported source (left as it is)")
    cli.add_argument("into", type=Path, help="where the changed copy goes (replaced if there)")
    cli.add_argument("changes", nargs="*", help=f"the changes to make, in order, of {', '.join(CHANGES)}")
    args = cli.parse_args(argv)
    unknown = [c for c in args.changes if c not in CHANGES]
    if unknown:
        cli.error(f"unknown change {', '.join(unknown)}: the changes are {', '.join(CHANGES)}")
    if not args.source.is_dir():
        cli.error(f"{args.source} is not a directory: give HAMi-core's exported source")
    changes = in_order(args.changes)
    try:
        with_changes(args.source, args.into, changes)
    except ChangeError as exc:
        cli.error(str(exc))
    for change in changes:
        sys.stdout.write(f"{change}: {DESCRIBED[change]}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
