"""nginx as the reference column: a plain reverse proxy to the fake upstream, one worker, if nginx is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from bench.processes import Child, answers, spawn, wait_until
from tests.ports import free_port

CONFIG = """\
daemon off;
master_process off;
worker_processes 1;
worker_rlimit_nofile 20000;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy_temp;
    fastcgi_temp_path {dir}/fastcgi_temp;
    uwsgi_temp_path {dir}/uwsgi_temp;
    scgi_temp_path {dir}/scgi_temp;
    client_max_body_size 64m;
    client_body_buffer_size 2m;
    keepalive_requests 100000;
    upstream fake {{
        server 127.0.0.1:{upstream_port};
        keepalive 256;
        keepalive_requests 100000;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://fake;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


def available() -> str | None:
    """The nginx binary on PATH (or in /usr/sbin), or None."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


def version() -> str:
    """For the table's header: `nginx -v`'s answer, or why there is no nginx column."""
    binary = available()
    if binary is None:
        return "not installed: no nginx column"
    done = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=10)
    return (done.stderr or done.stdout).strip().removeprefix("nginx version: ")


def start_nginx(directory: Path, upstream_port: int) -> tuple[Child, int] | None:
    """nginx in front of the fake upstream on a free port; None when nginx is not installed."""
    binary = available()
    if binary is None:
        return None
    home = directory / "nginx"
    home.mkdir(exist_ok=True)
    port = free_port()
    config = home / "nginx.conf"
    config.write_text(CONFIG.format(dir=home, upstream_port=upstream_port, port=port))
    argv = [binary, "-c", str(config), "-p", str(home), "-e", str(home / "error.log")]
    child = spawn("nginx", argv, cwd=home, log=home / "stdout.log")
    wait_until(child, lambda: answers(f"http://127.0.0.1:{port}/v1/models"))
    return child, port
