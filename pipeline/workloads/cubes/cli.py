"""``pipeline data frames``: input frames for cube jobs (registered under the entry-point
group ``pipeline.data``)."""

from __future__ import annotations

import click

__all__ = ["frames_command"]


@click.command("frames")
@click.option("--count", type=int, default=100, show_default=True, help="Number of frames.")
@click.option("--rows", type=int, default=1000, show_default=True, help="Rows per frame.")
@click.option("--cols", type=int, default=1000, show_default=True, help="Columns per frame.")
@click.option("--out", required=True, help="Folder or s3:// prefix to write into.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace the frames OUT holds (all of them: none is left from an earlier, larger count).",
)
def frames_command(count, rows, cols, out, seed, overwrite) -> None:
    """Write parquet frames of random floats rounded to 10 decimals. A folder that
    already holds frames is refused unless --overwrite."""
    from ...storage import open_store
    from .frames import write_frames

    store = open_store(out)
    keys = write_frames(
        store, "", count=count, rows=rows, cols=cols, seed=seed, overwrite=overwrite
    )
    click.echo(f"wrote {len(keys)} frames of {rows}x{cols} to {store.url}")
