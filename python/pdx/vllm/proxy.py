"""A small P/D proxy for vLLM engines running pdx.vllm.PdxConnector
(standard library only), in the pattern of vLLM's own disaggregated proxy:
the client's request goes to a prefill engine with max_tokens 1 and
kv_transfer_params {"do_remote_decode": true}; the kv_transfer_params of
P's response (pdx's handoff: where the blocks are, their hashes, P's side
channel) go into the same request to a decode engine, whose answer is
streamed back. A client that sends kv_transfer_params of its own (D's
from the previous turn, for D-to-P reuse of a conversation) has them
merged into P's.

Layer-wise push (--push): P and D get the request at once; P is given a
key (pdx_push_key), D the key and P's agent and side channel (pdx_push),
so D asks P to write each layer into its blocks while P still computes.
P's DP rank is chosen here (header X-data-parallel-rank), its agent and
side channel derived from --push-agent and --push-side-channel (the
agent_name and side_channel_port of P's kv_connector_extra_config).

    python -m pdx.vllm.proxy --port 8000 \\
        --prefill http://p-host:8100 --decode http://d-host:8200

Endpoints: /v1/completions, /v1/chat/completions, /healthcheck."""
import argparse
import http.client
import http.server
import itertools
import json
import sys
import threading
import urllib.parse
import uuid


def _post(base, path, body, headers, timeout):
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80,
                                      timeout=timeout)
    # vLLM serves /v1/...; a base URL given with its /v1 (as vLLM's own
    # proxies take it) is not doubled.
    prefix = u.path.rstrip("/")
    if prefix.endswith("/v1"):
        prefix = prefix[:-3]
    conn.request("POST", prefix + path, json.dumps(body),
                 dict(headers, **{"Content-Type": "application/json"}))
    return conn, conn.getresponse()


class Proxy:
    def __init__(self, prefill, decode, timeout=600.0, push_agent=None,
                 push_side=None, push_ranks=1):
        self.prefill = itertools.cycle(prefill)
        self.decode = itertools.cycle(decode)
        self.timeout = timeout
        self.push_agent = push_agent
        self.push_side = push_side
        self.ranks = itertools.cycle(range(push_ranks))
        self.lock = threading.Lock()

    def _next(self, it):
        with self.lock:
            return next(it)

    def prefill_body(self, body, rid):
        p = dict(body)
        p["kv_transfer_params"] = dict(body.get("kv_transfer_params") or {},
                                       do_remote_decode=True,
                                       do_remote_prefill=False)
        p.update(stream=False, max_tokens=1)
        if "max_completion_tokens" in p:
            p["max_completion_tokens"] = 1
        for k in ("stream_options", "min_tokens", "min_completion_tokens"):
            p.pop(k, None)
        return p

    def handle(self, path, body, auth):
        rid = str(uuid.uuid4())
        headers = {"X-Request-Id": rid}
        if auth:
            headers["Authorization"] = auth
        p_url, d_url = self._next(self.prefill), self._next(self.decode)
        pb = self.prefill_body(body, rid)
        if self.push_agent:
            return self._push(path, body, pb, headers, p_url, d_url)
        conn, resp = _post(p_url, path, pb, headers, self.timeout)
        data = resp.read()
        conn.close()
        if resp.status != 200:
            return resp.status, data, None
        kv = json.loads(data).get("kv_transfer_params") or {}
        db = dict(body)
        if kv:
            db["kv_transfer_params"] = kv
        return self._decode(path, db, headers, d_url)

    def _push(self, path, body, pb, headers, p_url, d_url):
        rank = self._next(self.ranks)
        key = "push-" + headers["X-Request-Id"]
        host, _, port = self.push_side.rpartition(":")
        pb["kv_transfer_params"]["pdx_push_key"] = key
        db = dict(body)
        db["kv_transfer_params"] = {
            "do_remote_prefill": True, "do_remote_decode": False,
            "pdx_push": {"agent": "%s-dp%d" % (self.push_agent, rank),
                         "req": key,
                         "side_channel": "%s:%d" % (host, int(port) + rank)}}
        ph = dict(headers, **{"X-data-parallel-rank": str(rank)})
        out = {}

        def run_p():
            try:
                conn, resp = _post(p_url, path, pb, ph, self.timeout)
                resp.read()
                out["p"] = resp.status
                conn.close()
            except OSError as e:
                out["p"] = e
        t = threading.Thread(target=run_p, daemon=True)
        t.start()
        status, data, stream = self._decode(path, db, headers, d_url)
        return status, data, stream

    def _decode(self, path, body, headers, d_url):
        conn, resp = _post(d_url, path, body, headers, self.timeout)
        if resp.status != 200:
            data = resp.read()
            conn.close()
            return resp.status, data, None
        return 200, None, (conn, resp)


def make_handler(proxy):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            sys.stderr.write("pdx proxy: " + fmt % args + "\n")

        def do_GET(self):
            if self.path != "/healthcheck":
                return self.send_error(404)
            self._send(200, b'{"status": "ok"}')

        def do_POST(self):
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                return self.send_error(404)
            n = int(self.headers.get("Content-Length", 0))
            try:
                body = json.loads(self.rfile.read(n) or b"{}")
            except ValueError:
                return self._send(400, b'{"error": "not JSON"}')
            try:
                status, data, stream = proxy.handle(
                    self.path, body,
                    self.headers.get("Authorization"))
            except OSError as e:
                return self._send(502, json.dumps(
                    {"error": "pdx proxy: %s" % e}).encode())
            if stream is None:
                return self._send(status, data)
            conn, resp = stream
            self.send_response(200)
            self.send_header("Content-Type",
                             resp.getheader("Content-Type",
                                            "application/json"))
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                while True:
                    chunk = resp.read1(65536)
                    if not chunk:
                        break
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.write(b"0\r\n\r\n")
            finally:
                conn.close()

        def _send(self, status, data):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m pdx.vllm.proxy",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--prefill", nargs="+", required=True,
                    help="prefill engines' base URLs (http://host:port)")
    ap.add_argument("--decode", nargs="+", required=True,
                    help="decode engines' base URLs")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--push", action="store_true",
                    help="layer-wise push (needs --push-agent and "
                         "--push-side-channel)")
    ap.add_argument("--push-agent", help="P's agent_name (before -dp<r>)")
    ap.add_argument("--push-side-channel",
                    help="P's side channel host:side_channel_port")
    ap.add_argument("--push-dp-size", type=int, default=1,
                    help="P's data-parallel ranks")
    a = ap.parse_args(argv)
    if a.push and not (a.push_agent and a.push_side_channel):
        ap.error("--push needs --push-agent and --push-side-channel")
    proxy = Proxy(a.prefill, a.decode, a.timeout,
                  a.push_agent if a.push else None, a.push_side_channel,
                  a.push_dp_size)
    srv = http.server.ThreadingHTTPServer((a.host, a.port),
                                          make_handler(proxy))
    print("pdx proxy on %s:%d: prefill %s, decode %s%s"
          % (a.host, a.port, a.prefill, a.decode,
             " (layer-wise push)" if a.push else ""), flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
