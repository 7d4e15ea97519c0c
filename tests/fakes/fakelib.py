"""Shared helpers of the stand-in CLIs (claude, codex, opencode) that the
integration tests put first on PATH. Each stand-in checks the arguments and
stdin it receives, replays events in the real CLI's format, and records
what it saw in $AGENT_OUT/<cli>.log (one JSON object a line) for the tests.

The scenario of a turn is named in its prompt: "scenario:<name>". A resumed
session remembers its scenario (a continuation prompt names none)."""

import hashlib
import json
import os
import re
import signal
import sys
import time
import uuid

CLI = os.path.basename(sys.argv[0])


def record(kind, **fields):
    out = os.environ.get("AGENT_OUT")
    if not out:
        return
    entry = {"cli": CLI, "pid": os.getpid(), "run": os.environ.get("ORIZU_RUN_ID"), "kind": kind}
    entry.update(fields)
    with open(os.path.join(out, CLI + ".log"), "a") as f:
        f.write(json.dumps(entry) + "\n")


WATCHED_ENV = [
    "ORIZU_AGENT_SESSION_ID", "ORIZU_RUN_ID", "ORIZU_MODEL", "ORIZU_REASONING_EFFORT",
    "CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "CLAUDE_CODE_OAUTH_TOKEN", "IS_SANDBOX",
    "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "CODEX_SANDBOX", "OPENCODE_PERMISSION",
    "OPENCODE_DISABLE_AUTOUPDATE", "OPENCODE_SERVER_USERNAME", "FAKE_EXTRA", "HOME",
]


def start_time():
    """This process's start time in clock ticks since boot: with the pid, its
    identity (the suite's orphan check tells a recycled pid by it)."""
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def record_start():
    env = {k: os.environ[k] for k in WATCHED_ENV if k in os.environ}
    record("start", argv=sys.argv[1:], env=env, cwd=os.getcwd(),
           has_password=bool(os.environ.get("OPENCODE_SERVER_PASSWORD")),
           password_digest=hashlib.sha256(
               os.environ.get("OPENCODE_SERVER_PASSWORD", "").encode()).hexdigest()[:12],
           start_time=start_time())


def fail(message, code=2):
    sys.stderr.write("%s: %s\n" % (CLI, message))
    sys.stderr.flush()
    record("argument_error", message=message)
    sys.exit(code)


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def scenario_of(prompt):
    m = re.search(r"scenario:([a-z0-9-]+)", prompt or "")
    return m.group(1) if m else None


def store_dir():
    d = os.path.join(os.environ.get("HOME", "/tmp"), ".fake-" + CLI)
    os.makedirs(d, exist_ok=True)
    return d


def load_session(sid):
    path = os.path.join(store_dir(), sid + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def save_session(sid, data):
    with open(os.path.join(store_dir(), sid + ".json"), "w") as f:
        json.dump(data, f)


def new_id(prefix=""):
    return prefix + str(uuid.uuid4())


def ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def sleep_forever():
    while True:
        time.sleep(60)


def check_prompt_not_in_argv(prompt):
    for a in sys.argv[1:]:
        if prompt and prompt.strip() and prompt.strip() in a:
            fail("the prompt travelled in argv")
