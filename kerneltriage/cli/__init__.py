"""The command line: parse, call the core, render. Nothing else lives here.

One module per command (``report_command.py``, ``profile_command.py``, …), the options several
share in ``options.py``, their output in ``console.py``. Core errors reach click in
``group.py``'s command group, which makes each a one-line message and its exit code. Modules
import click and little else: ``kerneltriage --help`` stays fast, ``report`` needs no torch.
"""

from __future__ import annotations

import click

from kerneltriage import __version__
from kerneltriage.cli.calibrate_command import calibrate
from kerneltriage.cli.diff_command import diff
from kerneltriage.cli.group import CommandGroup
from kerneltriage.cli.profile_command import profile
from kerneltriage.cli.report_command import report
from kerneltriage.cli.scaffold_command import scaffold
from kerneltriage.cli.verify_command import verify

__all__ = ["main"]


@click.group(
    cls=CommandGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.version_option(__version__, prog_name="kerneltriage")
def main() -> None:
    """Decide whether a custom GPU kernel is worth writing.

    A kernel pays only when three conditions hold for an op: HEADROOM (the profiler shows it
    far below its roofline ceiling), HOTNESS (it is a large share of step time) and SHAPE
    STABILITY (it runs on one or a few shapes). kerneltriage measures all three.

    The cheap fixes come first: a library op, a built-in or torch.compile, each measured by
    `verify` before the report counts on it. Profile again with the verified fixes applied, and
    a `write` verdict is what is left below its roof.

    \b
    Typical session:
      kerneltriage profile --out runs/exp1 -- python train.py --lr 3e-4
      kerneltriage report runs/exp1                # ranked verdicts, fixes and savings
      kerneltriage verify runs/exp1                # each fix applied and measured
      kerneltriage profile --apply runs/exp1       # again with the verified fixes: runs/exp1-applied
      kerneltriage diff runs/exp1 runs/exp1-applied
      kerneltriage scaffold runs/exp1-applied C1 --out kernels/c1  # a Triton package for a write
    """


for _command in (report, diff, profile, verify, calibrate, scaffold):
    main.add_command(_command)
