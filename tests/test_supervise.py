"""scripts/supervise.sh, which the run command starts each process under: a process that exits is
started again, with a line in its log, and stopping the supervisor stops the process."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.support import ROOT, wait_for


def test_a_process_that_exits_is_restarted_and_stopping_the_supervisor_stops_it(tmp_path: Path) -> None:
    # given a command that counts its starts, then exits at once on its first two starts and stays
    # up on the third
    starts, log = tmp_path / "starts", tmp_path / "worker.log"
    command = (
        f"echo started >> {starts}; "
        f'if [ "$(wc -l < {starts})" -lt 3 ]; then exit 3; fi; '
        f"echo $$ > {tmp_path / 'pid'}; exec sleep 60"
    )
    supervisor = subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "supervise.sh"), "worker", str(log), "bash", "-c", command],
        env={**os.environ, "SUPERVISE_DELAY": "0.1"},
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # when it runs under the supervisor, then it is started again after each exit, each
        # restart logged with the exit status
        # (the file exists, empty, a moment before the shell writes the pid into it)
        pid_file = tmp_path / "pid"
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=10, what="the third start")
        assert starts.read_text().splitlines() == ["started"] * 3
        restarts = [line for line in log.read_text().splitlines() if "supervise:" in line]
        assert len(restarts) == 2
        assert all("worker exited with status 3; restarting in" in line for line in restarts)
        child = int(pid_file.read_text())
        os.kill(child, 0)  # running

        # and when the supervisor gets SIGTERM, it stops the process and exits
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=10) == 0
        wait_for(lambda: not _alive(child), timeout=5, what="the supervised process to end")
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
        supervisor.wait(timeout=10)
        assert supervisor.stderr is not None
        supervisor.stderr.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie that its parent has not reaped yet counts as gone
    return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower() if Path(f"/proc/{pid}").exists() else False
