"""PdxConnector's worker side: vLLM's model runner calls, turned into pdx
connector calls on the engine's KV tensors. Loads start at start_load_kv
(READs from a holder, copies from the offload pool, or a push asked of a
prefill node); a load the step's forward needs is waited for layer by
layer in wait_for_layer_load; save_kv_layer hands each layer to pdx as the
forward leaves it (pool slots filled layer by layer, pushed to a decode
node that asked); get_finished reports loads over, and the requests whose
blocks may now be freed; a failed load's blocks are reported by
get_block_ids_with_load_errors. Nothing here imports vLLM."""
import logging
import time

import pdx

from . import _engine

log = logging.getLogger("vllm.distributed.kv_transfer.pdx")


class WorkerSide:
    def __init__(self, s):
        self.s = s
        extra = s["extra"]
        self.layerwise = bool(extra.get("layerwise", True))
        self.load_timeout = float(extra.get("load_timeout", 30.0))
        self.engine = None
        self.loads = {}        # cid -> the load, until reported over
        self.invalid = set()   # block ids of failed loads, not yet told
        self.failed = set()    # vLLM ids whose load failed (this report)
        self.waits = {}        # vid -> what its blocks wait for
        self.freed = {}        # cid -> when pdx reported its blocks freed
        self.step = None
        self.saved_layers = set()
        self.seen_names = set()
        self.finished_seen = set()

    # ------------------------------------------------------------- setup
    def register(self, kv_caches, num_blocks=None):
        self.engine = _engine.Engine(self.s, kv_caches, num_blocks)
        return self.engine

    # -------------------------------------------------------------- loads
    def start_load_kv(self, step):
        self.step = step
        self.saved_layers = set()
        self.seen_names = set()
        e = self.engine
        for params in step.get("rejects", ()):
            try:
                e.conn.reject(params)
            except pdx.Error as err:
                log.debug("pdx.vllm: reject: %s", err)
        for cid in step.get("aborts", ()):
            if cid in self.loads:
                try:
                    e.conn.load_abort(cid)
                except pdx.NotFound:
                    pass
                self.loads[cid]["aborted"] = True
        for cid in step.get("preempted", ()):
            self._wait_saves(cid)
            e.conn.request_dropped(cid)
        for cid in step.get("drops", ()):
            e.conn.request_dropped(cid)
        self.waits.update(step.get("waits", {}))
        for ld in step.get("loads", ()):
            self._start(ld)

    def _start(self, ld):
        e = self.engine
        ld = dict(ld, aborted=False, t0=time.monotonic())
        try:
            if ld["mode"] == "push":
                e.conn.push_expect(ld["cid"], ld["holder"], ld["holder_req"],
                                   ld["ids"], first_block=ld["first"],
                                   tokens=ld["tokens"],
                                   timeout=ld["timeout"])
                e.count("pushes_asked")
            else:
                e.conn.load(ld["req"], ld["match"], ld["ids"],
                            first_block=ld["first"], layered=ld["layered"])
        except pdx.Error as err:
            self._fail(ld, "it did not start: %s" % err)
        self.loads[ld["cid"]] = ld

    def _layer(self, layer_name):
        return self.engine.layer_of_name.get(layer_name)

    def wait_for_layer_load(self, layer_name):
        """Block (bounded) until the layer of every load this step's
        forward uses has landed; a load that fails is reported (its blocks
        in get_block_ids_with_load_errors) and not waited for again."""
        layer = self._layer(layer_name)
        if layer is None or self.step is None:
            return
        for ld in list(self.loads.values()):
            if ld["async"] or ld.get("failed") or ld.get("over"):
                continue
            self._wait_layer(ld, layer)

    def _wait_layer(self, ld, layer):
        e = self.engine
        deadline = time.monotonic() + self.load_timeout
        while True:
            try:
                if e.conn.load_layer_check(ld["cid"], layer):
                    return
            except pdx.Error as err:
                self._fail(ld, "layer %d: %s" % (layer, err))
                return
            if time.monotonic() > deadline:
                e.conn.load_abort(ld["cid"])
                self._fail(ld, "layer %d not in after %.0f s"
                           % (layer, self.load_timeout))
                return
            e.conn.progress()
            time.sleep(0.0002)

    def _fail(self, ld, why):
        if not ld.get("failed"):
            log.warning("pdx.vllm: load of %s failed (%s): its %d blocks "
                        "are recomputed", ld["vid"], why, len(ld["ids"]))
            self.engine.count("load_failures")
        ld["failed"] = True
        self.invalid.update(ld["ids"])

    # -------------------------------------------------------------- saves
    def save_kv_layer(self, layer_name):
        """The forward left `layer_name`: save every layer up to its own
        that the step has not saved (a pdx layer is saved once all its
        vLLM caches were left, or once a later layer's is)."""
        if not self.layerwise or self.step is None:
            return
        layer = self._layer(layer_name)
        if layer is None:
            return
        self.seen_names.add(layer_name)
        names = self.engine.names_of_layer.get(layer, set())
        upto = layer if names <= self.seen_names else layer - 1
        for lyr in self.engine.layers:
            if lyr > upto:
                break
            if lyr not in self.saved_layers:
                self._save_layer(lyr)

    def _save_layer(self, layer):
        self.saved_layers.add(layer)
        e = self.engine
        for sv in self.step.get("saves", ()):
            try:
                e.conn.save_layer(sv["req"], layer, sv["ids"], sv["tokens"],
                                  first_block=sv["first"], last=sv["last"])
                e.count("layer_saves")
            except pdx.Error as err:
                log.warning("pdx.vllm: save of layer %d of %s: %s", layer,
                            sv["vid"], err)

    def wait_for_save(self):
        """The step's forward is over: the layers it did not report are
        saved now; without layer-wise saves, the blocks it completed. The
        copies run on pdx's save worker: blocks of a finished request wait
        for them (request_finished, get_finished)."""
        if self.step is None:
            return
        if self.layerwise:
            for lyr in self.engine.layers:
                if lyr not in self.saved_layers:
                    self._save_layer(lyr)
            return
        B = self.s["block_size"]
        for sv in self.step.get("saves", ()):
            req, first = sv["req"], sv["first"]
            done = [b for b in range(first, first + len(sv["ids"]))
                    if b < len(req["hashes"]) and (b + 1) * B <= sv["tokens"]]
            tail = sv["last"] and req.get("tail_hash") is not None and \
                first + len(sv["ids"]) > len(req["hashes"])
            if not done and not tail:
                continue
            sub = dict(req, hashes=[req["hashes"][b] for b in done])
            ids = [sv["ids"][b - first] for b in done]
            if tail:
                ids.append(sv["ids"][len(req["hashes"]) - first])
            else:
                sub["tail_hash"], sub["tail_tokens"] = None, 0
            self.engine.conn.save(sub, ids)
            self.engine.count("saves")

    def _wait_saves(self, cid, timeout=5.0):
        deadline = time.monotonic() + timeout
        while not self.engine.conn.save_check(cid):
            if time.monotonic() > deadline:
                log.warning("pdx.vllm: saves of %s still copying after "
                            "%.0f s", cid, timeout)
                return False
            time.sleep(0.0005)
        return True

    def handle_preemptions(self, step):
        """Preempted requests' blocks are about to be reused: their copies
        finish first, and their layer-wise state goes."""
        for cid in step.get("preempted", ()):
            self._wait_saves(cid)
            self.engine.conn.request_dropped(cid)

    # ----------------------------------------------------------- finished
    def get_finished(self, finished_req_ids):
        e = self.engine
        if e is None:
            return None, None
        e.conn.progress()
        self.finished_seen.update(finished_req_ids or ())
        recving = set()
        for cid, ld in list(self.loads.items()):
            over, ok, tokens = self._check(ld)
            if not over:
                continue
            del self.loads[cid]
            if ok:
                e.count("loads")
                e.count("tokens_loaded", tokens)
                self._keep_loaded(ld)
            elif not ld["aborted"]:
                self._fail(ld, "the transfer ended without every block")
                self.failed.add(ld["vid"])
            if ld["async"] or ld["aborted"]:
                recving.add(ld["vid"])
        now = time.monotonic()
        for cid, why in e.conn.poll_freed():
            self.freed[cid] = now
            e.count("freed_" + why)
        sending = set()
        for vid, w in list(self.waits.items()):
            if vid not in self.finished_seen:
                continue
            if w["freed"] and w["cid"] not in self.freed:
                continue
            if w["cid"] in self.loads:
                continue  # a load still writes its blocks
            if w["saves"] and not e.conn.save_check(w["cid"]):
                continue
            if w.get("drop"):
                e.conn.request_dropped(w["cid"])
            self.freed.pop(w["cid"], None)
            del self.waits[vid]
            self.finished_seen.discard(vid)
            sending.add(vid)
        for cid, t in list(self.freed.items()):
            if now - t > 600:  # nobody waits for it (a pool handoff)
                del self.freed[cid]
        return sending or None, recving or None

    def _check(self, ld):
        """(over, succeeded, tokens) of a load."""
        if ld.get("failed"):
            try:
                if self.engine.conn.load_check(ld["cid"]) is None:
                    return False, False, 0
            except pdx.Error:
                pass
            return True, False, 0
        try:
            tokens = self.engine.conn.load_check(ld["cid"])
        except pdx.Error as err:
            if not ld["aborted"]:
                self._fail(ld, str(err))
            return True, False, 0
        if tokens is None:
            return False, False, 0
        # The recompute policy reports a failed load as 0 tokens.
        return True, tokens > 0 or ld["tokens"] == 0, tokens

    def _keep_loaded(self, ld):
        """A decode node keeps what it loaded in its pool too: its next
        turn's prefill node reads the whole conversation from there."""
        e = self.engine
        req = ld.get("req")
        if not e.offload or req is None:
            return
        first, ids = ld["first"], ld["ids"]
        n = min(len(req["hashes"]) - first, len(ids))
        if n <= 0:
            return
        sub = dict(req, hashes=req["hashes"][first:first + n],
                   tail_hash=None, tail_tokens=0, params=None)
        sub["req_id"] = ld["cid"]
        try:
            e.conn.save(sub, ids[:n])
        except pdx.Error as err:
            log.debug("pdx.vllm: keeping %s: %s", ld["vid"], err)

    def get_block_ids_with_load_errors(self):
        out, self.invalid = self.invalid, set()
        return out

    def take_failed(self):
        out, self.failed = self.failed, set()
        return out

    def finish_step(self):
        self.step = None

    def shutdown(self):
        if self.engine is not None:
            self.engine.close()
            self.engine = None
