"""What every worker process of the Python tests starts with (spawned by
the tests; every worker function takes the pipe end first): a bound on the
worker's life, its exception reported as ("error", traceback) so the test
fails with the worker's stack instead of a timeout, and bounded receives.
The one copy for pdx_workers.py, nixl_stack_workers.py,
nixl_vllm_workers.py and nixl_posix_workers.py."""
import faulthandler
import functools
import traceback


def reporting(fn=None, *, timeout=120.0):
    """Decorate a worker function: dump every stack and exit after
    `timeout` seconds, send ("error", traceback) on an exception, close the
    pipe end when done. @reporting or @reporting(timeout=...)."""
    if fn is None:
        return functools.partial(reporting, timeout=timeout)

    @functools.wraps(fn)
    def run(conn, *args):
        faulthandler.dump_traceback_later(timeout, exit=True)
        try:
            fn(conn, *args)
        except BaseException:
            try:
                conn.send(("error", traceback.format_exc()))
            except Exception:
                pass
            raise
        finally:
            conn.close()
    return run


def recv(conn, timeout=60.0):
    """The test process's next message, or TimeoutError after `timeout`
    seconds."""
    if not conn.poll(timeout):
        raise TimeoutError("test process sent nothing in %.0f s" % timeout)
    return conn.recv()
