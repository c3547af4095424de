"""``python -m toolbus run ...`` / ``python -m toolbus client ...`` without the console
script (the ``toolbus`` command itself is wired in ``gateway/cli.py``)."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    """Dispatch ``run`` to :mod:`toolbus.script` and ``client`` to :mod:`toolbus.interactive`."""
    if not argv or argv[0] not in ("run", "client"):
        print(
            "usage: python -m toolbus run FILE... --url URL | client URL --token T", file=sys.stderr
        )
        return 2
    if argv[0] == "run":
        from toolbus import script

        return script.main(argv[1:])
    from toolbus import interactive

    return interactive.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
