"""joblib's ``Parallel`` on the cluster: the ``pipeline`` backend (docs/joblib.md).

``import pipeline`` registers it, through joblib's public
``register_parallel_backend``::

    import joblib, pipeline

    with joblib.parallel_config(backend="pipeline"):
        results = joblib.Parallel(n_jobs=-1)(joblib.delayed(f)(x) for x in xs)
"""

from joblib import register_parallel_backend

from .backend import PipelineBackend
from .session import close_sessions

__all__ = ["BACKEND_NAME", "PipelineBackend", "close_sessions"]

#: The backend's name in ``parallel_config(backend=...)``.
BACKEND_NAME = "pipeline"

register_parallel_backend(BACKEND_NAME, PipelineBackend)
