"""Write every report of the shipped runs and the external-trace corpus to a folder, so that a
change meant to leave reports alone can be checked byte for byte:

    python scripts/report_digest.py /tmp/before          # on the old tree
    python scripts/report_digest.py /tmp/after           # on the new one
    diff -r /tmp/before /tmp/after                       # nothing, or the change is not a refactor

Each input gets its terminal, Markdown, JSON, CSV and HTML report. The corpus comes from
``$KERNELTRIAGE_CORPUS`` (else ``../shared``) and is left out, with a line saying so, where it is
absent. ``--quick`` reports the shipped runs only; ``--only NAME`` (repeatable) the inputs whose
name contains NAME.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
FORMATS = {"terminal": "txt", "markdown": "md", "json": "json", "csv": "csv", "html": "html"}


def inputs(quick: bool) -> list[tuple[str, Path]]:
    found = [(f"run-{p.name}", p) for p in sorted((ROOT / "examples" / "runs").iterdir()) if p.is_dir()]
    if quick:
        return found
    sys.path.insert(0, str(ROOT))
    from tests.helpers import EXTERNAL as traces  # one locator for the corpus, shared with the tests

    if not traces.is_dir():
        print("no external-trace corpus: the shipped runs only", file=sys.stderr)
        return found
    for folder in sorted(p for p in traces.iterdir() if p.is_dir()):
        ranks = [p for p in sorted(folder.iterdir()) if p.name.startswith("worker0.")]
        if len(ranks) > 1:  # separate captures of one rank, not one trace per rank: each alone
            found += [(f"trace-{folder.name}-{i}", p) for i, p in enumerate(ranks)]
        else:
            found.append((f"trace-{folder.name}", folder))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write the reports to (created)")
    parser.add_argument("--quick", action="store_true", help="the shipped runs only")
    parser.add_argument("--only", action="append", default=[], help="inputs whose name contains this")
    args = parser.parse_args()

    from kerneltriage.cli import main as cli

    args.out.mkdir(parents=True, exist_ok=True)
    runner = CliRunner()
    failed = 0
    for name, path in inputs(args.quick):
        if args.only and not any(o in name for o in args.only):
            continue
        for fmt, suffix in FORMATS.items():
            target = args.out / f"{name}.{suffix}"
            result = runner.invoke(cli, ["report", str(path), "--format", fmt, "-o", str(target)])
            output = result.output.replace(str(args.out), "OUT")
            (args.out / f"{name}.{fmt}.exit").write_text(f"{result.exit_code}\n{output}")
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                failed += 1
                print(f"{name} {fmt}: {result.exception!r}", file=sys.stderr)
        print(f"{name}: done", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
