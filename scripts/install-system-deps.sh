#!/usr/bin/env bash
# Install the system programs the stack and the benchmark drive (nginx, wrk, httperf) and what the
# venv is built with (Debian's python3, venv, headers, a compiler).
# Idempotent: does nothing when everything is already installed.
set -euo pipefail

missing=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v httperf >/dev/null 2>&1 || missing+=(httperf)  # uwsgi-layouts openloop (and its test)
# Bundle tests: systemd-analyze verify on the unit, a throwaway systemd booted with systemd-nspawn
# (PID 1 is often not systemd), self-signed certificates, HTTP checks inside that container.
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v systemd-nspawn >/dev/null 2>&1 || missing+=(systemd-container)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v logrotate >/dev/null 2>&1 || missing+=(logrotate)  # the bundle's logrotate file, run in a test
# Network namespaces for the multi-host tests and `bench compare --hosts` (ip netns, veth, bridge).
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || missing+=(iproute2)
# watch's tests scrape the exporter with a real Prometheus and check the alert rules with promtool.
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
# The container bundle's tests build images and run the generated manifests with podman (`podman kube
# play` needs catatonit for the pod's pause process; runc because crun refuses hybrid cgroups); the
# base images come from Debian's packages with mmdebstrap (no registry is reachable in CI).
for tool in podman runc mmdebstrap; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
[ -x /usr/libexec/podman/catatonit ] || [ -x /usr/bin/catatonit ] || missing+=(catatonit)
# The venv is built from Debian's python3 (readable by the unprivileged run user);
# uWSGI compiles against its headers, and has SSL (ssl-socket, for --uwsgi-tls) only if libssl-dev is
# installed when pip builds it, and internal routing (the route-if-not lines every uwsgi.ini holds
# to refuse code-loading packets) only if libpcre2-dev is: this script runs before the venv is made.
if command -v dpkg-query >/dev/null 2>&1; then
    for pkg in python3 python3-venv python3-dev gcc make libssl-dev libpcre2-dev; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: missing ${missing[*]} and apt-get is not available; install them with your package manager" >&2
    exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
        echo "error: missing ${missing[*]}; run as root or install sudo: apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi
echo "installing ${missing[*]} with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian's package may start a system nginx on :80; this project never uses it.
# Debian's prometheus package enables a service listening on :9090 on every interface, with no
# authentication; the tests start their own Prometheus on loopback. Stop and disable the one this
# script just installed (and only that one), and say so.
if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
    echo "note: stopped and disabled Debian's prometheus.service (it listens on :9090 on every interface); the tests start their own on 127.0.0.1" >&2
fi
