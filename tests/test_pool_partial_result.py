"""A worker killed halfway through writing its result to the pool's pipe must not leave the
parent hanging on exit: the pool's manager thread blocks reading the rest of the message, and
the interpreter's exit hook joins that thread (a pooled `check` stopped by SIGHUP under load
printed "stopped by SIGHUP" and never exited). Reproduced here without timing luck: a job
writes a partial message itself, then the parent is interrupted."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent('''
    import gc, multiprocessing, os, signal, struct, sys, time
    from multiprocessing.queues import SimpleQueue
    from cfgfix.pool import map_in_pool

    def job(n):
        if n == 0:
            # the result pipe, inherited by the fork: a header promising 1 MiB, then 5 bytes
            queue = next(o for o in gc.get_objects() if isinstance(o, SimpleQueue))
            os.write(queue._writer.fileno(), struct.pack("!i", 1 << 20) + b"parti")
        time.sleep(60)
        return n

    def nothing():
        pass

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, stop)
    signal.alarm(2)
    try:
        map_in_pool(multiprocessing.get_context("fork"), 2, nothing, (), job, [0, 1], 1)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
''')


def test_an_interrupted_pool_exits_although_a_worker_left_half_a_result():
    proc = subprocess.run([sys.executable, "-c", CHILD], check=False, capture_output=True, text=True, timeout=40)
    assert proc.returncode == 0, proc.stderr
    assert "interrupted" in proc.stdout
