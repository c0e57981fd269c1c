"""How identity events read on the Server-Sent Events stream."""

from __future__ import annotations

import json

import rayfleet as rf
from rayfleet.gateway._app import _sse_message


def test_an_event_is_one_sse_message_named_by_its_kind() -> None:
    event = rf.IdentityEvent(identity="counter/alice", kind=rf.EventKind.CHECKPOINT_COMPLETED,
                             state=rf.LifecycleState.ACTIVE, fencing_token=3, checkpoint_version=7, host="h-0", at=1.5)
    text = _sse_message(event).decode()
    assert text.endswith("\n\n") and text.count("\n") == 3
    kind_line, data_line = text.splitlines()[:2]
    assert kind_line == "event: CHECKPOINT_COMPLETED"
    assert json.loads(data_line.removeprefix("data: ")) == {
        "identity": "counter/alice", "kind": "CHECKPOINT_COMPLETED", "state": "ACTIVE", "fencing_token": 3,
        "checkpoint_version": 7, "host": "h-0", "at": 1.5,
    }


def test_an_identity_with_a_newline_cannot_break_the_stream() -> None:
    # Identities cannot hold newlines, but the data line is JSON anyway: escapes keep it one line.
    event = rf.IdentityEvent(identity="x", kind=rf.EventKind.PAUSED, host="line\nbreak")
    lines = _sse_message(event).decode().split("\n")
    assert lines[0] == "event: PAUSED" and lines[1].startswith("data: {") and lines[2:] == ["", ""]
