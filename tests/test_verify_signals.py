"""`cfgfix verify` stopped by SIGTERM or SIGHUP (a CI timeout, `timeout 2 cfgfix verify`, a
closed terminal): the launch's whole process group is killed (no orphan holds the GPU), the
`cfgfix-verify-*` folders are removed, and the exit code is the signal's (128+N)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
SCRIPT = (
    "import os, subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
    "with open(os.environ['PIDS_FILE'] + '.tmp', 'w') as f:\n"
    "    f.write(f'{os.getpid()} {child.pid}')\n"
    "os.replace(os.environ['PIDS_FILE'] + '.tmp', os.environ['PIDS_FILE'])\n"
    "time.sleep(300)\n"
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()  # a zombie has stopped running
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL])
def test_a_signal_stops_the_launch_group_and_cleans_up(tmp_path, sig):
    pytest.importorskip("torch")  # verify refuses to start without it
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(SCRIPT)
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-qm", "x")):
        subprocess.run(["git", "-C", str(project), *args], check=True, capture_output=True, env=env)
    temp = tmp_path / "tmp"
    temp.mkdir()
    pids_file = tmp_path / "pids"
    env.update(TMPDIR=str(temp), PIDS_FILE=str(pids_file))
    env.pop("GITHUB_EVENT_NAME", None)
    proc = subprocess.Popen([str(BIN / "cfgfix"), "verify", "--before", "HEAD", "--after", "HEAD", "--timeout", "120",
                             "--", sys.executable, "train.py"], cwd=project, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            # a shell's background job (`make test &`) inherits SIGINT ignored, and
                            # Python keeps an inherited SIG_IGN: give cfgfix a terminal's default
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 90
        while not pids_file.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert pids_file.exists(), proc.communicate(timeout=10)
        launch, grandchild = (int(p) for p in pids_file.read_text().split())
        assert _alive(launch) and _alive(grandchild)
        assert any(p.name.startswith("cfgfix-verify-") for p in temp.iterdir())
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    if sig == signal.SIGKILL:
        # verify cannot clean up; the launch's harness sees verify gone and kills its group
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 128 + sig, err
        assert f"stopped by {signal.Signals(sig).name}" in err.decode()
    deadline = time.monotonic() + 5
    while (_alive(launch) or _alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(launch) and not _alive(grandchild)
    if sig != signal.SIGKILL:
        assert list(temp.iterdir()) == []


# -- the guard: untrusted unless the event proves it trusted ------------------------------------
def _payload(tmp_path, name, data):
    import json

    path = tmp_path / f"{name}.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_the_guard_refuses_events_that_do_not_prove_trust(tmp_path):
    from cfgfix.verify import guard

    same = {"full_name": "org/x", "fork": False}
    fork = {"full_name": "evil/x", "fork": True}
    trusted_pr = {"pull_request": {"head": {"repo": same}, "base": {"repo": {"full_name": "org/x"}}}}
    cases = [
        # (event, payload or None for an unset GITHUB_EVENT_PATH, refused?)
        ("pull_request", None, True),
        ("pull_request", trusted_pr, False),
        ("pull_request_review", trusted_pr, False),
        ("pull_request_review_comment", {"pull_request": {"head": {"repo": fork}, "base": {"repo": same}}}, True),
        ("pull_request", {"pull_request": {"head": {"repo": {"full_name": "org/x"}}, "base": {}}}, True),
        ("pull_request", {"pull_request": "x"}, True),
        ("pull_request", {"pull_request": {"head": "x", "base": 5}}, True),
        ("pull_request", [1, 2], True),
        ("pull_request", "{not json", True),
        ("pull_request", "[" * 100000, True),
        ("workflow_run", {"workflow_run": {"head_repository": fork}, "repository": same}, True),
        ("workflow_run", {"workflow_run": {"head_repository": {"full_name": "evil/x"}}, "repository": same}, True),
        ("workflow_run", {"workflow_run": {"head_repository": same}, "repository": same}, False),
        ("workflow_run", {"workflow_run": None}, True),
        ("workflow_run", None, True),
        ("issue_comment", {"issue": {"number": 3, "pull_request": {"url": "u"}}}, True),
        ("issue_comment", {"issue": {"number": 3}}, False),
        ("issue_comment", {"comment": {}}, True),
        ("push", None, False),
        ("schedule", None, False),
    ]
    for event, payload, refused in cases:
        environ = {"GITHUB_EVENT_NAME": event}
        if payload is not None:
            environ["GITHUB_EVENT_PATH"] = _payload(tmp_path, event, payload)
        reason = guard.untrusted_event(environ)
        assert (reason is not None) == refused, (event, payload, reason)
        assert reason is None or isinstance(reason, str)
