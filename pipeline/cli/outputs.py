"""``pipeline`` commands about outputs and the installation: the registered workloads,
a job's tables, TLS certificates, and verifying an output."""

from __future__ import annotations

import sys
import warnings

import click

from .. import registry
from ..config import env_name, flag_name, settings_of
from ..errors import PipelineError
from ..summary import count


@click.command("workloads")
def workloads_command() -> None:
    """List the registered workloads: each one's package and settings."""
    for name in registry.names():
        e = registry.entry(name)
        click.echo(f"{name}  ({e.target}, from package {e.package})")
        try:
            cls = registry.load(name)
        except PipelineError as exc:
            click.echo(f"  cannot be loaded: {exc}")
            continue
        for f in settings_of(cls.settings_class):
            click.echo(f"  --{flag_name(f):<22} {env_name(f):<28} {f.metadata['help']}")


@click.command("results")
@click.argument("output")
@click.option("--job", help="The job's id, when OUTPUT holds several.")
@click.option(
    "--table",
    help="Which table (a regression job: models or coefficients; a map job: results, "
    "failures). Default: the workload's main table.",
)
@click.option("--out", help="Write the whole table here (.parquet or .csv, a local path or s3://).")
@click.option(
    "--code",
    help="Only the rows of the tasks this code version made (its first digits suffice; "
    "`pipeline verify` lists the versions of a job run with --keep-done).",
)
def results_command(output, job, table, out, code) -> None:
    """Concatenate a job's per-task tables into one, in unit order (or summarize it).

    OUTPUT: the run's output (a folder or s3:// prefix), or the job's own folder."""
    from ..results import IncompleteJob, summarize, write_results

    if out:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", IncompleteJob)
            rows = write_results(output, table, out, job, code)
        click.echo(f"wrote {rows} rows to {out}")
        for warning in caught:
            if issubclass(warning.category, IncompleteJob):
                click.echo(f"incomplete: {warning.message}", err=True)
    else:
        click.echo(summarize(output, table, job, code))


@click.command("certs")
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder for ca.pem, <role>.pem and <role>-key.pem.",
)
@click.option("--days", type=int, default=365, show_default=True, help="Validity in days.")
@click.option(
    "--host",
    "hosts",
    multiple=True,
    default=("localhost", "127.0.0.1"),
    show_default=True,
    help="Host name or IP for the certificates' SAN (repeatable, or comma-separated).",
)
@click.option("--overwrite", is_flag=True, help="Replace existing files.")
def certs_command(out, days, hosts, overwrite) -> None:
    """Create a CA and TLS certificates for the scheduler, worker and client roles.

    Keys are written with mode 0600. Give the scheduler, workers and driver the
    CA and their own role's pair; keep ca-key.pem offline.
    """
    from ..cluster.tls import make_certificates

    try:
        files = make_certificates(out, days=days, hosts=hosts, overwrite=overwrite)
    except (ValueError, FileExistsError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"wrote {len(files)} files to {out} (valid {days} days for {', '.join(hosts)})")


@click.command("verify")
@click.argument("output")
@click.option("--job", "jobs", multiple=True, help="Only this job id (repeatable).")
@click.option(
    "--repair",
    is_flag=True,
    help="Mark the tasks whose objects are missing or corrupt to run again (their "
    "objects and manifest entries are deleted); the job's command, run again, redoes them.",
)
def verify_command(output, jobs, repair) -> None:
    """Check OUTPUT (a folder or s3:// prefix, or one job's folder) against its manifests.

    Reports objects that are missing, extra (not in any manifest), corrupt
    (checksum differs), and units listed more or fewer than once. Exits
    non-zero when anything is wrong.
    """
    from ..verify import verify_output

    checks = verify_output(output, list(jobs) or None, repair=repair)
    bad = False
    for c in checks:
        status = "OK" if c.ok else "FAILED"
        click.echo(
            f"{c.job_id} ({c.workload}): {status}: {c.units_ok} of {c.units_expected} "
            f"units verified in {c.objects_checked} objects; {len(c.missing)} missing, "
            f"{len(c.extra)} extra, {len(c.corrupt)} corrupt, "
            f"{len(c.duplicated)} duplicated"
        )
        if c.failed_units:
            job = f" --job {c.job_id}" if len(checks) > 1 else ""
            again = ""
            if c.reruns_failed_units:
                again = "; the job's command, run again, calls them again"
            click.echo(
                f"  failed: {count(c.failed_units, 'unit')} failed as data, recorded in the "
                f"output (not damage): `pipeline results {output}{job} --table "
                f"{c.failures_table}` lists them{again}"
            )
        if len(c.code_versions) > 1:
            made = ", ".join(
                f"{n} by {v.replace('+', ' and ')}" + (" (rows of both)" if "+" in v else "")
                for v, n in sorted(c.code_versions.items(), key=lambda kv: -kv[1])
            )
            job = f" --job {c.job_id}" if len(checks) > 1 else ""
            click.echo(
                f"  code versions: tasks {made} (a run with --keep-done kept those done); "
                f"`pipeline results {output}{job} --code VERSION` shows one version's rows"
            )
        for label, items in (
            ("missing", c.missing),
            ("extra", c.extra),
            ("corrupt", c.corrupt),
            ("duplicated", c.duplicated),
        ):
            for item in items[:10]:
                click.echo(f"  {label}: {item}")
            if len(items) > 10:
                click.echo(f"  ... {len(items) - 10} more {label}")
        if c.incomplete:
            click.echo(f"  incomplete: {c.incomplete}")
        if c.leftovers:
            click.echo(
                f"  leftovers: {count(len(c.leftovers), 'object')} written by task attempts "
                "that lost or failed and ended before removing them (no entry lists them; "
                f"not damage): the job's next complete run removes them, e.g. {c.leftovers[0]}"
            )
        if c.repaired:
            spans = ", ".join(f"{t.start}-{t.stop - 1}" for t in c.repaired[:10])
            more = f" and {len(c.repaired) - 10} more" if len(c.repaired) > 10 else ""
            click.echo(
                f"  repair: {len(c.repaired)} task(s) (units {spans}{more}) marked to run "
                "again: run the job's command again (without --overwrite) to redo them"
            )
        elif c.damaged_units:
            click.echo(
                "  `pipeline verify --repair` marks the damaged tasks to run again, and the "
                "job's command then redoes them alone"
            )
        if c.damaged_manifest:
            click.echo(
                "  repair: removed the damaged manifest.parquet: run the job's command again "
                "to write it from the tasks' entries"
                if repair
                else "  `pipeline verify --repair` removes the damaged manifest.parquet, and "
                "the job's command writes it again from the tasks' entries"
            )
        if c.extra and c.incomplete:
            # A task whose entry is missing left its objects unlisted: its rerun writes
            # them again (the job's own, not strangers to delete).
            click.echo(
                "  extra objects: no manifest entry lists them; while tasks are missing "
                "they may be those tasks' own, which the job's command writes again"
            )
        elif c.extra:
            click.echo(
                "  extra objects are none of the job's: verify never deletes them (--repair "
                "neither); delete them, or keep them elsewhere"
            )
        bad |= not c.ok
    if bad:
        sys.exit(1)
