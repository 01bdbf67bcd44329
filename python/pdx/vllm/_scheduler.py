"""PdxConnector's scheduler side: vLLM's scheduler calls, turned into pdx
connector calls (lookup, request finished) and into the step's metadata
for the worker side (loads to start, layers and blocks to save, holders
to tell, requests whose blocks wait for a transfer).

kv_transfer_params, as pdx reads and writes them (beside vLLM's own keys,
do_remote_prefill / do_remote_decode, which the proxy sets as for
vLLM's NixlConnector):
  "pdx"              the C connector's handoff parameters (where the
                     blocks are, their hashes): P's after a prefill, D's
                     (its offload pool) after a decode, for the next turn
  "pdx_side_channel" host:port of the node that wrote "pdx"
  "pdx_push"         {"agent", "req", "side_channel"}: D, sent the request
                     before P finished it, asks P to write each layer as
                     P saves it ("req" is the key the proxy gave P as
                     kv_transfer_params["pdx_push_key"])
Nothing here imports vLLM."""
import logging

import pdx

from . import _engine

log = logging.getLogger("vllm.distributed.kv_transfer.pdx")

_DONE = ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED")


def c_req_id(vid):
    """The C connector's id of vLLM request `vid` (1..63 printable)."""
    if 0 < len(vid) < 64 and all(" " < ch <= "~" for ch in vid):
        return vid
    import hashlib
    return "h-" + hashlib.sha256(vid.encode()).hexdigest()[:40]


def _status(request):
    st = getattr(request, "status", None)
    return getattr(st, "name", str(st))


def _group0(block_ids):
    """vLLM's block ids of the first (the only) KV cache group."""
    if block_ids and isinstance(block_ids[0], (list, tuple)):
        return list(block_ids[0])
    return list(block_ids or ())


class _Req:
    __slots__ = ("vid", "cid", "request", "skip", "full", "tail", "ntok",
                 "local", "match", "ext", "async_", "mode", "holder",
                 "reject", "table", "loading", "push_key", "checked")

    def __init__(self, request):
        self.vid = request.request_id
        self.cid = c_req_id(self.vid)
        self.request = request
        self.skip = bool(getattr(request, "mm_features", None)) or \
            getattr(request, "prompt_embeds", None) is not None
        self.full, self.tail, self.ntok = [], None, -1
        self.local = self.ext = 0
        self.match = None
        self.async_ = False
        self.mode = None
        self.holder = None   # the handoff a load reads from
        self.reject = None   # a handoff whose holder must free it
        self.table = []      # vLLM's block ids of this request
        self.loading = False  # a load sent to the worker, not yet over
        self.push_key = None  # P: the key a decode node asks a push by
        self.checked = False


class SchedulerSide:
    def __init__(self, s):
        self.s = s
        self.B = s["block_size"]
        extra = s["extra"]
        self.layerwise = bool(extra.get("layerwise", True))
        self.push = bool(extra.get("push", True))
        self.load_mode = str(extra.get("load_mode", "async"))
        if self.load_mode not in ("async", "layerwise"):
            raise ValueError("pdx.vllm: load_mode %r: 'async' or "
                             "'layerwise'" % self.load_mode)
        self.reuse = bool(extra.get("reuse", True))
        self.load_timeout = float(extra.get("load_timeout", 30.0))
        self.reqs = {}
        self._loads, self._rejects, self._aborts = [], [], []
        self._drops, self._waits = [], {}
        # Requests whose blocks vLLM frees only when get_finished reports
        # them (held for D, pushed, or still being saved): vLLM's engine
        # keeps stepping while there are any (has_pending_push_work), or
        # it would go idle and never ask.
        self._sending = set()
        self._recv_aborted = set()  # aborted loads not yet reported over
        self._engine = None
        self._warned = set()

    # ------------------------------------------------------------ helpers
    def engine(self):
        if self._engine is None:
            self._engine = _engine.find(self.s, timeout=2.0)
            if self._engine is None:
                raise RuntimeError(
                    "pdx.vllm: the scheduler side of engine %s found no "
                    "worker side in this process: PdxConnector needs the "
                    "engine's worker in the scheduler's process (one GPU "
                    "per engine, vLLM's uni executor: tensor_parallel_size "
                    "1, no --distributed-executor-backend)"
                    % (self.s["engine_id"],))
        return self._engine

    def _state(self, request):
        r = self.reqs.get(request.request_id)
        if r is None or r.request is not request:
            r = self.reqs[request.request_id] = _Req(request)
        return r

    def _hash(self, r, ntok, tail):
        """r.full: pdx's hashes of (at least) the full blocks of the
        request's first ntok tokens; r.tail: the partial tail's key of
        exactly ntok tokens when `tail` (r.ntok says for which). A decode
        step only hashes the block it completed, if any."""
        req = r.request
        lora = getattr(getattr(req, "lora_request", None), "lora_name", None)
        salt = getattr(req, "cache_salt", None)
        if tail and r.ntok != ntok:
            toks = list(req.all_token_ids)[:ntok]
            r.full, r.tail = self.engine().hash_request(toks, lora, salt)
            r.ntok = ntok
        elif len(r.full) < ntok // self.B:
            toks = req.all_token_ids
            kw = {"lora_name": lora} if lora is not None else {}
            hasher = self.engine().hasher
            for b in range(len(r.full), ntok // self.B):
                if b == 0 and salt:
                    kw["cache_salt"] = salt
                r.full.append(hasher.hash_next(
                    r.full[-1] if r.full else None,
                    list(toks[b * self.B:(b + 1) * self.B]), **kw))
                kw.pop("cache_salt", None)
        if not r.checked:
            self._check_vllm_hashes(r)

    def _check_vllm_hashes(self, r):
        """vLLM's own hash of the first block, where it has one at pdx's
        block size, must be pdx's: else the seed or algorithm pdx was given
        is not the one vLLM hashes with, and every lookup would miss."""
        r.checked = True
        theirs = getattr(r.request, "block_hashes", None)
        if not theirs or not r.full:
            return
        first = bytes(theirs[0])[:len(r.full[0])]
        if first != r.full[0] and "hash" not in self._warned:
            self._warned.add("hash")
            log.error("pdx.vllm: block hash mismatch: vLLM hashed the first "
                      "block of %s as %s, pdx (%s, PYTHONHASHSEED=%r) as "
                      "%s: vLLM does not hash with the algorithm or seed "
                      "pdx was given", r.vid, first.hex(),
                      self.s["hash_algo"], self.s["hash_seed"],
                      r.full[0].hex())

    def c_request(self, r, ntok, params=None, tail=True):
        """The C connector's request for the first ntok tokens (with the
        partial tail's key when `tail`)."""
        self._hash(r, ntok, tail)
        t = r.tail if tail and r.ntok == ntok else None
        return {"req_id": r.cid, "hashes": r.full[:ntok // self.B],
                "prompt_tokens": ntok, "tail_hash": t,
                "tail_tokens": ntok % self.B if t is not None else 0,
                "params": params}

    # ---------------------------------------------------- vLLM: scheduler
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        r = self._state(request)
        params = getattr(request, "kv_transfer_params", None) or {}
        r.match, r.ext, r.mode, r.holder = None, 0, None, None
        r.local = num_computed_tokens
        if r.skip:
            return 0, False
        if params.get("do_remote_decode") and params.get("pdx_push_key"):
            r.push_key = str(params["pdx_push_key"])
            r.cid = c_req_id(r.push_key)
        n = request.num_tokens
        if params.get("do_remote_prefill") and params.get("pdx_push"):
            return self._match_push(r, params["pdx_push"], n,
                                    num_computed_tokens)
        handoff = params.get("pdx")
        if handoff is not None and not self.engine().ensure_peer(
                handoff.get("agent"), params.get("pdx_side_channel")):
            # Refused (the field is in the log) or unreachable: computed
            # here; its holder frees it at its lease's end.
            handoff = None
        m = self.engine().lookup(self.c_request(r, n, handoff))
        if m is None:
            return None, False  # pending: ask again
        ext = m["tokens"] - num_computed_tokens
        if ext <= 0 or m["source"] == "none":
            if handoff is not None and params.get("do_remote_prefill"):
                r.reject = handoff
            return 0, False
        r.match, r.ext, r.holder = m, ext, handoff
        r.mode = m["source"]
        r.async_ = m["source"] == "remote" and self.load_mode == "async"
        return ext, r.async_

    def _match_push(self, r, push, n, local):
        eng = self.engine()
        if not eng.remote or not eng.ensure_peer(push.get("agent"),
                                                 push.get("side_channel")):
            return 0, False
        r.mode, r.holder = "push", push
        r.async_ = self.load_mode == "async"
        # Async: the whole prompt (vLLM recomputes the last token after a
        # full hit); layer by layer in this step: all but the last token.
        r.ext = (n if r.async_ else n - 1) - local
        if r.ext <= 0:
            r.mode = None
            return 0, False
        return r.ext, r.async_

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        r = self.reqs.get(request.request_id)
        params = getattr(request, "kv_transfer_params", None)
        if r is None:
            return
        if num_external_tokens == 0 or r.mode is None:
            if r.reject is not None:
                self._rejects.append(r.reject)
                r.reject = None
            if params and params.get("do_remote_prefill") and \
                    r.mode is None and params.get("pdx") is not None and \
                    r.holder is None and not r.loading:
                self._rejects.append(params["pdx"])
            if params:
                params["do_remote_prefill"] = False
            return
        ids = _group0(blocks.get_block_ids())
        first = r.local // self.B
        load = {"vid": r.vid, "cid": r.cid, "mode": r.mode,
                "async": r.async_, "first": first,
                "tokens": r.local + num_external_tokens,
                "layered": not r.async_}
        if r.mode == "push":
            want = -(-request.num_prompt_tokens // self.B)
            ids = ids[first:min(want, len(ids))]
            load.update(ids=ids, holder=r.holder["agent"],
                        holder_req=c_req_id(str(r.holder["req"])),
                        timeout=self.load_timeout,
                        req=self.c_request(r, request.num_prompt_tokens))
        else:
            m = r.match
            nb = m["blocks"] + (1 if m["tail"] else 0)
            load.update(ids=ids[first:nb], match=m,
                        req=self.c_request(r, request.num_tokens, r.holder))
        r.loading = True
        self._loads.append(load)
        if params:
            params["do_remote_prefill"] = False

    def build_connector_meta(self, so):
        step = {"loads": self._loads, "rejects": self._rejects,
                "aborts": self._aborts, "drops": self._drops,
                "waits": self._waits, "saves": [],
                "preempted": [c_req_id(v) for v in
                              (getattr(so, "preempted_req_ids", None) or ())]}
        self._loads, self._rejects, self._aborts = [], [], []
        self._drops, self._waits = [], {}
        for vid, start, new_ids, resumed in self._scheduled(so):
            r = self.reqs.get(vid)
            if r is None:
                continue
            if resumed:
                r.table = list(new_ids or ())
            elif new_ids:
                r.table.extend(new_ids)
            n = so.num_scheduled_tokens.get(vid, 0)
            if n and not r.skip:
                sv = self._save(r, start, start + n)
                if sv is not None:
                    step["saves"].append(sv)
        return step

    def _scheduled(self, so):
        for nr in getattr(so, "scheduled_new_reqs", None) or ():
            yield nr.req_id, nr.num_computed_tokens, \
                _group0(nr.block_ids), True
        c = getattr(so, "scheduled_cached_reqs", None)
        if c is None:
            return
        resumed = getattr(c, "resumed_req_ids", None)
        flags = getattr(c, "resumed_from_preemption", None)
        for i, vid in enumerate(c.req_ids):
            nb = c.new_block_ids[i]
            again = (vid in resumed) if resumed is not None else \
                bool(flags and flags[i])
            yield vid, c.num_computed_tokens[i], \
                (_group0(nb) if nb is not None else None), again

    def _save(self, r, start, end):
        """This step's save of r: tokens [start, end) are computed by it."""
        eng = self.engine()
        params = getattr(r.request, "kv_transfer_params", None) or {}
        pushing = self.push and self.layerwise and eng.remote and \
            bool(params.get("do_remote_decode"))
        if not (eng.offload or pushing):
            return None
        req = r.request
        prompt = req.num_prompt_tokens
        last = start < prompt <= end
        ntok = prompt if last else min(end, req.num_tokens)
        creq = self.c_request(r, ntok, tail=last)
        first = start // self.B
        nb = min(-(-end // self.B), len(r.table)) - first
        if nb <= 0:
            return None
        return {"vid": r.vid, "cid": r.cid, "req": creq, "first": first,
                "ids": r.table[first:first + nb], "tokens": end,
                "last": last}

    def request_finished(self, request, block_ids):
        vid = request.request_id
        r = self.reqs.pop(vid, None)
        params = getattr(request, "kv_transfer_params", None) or {}
        done = _status(request) in _DONE
        if r is None:
            r = _Req(request)
        if r.loading and r.async_:
            # Aborted while its load is on its way: stopped; vLLM frees the
            # blocks once get_finished reports the load over.
            self._aborts.append(r.cid)
            self._recv_aborted.add(vid)
            return False, None
        # A load of this step's forward (layer by layer) may still write
        # its blocks: they wait for it to be over.
        sync_load = r.loading
        if sync_load and not done:
            self._aborts.append(r.cid)
        for i, ld in enumerate(self._loads):
            if ld["vid"] == vid:
                del self._loads[i]
                break
        if params.get("do_remote_prefill") and params.get("pdx"):
            self._rejects.append(params["pdx"])  # never loaded: free it
        if r.reject is not None:
            self._rejects.append(r.reject)
        eng = self.engine()
        ids = _group0(block_ids)
        if done and params.get("do_remote_decode") and eng.remote and \
                not r.skip:
            return self._hand_off(r, request, ids)
        out = None
        if done and eng.offload and self.reuse and not r.skip and \
                eng.remote and (params.get("do_remote_prefill") is not None
                                or self.s["kv_role"] == "kv_consumer"):
            out = self._hand_pool(r, request)
        if not done and not r.skip:
            self._drops.append(r.cid)  # its layer-wise state goes now
        if not (eng.offload or sync_load) or r.skip:
            return False, out
        # Its saves may still be copying its blocks: vLLM frees them once
        # get_finished says so; a finished one's layer state goes then.
        self._waits[vid] = {"cid": r.cid, "freed": False,
                            "saves": eng.offload, "drop": done}
        self._sending.add(vid)
        return True, out

    def _hand_off(self, r, request, ids):
        """P: its prompt's blocks held for D (freed on D's done, a reject,
        the lease's end, or a push's end), the handoff in the params."""
        eng = self.engine()
        n = request.num_prompt_tokens
        creq = self.c_request(r, n)
        nb = len(creq["hashes"]) + (1 if creq["tail_hash"] else 0)
        handoff = eng.request_finished(creq, ids[:nb], n, "arena")
        self._waits[r.vid] = {"cid": r.cid, "freed": True, "saves": True,
                              "drop": False}
        self._sending.add(r.vid)
        return True, {
            "do_remote_prefill": True, "do_remote_decode": False,
            "remote_engine_id": self.s["engine_id"],
            "remote_request_id": r.vid, "remote_block_ids": ids[:nb],
            "pdx": handoff, "pdx_side_channel": eng.side.addr}

    def _hand_pool(self, r, request):
        """D: the conversation's blocks from its offload pool, for the next
        turn's prefill node (D-to-P reuse)."""
        eng = self.engine()
        n = request.num_computed_tokens
        creq = self.c_request(r, n, tail=False)
        try:
            handoff = eng.request_finished(creq, None, n, "pool")
        except pdx.Error as e:
            log.warning("pdx.vllm: no reuse handoff for %s: %s", r.vid, e)
            return None
        if not handoff.get("hashes"):
            eng.conn.reject(handoff)  # nothing in the pool: nothing held
            return None
        return {"do_remote_prefill": False, "do_remote_decode": False,
                "pdx": handoff, "pdx_side_channel": eng.side.addr}

    def has_pending_work(self):
        return bool(self._sending or self._recv_aborted)

    def update_connector_output(self, output):
        self._sending.difference_update(
            getattr(output, "finished_sending", None) or ())
        self._recv_aborted.difference_update(
            getattr(output, "finished_recving", None) or ())
        for vid in getattr(output, "finished_recving", None) or ():
            r = self.reqs.get(vid)
            if r is not None:
                r.loading = False
