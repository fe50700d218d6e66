"""Helpers shared by the tests and the benchmarks: real-process clusters (a TLS
scheduler behind HAProxy, ``dask worker`` processes), and the references the
regression engines' accuracy is measured against (exact rational least squares,
NIST's StRD sets, designs of chosen conditioning).

Not product code and not shipped (the package build takes ``pipeline*`` only). Imported
as ``harness``: the tests get the repository's root on ``sys.path`` from pytest's
``pythonpath`` setting (pyproject.toml), the benchmarks by running as modules from the
root (``python -m benchmarks.NAME``).
"""
