"""A real Prometheus (Debian's package) for the tests: its own config and data directory in a
temporary directory, on a free loopback port, scraping the given targets every second; stopped
and its directory removed on the way out (SIGKILL of the test included: PR_SET_PDEATHSIG)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from uwsgi_layouts.deploy.run import child_setup

PROMETHEUS = "/usr/bin/prometheus"
SCRAPE_S = 1


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """An instant query's result vector ([{"metric": {...}, "value": [t, "x"]}, ...])."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def value(self, expr: str, at: float | None = None) -> float | None:
        """The single value of an instant query, None when it is empty."""
        result = self.query(expr, at)
        assert len(result) <= 1, (expr, result)
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, expr: str, timeout: float = 30.0) -> float:
        """Poll until ``expr`` has a value; return it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.value(expr)
            if value is not None:
                return value
            time.sleep(0.5)
        raise AssertionError(f"{expr} had no value within {timeout:g} s")


@contextmanager
def prometheus(targets: list[str], port: int):
    """Prometheus on 127.0.0.1:``port`` scraping ``targets`` (HOST:PORT) every second."""
    work = Path(tempfile.mkdtemp(prefix="ul-prom-"))
    config = work / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "scrape_configs": [{"job_name": "watch", "static_configs": [{"targets": targets}]}],
    }))
    log = (work / "prometheus.log").open("w")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                            cwd=work, preexec_fn=child_setup())
    try:
        server = Prometheus(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (work / "prometheus.log").read_text()[-2000:]
            time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)
