"""`python -m bench NAME [args]`: the one way to run a benchmark (bench/NAME.py's `main(argv)`).

Run from the repository root, which puts `dashboard`, `ingest` and `agents` on the import path.
`python -m bench` alone lists the benches.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

NOT_BENCHES = {"common", "results"}


def benches() -> list[str]:
    """Modules of this package that are benchmarks (each has a `main(argv)`)."""
    here = str(Path(__file__).resolve().parent)
    return sorted(
        m.name for m in pkgutil.iter_modules([here]) if m.name not in NOT_BENCHES and not m.name.startswith("_")
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m bench NAME [args]   (python -m bench NAME --help for a bench's own arguments)")
        print("benches: " + ", ".join(benches()))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in benches():
        print(f"no bench {name!r}; benches: {', '.join(benches())}", file=sys.stderr)
        return 2
    sys.argv = [f"python -m bench {name}", *rest]  # argparse's usage lines name the real command
    status = importlib.import_module(f"bench.{name}").main(rest)
    return int(status or 0)


if __name__ == "__main__":
    raise SystemExit(main())
