"""``kerneltriage scaffold``: a Triton kernel package for a report candidate, or for an op class
and its shapes, correct and benchmarked from the start."""

from __future__ import annotations

from pathlib import Path

import click

from kerneltriage.cli.options import gpu_option, ncu_option, rules_option


class _KindOption(click.Option):
    """``--kind``, its help read from the scaffold families' registry when help is shown (the
    registry's import is too slow for every start)."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from kerneltriage.scaffold import kinds_text

        self.help = f"Without a run, the op class to scaffold, by template: {kinds_text()}."
        return super().get_help_record(ctx)


@click.command()
@click.argument("run", required=False, type=click.Path(path_type=Path))
@click.argument("candidate", required=False)
@click.option(
    "--out",
    "-o",
    required=True,
    type=click.Path(path_type=Path),
    help="Folder for the package (created; refused when it exists and is not empty, unless --force).",
)
@click.option(
    "--force", is_flag=True, help="Write into a non-empty --out, replacing the scaffold's own files."
)
@click.option("--kind", cls=_KindOption)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    help="With --kind: one observed shape, e.g. 16384x4096 (attention BxHxSxD, gemm MxNxK); repeatable.",
)
@click.option("--dtype", help="With --kind: bf16 (default), fp16 or fp32.")
@gpu_option("with --kind: default H100-SXM")
@ncu_option
@rules_option
@click.option(
    "--rank",
    type=click.IntRange(min=0),
    help="For a multi-rank run: the rank whose candidate to scaffold (ids are numbered per rank; "
    "the report's commands name it). Default: the only rank, else the one Nsight Compute profiled.",
)
def scaffold(
    run: Path | None,
    candidate: str | None,
    out: Path,
    force: bool,
    kind: str | None,
    shapes: tuple[str, ...],
    dtype: str | None,
    gpu: str | None,
    ncu: Path | None,
    rules_file: Path | None,
    rank: int | None,
) -> None:
    """Write a Triton kernel package for a report candidate: kernel.py, reference.py,
    test_kernel.py, bench.py and README.md, correct and benchmarked from the start.

    RUN and CANDIDATE are a run (or trace) and a candidate id from `kerneltriage report RUN`.
    Without a run, --kind with --shape (and --dtype) scaffolds an op class directly.

    \b
    Examples:
      kerneltriage scaffold runs/exp1 C3 --out kernels/c3
      kerneltriage scaffold runs/ddp C2 --rank 1 --out kernels/c2   # a rank of a torchrun run
      kerneltriage scaffold --kind rmsnorm --shape 16384x4096 --dtype bf16 --out kernels/my_norm
      cd kernels/c3 && TRITON_INTERPRET=1 pytest -q && python bench.py
    """
    from kerneltriage.errors import InputError
    from kerneltriage.outputs import check_outputs
    from kerneltriage.scaffold import scaffold_candidate, scaffold_kind

    check_outputs({}, [run, ncu, rules_file], {"--out": out})

    if kind:
        if run is not None or candidate is not None:
            raise InputError("give either RUN CANDIDATE or --kind with --shape, not both")
        if rank is not None:
            raise InputError("--rank goes with RUN CANDIDATE, not --kind")
        result = scaffold_kind(kind, list(shapes), dtype, out, force=force, gpu=gpu)
    else:
        if run is None or candidate is None:
            raise InputError(
                "expected RUN and CANDIDATE (kerneltriage scaffold runs/exp1 C3 --out kernels/c3), "
                "or --kind with --shape"
            )
        if shapes or dtype:
            raise InputError("--shape and --dtype go with --kind")
        result = scaffold_candidate(
            run, candidate, out, force=force, ncu=ncu, rules_file=rules_file, gpu=gpu, rank=rank
        )
    for message in result.messages:
        click.echo(f"note: {message}", err=True)
    names = ", ".join(path.name for path in result.files)
    click.echo(f"wrote {result.out}/: {names} ({result.template} template, `{result.name}`)")
    click.echo(f"next: cd {result.out} && TRITON_INTERPRET=1 pytest -q && python bench.py")
