"""The client's own parts: the event-stream parser and error decoding."""

import pytest

from gpubroker_jupyterhub import client
from gpubroker_jupyterhub.client import BrokerError, _decode_event, _error_from, _SSEParser


def feed_all(chunks):
    p = _SSEParser()
    out = []
    for c in chunks:
        out.extend(p.feed(c))
    return out


@pytest.mark.parametrize(
    "chunks",
    [
        ["id: 1-0\nevent: state\ndata: {\"a\":1}\n\n"],
        ["id: 1-0\r\nevent: state\r\ndata: {\"a\":1}\r\n\r\n"],
        # a final CR may be half a CRLF: it ends its line once more arrives
        ["id: 1-0\revent: state\rdata: {\"a\":1}\r\r", ": keepalive\r"],
        # split anywhere, CRLF split across chunks included
        ["id: 1", "-0\r", "\nevent: st", "ate\ndata: {\"a\"", ":1}\r", "\n\r", "\n"],
    ],
)
def test_sse_lines_end_with_cr_lf_or_crlf_and_may_split_anywhere(chunks):
    assert feed_all(chunks) == [("state", "1-0", '{"a":1}')]


def test_sse_comments_keepalives_and_fields():
    events = feed_all([
        ": keepalive\n\n",
        "event: state\ndata: one\ndata: two\nid: 7-0\nretry: 100\nunknown: x\n\n",
        "data:no-space\n\n",
        "event: state\n\n",  # no data: nothing dispatched
    ])
    assert events == [("state", "7-0", "one\ntwo"), ("message", "7-0", "no-space")]


def test_state_event_is_decoded_and_other_kinds_ignored():
    ev = _decode_event("state", "3-0", '{"id":"3-0","spawnId":"s1","state":"placing","message":"looking"}')
    assert ev == client.Event(id="3-0", spawn_id="s1", state="placing", message="looking")
    assert _decode_event("message", "", "hello") is None


def test_error_event_raises_the_brokers_words():
    with pytest.raises(BrokerError) as e:
        _decode_event("error", "", '{"code":"unavailable","message":"Redis is down; try again shortly"}')
    assert (e.value.status, e.value.code, str(e.value)) == (503, "unavailable", "Redis is down; try again shortly")


def test_malformed_state_event_is_a_bad_answer():
    with pytest.raises(BrokerError) as e:
        _decode_event("state", "", '{"state":"running"}')
    assert e.value.code == "bad_answer"


def test_error_answers_keep_the_brokers_message_or_say_what_came():
    e = _error_from(403, '{"code":"quota_exceeded","message":"user a quota exceeded: it allows 2 servers at once, and 2 are in use"}')
    assert (e.status, e.code, e.message) == (403, "quota_exceeded", "user a quota exceeded: it allows 2 servers at once, and 2 are in use")
    e = _error_from(502, "<html><body>\n  Bad   Gateway </body></html>")
    assert (e.code, e.message) == ("http_502", "gpubroker answered HTTP 502: <html><body> Bad Gateway </body></html>")
    assert _error_from(500, "").message == "gpubroker answered HTTP 500"


def test_paths_escape_each_name_as_one_segment():
    assert client.server_path("zoë@x.org", "a/b c") == "/api/v1/users/zo%C3%AB%40x.org/servers/a%2Fb%20c"


def test_groups_header_refuses_commas():
    assert client.groups_header(["a", "b"]) == "a,b"
    with pytest.raises(ValueError):
        client.groups_header(["a,b"])
