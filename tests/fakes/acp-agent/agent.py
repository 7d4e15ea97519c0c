#!/usr/bin/env python3
"""A hostile or buggy ACP agent for tests/suite/acp_edges.rs.

argv[1] names the scenario. Every message it reads, and what it does, is
logged to $AGENT_OUT/acp-log.jsonl; it records its process group in
$AGENT_OUT/.agent-pgids (the Sandbox's drop check) like the shell agents.
"""

import json
import os
import select
import signal
import subprocess
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
        f.write(json.dumps({"k": kind, "pid": os.getpid(), "sc": SC, **kw}) + "\n")


if os.getpgrp() == os.getpid():
    with open(os.path.join(OUT, ".agent-pgids"), "a") as f:
        f.write(f"{os.getpid()} {start_time(os.getpid())}\n")
log("start", argv=sys.argv, has_secret=bool(SECRET), env_session=os.environ.get("ORIZU_AGENT_SESSION_ID"))


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def update(sid, upd):
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": upd}})


def chunk(sid, text, kind="agent_message_chunk"):
    update(sid, {"sessionUpdate": kind, "content": {"type": "text", "text": text}})


class Reader:
    def __init__(self):
        self.buf = b""
        self.eof = False

    def readline(self, timeout=None):
        """A parsed message, None on timeout, "EOF" at the end."""
        deadline = None if timeout is None else time.time() + timeout
        while True:
            if b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                if not line.strip():
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    log("in_garbage", line=line[:200].decode("utf-8", "replace"))
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
                log("eof")
            self.buf += data


R = Reader()
state = {"sid": None, "refused_load": False, "prompt_id": None, "prompts": 0}


def linger():
    log("linger")
    while True:
        time.sleep(3600)


def on_eof():
    if SC in ("never_init", "ignore_cancel", "never_exit") or (
        SC == "load_refused_linger" and state["refused_load"]
    ) or SC == "stray_err_init_linger":
        linger()
    log("exit", code=0)
    sys.exit(0)


def wait_answer(want_id, timeout=10):
    """Reads until the answer to our request `want_id` (others handled)."""
    end = time.time() + timeout
    while time.time() < end:
        msg = R.readline(timeout=end - time.time())
        if msg == "EOF":
            return "EOF"
        if msg is None:
            return None
        if "method" not in msg and msg.get("id") == want_id:
            log("answer", id=want_id, msg=msg)
            return msg
        dispatch(msg)
    return None


def end_prompt(reason="end_turn", usage=None):
    result = {"stopReason": reason}
    if usage:
        result["usage"] = usage
    send({"jsonrpc": "2.0", "id": state["prompt_id"], "result": result})
    log("answered_prompt", reason=reason)


def on_prompt(msg):
    state["prompts"] += 1
    state["prompt_id"] = msg["id"]
    sid = msg["params"].get("sessionId")
    log("prompt", n=state["prompts"], text=msg["params"]["prompt"][0]["text"][:200])
    if SC == "stray_ok2" and state["prompts"] > 1:
        log("second_prompt")
        return
    if SC == "stray_err":
        chunk(sid, "before-stray")
        send({"jsonrpc": "2.0", "id": 99, "error": {"code": -32600, "message": "stray"}})
        send({"jsonrpc": "2.0", "id": "perm-1", "method": "session/request_permission",
              "params": {"sessionId": sid, "toolCall": {"toolCallId": "t1", "title": "write"},
                         "options": [{"optionId": "ok", "kind": "allow_once", "name": "Allow"}]}})
        got = wait_answer("perm-1", timeout=5)
        if got in ("EOF", None):
            log("permission_unanswered", got=str(got))
            sys.exit(2)
        chunk(sid, "after-stray")
        end_prompt()
        return
    if SC == "stray_ok2":
        chunk(sid, "first")
        # A response to an id the runner never used (it sent no setting).
        send({"jsonrpc": "2.0", "id": 2, "result": {}})
        end = time.time() + 1.5
        while time.time() < end:
            m = R.readline(timeout=end - time.time())
            if m in ("EOF", None):
                break
            if m.get("method") == "session/prompt":
                state["prompts"] += 1
                log("second_prompt")
        end_prompt()
        return
    if SC == "spoof":
        update(sid, {"sessionUpdate": "hosted_boot.runner", "forged": True})
        update(sid, {"sessionUpdate": "Hosted_Boot.harvest", "forged": True})
        update(sid, {"sessionUpdate": "\u200bhosted_boot.finish", "forged": True})
        update(sid, {"sessionUpdate": "ho\u017fted_boot.agent_session", "forged": True})
        send({"jsonrpc": "2.0", "method": "hosted_boot.checkpoint", "params": {"forged": True}})
        send({"jsonrpc": "2.0", "id": 77, "method": "hosted_boot.harvest", "params": {"forged": True}})
        wait_answer(77, timeout=5)
        update(sid, {"sessionUpdate": "", "forged": True})
        end_prompt()
        return
    if SC == "foreign":
        send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "someone-else",
              "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "FOREIGN-TEXT"}}}})
        send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "someone-else",
              "update": {"sessionUpdate": "tool_call", "toolCallId": "x", "title": "FOREIGN-TOOL"}}})
        chunk(sid, "mine")
        end_prompt()
        return
    if SC == "secrets":
        chunk(sid, "key: " + SECRET[:9])
        chunk(sid, SECRET[9:] + " end")
        chunk(sid, "thinking " + SECRET, kind="agent_thought_chunk")
        update(sid, {"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "curl -H " + SECRET})
        update(sid, {"sessionUpdate": SECRET, "x": 1})
        send({"jsonrpc": "2.0", "id": 5, "method": "session/request_permission",
              "params": {"sessionId": sid, "toolCall": {"toolCallId": "t1", "title": SECRET},
                         "options": [{"optionId": "ok", "kind": "allow_once"}]}})
        wait_answer(5, timeout=5)
        sys.stderr.write("stderr has " + SECRET + "\n")
        sys.stderr.flush()
        end_prompt()
        return
    if SC == "overload_no_load" and "Continue the same task" not in msg["params"]["prompt"][0]["text"]:
        send({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32603,
              "message": "Internal error: API Error: 529 {\"type\":\"overloaded_error\"}"}})
        return
    if SC == "secret_error":
        send({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32603, "message": "Internal error",
              "data": {"detail": "key " + SECRET + " rejected"}}})
        return
    if SC == "ignore_cancel":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        gc = subprocess.Popen(["sleep", "1000"], start_new_session=True)
        with open(os.path.join(OUT, "grandchild"), "w") as f:
            f.write(f"{gc.pid} {start_time(gc.pid)}\n")
        chunk(sid, "working")
        open(os.path.join(OUT, "started"), "w").close()
        return  # never answers; session/cancel ignored by dispatch
    if SC == "exit_mid":
        chunk(sid, "partial-")
        chunk(sid, "message")
        log("exit", code=3)
        sys.exit(3)
    if SC == "flood":
        n = int(os.environ.get("FLOOD_N", "10000"))
        piece = "y" * 2000
        for _ in range(n):
            chunk(sid, piece)
        update(sid, {"sessionUpdate": "plan", "entries": [{"content": "after-flood-plan"}]})
        chunk(sid, "after-flood")
        end_prompt()
        return
    if SC == "huge_line":
        chunk(sid, "x" * (40 * 1024 * 1024))
        chunk(sid, "after-huge")
        end_prompt()
        return
    if SC == "weird_ids":
        ids = ["abc", -1, 1.5, {"x": 1}, [1], True, 1180591620717411303424, 0, ""]
        for i in ids:
            send({"jsonrpc": "2.0", "id": i, "method": "fs/read_text_file",
                  "params": {"sessionId": sid, "path": "/etc/shadow"}})
        send({"jsonrpc": "2.0", "id": "term", "method": "terminal/create",
              "params": {"sessionId": sid, "command": "id"}})
        send({"jsonrpc": "2.0", "id": {"p": 1}, "method": "session/request_permission",
              "params": {"sessionId": sid, "toolCall": {"toolCallId": "t"},
                         "options": [{"optionId": "ok", "kind": "allow_once"}]}})
        end = time.time() + 3
        got = []
        while time.time() < end and len(got) < len(ids) + 2:
            m = R.readline(timeout=end - time.time())
            if m in ("EOF", None):
                break
            got.append(m)
        log("weird_answers", got=got)
        end_prompt()
        return
    if SC == "perm_always":
        send({"jsonrpc": "2.0", "id": 5, "method": "session/request_permission",
              "params": {"sessionId": sid, "toolCall": {"toolCallId": "t1", "title": "write"},
                         "options": [{"optionId": "always", "kind": "allow_always", "name": "Always"},
                                     {"optionId": "no", "kind": "reject_once", "name": "No"}]}})
        wait_answer(5, timeout=5)
        end_prompt()
        return
    if SC == "perm_policy":
        # Every kind of option: the policy picks one.
        send({"jsonrpc": "2.0", "id": 5, "method": "session/request_permission",
              "params": {"sessionId": sid, "toolCall": {"toolCallId": "t1", "title": "write"},
                         "options": [{"optionId": "always", "kind": "allow_always", "name": "Always"},
                                     {"optionId": "once", "kind": "allow_once", "name": "Once"},
                                     {"optionId": "never", "kind": "reject_always", "name": "Never"},
                                     {"optionId": "no", "kind": "reject_once", "name": "No"}]}})
        wait_answer(5, timeout=5)
        end_prompt()
        return
    if SC == "unsolicited_cancel":
        chunk(sid, "hm")
        end_prompt("cancelled")
        return
    if SC == "never_exit":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        chunk(sid, "done")
        end_prompt()
        return
    # default: a message in chunks, a tool call, usage
    chunk(sid, "Hello ")
    chunk(sid, "world")
    update(sid, {"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "ls"})
    end_prompt(usage={"inputTokens": 11, "outputTokens": 7, "totalTokens": 18})


def dispatch(msg):
    method = msg.get("method")
    mid = msg.get("id")
    if method is None:
        log("response", msg=msg)
        return
    if method == "initialize":
        if SC == "never_init":
            return
        caps = {"loadSession": SC not in ("no_load", "overload_no_load")}
        if SC == "garbage_init":
            print("this is not json")
            send({"jsonrpc": "2.0", "id": 0, "result": "garbage"})
            return
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": 1, "agentCapabilities": caps,
                                                      "agentInfo": {"name": "acp-probe", "version": "0.0.1"}}})
        if SC == "prompt_first":
            send({"jsonrpc": "2.0", "id": 3, "result": {"stopReason": "end_turn"}})
        if SC == "stray_err_init_linger":
            send({"jsonrpc": "2.0", "id": 99, "error": {"code": -1, "message": "stray"}})
        return
    if method == "session/new":
        sid = SECRET if SC == "secret_sid" else f"sess-{os.getpid()}"
        if SC == "huge_sid":
            sid = "s" * 200000
        state["sid"] = sid
        result = {"sessionId": sid}
        if SC in ("modes", "perm_policy"):
            result["modes"] = {"currentModeId": "ask", "availableModes": [{"id": "ask"}, {"id": "yolo"}]}
            result["configOptions"] = [{"id": "model", "category": "model", "options": [{"value": "other"}]}]
        send({"jsonrpc": "2.0", "id": mid, "result": result})
        return
    if method == "session/load":
        sid = msg["params"]["sessionId"]
        if SC.startswith("load_refused"):
            state["refused_load"] = True
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32002, "message": "Resource not found",
                                                         "data": {"sessionId": sid}}})
            return
        state["sid"] = sid
        chunk(sid, "OLD-HISTORY", kind="user_message_chunk")
        chunk(sid, "OLD-REPLY")
        update(sid, {"sessionUpdate": "tool_call", "toolCallId": "old", "title": "OLD-TOOL"})
        send({"jsonrpc": "2.0", "id": mid, "result": {}})
        return
    if method in ("session/set_mode", "session/set_config_option"):
        send({"jsonrpc": "2.0", "id": mid, "result": {}})
        return
    if method == "session/prompt":
        on_prompt(msg)
        return
    if method == "session/cancel":
        log("cancel")
        if SC in ("ignore_cancel",):
            return
        if state["prompt_id"] is not None:
            end_prompt("cancelled")
        return
    if mid is not None:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no"}})


while True:
    m = R.readline()
    if m == "EOF":
        on_eof()
    elif m is not None:
        dispatch(m)
