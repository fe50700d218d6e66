"""Resume for joblib code: ``parallel_config(backend="pipeline", output=...)`` keeps each
call's result, and a rerun returns the kept results and runs only the calls not kept.

Layout (the project's, :mod:`pipeline.layout`), the job named after the function of the
``Parallel`` call's first call::

    <output>/<function>/job.json                 workload "joblib", the function and a
                                                 digest of its code, the calls (units)
    <output>/<function>/calls/<digest>.pkl       one call's result, pickled; <digest> is
                                                 joblib.hash of the function's identity,
                                                 its code and the call's arguments
    <output>/<function>/manifest/part-000000.parquet, manifest.parquet
                                                 written when a Parallel call completes:
                                                 each call's object, its position in the
                                                 call (its unit), size and checksum

so ``pipeline verify <output>`` checks a completed call's results like any job's, and
says "not complete" of one whose driver was killed. An output whose job folder holds
another function's results (or this function's from other code) is refused, naming
both. Without ``output`` nothing is kept and nothing read.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re

from ..cluster.code_digest import source_hash
from ..errors import ConfigError
from ..layout import consolidated_manifest_key, job_record_key, manifest_key
from ..manifest import UNIT_RANGE, checksum, task_entry
from ..storage import join, open_store, write_parquet
from .calls import CallsWorkload, describe_call

__all__ = ["KeptResults", "call_identity"]

#: The folder of a job holding its calls' results.
CALLS_FOLDER = "calls"
PLAN_FORMAT = 2


def call_identity(func) -> tuple[str, str]:
    """The function's ``module:qualname`` and a digest of its code: its source with
    the values it captures (a closure's, a partial's arguments) or reads from its module
    (constants, helpers' source), as a map job's is hashed, else its bytecode. A changed
    function is another function: with its source alone, a constant or a closure's
    value changed returned the results kept of the old one."""
    import functools

    digest = source_hash(func)
    while isinstance(func, functools.partial):
        func = func.func
    if digest is None:
        code_obj = getattr(func, "__code__", None)
        code = code_obj.co_code if code_obj is not None else repr(func).encode()
        digest = hashlib.sha256(code).hexdigest()[:16]
    return describe_call(func), digest


def job_name(func) -> str:
    """The job folder of a function's results: its name, as a folder name."""
    import functools

    while isinstance(func, functools.partial):
        func = func.func
    name = getattr(func, "__name__", None) or type(func).__name__
    return re.sub(r"[^\w.-]", "", name).lstrip("._") or "calls"


class KeptResults:
    """Driver: the results kept under ``output`` for the running ``Parallel`` call."""

    def __init__(self, output_url: str):
        self.url = output_url
        self.store = open_store(output_url)
        self.job_id: str | None = None
        self._present: set[str] = set()
        self._identities: dict[int, tuple[str, str]] = {}
        #: (key, size, checksum) of each call of the running Parallel call, by position.
        self.entries: dict[int, tuple[str, int, str]] = {}

    def start_call(self) -> None:
        self.job_id = None
        self.entries = {}

    def keys_of(self, items: list) -> list[str]:
        """Each call's key (the job chosen, and checked, at the call's first batch)."""
        import joblib

        if self.job_id is None:
            self._open_job(items[0][0])
        keys = []
        for func, args, kwargs in items:
            identity = self._identity(func)
            digest = joblib.hash((identity, args, kwargs))
            keys.append(join(self.job_id, CALLS_FOLDER, f"{digest}.pkl"))
        return keys

    def stored(self, keys: list[str]) -> list | None:
        """The batch's results when every one of its calls is kept, else None."""
        if not all(k in self._present for k in keys):
            return None
        values, meta = [], []
        for key in keys:
            data = self.store.read_bytes(key)
            values.append(pickle.loads(data))
            meta.append((len(data), checksum(data)))
        return values, meta

    def record(self, first: int, keys: list[str], meta: list) -> None:
        for i, (key, (size, digest)) in enumerate(zip(keys, meta, strict=True)):
            self.entries[first + i] = (key, size, digest)

    def finish(self, calls: int) -> None:
        """The Parallel call completed with ``calls`` calls: its manifest and record."""
        if self.job_id is None or len(self.entries) != calls:
            return
        objects = [(k, "call", i, i + 1, s, c) for i, (k, s, c) in sorted(self.entries.items())]
        table = task_entry(UNIT_RANGE, objects)
        write_parquet(self.store, manifest_key(self.job_id, 0), table)
        write_parquet(self.store, consolidated_manifest_key(self.job_id), table)
        self._write_record(calls)

    # -- the job's record --------------------------------------------------------------

    def _identity(self, func) -> tuple[str, str]:
        # (by the function object: hashing its source once per Parallel call, not per call)
        found = self._identities.get(id(func))
        if found is None:
            found = self._identities[id(func)] = call_identity(func)
        return found

    def _open_job(self, func) -> None:
        job_id = job_name(func)
        function, code = self._identity(func)
        key = job_record_key(job_id)
        if self.store.exists(key):
            record = json.loads(self.store.read_bytes(key))
            kept = record.get("function")
            if record.get("workload") != CallsWorkload.kind:
                raise ConfigError(
                    f"{self.store.describe(job_id)} holds a {record.get('workload')!r} job's "
                    f"output, not joblib calls of {function}: give another output"
                )
            if kept != function or record.get("code") != code:
                why = "" if kept != function else " (its code has changed since)"
                raise ConfigError(
                    f"{self.store.describe(job_id)} holds the results of {kept}, not of this "
                    f"program's {function}{why}: give another output, or delete that "
                    "folder to start over"
                )
        self.job_id = job_id
        self._function, self._code = function, code
        prefix = join(job_id, CALLS_FOLDER)
        self._present = set(self.store.list(prefix))
        if not self.store.exists(key):
            self._write_record(0)

    def _write_record(self, calls: int) -> None:
        record = {
            "plan_format": PLAN_FORMAT,
            "workload": CallsWorkload.kind,
            "job_id": self.job_id,
            "function": self._function,
            "code": self._code,
            "head": [],
            "units_per_task": None,
            "stops": [calls] if calls else [],
            "cost_model": None,
            "units": calls,
        }
        data = json.dumps(record, indent=2, sort_keys=True).encode()
        self.store.write_bytes(job_record_key(self.job_id), data)
