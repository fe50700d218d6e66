"""``pipeline data regressions``: a demo panel for per-chunk regressions (registered under
the entry-point group ``pipeline.data``)."""

from __future__ import annotations

import click

__all__ = ["regressions_data_command"]


@click.command("regressions")
@click.option("--chunks", type=int, default=1000, show_default=True, help="Number of chunks.")
@click.option("--rows", type=int, default=250, show_default=True, help="Rows per chunk.")
@click.option("--features", type=int, default=5, show_default=True, help="Features x1..xK.")
@click.option("--out", required=True, help="Folder or s3:// prefix to write into.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
def regressions_data_command(chunks, rows, features, out, seed) -> None:
    """Write a panel for per-chunk regressions: a `chunk` column, a response `y`,
    features x1..xK and a categorical `sector`, with known coefficients per chunk."""
    from ...storage import open_store
    from .generate import write_regression_data

    facts = write_regression_data(
        open_store(out), "", chunks=chunks, rows=rows, features=features, seed=seed
    )
    click.echo(f"wrote {chunks} chunks of {rows} rows to {out}; model: {facts['formula']}")
