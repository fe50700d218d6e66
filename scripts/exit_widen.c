/* Widens the exit race of scripts/exit_stress.py (--widen-us): a measuring aid, never
   part of the pipeline.

   Loaded with LD_PRELOAD, it stands in for PyGILState_Ensure, the call by which
   pyarrow's C++ threads take the GIL (to release a Python object a task holds: the
   bytes a parquet file was read from, as a PyBuffer). On any thread but the main one
   it sleeps WIDEN_US microseconds first, then calls Python's own. A pool thread that
   takes the GIL while the main thread waits for it only runs later; one that takes it
   after the call that started it has returned now does so while the interpreter is
   finalizing, where Python ends it with pthread_exit, whose unwinding through Arrow's
   noexcept frames aborts the process ("terminate called without an active
   exception"). So a rare abort becomes a near-certain one wherever such a late GIL
   request exists, and none appears where none exists.

   A request still waiting as the interpreter finalizes is waited for there by
   scripts/exit_widen_hold.py (exit_widen_pending() counts them), so that it lands
   while the interpreter is finalizing rather than after the process is gone.

   WIDEN_LOG=1 writes a line to stderr for each such call, saying whether the
   interpreter was finalizing. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int (*ensure_fn)(void);
static int pending;

int exit_widen_pending(void) { return __atomic_load_n(&pending, __ATOMIC_SEQ_CST); }
extern int _Py_IsFinalizing(void);

int PyGILState_Ensure(void) {
    static ensure_fn real;
    static long delay_us = -1;
    if (!real) real = (ensure_fn)dlsym(RTLD_NEXT, "PyGILState_Ensure");
    if (delay_us < 0) {
        const char *s = getenv("WIDEN_US");
        delay_us = s ? atol(s) : 50000;
    }
    long tid = syscall(SYS_gettid);
    if (tid != getpid()) {
        if (delay_us > 0) {
            struct timespec ts = {delay_us / 1000000, (delay_us % 1000000) * 1000};
            __atomic_add_fetch(&pending, 1, __ATOMIC_SEQ_CST);
            nanosleep(&ts, NULL);
            __atomic_sub_fetch(&pending, 1, __ATOMIC_SEQ_CST);
        }
        if (getenv("WIDEN_LOG")) {
            char line[96];
            int n = snprintf(line, sizeof line, "exit_widen: GIL asked by thread %ld, finalizing=%d\n",
                             tid, _Py_IsFinalizing());
            if (write(2, line, n) < 0) {
            }
        }
    }
    return real();
}
