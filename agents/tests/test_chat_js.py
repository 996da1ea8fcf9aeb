"""The chat page's script (agents/static/agents/chat.js) in a real browser, against a socket the
test plays the server's part on (Playwright's ``route_web_socket``), so that an order of frames the
real server sends only now and then, under load, is sent every time.

A live chunk can reach the page before the replay of the chunks before it: the server pushes what
the turn streams from the moment of its snapshot, and reads the page's ``resume`` only after that.
The page drew the live chunk, took its seq as the last drawn, and dropped the replay as already
drawn: its words were missing from the answer while it streamed (the refunds' browser test once
saw it on CI, as a shown text that was not the beginning of the answer)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.browser import chromium, new_page

SCRIPT = (Path(__file__).resolve().parent.parent / "static" / "agents" / "chat.js").read_text()
ORIGIN = "http://chat.test"
TURN = "7f0e2a64-4a8e-4d3c-9a36-5b1c3c1d2e01"
# What of agents/templates/agents/chat.html the script reads and writes.
PAGE = f"""<!doctype html><html><body>
<div id="chat" data-ws-path="/ws/agents/test.chat/help/">
  <span id="connection">not connected</span>
  <ol id="messages"></ol><p id="notice" hidden></p><p id="status"></p>
  <form id="composer"><textarea id="text"></textarea><button type="submit" id="send">Send</button>
  <button type="button" id="stop" hidden>Stop</button></form>
  <div id="state-body"></div>
</div>
<script>{SCRIPT}</script>
</body></html>"""
SNAPSHOT = {
    "type": "snapshot",
    "since": None,
    "more": False,
    "messages": [{"id": 1, "role": "user", "text": "refund please", "turn": TURN, "parts": {}}],
    "queued": [],
    "turn": {"id": TURN, "number": 1, "status": "running", "seq": 3},
    "state": {},
    "state_version": 0,
}


def load_page(browser: Any, server: Any) -> Any:
    """PAGE in a new tab, its socket (each one it opens) played by ``server``."""
    page = new_page(browser)
    html = "text/html; charset=utf-8"  # as the real page declares it (<meta charset>)
    page.route(f"{ORIGIN}/", lambda route: route.fulfill(status=200, content_type=html, body=PAGE))
    page.route_web_socket("**/ws/agents/**", server)
    page.goto(f"{ORIGIN}/")
    return page


def open_page(browser: Any, server: Any) -> Any:
    """``load_page``, once the page says it is live."""
    page = load_page(browser, server)
    page.wait_for_selector("#connection:text-is('live')")
    return page


def chunk(seq: int, word: str, *, replay: bool = False) -> str:
    frame = {"type": "chunk", "turn": TURN, "seq": seq, "chunk_type": "text-delta", "data": {"delta": word}}
    return json.dumps({**frame, "replay": True} if replay else frame)


def streamed_text(replayed: list[int], live: list[int]) -> str:
    """The answer the page draws when the server sends the snapshot (the turn at seq 3), the
    ``live`` chunks at once, and, once the page asks to resume, the ``replayed`` ones and the
    replay's end."""
    words = {1: "I've ", 2: "asked ", 3: "for ", 4: "a ", 5: "refund"}
    resumes: list[dict[str, Any]] = []

    def server(ws: Any) -> None:
        def received(message: str | bytes) -> None:
            frame = json.loads(message)
            if frame.get("type") != "resume":
                return
            resumes.append(frame)
            for seq in replayed:
                ws.send(chunk(seq, words[seq], replay=True))
            ws.send(json.dumps({"type": "replay_complete", "turn": TURN, "seq": max(replayed + [frame["after"]])}))

        ws.on_message(received)
        ws.send(json.dumps(SNAPSHOT))
        for seq in live:  # pushed before the server has read the page's resume
            ws.send(chunk(seq, words[seq]))

    with chromium() as browser:
        page = open_page(browser, server)
        # the last word is drawn last (held until what comes before it has been drawn, or the replay ended)
        page.wait_for_function("() => document.querySelector('#messages li.streaming')?.textContent.endsWith('refund')")
        text = page.evaluate(
            "() => Array.from(document.querySelector('#messages li.streaming').childNodes)"
            ".filter((n) => n.nodeType === Node.TEXT_NODE).map((n) => n.data).join('')"
        )
    assert resumes and resumes[0]["after"] == 0, resumes  # the page asked for what it lacked
    return str(text)


def test_a_live_chunk_before_the_replay_waits_for_it() -> None:
    assert streamed_text(replayed=[1, 2, 3], live=[4, 5]) == "I've asked for a refund"


def test_a_chunk_the_replay_never_brings_does_not_stop_the_rest() -> None:
    # seq 4 is lost for good (stored nowhere the replay reads): once the replay is complete, what
    # was held after it is drawn rather than held for ever
    assert streamed_text(replayed=[1, 2, 3], live=[5]) == "I've asked for refund"


def frames_sent_after(actions: Any, answer: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Open the page on SNAPSHOT (turn 1 running), do ``actions(page)``; the frames the page sent
    but its resumes, and what ``#notice``, ``#text`` and the stop button show then. ``answer``:
    what the server sends back to each frame (a function of it, None for nothing)."""
    sent: list[dict[str, Any]] = []

    def server(ws: Any) -> None:
        def received(message: str | bytes) -> None:
            frame = json.loads(message)
            if frame.get("type") == "resume":
                ws.send(json.dumps({"type": "replay_complete", "turn": TURN, "seq": 3}))
                return
            sent.append(frame)
            if answer is not None and (reply := answer(frame)) is not None:
                ws.send(json.dumps(reply))

        ws.on_message(received)
        ws.send(json.dumps(SNAPSHOT))

    with chromium() as browser:
        page = open_page(browser, server)
        actions(page)
        shown = page.evaluate(
            "() => ({notice: document.querySelector('#notice').hidden ? null : "
            "document.querySelector('#notice').textContent, text: document.querySelector('#text').value})"
        )
    return sent, shown


def test_stop_names_the_turn_the_page_shows_running() -> None:
    # a bare stop would stop whatever runs when the server reads it: the next person's turn, if
    # this one ended meanwhile
    def stop(page: Any) -> None:
        page.click("#stop")
        page.wait_for_timeout(200)

    sent, _ = frames_sent_after(stop)

    assert sent == [{"type": "stop", "turn": TURN}]


def test_a_refused_message_is_said_and_its_text_given_back() -> None:
    refusal = "5 messages are waiting for an answer already (the limit is 5)"

    def write(page: Any) -> None:
        page.fill("#text", "one more thing")
        page.click("#send")
        page.wait_for_selector("#notice:not([hidden])")

    sent, shown = frames_sent_after(
        write, answer=lambda frame: {"type": "error", "message": refusal, "about": "message"}
    )

    assert sent == [{"type": "message", "text": "one more thing"}]
    assert shown == {"notice": refusal, "text": "one more thing"}


def test_a_refused_message_is_quoted_when_something_new_is_written_already() -> None:
    # the refusal arrives after the customer began the next message: that stays as it is, and the
    # notice quotes what was not sent (the stop is only what makes the server answer then)
    refusal = "5 messages are waiting for an answer already (the limit is 5)."

    def write_then_more(page: Any) -> None:
        page.fill("#text", "one more thing")
        page.click("#send")
        page.fill("#text", "and another")
        page.click("#stop")
        page.wait_for_selector("#notice:not([hidden])")

    def answer(frame: dict[str, Any]) -> dict[str, Any] | None:
        return {"type": "error", "message": refusal, "about": "message"} if frame["type"] == "stop" else None

    sent, shown = frames_sent_after(write_then_more, answer=answer)

    assert [frame["type"] for frame in sent] == ["message", "stop"]
    assert shown == {"notice": refusal + " Not sent: “one more thing”", "text": "and another"}


def test_a_round_recovered_after_its_tool_call_is_drawn_once() -> None:
    # a round wrote text and called a tool, then was recovered ("retry"): it writes its text again,
    # and its tool call, sent once, is not sent again
    stream = [
        ("text-delta", {"delta": "Let me check. "}),
        ("tool-input-available", {"toolCallId": "c1", "toolName": "find_order", "input": {"number": "1042"}}),
        ("data-reset", {}),
        ("text-delta", {"delta": "Let me check. "}),
        ("tool-output-available", {"toolCallId": "c1", "output": {}}),
        ("text-delta", {"delta": "It is on its way."}),
    ]

    def server(ws: Any) -> None:
        def received(message: str | bytes) -> None:
            if json.loads(message).get("type") != "resume":
                return
            for seq, (type_, data) in enumerate(stream, start=1):
                frame = {"type": "chunk", "turn": TURN, "seq": seq, "chunk_type": type_, "data": data, "replay": True}
                ws.send(json.dumps(frame))
            ws.send(json.dumps({"type": "replay_complete", "turn": TURN, "seq": len(stream)}))

        ws.on_message(received)
        ws.send(json.dumps({**SNAPSHOT, "turn": {**SNAPSHOT["turn"], "seq": 0}}))  # type: ignore[dict-item]

    with chromium() as browser:
        page = open_page(browser, server)
        page.wait_for_function("() => document.querySelector('#messages li.streaming')?.textContent.endsWith('way.')")
        shown = page.evaluate("() => document.querySelector('#messages li.streaming').textContent")

    assert shown.count("Let me check.") == 1, shown
    assert shown.index("Let me check.") < shown.index("find_order") < shown.index("It is on its way."), shown


def test_the_refusal_of_a_stop_leaves_a_message_sent_since_alone() -> None:
    # the customer presses Stop on an answer that has just ended, then sends a message at once: the
    # stop's refusal arrives after the message left, and must not give its text back (it is taken,
    # and sending it again would ask twice)
    def stop_then_write(page: Any) -> None:
        page.click("#stop")
        page.fill("#text", "and my other order?")
        page.click("#send")
        page.wait_for_selector("#notice:not([hidden])")

    def answer(frame: dict[str, Any]) -> dict[str, Any] | None:
        # the stop's refusal, held until the message has left (the message's own turn comes later)
        if frame["type"] == "message":
            return {"type": "error", "message": "turn 1 has already ended (completed)", "about": "stop"}
        return None

    sent, shown = frames_sent_after(stop_then_write, answer=answer)

    assert [frame["type"] for frame in sent] == ["stop", "message"]
    assert shown == {"notice": "turn 1 has already ended (completed)", "text": ""}


BUDGET_REFUSAL = {
    "type": "error",
    "message": "too many messages: at most 10 a second; this one was not read",
    "retry_after": 0.1,
}


def test_a_resume_the_server_did_not_read_is_asked_again() -> None:
    resumes: list[dict[str, Any]] = []

    def server(ws: Any) -> None:
        def received(message: str | bytes) -> None:
            frame = json.loads(message)
            resumes.append(frame)
            if len(resumes) == 1:  # the first is refused unread, as past the socket's frame budget
                ws.send(json.dumps({**BUDGET_REFUSAL, "about": "resume"}))
            else:
                ws.send(chunk(4, "a ", replay=True))
                ws.send(json.dumps({"type": "replay_complete", "turn": TURN, "seq": 4}))

        ws.on_message(received)
        ws.send(json.dumps(SNAPSHOT))

    with chromium() as browser:
        page = open_page(browser, server)
        page.wait_for_function("() => document.querySelector('#messages li.streaming')?.textContent.includes('a')")

    assert [(frame["type"], frame["after"]) for frame in resumes] == [("resume", 0), ("resume", 0)]


def test_a_sealed_answer_says_so_in_words_not_in_the_operators_reason() -> None:
    def server(ws: Any) -> None:
        def received(message: str | bytes) -> None:
            if json.loads(message).get("type") == "resume":  # nothing stored: the turn sealed before its first word
                ws.send(json.dumps({"type": "replay_complete", "turn": TURN, "seq": 0}))

        ws.on_message(received)
        sealed = {"id": TURN, "number": 1, "status": "sealed", "end_reason": "stale"}
        ws.send(json.dumps({**SNAPSHOT, "turn": None, "queued": []}))
        ws.send(json.dumps({"type": "turn", **sealed}))

    with chromium() as browser:
        page = open_page(browser, server)
        page.wait_for_selector("#messages .notice")
        shown = page.evaluate("() => document.querySelector('#messages').textContent")

    assert "interrupted and could not be finished" in shown and "stale" not in shown


QUEUED_TURN = "7f0e2a64-4a8e-4d3c-9a36-5b1c3c1d2e02"


def test_a_message_stopped_while_queued_says_it_was_never_answered() -> None:
    # given a page whose snapshot has a message stopped while queued, and one queued now that is
    # stopped right after, live (the turn frame every tab gets)
    other = "7f0e2a64-4a8e-4d3c-9a36-5b1c3c1d2e03"
    stopped = {"id": QUEUED_TURN, "number": 2, "status": "cancelled", "end_reason": "stopped by bob"}
    queued = {"id": other, "number": 3, "status": "queued", "end_reason": ""}

    def server(ws: Any) -> None:
        ws.on_message(lambda message: None)
        messages = [
            {"id": 2, "role": "user", "text": "never mind", "turn": QUEUED_TURN, "parts": {}},
            {"id": 3, "role": "user", "text": "and this", "turn": other, "parts": {}},
        ]
        ws.send(json.dumps({**SNAPSHOT, "turn": None, "messages": messages, "queued": [queued], "stopped": [stopped]}))
        ws.send(json.dumps({"type": "turn", **queued, "status": "cancelled", "end_reason": "stopped by alice"}))

    with chromium() as browser:
        page = open_page(browser, server)
        page.wait_for_selector("#messages li[data-message='3'] .muted:has-text('not answered')")
        said = page.evaluate(
            "() => Array.from(document.querySelectorAll('#messages li[data-message]')).map((li) => li.textContent)"
        )

    # then each says it was never answered, and who stopped it
    assert said == ["never mindnot answered: stopped by bob", "and thisnot answered: stopped by alice"]


def test_resumes_refused_over_and_over_are_asked_again_by_one_backing_off_timer() -> None:
    # two turns to draw (one running, one that ended without an answer) and a server that refuses
    # every resume unread: the page asks again, never more than once per turn a round, less and
    # less often (each refusal once started a timer of its own: thousands of resumes in seconds)
    resumes: list[float] = []

    def server(ws: Any) -> None:
        def received(message: str | bytes) -> None:
            if json.loads(message).get("type") == "resume":
                resumes.append(time.monotonic())
                ws.send(json.dumps({**BUDGET_REFUSAL, "about": "resume", "retry_after": 0.05}))

        ws.on_message(received)
        ws.send(json.dumps(SNAPSHOT))
        ended = {"id": "7f0e2a64-4a8e-4d3c-9a36-5b1c3c1d2e02", "number": 2, "status": "sealed", "end_reason": "stale"}
        ws.send(json.dumps({"type": "turn", **ended}))

    with chromium() as browser:
        page = load_page(browser, server)
        page.wait_for_timeout(2500)

    # rounds 0.25, 0.5 and 1 s apart (then 2 s): the first resume, then at most two a round
    assert 3 <= len(resumes) <= 1 + 2 * 4, len(resumes)
    assert resumes[-1] - resumes[0] > 1.5  # still asking, less often


def test_a_message_the_server_did_not_read_gives_its_text_back() -> None:
    def write(page: Any) -> None:
        page.fill("#text", "are you there?")
        page.click("#send")
        page.wait_for_selector("#notice:not([hidden])")

    sent, shown = frames_sent_after(write, answer=lambda frame: {**BUDGET_REFUSAL, "about": "message"})

    assert sent == [{"type": "message", "text": "are you there?"}]
    assert shown == {"notice": BUDGET_REFUSAL["message"], "text": "are you there?"}


def test_only_the_refused_resume_is_asked_again_not_one_the_server_is_still_answering() -> None:
    # turn 2 running and turn 1 sealed without an answer. The server answers frames in the order
    # sent: it refuses turn 2's first resume unread, then (the page asking again) refuses turn 2's
    # second, and reads turn 1's, whose replay is still going on (no replay_complete yet): only
    # turn 2's is asked again; turn 1's, being answered, is not
    other = "7f0e2a64-4a8e-4d3c-9a36-5b1c3c1d2e02"
    resumes: dict[str, int] = {TURN: 0, other: 0}

    def server(ws: Any) -> None:
        def received(message: str | bytes) -> None:
            frame = json.loads(message)
            if frame.get("type") != "resume":
                return
            resumes[frame["turn"]] += 1
            if frame["turn"] == other and resumes[other] <= 2:
                ws.send(json.dumps({**BUDGET_REFUSAL, "about": "resume"}))
            # anything else is read: turn 1's replay goes on, and turn 2's third waits behind it

        ws.on_message(received)
        ws.send(json.dumps({**SNAPSHOT, "turn": {**SNAPSHOT["turn"], "id": other, "number": 2}}))  # type: ignore[dict-item]
        ws.send(json.dumps({"type": "turn", "id": TURN, "number": 1, "status": "sealed", "end_reason": "stale"}))

    with chromium() as browser:
        page = load_page(browser, server)
        page.wait_for_timeout(3000)

    assert resumes == {other: 3, TURN: 1}


def test_a_turn_that_ended_while_away_is_replayed_once_not_on_every_reconnect() -> None:
    # the page draws turn 1 running; the connection drops twice; turn 1 ended meanwhile without an
    # answer the page has (stopped): the next socket replays it, and the one after has nothing to ask
    sockets: list[list[dict[str, Any]]] = []

    def server(ws: Any) -> None:
        mine: list[dict[str, Any]] = []
        sockets.append(mine)

        def received(message: str | bytes) -> None:
            frame = json.loads(message)
            if frame.get("type") == "resume":
                mine.append(frame)
                ws.send(json.dumps({"type": "replay_complete", "turn": TURN, "seq": frame["after"]}))
                if len(sockets) < 3:
                    ws.close()  # the connection drops once the replay is through

        ws.on_message(received)
        ws.send(json.dumps(SNAPSHOT if len(sockets) == 1 else {**SNAPSHOT, "turn": None}))

    with chromium() as browser:
        page = load_page(browser, server)
        page.wait_for_function("() => document.querySelector('#connection').textContent === 'live'")
        deadline = time.monotonic() + 20
        while len(sockets) < 3 and time.monotonic() < deadline:
            page.wait_for_timeout(200)
        page.wait_for_timeout(1000)

    assert [len(resumes) for resumes in sockets] == [1, 1, 0], sockets
