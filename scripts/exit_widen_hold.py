"""Holds the interpreter's finalization open while a GIL request that
``scripts/exit_widen.c`` delays is still waiting (at most 10 s): part of
``scripts/exit_stress.py --widen-us``, a measuring aid. Imported before the command;
its object is deleted as the modules are cleared, after the interpreter has set itself
finalizing, and waits there (releasing the GIL) so that the delayed request meets the
finalizing interpreter, as a late one does by chance without the delay."""

import ctypes
import time

_pending = ctypes.CDLL(None).exit_widen_pending


class _Hold:
    def __del__(self, pending=_pending, sleep=time.sleep, now=time.monotonic):
        end = now() + 10
        while pending() and now() < end:
            sleep(0.005)
        sleep(0.05)  # the request that just left the delay reaches take_gil


_hold = _Hold()
