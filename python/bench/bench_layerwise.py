"""Layer-wise push against whole-request handoff, on the GLM-5.2 layout
(101 arenas, 79 layers, 3,502,592 B a 64-token block): the time from P's
last layer to D's last byte.

Two processes, P and D, each a pdx.KVConnector over DRAM arenas (pdx
shared memory, so UCX's shared-memory transport carries them). P "computes"
a prompt layer by layer (a sleep of --us-per-token microseconds per token
per layer stands in for the forward) and hands it off three ways:

  layerwise   D asked first (push_expect); P's save_layer after each layer
              writes that layer into D's blocks while later layers compute
  whole-push  D asked first; P writes every layer after the last one
              (request_finished), as a connector without layer-wise saves
  whole-pull  P's handoff after the last layer; D reads it all (READ), as
              vLLM's pull P/D does (less the proxy's HTTP hop)

t0 is the end of P's last layer, t1 the moment D's load check says every
byte is in; the median over --runs of t1 - t0 is reported, in ms. Clocks:
CLOCK_MONOTONIC, one per host, so the two processes' times compare.

    PYTHONPATH=build/python python3 python/bench/bench_layerwise.py \\
        --tokens 2048 8192 --runs 5
"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "configs", "glm52-fp8-mtp")
AGENT_P = "glm52-p-dp0"  # colocated-prefill.json's agent


def node(which, nblocks, seed="bench"):
    import pdx
    with open(os.path.join(CONFIGS, "colocated-%s.json" % which)) as f:
        doc = json.load(f)
    doc["kv"]["num_blocks"] = nblocks
    doc["kv"].pop("bytes_per_block", None)
    doc["hashing"]["seed"] = seed
    doc["connector"]["children"] = [
        dict(c, lease_ms=600000, heartbeat_ms=1000)
        for c in doc["connector"]["children"] if c["type"] == "remote"]
    cfg = pdx.KVConfig.parse(json.dumps(doc))
    lay = pdx.Layout.from_config(cfg)
    mem = pdx.mem_alloc(lay.carve_size())
    lay.carve(mem)
    conn = pdx.KVConnector(cfg, lay)
    return conn, lay, mem


def layers_of(lay):
    return sorted({a["layer"] for a in lay.arenas()})


def p_main(pipe, ntok, us, runs):
    import pdx
    conn, lay, mem = node("prefill", -(-ntok // 64) + 1)
    pipe.send(conn.describe())
    conn.connect(pipe.recv())
    hasher = conn.hasher()
    layers = layers_of(lay)
    nb = -(-ntok // 64)
    ids = list(range(nb))
    per_layer = ntok * us / 1e6
    while True:
        msg = pipe.recv()
        if msg == "stop":
            break
        mode, run = msg
        toks = [(i * 7919 + run * 31 + 1) % 151552 for i in range(ntok)]
        req = pdx.KVRequest.from_tokens("p-%s-%d" % (mode, run), toks, hasher)
        if mode != "whole-pull":
            assert pipe.recv() == "asked"
        for x in layers:
            time.sleep(per_layer)  # the forward of layer x
            if mode == "layerwise":
                conn.save_layer(req, x, ids, ntok, last=True)
                conn.progress()
        t0 = time.monotonic()
        params = conn.request_finished(req, ids, ntok)
        pipe.send((t0, params if mode == "whole-pull" else None))
        while not conn.poll_freed():
            conn.progress()
            time.sleep(0.0001)
    conn.close()


def d_main(pipe, ntok, runs):
    import pdx
    conn, lay, mem = node("decode", -(-ntok // 64) + 1)
    conn.connect(pipe.recv())
    pipe.send(conn.describe())
    hasher = conn.hasher()
    nb = -(-ntok // 64)
    ids = list(range(nb))
    holder = None
    while True:
        msg = pipe.recv()
        if msg == "stop":
            break
        if isinstance(msg, str):
            holder = msg
            continue
        mode, run = msg
        rid = "d-%s-%d" % (mode, run)
        if mode != "whole-pull":
            conn.push_expect(rid, holder, "p-%s-%d" % (mode, run), ids,
                             tokens=ntok - 1, timeout=120)
            pipe.send("asked")
            t0, _ = pipe.recv()
        else:
            t0, params = pipe.recv()
            toks = [(i * 7919 + run * 31 + 1) % 151552 for i in range(ntok)]
            req = pdx.KVRequest.from_tokens(rid, toks, hasher, params)
            m = conn.lookup(req)
            conn.load(req, m, ids)
        while conn.load_check(rid) is None:
            conn.progress()
        t1 = time.monotonic()
        pipe.send(t1 - t0)
    conn.close()


def bench(ntok, us, runs, modes):
    ctx = mp.get_context("spawn")
    pp, pc = ctx.Pipe()
    dp, dc = ctx.Pipe()
    p = ctx.Process(target=p_main, args=(pc, ntok, us, runs), daemon=True)
    d = ctx.Process(target=d_main, args=(dc, ntok, runs), daemon=True)
    p.start()
    d.start()
    dp.send(pp.recv())  # P's blob to D, D's back
    pp.send(dp.recv())
    dp.send(AGENT_P)  # the holder D asks for pushes
    out = {}
    for mode in modes:
        vals = []
        for run in range(runs):
            pp.send((mode, run))
            dp.send((mode, run))
            if mode != "whole-pull":
                pp.send(dp.recv())   # "asked"
                dp.send(pp.recv())   # t0
            else:
                dp.send(pp.recv())   # t0 and the handoff
            vals.append(dp.recv())
        out[mode] = statistics.median(vals) * 1e3
    pp.send("stop")
    dp.send("stop")
    p.join(30)
    d.join(30)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--us-per-token", type=float, default=1.0,
                    help="stand-in forward time per token per layer (us)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--modes", nargs="+",
                    default=["layerwise", "whole-push", "whole-pull"])
    a = ap.parse_args()
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    print("tokens  MiB    layer(ms)  " + "  ".join("%12s" % m
                                                 for m in a.modes))
    for ntok in a.tokens:
        r = bench(ntok, a.us_per_token, a.runs, a.modes)
        mib = -(-ntok // 64) * 3502592 / 2**20
        print("%6d  %5.0f  %9.2f  %s" % (
            ntok, mib, ntok * a.us_per_token / 1e3,
            "  ".join("%10.2fms" % r[m] for m in a.modes)), flush=True)


if __name__ == "__main__":
    main()
