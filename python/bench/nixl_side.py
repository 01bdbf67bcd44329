#!/usr/bin/env python3
"""pdx and NIXL side by side: the same Python cycle, both libraries
alternately, two processes on one host.

  PYTHONPATH=<build>/python UCX_NET_DEVICES=lo /usr/bin/python3 \\
      python/bench/nixl_side.py --nixl PREFIX [--quick] [--json F]

(`pdx-bench nixl --nixl PREFIX` runs this script with that environment.)

PREFIX is a NIXL install (docs/BENCH.md, /work/shared/nixl-build.md):
PREFIX/nixl/lib/<arch>/python... is searched for the `nixl` package (or
`nixl_cu12`), PREFIX/nixl/lib/<arch> and PREFIX/absl/lib go on the
library path (the script re-executes itself with them), and
NIXL_PLUGIN_DIR points at the UCX plugin. Without a NIXL build,
`--nixl shim` runs pdx's own NIXL shim (pdx.nixl) in NIXL's column: the
mode's plumbing is tested, and that column is not NIXL.

A cycle is what a stack does per transfer: make_prepped_xfer, transfer,
check_xfer_state until "DONE", release_xfer_handle. Each stage is timed
(make, post = transfer, wait = the check loop, checks = how many calls,
release). Columns (host memory on both sides):

  nixl      NIXL's UCX backend, numpy memory (NIXL with
            UCX_POSIX_ERROR_HANDLING=y UCX_SYSV_ERROR_HANDLING=y, so UCX
            uses shared memory as it does for pdx)
  pdx-ucx   pdx.nixl with backends ["UCX"], pinned to pdx's ucx backend
            (PDX_PATH_BACKEND=ucx), numpy memory
  pdx-cma   the same pinned to cma: process_vm_readv/writev, numpy memory
  pdx-auto  pdx.nixl as it chooses, numpy memory (what a stack that
            registers its own arrays or tensors gets)
  pdx-shm   pdx.nixl as it chooses, pdx.mem_alloc memory on both sides
            (cma's memcpy into the peer's mapping)

Rounds interleave every column for every row (turns of a few thousand
cycles, after untimed warm-up cycles: at least 12 in a column's first
round, where first use happens: UCX endpoints, pdx's calibration of two
competing paths); medians of all samples are reported, and GB/s as bytes
over the mean cycle. NIXL's agents live only during their own turns (its progress
thread spins a core, which would tax the other columns); pdx's stay.
Every READ row's bytes are checked against the target's pattern."""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

ROWS = [("READ", 8448, 1), ("READ", 65536, 1), ("READ", 1 << 20, 1),
        ("READ", 65536, 64), ("READ", 1 << 20, 64), ("WRITE", 8448, 1),
        ("WRITE", 65536, 1), ("WRITE", 1 << 20, 1), ("WRITE", 65536, 64)]
SLOTS = 64
SLOT = (1 << 20) + 4096  # distinct blocks never merge
REGION = SLOTS * SLOT
CONFIGS = ["nixl", "pdx-ucx", "pdx-cma", "pdx-auto", "pdx-shm"]
PIN = {"pdx-ucx": "ucx", "pdx-cma": "cma"}


def nixl_env(prefix):
    """Environment for a NIXL install at `prefix` (None: the shim)."""
    env = {"UCX_POSIX_ERROR_HANDLING": "y", "UCX_SYSV_ERROR_HANDLING": "y"}
    if prefix in (None, "shim"):
        return env, None
    libs = []
    pyroot = None
    for root, dirs, files in os.walk(os.path.join(prefix, "nixl")):
        if "plugins" in dirs and os.path.basename(root) != "nixl":
            libs.append(root)
            env["NIXL_PLUGIN_DIR"] = os.path.join(root, "plugins")
        for d in dirs:
            if d in ("nixl", "nixl_cu12") and \
                    os.path.exists(os.path.join(root, d, "_api.py")):
                pyroot = pyroot or (root, d)
    if pyroot is None:
        sys.exit("nixl_side: no nixl Python package under %s" % prefix)
    absl = os.path.join(prefix, "absl", "lib")
    env["LD_LIBRARY_PATH"] = ":".join(
        libs + [absl] + [p for p in os.environ.get("LD_LIBRARY_PATH",
                                                   "").split(":") if p])
    return env, pyroot


def import_nixl(pyroot):
    """The `_api` module of the NIXL build (or pdx.nixl for the shim),
    imported under the package's own folder name (nixl_cu12): a `nixl`
    module in this process would be taken by pdx.nixl for its own
    bindings (pdx.nixl serves stacks that import `nixl`)."""
    if pyroot is None:
        import pdx.nixl as api
        return api
    root, name = pyroot
    if name == "nixl":
        link_dir = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                "pdx-nixl-side-%d" % os.getuid())
        os.makedirs(link_dir, exist_ok=True)
        link = os.path.join(link_dir, "nixl_real")
        if not os.path.islink(link):
            os.symlink(os.path.join(root, name), link)
        root, name = link_dir, "nixl_real"
    sys.path.insert(0, root)
    import importlib
    return importlib.import_module(name + "._api")


def lib_of(cfg, nixl_api):
    if cfg == "nixl":
        return nixl_api
    import pdx.nixl
    return pdx.nixl


def pattern(cfg):
    import numpy as np
    salt = CONFIGS.index(cfg) * 37 + 11
    return ((np.arange(REGION, dtype=np.uint64) * 2654435761 + salt)
            >> np.uint64(13)).astype(np.uint8)


def alloc(cfg):
    """(keepalive, numpy view, address) of REGION bytes for a column."""
    import numpy as np
    if cfg == "pdx-shm":
        import pdx
        mem = pdx.mem_alloc(REGION, populate=True)
        view = np.frombuffer(mem, np.uint8)
        return mem, view, mem.addr
    raw = np.zeros(REGION + 4096, np.uint8)
    start = (-raw.ctypes.data) % 4096  # page-aligned, like torch's
    view = raw[start:start + REGION]
    view[:] = 0
    return raw, view, view.ctypes.data


def make_agent(cfg, name, api, threads):
    """A NIXL-API agent of column `cfg` (pdx pins through the
    environment at agent creation)."""
    conf = api.nixl_agent_config(enable_prog_thread=threads,
                                 backends=["UCX"])
    pin = PIN.get(cfg)
    old = os.environ.pop("PDX_PATH_BACKEND", None)
    if pin:
        os.environ["PDX_PATH_BACKEND"] = pin
    try:
        return api.nixl_agent(name, conf)
    finally:
        os.environ.pop("PDX_PATH_BACKEND", None)
        if old is not None:
            os.environ["PDX_PATH_BACKEND"] = old


def target_main(conn, prefix, nixl_threads):
    env, pyroot = nixl_env(prefix)
    api = import_nixl(pyroot)
    open_ = {}
    while True:
        cmd, cfg = conn.recv()
        if cmd == "quit":
            break
        if cmd == "open":
            keep, view, addr = alloc(cfg)
            view[:] = pattern(cfg)
            w = make_agent(cfg, "side-p-%s-%d" % (cfg, time.monotonic_ns()),
                           lib_of(cfg, api),
                           cfg != "nixl" or nixl_threads != "off")
            w.register_memory([(addr, REGION, 0, "")], "DRAM")
            open_[cfg] = (w, keep, view)
            conn.send((w.get_agent_metadata(), addr))
        elif cmd == "close":
            w, keep, view = open_.pop(cfg)
            w = None
            conn.send(True)
    for cfg in list(open_):
        open_.pop(cfg)
    conn.send(True)


def ask(conn, proc, msg, timeout=120):
    """Send `msg` to the target and return its answer (bounded: a dead
    or silent target ends the run)."""
    conn.send(msg)
    end = time.monotonic() + timeout
    while not conn.poll(0.5):
        if not proc.is_alive() or time.monotonic() > end:
            raise RuntimeError("the target process %s (answering %r)" % (
                "died" if not proc.is_alive() else "did not answer", msg))
    return conn.recv()


class Side:
    """The initiator's agent, memory and prepared lists of one column."""

    def __init__(self, cfg, api, conn, proc, threads):
        import numpy as np
        self.cfg = cfg
        meta, self.raddr = ask(conn, proc, ("open", cfg))
        self.keep, self.view, self.addr = alloc(cfg)
        self.w = make_agent(cfg, "side-d-%s-%d" % (cfg, time.monotonic_ns()),
                            lib_of(cfg, api), threads)
        self.w.register_memory([(self.addr, REGION, 0, "")], "DRAM")
        self.peer = self.w.add_remote_agent(meta)
        if isinstance(self.peer, bytes):
            self.peer = self.peer.decode()
        self.lists = {}
        for size in sorted({s for _, s, _ in ROWS}):
            rows_l = np.zeros((SLOTS, 3), np.uint64)
            rows_r = np.zeros((SLOTS, 3), np.uint64)
            rows_l[:, 0] = self.addr + np.arange(SLOTS, dtype=np.uint64) * SLOT
            rows_r[:, 0] = self.raddr + np.arange(SLOTS, dtype=np.uint64) * \
                SLOT
            rows_l[:, 1] = rows_r[:, 1] = size
            lh = self.w.prep_xfer_dlist(
                "NIXL_INIT_AGENT", self.w.get_xfer_descs(rows_l, "DRAM"))
            rh = self.w.prep_xfer_dlist(
                self.peer, self.w.get_xfer_descs(rows_r, "DRAM"))
            self.lists[size] = (lh, rh)

    def close(self, conn, proc):
        for lh, rh in self.lists.values():
            self.w.release_dlist_handle(lh)
            self.w.release_dlist_handle(rh)
        self.lists = {}
        self.w.remove_remote_agent(self.peer)
        if hasattr(self.w, "close"):
            self.w.close()
        self.w = None
        ask(conn, proc, ("close", self.cfg))

    def cycles(self, op, size, batch, iters):
        """`iters` cycles; per cycle (make, post, wait, checks, release,
        total) in ns."""
        import numpy as np
        lh, rh = self.lists[size]
        idx = np.arange(batch, dtype=np.int64)
        w = self.w
        make, transfer = w.make_prepped_xfer, w.transfer
        check, release = w.check_xfer_state, w.release_xfer_handle
        pc = time.perf_counter_ns
        out = []
        for _ in range(iters):
            t0 = pc()
            h = make(op, lh, idx, rh, idx)
            t1 = pc()
            st = transfer(h)
            t2 = pc()
            n = 0
            while st == "PROC":
                st = check(h)
                n += 1
            t3 = pc()
            release(h)
            t4 = pc()
            if st != "DONE":
                raise RuntimeError("%s %s %d x%d: %s" % (self.cfg, op, size,
                                                         batch, st))
            out.append((t1 - t0, t2 - t1, t3 - t2, n, t4 - t3, t4 - t0))
        return out

    def path(self, op, size, batch):
        """Backend, transport and reason of one request (pdx only)."""
        import numpy as np
        if self.cfg == "nixl":
            return None
        lh, rh = self.lists[size]
        idx = np.arange(batch, dtype=np.int64)
        h = self.w.make_prepped_xfer(op, lh, idx, rh, idx)
        st = self.w.transfer(h)
        while st == "PROC":
            st = self.w.check_xfer_state(h)
        t = h.telemetry() if hasattr(h, "telemetry") else {}
        self.w.release_xfer_handle(h)
        return {k: t.get(k) for k in ("backend", "transport",
                                      "fallback_why")}

    def settle(self, op, size, batch, most=96):
        """Untimed cycles until pdx's path choice for this row is made: a
        calibration takes two runs of 16 posts (core/path_int.h), more
        than the warm-up when a row's cycles are few (6 a round at 64
        MiB), and its runs on the dearer path are first use, not the
        steady state a stack sees. Bounded; a no-op for NIXL and for
        rows with one path."""
        for _ in range(most):
            p = self.path(op, size, batch)
            if p is None or "calibrating" not in str(p.get("fallback_why")):
                return

    def verify_read(self, size, batch):
        want = pattern(self.cfg)
        for i in range(batch):
            o = i * SLOT
            if not (self.view[o:o + size] == want[o:o + size]).all():
                raise RuntimeError("%s: READ %d x%d: block %d differs"
                                   % (self.cfg, size, batch, i))


def iters_for(size, batch, quick):
    total = size * batch
    n = 3000 if total <= 16384 else 1500 if total <= 65536 else \
        300 if total <= (1 << 20) else 60 if total <= (4 << 20) else 6
    return max(2, n // 10) if quick else n


def summarise(samples, size, batch):
    tot = [s[5] for s in samples]
    med = lambda k: statistics.median(s[k] for s in samples) / 1e3  # noqa
    return {"p50_us": round(statistics.median(tot) / 1e3, 2),
            "gbps": round(size * batch * len(tot) / sum(tot), 3),
            "make_us": round(med(0), 2), "post_us": round(med(1), 2),
            "wait_us": round(med(2), 2),
            "checks": statistics.median(s[3] for s in samples),
            "release_us": round(med(4), 2), "n": len(tot)}


def row_name(op, size, batch):
    s = "%d" % size if size < 65536 else "%d KiB" % (size >> 10) \
        if size < (1 << 20) else "%d MiB" % (size >> 20)
    return "%s %s x%d" % (op, s, batch)


def report(res, configs, nixl_is_shim):
    head = "| row | " + " | ".join(configs) + \
        " | auto / best own (p50) | auto vs nixl: p50, GB/s |"
    print("p50 us / GB/s (GB/s = bytes over the mean cycle)%s\n" % (
        "; NIXL column: pdx's own shim, NOT NIXL" if nixl_is_shim else ""))
    print(head)
    print("|" + "---|" * (len(configs) + 3))
    for name, r in res["rows"].items():
        cells = ["%.2f / %.2f" % (r[c]["p50_us"], r[c]["gbps"])
                 if c in r else "n/a" for c in configs]
        own = [r[c]["p50_us"] for c in ("pdx-ucx", "pdx-cma") if c in r]
        auto = r.get("pdx-auto")
        ratio = "%.2f" % (auto["p50_us"] / min(own)) if auto and own else ""
        vs = ""
        if auto and "nixl" in r:
            vs = "%.2f, %.2f" % (auto["p50_us"] / r["nixl"]["p50_us"],
                                 auto["gbps"] / r["nixl"]["gbps"])
        print("| %s | %s | %s | %s |" % (name, " | ".join(cells), ratio, vs))
    print("\nper stage, medians (us): make / post / wait / release, "
          "checks per cycle\n")
    print("| row | " + " | ".join(configs) + " |")
    print("|" + "---|" * (len(configs) + 1))
    for name, r in res["rows"].items():
        cells = ["%.2f / %.2f / %.2f / %.2f, %g" % (
            r[c]["make_us"], r[c]["post_us"], r[c]["wait_us"],
            r[c]["release_us"], r[c]["checks"]) if c in r else "n/a"
            for c in configs]
        print("| %s | %s |" % (name, " | ".join(cells)))
    print("\npaths pdx took (last request of each row):")
    for name, r in res["paths"].items():
        for c, p in r.items():
            if p:
                print("  %-18s %-9s %s %s%s" % (
                    name, c, p.get("backend"), p.get("transport"),
                    (": " + p["fallback_why"]) if p.get("fallback_why")
                    else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nixl", required=True,
                    help="NIXL install prefix, or 'shim' (pdx's own "
                    "NIXL shim in NIXL's column: tests the mode only)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--rows", default="",
                    help="e.g. READ:8448:1,WRITE:1048576:1 (default: all)")
    ap.add_argument("--nixl-threads", default="target",
                    choices=["on", "off", "target"],
                    help="NIXL progress threads: both sides, none, or the "
                    "target's only (default: the initiator polls in "
                    "check_xfer_state, its best case on few cores)")
    args = ap.parse_args()
    env, pyroot = nixl_env(args.nixl)
    if any(os.environ.get(k) != v for k, v in env.items()) and \
            not os.environ.get("PDX_NIXL_SIDE_REEXEC"):
        # The dynamic loader reads LD_LIBRARY_PATH at start: run again.
        os.environ.update(env)
        os.environ["PDX_NIXL_SIDE_REEXEC"] = "1"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    api = import_nixl(pyroot)
    configs = [c for c in args.configs.split(",") if c]
    for c in configs:
        if c not in CONFIGS:
            sys.exit("nixl_side: unknown column %s (%s)" % (c, CONFIGS))
    rows = ROWS
    if args.quick:
        rows = [ROWS[0], ROWS[3], ROWS[7]]
    if args.rows:
        rows = []
        for t in args.rows.split(","):
            op, size, batch = t.split(":")
            rows.append((op.upper(), int(size), int(batch)))
    rounds = args.rounds or (1 if args.quick else 3)

    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=target_main,
                       args=(child, args.nixl, args.nixl_threads),
                       daemon=True)
    proc.start()
    samples = {}
    paths = {}
    sides = {}
    t_start = time.monotonic()
    try:
        for rnd in range(rounds):
            for cfg in configs:
                side = sides.get(cfg)
                if side is None:
                    side = Side(cfg, api, conn, proc,
                                cfg != "nixl" or args.nixl_threads == "on")
                for op, size, batch in rows:
                    n = iters_for(size, batch, args.quick)
                    # Warm-up, untimed: first use (UCX endpoints, NIXL's
                    # and pdx's; pdx's calibration of competing paths, a
                    # few posts) in the first round, then a few cycles.
                    side.cycles(op, size, batch,
                                max(12, n // 10) if rnd == 0 or
                                cfg == "nixl" else max(1, n // 20))
                    if rnd == 0:
                        side.settle(op, size, batch)
                    got = side.cycles(op, size, batch, n)
                    samples.setdefault((op, size, batch), {}) \
                        .setdefault(cfg, []).extend(got)
                    if op == "READ":
                        side.verify_read(size, batch)
                    if rnd == rounds - 1:
                        paths.setdefault(row_name(op, size, batch), {})[
                            cfg] = side.path(op, size, batch)
                if cfg == "nixl" or rnd == rounds - 1:
                    side.close(conn, proc)
                    sides.pop(cfg, None)
                else:
                    sides[cfg] = side
    finally:
        if proc.is_alive():
            conn.send(("quit", None))
            conn.poll(30) and conn.recv()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    res = {"nixl": args.nixl, "nixl_is_shim": pyroot is None,
           "rounds": rounds, "wall_s": round(time.monotonic() - t_start, 1),
           "rows": {}, "paths": paths}
    for (op, size, batch), per in samples.items():
        res["rows"][row_name(op, size, batch)] = {
            c: summarise(s, size, batch) for c, s in per.items()}
    report(res, configs, pyroot is None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
