"""A joblib call as the ``pipeline`` backend hands it to a runner: one task."""

from __future__ import annotations

from pipeline.joblib import PipelineBackend
from pipeline.joblib.calls import CallBatch, CallTask, pickle_batch


def call_task(index: int, func, *args) -> CallTask:
    """Task ``index``: the call ``func(*args)``, its payload inline."""
    nested = PipelineBackend(nesting_level=0).get_nested_backend()
    payload = pickle_batch(CallBatch([(func, args, {})], nested))
    return CallTask.inline(index, index, index + 1, payload)
