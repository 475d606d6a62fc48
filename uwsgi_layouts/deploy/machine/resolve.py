"""``checked(layout)``: a layout as it runs on this machine, or LayoutError naming the field.

The model validated what the layout says; this resolves and checks what it names here: the
app directory (default: this project's demo app), the kernel's backlog cap, the run user (under
root www-data, else whoever runs us), the data set and its map, the run directory (never a
symlink), the virtualenv and the Python version our server runs (and another uWSGI build's),
the static directories, a CPU or memory limit (within the host's CPUs, a cgroup controller to
enforce it), and across hosts the certificates (and plain uwsgi off loopback only
inside a network this process isolated). Risky input is refused unless the layout accepts the
risk by name (deploy/machine/risks.py): code directories others can write to, root, system
directories served as static, a listen address beyond loopback.
It returns a new Layout with those values resolved and ``run_as`` attached; checking a checked
layout again gives the same layout.
"""

from __future__ import annotations

import os
from dataclasses import replace

from uwsgi_layouts.deploy.machine.certificates import resolve_tls_dir
from uwsgi_layouts.deploy.machine.cgroups import check_limits
from uwsgi_layouts.deploy.machine.datasets import check_data_dir
from uwsgi_layouts.deploy.machine.netns import plain_allowed
from uwsgi_layouts.deploy.machine.network import check_backlog
from uwsgi_layouts.deploy.machine.paths import PACKAGE_DIR, existing_dir, output_dir, static_dirs
from uwsgi_layouts.deploy.machine.python import check_uwsgi_bin, check_virtualenv, default_virtualenv
from uwsgi_layouts.deploy.machine.replicas import check_replicas
from uwsgi_layouts.deploy.machine.risks import (
    check_code_dirs,
    check_listen,
    check_run_user,
    check_static_locations,
    check_stats,
)
from uwsgi_layouts.deploy.machine.users import group_of, resolve_user
from uwsgi_layouts.deploy.model import Layout, LayoutError, RunAs, config_path


def checked(layout: Layout) -> Layout:
    app_dir = existing_dir("app_dir", layout.app_dir or str(PACKAGE_DIR))
    check_backlog(layout.backlog)
    user = resolve_user(layout.user)
    data_dir = check_data_dir(layout.data_dir) if layout.data_dir else ""
    run_dir = config_path("run_dir", str(output_dir("run_dir", layout.run_dir)), nginx=layout.transport == "unix")
    virtualenv = check_virtualenv(layout.virtualenv, layout.server) if layout.virtualenv else default_virtualenv()
    check_static_locations(layout.static, layout.allow)  # as given: /s=/proc/self resolves to /proc/PID
    static = static_dirs(layout.static)
    tls_dir = check_hosts(layout)
    uwsgi_bin = check_uwsgi_bin(layout.uwsgi_bin, layout.uwsgi_tls != "off") if layout.uwsgi_bin else ""
    check_limits(layout)  # @cpus within the host's CPUs, and a cgroup controller to enforce it
    check_replicas(layout)  # @replicas: their quotas, memory limits and threads fit this machine
    out = replace(layout, app_dir=app_dir, user=user, data_dir=data_dir, run_dir=run_dir, virtualenv=virtualenv,
                  static=static, uwsgi_tls_dir=tls_dir, uwsgi_bin=uwsgi_bin,
                  run_as=RunAs(group=group_of(user), as_root=os.geteuid() == 0))
    check_run_user(out)
    check_listen(out)
    check_stats(out)
    check_code_dirs(out)
    return out


def check_hosts(layout: Layout) -> str:
    """Plain uwsgi reaches loopback only (or an isolated network this process made); TLS needs
    its certificates here. Returns the certificates' directory, resolved ("" without TLS)."""
    addresses = layout.app_hosts if layout.transport == "tcp" else ()
    if layout.uwsgi_tls == "off":
        exposed = next((a for a in addresses if not plain_allowed(a)), None)
        if exposed:
            raise LayoutError("uwsgi_tls", f"plain uwsgi to {exposed} would let anyone who reaches it make uWSGI "
                                           "load and run code (UWSGI_FILE...): use --uwsgi-tls suwsgi with "
                                           "--uwsgi-tls-dir (uwsgi-layouts certs DIR --hosts ...)")
        return ""
    return resolve_tls_dir(layout.uwsgi_tls_dir, addresses)
