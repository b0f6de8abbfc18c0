"""`verify`'s guard fails closed on event names GitHub does not send (issue 24): an empty,
mixed-case or made-up name, or `workflow_call`, with a fork's payload, is refused."""

from __future__ import annotations

import json

import pytest

from cfgfix.verify import guard

FORK = {"pull_request": {"head": {"repo": {"full_name": "evil/x", "fork": True}},
                         "base": {"repo": {"full_name": "org/x"}}}}


@pytest.mark.parametrize("name", ["", " ", "Pull_Request", "PULL_REQUEST", "pull_request ", "workflow_call",
                                  "Push", "merge_group", "check_suite", "pull-request", "pull_request\n", "x" * 500])
def test_unknown_or_misspelled_event_names_are_refused(tmp_path, name):
    path = tmp_path / "event.json"
    path.write_text(json.dumps(FORK))
    reason = guard.untrusted_event({"GITHUB_EVENT_NAME": name, "GITHUB_EVENT_PATH": str(path)})
    assert reason is not None and len(reason) < 400, reason


@pytest.mark.parametrize("name", sorted(guard.TRUSTED_EVENTS))
def test_events_that_run_the_repositorys_own_code_pass(name):
    assert guard.untrusted_event({"GITHUB_EVENT_NAME": name}) is None


def test_actions_without_an_event_name_is_refused_and_a_local_run_is_not():
    assert "GITHUB_EVENT_NAME is unset" in guard.untrusted_event({"GITHUB_ACTIONS": "true"})
    assert guard.untrusted_event({}) is None
