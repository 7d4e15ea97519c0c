#!/usr/bin/env python3
"""A hostile or buggy ACP agent for tests/suite/acp_review.rs (issue 42's
review: Codex-style system errors and permission requests with odd option
lists).

argv[1] names the scenario. Every message it reads, and the answers to its
own requests, are logged to $AGENT_OUT/acp-log.jsonl; it records its
process group in $AGENT_OUT/.agent-pgids (the Sandbox's drop check).
"""

import json
import os
import select
import sys
import time

SC = sys.argv[1] if len(sys.argv) > 1 else "ok"
OUT = os.environ.get("AGENT_OUT", "/tmp")
LOG = os.path.join(OUT, "acp-log.jsonl")
SECRET = os.environ.get("ACME_TOKEN", "")


def start_time(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(") ", 1)[1].split(" ")[19]


def log(kind, **kw):
    with open(LOG, "a") as f:
        f.write(json.dumps({"k": kind, "sc": SC, **kw}) + "\n")


if os.getpgrp() == os.getpid():
    with open(os.path.join(OUT, ".agent-pgids"), "a") as f:
        f.write(f"{os.getpid()} {start_time(os.getpid())}\n")
log("start", has_secret=bool(SECRET))


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def update(sid, upd):
    params = {"update": upd}
    if sid is not None:
        params["sessionId"] = sid
    send({"jsonrpc": "2.0", "method": "session/update", "params": params})


def chunk(sid, text):
    update(sid, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}})


def status(sid, kind, meta_extra=None):
    meta = {"codex": {"threadStatus": {"type": kind}}}
    if meta_extra:
        meta.update(meta_extra)
    update(sid, {"sessionUpdate": "session_info_update", "_meta": meta})


class Reader:
    def __init__(self):
        self.buf = b""
        self.eof = False

    def readline(self, timeout=None):
        deadline = None if timeout is None else time.time() + timeout
        while True:
            if b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                if not line.strip():
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                log("in", msg=msg)
                return msg
            if self.eof:
                return "EOF"
            wait = None if deadline is None else max(0.0, deadline - time.time())
            r, _, _ = select.select([0], [], [], wait)
            if not r:
                return None
            data = os.read(0, 1 << 20)
            if not data:
                self.eof = True
            self.buf += data


R = Reader()
state = {"sid": None}


def ask(sid, rid, options, tool_call=None, about=None):
    """A permission request; waits for its answer (logged)."""
    send({"jsonrpc": "2.0", "id": rid, "method": "session/request_permission",
          "params": {"sessionId": about or sid,
                     "toolCall": tool_call or {"toolCallId": "t1", "title": "write a file"},
                     "options": options}})
    end = time.time() + 5
    while time.time() < end:
        m = R.readline(timeout=end - time.time())
        if m in ("EOF", None):
            log("unanswered", id=rid)
            return None
        if "method" not in m and m.get("id") == rid:
            log("answer", id=rid, result=m.get("result"), error=m.get("error"))
            return m
    return None


def end_prompt(pid, reason="end_turn"):
    send({"jsonrpc": "2.0", "id": pid, "result": {"stopReason": reason}})


def on_prompt(msg):
    sid = msg["params"]["sessionId"]
    pid = msg["id"]
    # Codex-style system errors.
    if SC == "text_429":
        chunk(sid, "The endpoint now returns 429 Too Many Requests when the ")
        chunk(sid, "quota is exhausted, and 529 overloaded on retry; tests pass.")
    elif SC == "sys_err_foreign":
        status("someone-else", "systemError")
        chunk("someone-else", "exceeded retry limit, last status: 429 Too Many Requests")
        chunk(sid, "All done.")
    elif SC == "sys_err_no_session":
        # ACP requires sessionId on session/update; this agent omits it.
        status(None, "systemError")
        chunk(sid, "All done.")
    elif SC == "sys_err_recovered":
        status(sid, "systemError")
        chunk(sid, "stream disconnected before completion: 529")
        status(sid, "active")
        chunk(sid, "All done.")
    elif SC == "sys_err_empty":
        status(sid, "systemError")
    elif SC == "sys_err_long_429":
        # Codex words a provider error as one message: a long body (an HTML
        # error page of a proxy) after the status line.
        status(sid, "systemError")
        chunk(sid, "exceeded retry limit, last status: 429 Too Many Requests: " + "<p>slow down</p>" * 400)
    elif SC == "sys_err_long_529":
        status(sid, "systemError")
        chunk(sid, "unexpected status 529 <unknown status code>: " + "<p>The server is overloaded.</p>" * 200)
    elif SC == "sys_err_secret":
        status(sid, "systemError")
        chunk(sid, "unexpected status 401 Unauthorized: bad key " + SECRET)
    elif SC == "sys_err_huge_meta":
        huge = {"junk": ["x" * 1000] * 500, "nested": None}
        n = huge
        for _ in range(100):
            n["nested"] = {"nested": None}
            n = n["nested"]
        status(sid, "systemError", {"other": huge})
        chunk(sid, "unexpected status 529 <unknown status code>: overloaded")
    elif SC == "sys_err_malformed_meta":
        update(sid, {"sessionUpdate": "session_info_update", "_meta": "systemError"})
        update(sid, {"sessionUpdate": "session_info_update", "_meta": {"codex": {"threadStatus": "systemError"}}})
        update(sid, {"sessionUpdate": "session_info_update", "_meta": {"codex": {"threadStatus": {"type": 529}}}})
        update(sid, {"sessionUpdate": "session_info_update", "_meta": {"codex": [1, 2]}})
        chunk(sid, "All done.")
    elif SC == "sys_err_after_answer":
        chunk(sid, "All done.")
        end_prompt(pid)
        status(sid, "systemError")
        chunk(sid, "exceeded retry limit, last status: 429 Too Many Requests")
        return
    # Permission requests.
    elif SC == "perm_secret":
        ask(sid, 5, [{"optionId": SECRET, "kind": "allow_once", "name": "Allow " + SECRET},
                     {"optionId": "no\u0000\u001b[2J\n", "kind": "reject_once", "name": "No"}],
            tool_call={"toolCallId": "t1", "title": "curl -H 'Authorization: " + SECRET + "'",
                       "rawInput": {"command": "echo " + SECRET, "env": {"TOKEN": SECRET}}})
        chunk(sid, "All done.")
    elif SC == "perm_empty":
        ask(sid, 5, [])
        chunk(sid, "All done.")
    elif SC == "perm_numeric_once":
        # The "once" option's id is a number (ACP says string): the runner
        # must not fall back to "always" as if no "once" were offered.
        ask(sid, 5, [{"optionId": 1, "kind": "allow_once", "name": "Once"},
                     {"optionId": "always", "kind": "allow_always", "name": "Always"},
                     {"optionId": "no", "kind": "reject_once", "name": "No"}])
        chunk(sid, "All done.")
    elif SC == "perm_dup_ids":
        ask(sid, 5, [{"optionId": "x", "kind": "allow_always", "name": "Always"},
                     {"optionId": "x", "kind": "reject_once", "name": "No"}])
        chunk(sid, "All done.")
    elif SC == "perm_foreign":
        ask(sid, 5, [{"optionId": "once", "kind": "allow_once", "name": "Once"},
                     {"optionId": "no", "kind": "reject_once", "name": "No"}],
            about="someone-else")
        chunk(sid, "All done.")
    elif SC == "perm_only_reject":
        ask(sid, 5, [{"optionId": "no", "kind": "reject_once", "name": "No"}])
        chunk(sid, "All done.")
    else:
        chunk(sid, "All done.")
    end_prompt(pid)


def dispatch(msg):
    method = msg.get("method")
    mid = msg.get("id")
    if method is None:
        return
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": 1,
                                                      "agentCapabilities": {"loadSession": True}}})
        if SC == "sys_err_before_session":
            # Before the session exists, about another one.
            status("someone-else", "systemError")
        return
    if method == "session/new":
        state["sid"] = f"sess-{os.getpid()}"
        send({"jsonrpc": "2.0", "id": mid, "result": {"sessionId": state["sid"],
              "modes": {"currentModeId": "ask", "availableModes": [{"id": "ask"}, {"id": "yolo"}]}}})
        return
    if method == "session/load":
        state["sid"] = msg["params"]["sessionId"]
        send({"jsonrpc": "2.0", "id": mid, "result": {}})
        return
    if method in ("session/set_mode", "session/set_config_option"):
        send({"jsonrpc": "2.0", "id": mid, "result": {}})
        return
    if method == "session/prompt":
        on_prompt(msg)
        return
    if method == "session/cancel":
        return
    if mid is not None:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no"}})


while True:
    m = R.readline()
    if m == "EOF":
        sys.exit(0)
    if m is not None:
        dispatch(m)
