"""pdx.vllm.proxy between a client and two stand-in engines (HTTP servers
of the standard library on loopback that answer as vLLM's OpenAI server
does with a KV connector): the request goes to P with max_tokens 1 and
do_remote_decode, P's kv_transfer_params go into the same request to D,
D's answer (streamed or not) comes back; a client's own
kv_transfer_params (D-to-P reuse) reach P; P's error comes back as is;
with --push, P and D get the request at once, D with P's agent and side
channel for the chosen DP rank."""
import http.client
import http.server
import json
import threading

import pytest

from pdx.vllm import proxy as px


class Engine:
    """A stand-in engine: records each request, answers `reply(body)`."""

    def __init__(self, reply):
        self.got = []
        self.lock = threading.Lock()
        eng = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n))
                with eng.lock:
                    eng.got.append((self.path, dict(self.headers), body))
                status, out = reply(body)
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d" % self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


HANDOFF = {"do_remote_prefill": True, "do_remote_decode": False,
           "pdx": {"agent": "glm52-p-dp0", "hashes": ["ab" * 32],
                   "tail": {"tokens": 48}}}


def p_reply(body):
    if body.get("prompt") == "fail":
        return 503, {"error": "P is full"}
    return 200, {"choices": [{"text": "x"}],
                 "kv_transfer_params": HANDOFF}


def d_reply(body):
    return 200, {"choices": [{"text": "decoded"}],
                 "echo": body.get("kv_transfer_params")}


@pytest.fixture
def pair():
    p, d = Engine(p_reply), Engine(d_reply)
    yield p, d
    p.close()
    d.close()


def serve(prox):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                          px.make_handler(prox))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def post(srv, path, body):
    c = http.client.HTTPConnection("127.0.0.1", srv.server_address[1],
                                   timeout=30)
    c.request("POST", path, json.dumps(body),
              {"Content-Type": "application/json",
               "Authorization": "Bearer k"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data)


def test_pull_handoff(pair):
    p, d = pair
    # D's base URL with its /v1, as vLLM's own proxies take it: not doubled.
    srv = serve(px.Proxy([p.url], [d.url + "/v1"], timeout=30))
    try:
        st, out = post(srv, "/v1/completions",
                       {"model": "m", "prompt": "hi", "max_tokens": 8,
                        "stream": True, "stream_options": {"x": 1}})
        assert st == 200 and out["choices"][0]["text"] == "decoded"
        (pp, ph, pb), = p.got
        (dp, dh, db), = d.got
        assert pp == dp == "/v1/completions"
        # P: one token, no stream, asked to keep the blocks for D.
        assert pb["max_tokens"] == 1 and pb["stream"] is False
        assert "stream_options" not in pb
        assert pb["kv_transfer_params"] == {"do_remote_decode": True,
                                            "do_remote_prefill": False}
        # D: the client's request with P's handoff.
        assert db["max_tokens"] == 8 and db["stream"] is True
        assert db["kv_transfer_params"] == HANDOFF
        assert out["echo"] == HANDOFF
        assert ph["X-Request-Id"] == dh["X-Request-Id"]
        assert ph["Authorization"] == dh["Authorization"] == "Bearer k"
        # D-to-P reuse: the client's kv_transfer_params (D's handoff of
        # the previous turn) reach P, with do_remote_decode set.
        reuse = {"pdx": {"agent": "glm52-d-dp0", "source": "pool"}}
        st, _ = post(srv, "/v1/chat/completions",
                     {"messages": [], "max_completion_tokens": 5,
                      "kv_transfer_params": reuse})
        assert st == 200
        pb = p.got[-1][2]
        assert pb["max_completion_tokens"] == 1
        assert pb["kv_transfer_params"] == dict(
            reuse, do_remote_decode=True, do_remote_prefill=False)
        assert d.got[-1][2]["kv_transfer_params"] == HANDOFF
        # P's error is the client's; D is not asked.
        n = len(d.got)
        st, out = post(srv, "/v1/completions", {"prompt": "fail"})
        assert st == 503 and out == {"error": "P is full"}
        assert len(d.got) == n
        # Unknown paths and the health check.
        c = http.client.HTTPConnection("127.0.0.1", srv.server_address[1],
                                       timeout=30)
        c.request("GET", "/healthcheck")
        assert c.getresponse().status == 200
        c.close()
    finally:
        srv.shutdown()
        srv.server_close()


def test_push_ranks(pair):
    p, d = pair
    srv = serve(px.Proxy([p.url], [d.url], timeout=30,
                         push_agent="glm52-p", push_side="10.0.0.1:18100",
                         push_ranks=2))
    try:
        for rank in (0, 1, 0):
            st, _ = post(srv, "/v1/completions",
                         {"prompt": "hi", "max_tokens": 4})
            assert st == 200
            db = d.got[-1][2]
            kv = db["kv_transfer_params"]
            assert kv["do_remote_prefill"] and db["max_tokens"] == 4
            assert kv["pdx_push"]["agent"] == "glm52-p-dp%d" % rank
            assert kv["pdx_push"]["side_channel"] == \
                "10.0.0.1:%d" % (18100 + rank)
            # P is asked concurrently; its request arrives (bounded wait).
            for _ in range(300):
                with p.lock:
                    if len(p.got) == len(d.got):
                        break
                threading.Event().wait(0.01)
            ph, pb = p.got[-1][1], p.got[-1][2]
            assert ph["X-data-parallel-rank"] == str(rank)
            assert pb["max_tokens"] == 1
            assert pb["kv_transfer_params"]["pdx_push_key"] == \
                kv["pdx_push"]["req"]
    finally:
        srv.shutdown()
        srv.server_close()


def test_cli_needs_push_agent():
    with pytest.raises(SystemExit):
        px.main(["--prefill", "http://a:1", "--decode", "http://b:2",
                 "--push"])
