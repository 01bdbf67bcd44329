"""Metrics and log lines as an operator sees them.

* An agent's endpoint (Agent.serve_metrics: libpdx.so's libmicrohttpd
  server) scraped by Debian's real `prometheus` server on loopback: its
  query API returns pdx's request counter and the completion latency
  histogram for that agent, with the values the agent counted.
* The text passes `promtool check metrics`; per path (backend): requests,
  bytes, errors by class (a killed peer: remote_disconnect), histograms
  whose +Inf bucket equals their count; peers by state.
* PDX_METRICS_LISTEN starts the endpoint at agent create (an unchanged
  stack, e.g. through pdx.nixl).
* pdx.metrics.Collector in a prometheus_client registry (a stack that runs
  its own client): two agents' samples under one family each.
* Log lines carry the time, the pid and the agent; PDX_LOG_LEVEL=bogus is
  reported; a Python exception is not also printed as a "pdx error" line
  unless the log level asks for it.
Loopback only; every wait bounded. Skipped, with the reason, where
libpdx.so lacks libmicrohttpd or the tools are not installed (a failure
instead under scripts/test.sh, which installed them: PDX_TEST_REQUIRE_DEPS)."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import json

import pytest

import pdx
import pdx.metrics

from conftest import missing_dep


def _doc(name):
    src = os.environ.get("PDX_SOURCE_DIR", os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))))
    with open(os.path.join(src, "docs", name)) as f:
        return f.read()


def _metrics_md_queries():
    """The PromQL lines of docs/METRICS.md's block after "Queries:"."""
    doc = _doc("METRICS.md")
    m = re.search(r"^Queries:\n\n```\n(.*?)^```", doc, re.S | re.M)
    assert m, "docs/METRICS.md has no Queries block"
    qs = [l.split("#")[0].strip() for l in m.group(1).splitlines()]
    return [q for q in qs if q]


def _query_ok(web, q):
    """(True, None) when Prometheus accepts q; (False, its error) when it
    answers with an error; a connection that fails is tried again, a
    bounded number of times."""
    url = "http://127.0.0.1:%d/api/v1/query?%s" % (
        web, urllib.parse.urlencode({"query": q}))
    why = None
    for _ in range(10):
        try:
            _, _, body = http_get(url, timeout=5)
            return json.loads(body).get("status") == "success", body
        except urllib.error.HTTPError as e:
            return False, e.read().decode(errors="replace")
        except OSError as e:
            why = e
            time.sleep(0.5)
    return False, why


@pytest.fixture
def need_http():
    if not pdx.HAVE.get("metrics"):
        missing_dep("libpdx.so built without libmicrohttpd "
                    "(Debian: libmicrohttpd-dev)")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http_get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type"), r.read().decode()


def samples(text, name, **labels):
    """Values of `name`'s samples whose labels include `labels`."""
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name + "{"):
            continue
        lab, val = line[len(name) + 1:].rsplit("} ", 1)
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', lab))
        if all(have.get(k) == v for k, v in labels.items()):
            out.append(float(val))
    return out


def read_pairs(d, p, n, size=65536):
    """n READs of `size` bytes from p's shared memory into d (cma)."""
    src = pdx.mem_alloc(size)
    memoryview(src)[:] = b"\x5a" * size
    dst = bytearray(size)
    p.register(src)
    d.register(dst)
    peer = d.load_peer(p.describe())
    for _ in range(n):
        x = d.create_xfer("READ", [(pdx.addr_of(dst), size, 0)],
                          [(src.addr, size, 0)], peer)
        x.post()
        x.wait(timeout=10)
        x.release()
    assert dst == bytearray(b"\x5a" * size)
    return peer


def test_metrics_text_per_path_and_promtool(spawn, tmp_path):
    with pdx.Agent("met-p") as p, pdx.Agent("met-d") as d:
        d.metrics_text()  # the first scrape turns request timing on
        read_pairs(d, p, 7)
        # A UCX-only agent whose peer is killed: its post ends
        # remote_disconnect, the peer is dead.
        v = spawn("victim", 1 << 16)
        blob, raddr, _ = v.recv()
        with pdx.Agent("met-u", backends=["ucx"]) as u:
            u.metrics_text()
            buf = pdx.mem_alloc(1 << 16)
            u.register(buf)
            vp = u.load_peer(blob)
            x = u.create_xfer("READ", [(buf.addr, 1 << 16, 0)],
                              [(raddr, 1 << 16, 0)], vp)
            x.post()
            x.wait(timeout=20)
            v.kill()
            end = time.monotonic() + 10
            while time.monotonic() < end:
                try:
                    x.post()
                    x.wait(timeout=5)
                except pdx.RemoteDisconnect:
                    break
                time.sleep(0.01)
            x.release()
            ut = u.metrics_text()
        text = d.metrics_text()
    assert samples(text, "pdx_requests_total", agent="met-d",
                   path="cma") == [7]
    assert samples(text, "pdx_bytes_total", agent="met-d",
                   path="cma") == [7 * 65536]
    for h in ("pdx_post_duration_seconds", "pdx_completion_duration_seconds"):
        assert samples(text, h + "_count", agent="met-d", path="cma") == [7]
        assert samples(text, h + "_bucket", agent="met-d", path="cma",
                       le="+Inf") == [7]
        assert samples(text, h + "_sum", agent="met-d", path="cma")[0] > 0
        b = samples(text, h + "_bucket", agent="met-d", path="cma")
        assert b == sorted(b)  # cumulative
    assert samples(text, "pdx_peers", agent="met-d", state="alive") == [1]
    errs = [l for l in ut.splitlines()
            if l.startswith('pdx_errors_total{agent="met-u",path="ucx",'
                            'class="remote_disconnect"}')]
    assert errs and float(errs[0].split()[-1]) >= 1, ut
    assert samples(ut, "pdx_peers", agent="met-u", state="dead") == [1]
    promtool = shutil.which("promtool")
    if promtool is None:
        missing_dep("promtool not installed (Debian: prometheus)")
    for t in (text, ut, pdx.metrics.text([])):
        r = subprocess.run([promtool, "check", "metrics"], input=t.encode(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=60)
        assert r.returncode == 0, r.stdout.decode()
    # docs/METRICS.md's scrape config, as written, is one promtool accepts.
    m = re.search(r"^```yaml\n(.*?)^```", _doc("METRICS.md"), re.S | re.M)
    assert m, "docs/METRICS.md has no scrape config"
    cfg = tmp_path / "scrape.yml"
    cfg.write_text(m.group(1))
    r = subprocess.run([promtool, "check", "config", str(cfg)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=60)
    assert r.returncode == 0, r.stdout.decode()


def _prometheus(tmp_path, target_port):
    exe = shutil.which("prometheus")
    if exe is None:
        missing_dep("prometheus not installed (Debian: prometheus)")
    web = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: pdx\n    static_configs:\n"
        "      - targets: ['127.0.0.1:%d']\n" % target_port)
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [exe, "--config.file=%s" % cfg,
         "--storage.tsdb.path=%s" % (tmp_path / "data"),
         "--web.listen-address=127.0.0.1:%d" % web, "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, web, log


def _query(web, q):
    url = "http://127.0.0.1:%d/api/v1/query?%s" % (
        web, urllib.parse.urlencode({"query": q}))
    try:
        _, _, body = http_get(url, timeout=2)
    except OSError:
        return None
    r = json.loads(body)
    return r["data"]["result"] if r.get("status") == "success" else None


def test_prometheus_scrapes_agent(tmp_path, need_http):
    with pdx.Agent("prom-p") as p, pdx.Agent("prom-d") as d:
        port = d.serve_metrics("127.0.0.1", 0)
        assert port > 0
        st, ctype, body = http_get("http://127.0.0.1:%d/metrics" % port)
        assert st == 200 and ctype.startswith("text/plain; version=0.0.4")
        assert 'pdx_agent_info{agent="prom-d"' in body
        with pytest.raises(urllib.error.HTTPError) as e:
            http_get("http://127.0.0.1:%d/other" % port)
        assert e.value.code == 404
        with pytest.raises(pdx.Exists):
            d.serve_metrics()
        read_pairs(d, p, 12)
        proc, web, log = _prometheus(tmp_path, port)
        try:
            want = {
                'pdx_requests_total{agent="prom-d",path="cma"}': 12,
                'pdx_completion_duration_seconds_count{agent="prom-d",'
                'path="cma"}': 12,
                'pdx_completion_duration_seconds_bucket{agent="prom-d",'
                'path="cma",le="+Inf"}': 12,
            }
            got = {}
            end = time.monotonic() + 90
            while time.monotonic() < end and len(got) < len(want):
                for q, n in want.items():
                    res = _query(web, q)
                    if res:
                        assert len(res) == 1, res
                        m = res[0]["metric"]
                        assert m["agent"] == "prom-d" and m["job"] == "pdx"
                        got[q] = float(res[0]["value"][1])
                time.sleep(0.5)
            assert proc.poll() is None, (tmp_path / "prometheus.log"
                                         ).read_text()
            assert got == want, (got, (tmp_path / "prometheus.log"
                                       ).read_text()[-3000:])
            # The histogram as Prometheus reads it: a quantile of the
            # agent's completion latency.
            res = _query(web, 'histogram_quantile(0.5, '
                              'pdx_completion_duration_seconds_bucket{'
                              'agent="prom-d",path="cma"})')
            assert res and 0 < float(res[0]["value"][1]) < 10, res
            # docs/METRICS.md's queries as written: PromQL this server
            # accepts, over families the agent serves.
            text = d.metrics_text()
            for q in _metrics_md_queries():
                for name in re.findall(r"\b(pdx_[a-z_]+)", q):
                    assert "\n" + name + "{" in text, (name, q)
                ok, why = _query_ok(web, q)
                assert ok, (q, why)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            log.close()
        d.stop_metrics()
        with pytest.raises(pdx.NotFound):
            d.stop_metrics()
        with pytest.raises(OSError):
            http_get("http://127.0.0.1:%d/metrics" % port, timeout=2)
        # A port in use is refused with the reason.
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        try:
            with pytest.raises(pdx.IOFailure) as e:
                d.serve_metrics("127.0.0.1", s.getsockname()[1])
            assert "cannot listen" in str(e.value)
        finally:
            s.close()
        with pytest.raises(pdx.InvalidArgument):
            d.serve_metrics("localhost", 0)


def test_metrics_listen_env(need_http):
    port = free_port()
    code = (
        "import pdx, urllib.request\n"
        "a = pdx.Agent('env-agent')\n"
        "b = urllib.request.urlopen('http://127.0.0.1:%d/metrics', "
        "timeout=5).read().decode()\n"
        "assert 'pdx_agent_info{agent=\"env-agent\"' in b, b\n"
        "a.close()\n"
        "print('env-ok')\n" % port)
    env = dict(os.environ, PDX_METRICS_LISTEN="127.0.0.1:%d" % port)
    r = subprocess.run([sys.executable, "-c", code], env=env, timeout=60,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert r.returncode == 0 and b"env-ok" in r.stdout, r.stdout.decode()
    env["PDX_METRICS_LISTEN"] = "nonsense"
    r = subprocess.run([sys.executable, "-c",
                        "import pdx; pdx.Agent('env-bad').close()"],
                       env=env, timeout=60, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    assert r.returncode == 0 and b"PDX_METRICS_LISTEN=nonsense" in r.stdout


def test_prometheus_client_collector():
    try:
        import prometheus_client as prom
    except ImportError:
        missing_dep("prometheus_client not importable "
                    "(Debian: python3-prometheus-client)")
    from prometheus_client.parser import text_string_to_metric_families
    reg = prom.CollectorRegistry()
    with pdx.Agent("coll-p") as p, pdx.Agent("coll-d") as d:
        coll = pdx.metrics.Collector(p)
        coll.add(d)
        reg.register(coll)
        d.metrics_text()
        read_pairs(d, p, 3)
        out = prom.generate_latest(reg).decode()
    fams = {f.name: f for f in text_string_to_metric_families(out)}
    req = [s for s in fams["pdx_requests"].samples
           if s.labels.get("path") == "cma"]
    assert {s.labels["agent"]: s.value for s in req} == \
        {"coll-p": 0, "coll-d": 3}
    hist = fams["pdx_completion_duration_seconds"]
    assert hist.type == "histogram"
    cnt = [s.value for s in hist.samples
           if s.name.endswith("_count") and s.labels["agent"] == "coll-d"
           and s.labels["path"] == "cma"]
    assert cnt == [3]
    # Closed agents are skipped, not an error.
    assert "coll-d" not in prom.generate_latest(reg).decode()


LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z pdx (error|warn|"
                  r"info|debug|trace) pid=(\d+) agent=(\S+): (.*)$")


def _py(code, **env):
    e = dict(os.environ)
    e.pop("PDX_LOG_LEVEL", None)
    e.update(env)
    r = subprocess.run([sys.executable, "-c", code], env=e, timeout=60,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode(), r.stderr.decode()


def test_log_lines():
    # A bad level is reported once, at load, with what it means.
    out, err = _py("import pdx", PDX_LOG_LEVEL="bogus")
    bad = [l for l in err.splitlines() if "PDX_LOG_LEVEL" in l]
    assert len(bad) == 1 and "PDX_LOG_LEVEL=bogus is not a level" in bad[0]
    m = LINE.match(bad[0])
    assert m and m.group(1) == "warn", bad
    # An exception raised to Python is not printed a second time...
    code = ("import pdx\n"
            "a = pdx.Agent('log-a')\n"
            "try:\n"
            "    a.load_peer(b'garbage')\n"
            "except pdx.Error as e:\n"
            "    print('raised:', e)\n"
            "a.close()\n")
    out, err = _py(code)
    assert "raised:" in out and "pdx error" not in err, err
    # ... unless the level asks for it: then each line names the time,
    # the pid and the agent of the call.
    out, err = _py(code, PDX_LOG_LEVEL="info")
    lines = [LINE.match(l) for l in err.splitlines() if " pdx " in l]
    assert lines and all(lines), err
    errs = [m for m in lines if m.group(1) == "error"]
    assert errs and errs[0].group(3) == "log-a", err
    pid = int(errs[0].group(2))
    assert pid > 0 and errs[0].group(4) in out
    # Lines of a call that succeeds are still written (a warning).
    out, err = _py("import pdx\n"
                   "with pdx.Agent('log-p') as p, "
                   "pdx.Agent('log-d', backends=['ucx']) as d:\n"
                   "    p.register(pdx.mem_alloc(4096))\n"
                   "    d.load_peer(p.describe())\n")
    warn = [LINE.match(l) for l in err.splitlines() if "slower path" in l]
    assert warn and warn[0] and warn[0].group(3) == "log-d", err
