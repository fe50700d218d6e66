"""The fleet simulation, ``benchmarks/fleet/scale_sim.py``, by the path the GPU host's
harness runs (``python3 scripts/scale_sim.py ...`` in its ``bench.sh``):
the module, with the repository's root on its import path, in this interpreter."""

import os
import sys
from pathlib import Path

root = str(Path(__file__).resolve().parents[1])
path = os.environ.get("PYTHONPATH")
os.environ["PYTHONPATH"] = root + (os.pathsep + path if path else "")
os.execv(sys.executable, [sys.executable, "-m", "benchmarks.fleet.scale_sim", *sys.argv[1:]])
