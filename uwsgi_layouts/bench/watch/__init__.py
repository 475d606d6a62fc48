"""``watch``: a running service's figures as Prometheus metrics, continuously (doctor diagnoses a
window and exits; watch exports the same figures for as long as it runs).

- ``sources``: what it reads, each in a thread, each bounded to the sliding window: the uWSGI
  stats server (doctor's sampler and its definitions), the kernel's accept queues of any
  server's listening sockets (sock_diag), nginx's access log (tailed, latency histograms);
- ``datagrams``: nginx's access log as syslog datagrams on a unix socket (a pod's sidecar);
- ``metrics``: the sources as metric families at each scrape (``WatchCollector``, ``METRICS``);
- ``serve``: the endpoint, on loopback TCP or a unix socket;
- ``rules``: alert rules and a Grafana dashboard over the same metrics.

Nothing here parses a command line: the tools ``bench.watchcli`` and ``bench.watchrulescli`` do.
"""

from __future__ import annotations

from uwsgi_layouts.bench.watch.datagrams import DatagramLog
from uwsgi_layouts.bench.watch.metrics import METRICS, PREFIX, WatchCollector
from uwsgi_layouts.bench.watch.rules import alerts, dashboard_json, expressions, rules_yaml
from uwsgi_layouts.bench.watch.serve import MetricsServer, is_loopback, listen_address
from uwsgi_layouts.bench.watch.sources import (
    LatencyHistograms,
    LogWatch,
    SocketWatch,
    StatsWatch,
    is_timed,
    last_lines,
    say,
)

__all__ = [
    "METRICS", "PREFIX", "DatagramLog", "LatencyHistograms", "LogWatch", "MetricsServer", "SocketWatch", "StatsWatch",
    "WatchCollector", "alerts", "dashboard_json", "expressions", "is_loopback", "is_timed", "last_lines",
    "listen_address", "rules_yaml", "say",
]
