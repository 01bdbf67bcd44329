"""pdx.metrics: pdx agents' metrics for a stack that already runs a
Prometheus client, or that serves text itself.

Each agent's numbers come from libpdx.so (``Agent.metrics_text()``:
Prometheus's text format, the families listed in docs/METRICS.md); this
module merges several agents' texts and hands them to prometheus_client::

    import pdx, pdx.metrics
    from prometheus_client import REGISTRY, start_http_server
    agent = pdx.Agent("glm52-d-dp0")
    REGISTRY.register(pdx.metrics.Collector(agent))
    start_http_server(8000)                 # the stack's own endpoint

A ``pdx.nixl.nixl_agent`` is accepted where an agent is (its pdx agent is
used). Without a Prometheus client: ``pdx.metrics.text(agents)`` is the
merged text, and ``Agent.serve_metrics(addr, port)`` serves one agent from
libpdx.so itself (libmicrohttpd). prometheus_client is imported only by
Collector."""

import threading

__all__ = ["Collector", "text"]


def _pdx_agent(a):
    """The pdx.Agent of `a` (a pdx.Agent or a nixl_agent)."""
    inner = getattr(a, "agent", None)
    return inner if inner is not None and hasattr(inner, "metrics_text") \
        else a


def _families(txt):
    """[(family name, [lines])] of one agent's text, in order."""
    out, cur = [], None
    for line in txt.splitlines():
        if line.startswith("# HELP "):
            cur = (line.split()[2], [])
            out.append(cur)
        if cur is not None:
            cur[1].append(line)
    return out


def text(agents):
    """The metrics of several agents as one text in Prometheus's format
    (each family's HELP and TYPE once, every agent's samples under it).
    Closed agents are skipped."""
    import pdx
    merged, order = {}, []
    for a in agents:
        try:
            txt = _pdx_agent(a).metrics_text()
        except pdx.Closed:
            continue
        for name, lines in _families(txt):
            if name not in merged:
                merged[name] = list(lines)
                order.append(name)
            else:
                merged[name].extend(l for l in lines
                                    if not l.startswith("#"))
    return "".join("\n".join(merged[n]) + "\n" for n in order)


class Collector:
    """A prometheus_client collector of pdx agents' metrics: register it
    with a CollectorRegistry (REGISTRY); each scrape reads every agent's
    counters from libpdx.so. Agents may be added and removed while it is
    registered; closed ones are skipped."""

    def __init__(self, *agents):
        self._lock = threading.Lock()
        self._agents = list(agents)

    def add(self, agent):
        with self._lock:
            self._agents.append(agent)

    def remove(self, agent):
        with self._lock:
            self._agents = [a for a in self._agents if a is not agent]

    def collect(self):
        from prometheus_client.parser import text_string_to_metric_families
        with self._lock:
            agents = list(self._agents)
        for fam in text_string_to_metric_families(text(agents)):
            yield fam

    def describe(self):
        # No fixed description: the registry calls collect() to find the
        # names (they do not clash with a stack's own, all start pdx_).
        return []
