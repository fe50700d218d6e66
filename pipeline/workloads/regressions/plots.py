"""Diagnostic figures: per chunk (on the workers) and a summary across chunks (driver).

matplotlib with the non-interactive Agg/PDF backends, and no creation date in the
PDF metadata, so the same fit gives the same bytes.
"""

from __future__ import annotations

import io

import numpy as np

from ...storage import Store, join, read_parquet_object

__all__ = ["chunk_figure", "write_summary_figure"]

_METADATA = {"CreationDate": None, "Creator": "pipeline", "Producer": None}


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def chunk_figure(fit, label: str) -> bytes:
    """PDF: residuals against fitted values, and a normal QQ plot of the residuals."""
    from scipy import stats

    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 4))
    try:
        ax1.scatter(fit.fitted, fit.resid, s=6, alpha=0.6)
        ax1.axhline(0.0, color="grey", lw=0.8)
        ax1.set_xlabel("fitted values")
        ax1.set_ylabel("residuals")
        ax1.set_title("residuals vs fitted")
        r = np.sort(fit.resid)
        q = stats.norm.ppf((np.arange(1, len(r) + 1) - 0.5) / len(r))
        ax2.scatter(q, r, s=6, alpha=0.6)
        lo, hi = q[0], q[-1]
        scale = np.std(r) or 1.0
        ax2.plot([lo, hi], [lo * scale + r.mean(), hi * scale + r.mean()], color="grey", lw=0.8)
        ax2.set_xlabel("normal quantiles")
        ax2.set_ylabel("residual quantiles")
        ax2.set_title("normal QQ")
        fig.suptitle(f"{label}  (n={fit.nobs}, R²={fit.rsquared:.3g})")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="pdf", metadata=_METADATA)
        return buf.getvalue()
    finally:
        plt.close(fig)


def write_summary_figure(store: Store, job_id: str) -> str:
    """Histogram of each term's estimates across chunks -> ``<job>/coefficients-summary.pdf``."""
    import pyarrow as pa

    parts = [
        read_parquet_object(store, k, columns=["term", "estimate"])
        for k in store.list(join(job_id, "coefficients"))
        if k.endswith(".parquet")
    ]
    table = pa.concat_tables(parts).to_pandas(use_threads=False) if parts else None
    plt = _plt()
    terms = list(dict.fromkeys(table["term"])) if table is not None else []
    cols = min(4, max(1, len(terms)))
    rows = max(1, -(-len(terms) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
    try:
        for ax, term in zip(axes.flat, terms, strict=False):
            values = table.loc[table["term"] == term, "estimate"].to_numpy()
            ax.hist(values[np.isfinite(values)], bins=40)
            ax.set_title(term, fontsize=8)
        for ax in list(axes.flat)[len(terms) :]:
            ax.axis("off")
        fig.suptitle(f"{job_id}: estimates across chunks")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="pdf", metadata=_METADATA)
    finally:
        plt.close(fig)
    key = join(job_id, "coefficients-summary.pdf")
    store.write_bytes(key, buf.getvalue())
    return store.describe(key)
