"""``kerneltriage calibrate``: measure this GPU's ceilings (copy bandwidth, matmul and FMA peaks)
and store them for every later profile, or record them in a run."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option("--quick", is_flag=True, help="Smaller problems and fewer repetitions (a few seconds).")
@click.option("--device", type=click.IntRange(min=0), default=0, show_default=True, help="CUDA device index.")
@click.option("--json", "as_json", is_flag=True, help="Print the measurement as JSON.")
@click.option(
    "--run",
    "run_path",
    type=click.Path(exists=True, path_type=Path),
    help="Also measure this run's own GEMM shapes (the 8 with the most FLOPs) and record the "
    "result in the run's manifest when the run was made on this GPU.",
)
def calibrate(quick: bool, device: int, as_json: bool, run_path: Path | None) -> None:
    """Measure this GPU's ceilings: copy bandwidth, bf16/fp16/tf32 matmul and fp32 FMA peaks.

    A matmul peak is the best of several shapes (square 4096 and 8192, a long K, and with
    --run the run's own GEMMs): one long run of one shape throttles the clock below what a
    training step's GEMMs reach. The result is stored per GPU
    (~/.cache/kerneltriage/calibration/); `profile` records it in each run's manifest and
    `report` then prefers it to the datasheet figures. Needs torch with CUDA and a GPU.

    \b
    Examples:
      kerneltriage calibrate                       # this machine's GPU 0, then every later profile uses it
      kerneltriage calibrate --quick               # smaller problems, fewer repetitions
      kerneltriage calibrate --device 1 --json     # another GPU, the measurement as JSON
      kerneltriage profile --calibrate -- python train.py   # measure first, record it in the run
      kerneltriage calibrate --run runs/exp1       # add that run's GEMM shapes, record in the run
    """
    import json

    from kerneltriage.profile import calibrate as cal

    shapes = cal.run_gemm_shapes(run_path) if run_path else None
    result = cal.measure(device, quick, shapes)
    if run_path:
        result["run"] = str(run_path)
    path = cal.save(result)
    recorded = cal.record_in_run(run_path, result) if run_path else None
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        peaks = ", ".join(f"{k} {v:g}" for k, v in result["peak_tflops"].items())
        click.echo(f"{result['gpu']}: copy {result['hbm_gbs']:g} GB/s; peak TFLOP/s: {peaks}")
        for precision, best in cal.best_shapes(result).items():
            click.echo(
                f"  {precision}: best {best['tflops']:g} TFLOP/s at {best['shape']} ({best['from']} shape)"
            )
        click.echo(f"saved {path}")
    if recorded:
        click.echo(recorded, err=as_json)
