"""Observers of a running stack: what its processes, its stats server and its logs show.

Nothing here starts or stops anything (``bench.stack`` does); every function reads:

- CPU seconds of the app server's (uWSGI, gunicorn, granian) and nginx's process trees
  (``tree_cpu_seconds``, ``Snapshot``), and under a layout's ``@cpus``/``@memory`` its cgroup's
  counters (periods, throttling, CPU used, OOM kills), a cell's ``limit`` record (``limit_record``);
- memory of the app server's process tree, per worker, and of nginx (``stack_memory``: PSS, USS,
  RSS read by psutil from /proc/PID/smaps_rollup; ``memory_record`` assembles the figures);
- requests served per uWSGI worker, from the stats server (``worker_requests``, ``Snapshot``),
  and over time in the background (``Sampler``: pids, request counters, accepting flags, and
  requests in flight per worker, summarised per cell by ``inflight_summary``; the sockets' listen
  queues and the workers' cumulative counters, for ``doctor``); for a server without a stats
  server, from the app's ``X-Worker-Pid`` header as wrk counted it, mapped to worker numbers
  (``requests_by_worker``). A stats server is a unix socket (a path: the lab's
  ``RUN_DIR/control/stats.sock``, the bundle's ``/run/NAME/stats.sock``) or, where the user accepted
  the risk, ``HOST:PORT``; it is read by deploy.machine's ``read_stats`` only, which drops the
  variables of requests in flight (cookies, Authorization headers) before anything here sees them;
- the kernel's view of listening sockets: unix listen queues (``unix_listen_queues``, sock_diag
  netlink: uWSGI cannot see them on stock Linux), TCP listen overflows (``kernel_listen_overflows``),
  which listening sockets a process holds (``process_listeners``);
- how nginx's workers share the clients (``nginx_workers``, ``busiest_connections``,
  ``spread_extra``);
- nginx's error and access logs (``error_kinds``, ``access_log``), and an access log read from
  its end while a window runs (``LogTail``, ``parse_timed_line``: status, request and upstream
  times, upstream addresses).

By concern, one module each: ``processes`` (CPU, requests, memory), ``stats`` (the stats
server over time), ``sockets`` (the kernel's listening sockets), ``nginx`` (its workers and
logs), ``config`` (uWSGI's own configuration). Other modules import these names from
``bench.observe``.
"""

from uwsgi_layouts.bench.observe.config import (
    APP_OPTIONS,
    ENTRY_NAME,
    app_options_of_ini,
    factory_of_entry,
    uwsgi_config,
)
from uwsgi_layouts.bench.observe.nginx import (
    ACCESS_RE,
    COMBINED_TIMED_RE,
    LOG_LIMIT_BYTES,
    REQUEST_TIME_KEYS,
    UPSTREAM_ADDR_KEYS,
    UPSTREAM_TIME_KEYS,
    UPSTREAMS_TIMED_RE,
    Access,
    LogTail,
    TimedLine,
    access_log,
    busiest_connections,
    client_connections,
    error_kinds,
    log_size,
    logged_requests,
    nginx_log_lines,
    nginx_workers,
    parse_timed_line,
    spread_extra,
)
from uwsgi_layouts.bench.observe.processes import (
    MB,
    ProcessMemory,
    Snapshot,
    cpu_seconds,
    limit_record,
    memory_record,
    process_memory,
    requests_by_worker,
    stack_memory,
    tree_cpu_seconds,
    tree_memory,
    worker_memory,
    worker_requests,
)
from uwsgi_layouts.bench.observe.sockets import (
    NETLINK_SOCK_DIAG,
    SOCK_DIAG_BY_FAMILY,
    TCP_LISTEN,
    Listener,
    inet_listeners,
    kernel_listen_overflows,
    process_listeners,
    same_listener,
    socket_holdings,
    tcp_listeners,
    unix_listen_queues,
    unix_listeners,
    workers_are_local,
)
from uwsgi_layouts.bench.observe.stats import (
    Sample,
    Sampler,
    WorkerCounters,
    inflight_summary,
    read_sample,
)

__all__ = [
    "Access",
    "access_log",
    "ACCESS_RE",
    "APP_OPTIONS",
    "app_options_of_ini",
    "busiest_connections",
    "client_connections",
    "COMBINED_TIMED_RE",
    "cpu_seconds",
    "ENTRY_NAME",
    "error_kinds",
    "factory_of_entry",
    "inet_listeners",
    "inflight_summary",
    "kernel_listen_overflows",
    "limit_record",
    "Listener",
    "LOG_LIMIT_BYTES",
    "LogTail",
    "log_size",
    "logged_requests",
    "MB",
    "memory_record",
    "NETLINK_SOCK_DIAG",
    "nginx_log_lines",
    "nginx_workers",
    "parse_timed_line",
    "process_listeners",
    "process_memory",
    "ProcessMemory",
    "read_sample",
    "REQUEST_TIME_KEYS",
    "requests_by_worker",
    "same_listener",
    "Sample",
    "Sampler",
    "Snapshot",
    "SOCK_DIAG_BY_FAMILY",
    "socket_holdings",
    "spread_extra",
    "stack_memory",
    "TCP_LISTEN",
    "tcp_listeners",
    "TimedLine",
    "tree_cpu_seconds",
    "tree_memory",
    "unix_listen_queues",
    "unix_listeners",
    "UPSTREAM_ADDR_KEYS",
    "UPSTREAM_TIME_KEYS",
    "UPSTREAMS_TIMED_RE",
    "uwsgi_config",
    "worker_memory",
    "worker_requests",
    "WorkerCounters",
    "workers_are_local",
]
