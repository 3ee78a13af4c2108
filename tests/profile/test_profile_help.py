"""`kerneltriage profile --help` says the phases in the order they run."""

from __future__ import annotations

import re

from click.testing import CliRunner

from kerneltriage.cli import main


def test_timing_steps_help_follows_the_order_of_the_steps():
    """Plain steps come right after the warm-up (no profiler may have run before them), then the
    clean steps, then the recorded ones (profile/step_plan.py's StepPlan)."""
    result = CliRunner().invoke(main, ["profile", "--help"], terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    help_text = re.search(r"--timing-steps INTEGER RANGE (.*?)\[default: 5", text).group(1)
    assert help_text.index("warm-up") < help_text.index("nothing installed") < help_text.index("GPU-only")
    assert help_text.index("GPU-only") < help_text.index("before the recorded steps")
    assert "After the recorded steps" not in help_text
