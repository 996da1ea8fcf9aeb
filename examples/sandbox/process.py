"""Run the sandbox provider as a real subprocess and talk to it over HTTP: for tests (these
and any other app's, e.g. the ledger's adapter or the refund workflow end to end).

    with SandboxProcess(tmp_path / "sandbox.sqlite3") as sandbox:
        status, body = sandbox.request("POST", "/v1/refunds", {"order": "A1", "amount": "5.00"},
                                       headers={"Idempotency-Key": "k1"})
        sandbox.arm("k2", "timeout=3")           # the next POST on k2 stores, then hangs 3 s
        assert sandbox.stats()["refunds"] == 1

    # Outcome webhooks to a receiver, signed with the secret (given to the process in its
    # environment, off the command line), every event sent twice:
    SandboxProcess(data, webhook_url="http://127.0.0.1:8000/webhooks/sandbox-payments/",
                   webhook_secret="whsec_...", webhook_faults="duplicate")

Standard library only, like the provider.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"listening on http://([^\s:]+):(\d+)")


class SandboxProcess:
    def __init__(
        self,
        data: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log: str | Path | None = None,
        args: tuple[str, ...] = (),
        webhook_url: str | None = None,
        webhook_secret: str | None = None,
        webhook_faults: str = "",
    ) -> None:
        self.data = Path(data)
        self.host = host
        self.requested_port = port
        self.log = Path(log) if log is not None else self.data.with_suffix(".log")
        self.args = args
        if webhook_url is not None:
            self.args += ("--webhook-url", webhook_url)
        if webhook_faults:
            self.args += ("--webhook-faults", webhook_faults)
        self.webhook_secret = webhook_secret
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the sandbox is not running")
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> SandboxProcess:
        """Start the process (on a free port unless told one) and wait until it listens."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log.stat().st_size if self.log.exists() else 0  # the log is appended to
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        if self.webhook_secret is not None:
            env["SANDBOX_WEBHOOK_SECRET"] = self.webhook_secret
        command = [
            sys.executable,
            "-m",
            "examples.sandbox",
            "--host",
            self.host,
            "--port",
            str(self.requested_port),
            "--data",
            str(self.data),
            *self.args,
        ]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = LISTENING.search(self.log_text(offset))
            if found:
                self.port = int(found.group(2))
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"the sandbox exited with {self.process.returncode}:\n{self.log_text(offset)}")
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the sandbox did not start within {timeout}s:\n{self.log_text(offset)}")

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL if it lingers; returns the exit code."""
        process, self.process, self.port = self.process, None, None
        if process is None:
            return None
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def restart(self) -> SandboxProcess:
        self.stop()
        return self.start()

    def log_text(self, offset: int = 0) -> str:
        try:
            with open(self.log, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> SandboxProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- a small client ---------------------------------------------------------------------

    def request(
        self, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None, timeout: float = 10.0
    ) -> tuple[int, Any]:
        """One request on a fresh connection; returns (status, decoded JSON body). ``body`` is
        sent as JSON, or as it is when it is bytes. Raises TimeoutError when no answer comes
        within ``timeout`` seconds."""
        if self.port is None:
            raise RuntimeError("the sandbox is not running")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
            all_headers = {"Content-Type": "application/json", **(headers or {})}
            conn.request(method, path, body=data, headers=all_headers)
            response = conn.getresponse()
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
        finally:
            conn.close()

    def arm(self, key: str, fault: str, times: int = 1, on: str = "create") -> None:
        """Make the next ``times`` requests on ``key`` suffer ``fault`` (see faults.py)."""
        status, body = self.request("POST", "/v1/faults", {"key": key, "fault": fault, "times": times, "on": on})
        if status != 201:
            raise RuntimeError(f"arming {fault!r} failed: {status} {body}")

    def stats(self) -> dict[str, Any]:
        status, body = self.request("GET", "/v1/stats")
        assert status == 200, body
        return dict(body)

    def webhooks(self) -> list[dict[str, Any]]:
        """The outbox: every outcome event in the order it was queued, with its status
        (held, queued, delivered, failed, dropped), attempts, sends and last answer."""
        status, body = self.request("GET", "/v1/webhooks")
        assert status == 200, body
        return list(body["events"])

    def reset(self) -> None:
        status, body = self.request("POST", "/v1/reset")
        assert status == 200, body
