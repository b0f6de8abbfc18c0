"""A process pool whose workers never outlive the process that started them.

A large `check` lints in a pool of forked workers. A worker blocked on the pool's pipe does
not see its parent die: it holds the pipe's write end itself, so it never reads end-of-file.
Killed by the OOM killer, `timeout` or a CI runner, the parent used to leave its workers
alive for good, holding the caller's stdout and stderr open (a caller waiting for EOF hung).
So each worker, before it takes a job:
- writes nothing to the caller's streams (stdin, stdout and stderr are /dev/null; results go
  back through the pool's pipe);
- leaves the terminal's process group, so Ctrl-C reaches only the parent, which kills it;
- takes the default action for SIGTERM and SIGHUP (a forked worker inherits the parent's
  handlers, which would turn them into an exception the pool sends back and survives);
- dies with its parent: Linux's parent-death signal (SIGKILL), and on every platform a
  watchdog thread that exits when the parent's pid is no longer its parent.
The parent kills the workers when anything, a stop signal included, interrupts the map."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

WATCHDOG_SECONDS = 0.5


def map_in_pool(context, workers: int, initializer, initargs: tuple, fn, jobs: list, chunksize: int) -> list:
    """`fn` over `jobs` in `workers` processes, in order; the workers are gone when it returns
    or raises."""
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(workers, context, _tied_init, (os.getpid(), initializer, initargs))
    # chunks as futures of our own rather than `pool.map`: its iterator cancels the pending
    # futures as an exception leaves it, and the pool's manager thread then fails on them
    # (InvalidStateError) once the killed workers break the pool
    futures = [pool.submit(_run_chunk, fn, jobs[i:i + chunksize]) for i in range(0, len(jobs), chunksize)]
    try:
        results = [result for future in futures for result in future.result()]
    except BaseException:
        kill_workers(pool)
        release_result_pipe(pool)
        manager = getattr(pool, "_executor_manager_thread", None)
        pool.shutdown(wait=False)
        if manager is not None:
            # let the pool's manager thread see the dead workers and close its pipe before the
            # interpreter's exit hook writes to that pipe (a race that printed a traceback)
            manager.join(5)
        raise
    pool.shutdown(wait=True)
    return results


def _run_chunk(fn, chunk: list) -> list:
    return [fn(job) for job in chunk]


def release_result_pipe(pool) -> None:
    """Close the parent's write end of the pool's result pipe once the workers are dead. A
    worker killed halfway through writing its result leaves a partial message, and the pool's
    manager thread then blocks reading the rest; with no writer left the read ends (EOF), the
    pool is marked broken and the thread exits. Otherwise the interpreter's exit hook joins that
    thread forever and a stopped `check` never exits (seen under load: SIGHUP, exit never came)."""
    queue = getattr(pool, "_result_queue", None)
    writer = getattr(queue, "_writer", None)
    if writer is not None:
        try:
            writer.close()
        except OSError:
            pass


def kill_workers(pool) -> None:
    """SIGKILL every worker of a ProcessPoolExecutor and reap it."""
    kill = getattr(pool, "kill_workers", None)  # Python 3.14
    if kill is not None:
        kill()
        return
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        try:
            process.kill()
        except (OSError, ValueError, AttributeError):
            pass
    for process in processes:
        try:
            process.join(2)
        except (OSError, ValueError, AttributeError, AssertionError):
            pass


def _tied_init(parent: int, initializer, initargs: tuple) -> None:
    tie_to_parent(parent)
    initializer(*initargs)


def tie_to_parent(parent: int) -> None:
    """Make this (forked or spawned) worker process unable to outlive `parent`."""
    _quiet_streams()
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and kills us
    try:
        os.setpgid(0, 0)
    except (OSError, AttributeError):
        pass
    die_with_parent(parent)


def die_with_parent(parent: int) -> None:
    """End this process when `parent` (its parent's pid when it started) ends."""
    _death_signal()
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)
    threading.Thread(target=_watch, args=(parent,), name="cfgfix-parent-watch", daemon=True).start()


def _quiet_streams() -> None:
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    for fd in (0, 1, 2):
        try:
            os.dup2(null, fd)
        except OSError:
            pass
    os.close(null)


def _death_signal() -> None:
    """prctl(PR_SET_PDEATHSIG, SIGKILL): the kernel kills this process when its parent dies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCHDOG_SECONDS)
    os._exit(1)
