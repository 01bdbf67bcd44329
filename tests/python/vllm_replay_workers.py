"""The replay's engine processes (spawned by test_vllm_replay.py): one
MiniEngine each (a P, a D, or a peer that must be refused), on the vLLM
stand-in, serving the test's commands over the pipe."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

from worker_boot import recv, reporting  # noqa: E402


@reporting(timeout=400.0)
def engine_proc(conn, spec):
    sys.path.insert(0, os.path.join(HERE, "vllm_standin"))
    import vllm
    assert getattr(vllm, "STANDIN", False), "the stand-in, not vLLM"
    from vllm_replay import MiniEngine
    eng = MiniEngine(**spec)
    conn.send(("ready", eng.info()))
    while True:
        cmd = recv(conn, 300.0)
        if isinstance(cmd, str):
            cmd = (cmd,)
        op, args = cmd[0], cmd[1:]
        if op == "submit":
            eng.add(*args)
            conn.send("ok")
        elif op == "run":
            until, kw = args
            conn.send(eng.run(until, **kw))
        elif op == "run_paused":
            # Stop before the worker starts the load of `vid`: tell the
            # test, wait for its go (it kills the holder meanwhile).
            until, vid, kw = args

            def pause(meta, vid=vid):
                if any(ld["vid"] == vid for ld in meta.step["loads"]):
                    conn.send(("paused", vid))
                    assert recv(conn, 60.0) == "go"
                    eng.pause_before_load = None
            eng.pause_before_load = pause
            conn.send(eng.run(until, **kw))
        elif op == "steps":
            for _ in range(args[0]):
                eng.step()
            conn.send("ok")
        elif op == "abort":
            eng.abort(args[0])
            conn.send("ok")
        elif op == "evict":
            eng.evict()
            conn.send("ok")
        elif op == "pending":
            conn.send(eng.sched.has_pending_push_work())
        elif op == "info":
            conn.send(eng.info())
        elif op == "timing":
            conn.send({"wait": eng.layer_wait_done.get(args[0], {}),
                       "saved": dict(eng.layer_saved)})
        elif op == "refused":
            e = eng.worker._obj._worker.engine
            conn.send(e.refused(args[0]))
        elif op == "stop":
            conn.send(eng.shutdown())
            return
        else:
            raise ValueError(op)


@reporting(timeout=60.0)
def settings_proc(conn, spec, extra):
    """Build a connector whose extra config pins a value vLLM does not
    have: the SettingsMismatch text, or None."""
    sys.path.insert(0, os.path.join(HERE, "vllm_standin"))
    from vllm_replay import MiniEngine
    try:
        MiniEngine(**dict(spec, extra=extra))
        conn.send(None)
    except Exception as e:  # noqa: BLE001 - the refusal is the result
        conn.send("%s: %s" % (type(e).__name__, e))
