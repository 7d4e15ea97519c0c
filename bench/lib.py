"""Shared parts of the bench/ scripts: the reference coordinator as a
process, its dev API, a runner's environment, a latency proxy, /proc
figures. Standard library only."""

import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def binary():
    """The hosted-boot binary: $HOSTED_BOOT_BIN, else the release build,
    else the debug build."""
    env = os.environ.get("HOSTED_BOOT_BIN")
    if env:
        return env
    for kind in ("release", "debug"):
        path = os.path.join(ROOT, "target", kind, "hosted-boot")
        if os.path.exists(path):
            return path
    raise SystemExit("no hosted-boot binary: cargo build --release first")


def coordinator_command(runner):
    """The command that serves the reference coordinator for the runner
    binary `runner`: `hosted-boot-coordinator serve` beside it (issue 34),
    else, for a build from before issue 34, the runner's own `coordinator`
    subcommand (so that a benchmark can still compare against one)."""
    beside = os.path.join(os.path.dirname(os.path.abspath(runner)), "hosted-boot-coordinator")
    if os.path.exists(beside):
        return [beside, "serve"]
    return [runner, "coordinator"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as r:
        raw = r.read()
        return json.loads(raw) if raw else None


class Coordinator:
    """The reference coordinator (`coordinator_command`) on a free loopback port; `advertise` is
    the base URL sandboxes are given (a latency proxy in front of it)."""

    def __init__(self, args, advertise_port=None):
        self.tmp = tempfile.mkdtemp(prefix="bench-coordinator-")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}/"
        cmd = coordinator_command(binary()) + ["--listen", f"127.0.0.1:{self.port}",
               "--no-request-log", "--workdir", os.path.join(self.tmp, "work")] + args
        if advertise_port:
            cmd += ["--advertise-url", f"http://127.0.0.1:{advertise_port}/"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(self.tmp, "stderr"), "w"))
        deadline = time.time() + 120
        while True:
            try:
                self.dev("GET", "sessions")
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise SystemExit("the coordinator did not start: see " + self.tmp)
                time.sleep(0.05)

    def dev(self, method, path, body=None):
        return http(method, self.base + "dev/" + path, body)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def runner_env(session_env, root, agent_command, extra=None):
    """The environment of `hosted-boot run` on one session."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": root,
           "HOSTED_BOOT_ROOT": root, "HOSTED_BOOT_AGENT": "command",
           "HOSTED_BOOT_AGENT_COMMAND": agent_command,
           "HOSTED_BOOT_INSECURE_HTTP": "1", "HOSTED_BOOT_LOG": "warn"}
    env.update(session_env)
    env.update(extra or {})
    return env


class LatencyProxy:
    """A TCP proxy on loopback that delays every chunk by `one_way_ms` in
    each direction (a round trip of twice that), keeping order: a network
    of that latency between the runner and the coordinator. With `tls` (an
    `ssl.SSLContext` for a server), it terminates TLS: an HTTPS front of a
    plain-HTTP coordinator. `target` may be set after the start."""

    def __init__(self, target_port, one_way_ms, port=None, tls=None):
        self.target = target_port
        self.delay = one_way_ms / 1000.0
        self.port = port or free_port()
        self.tls = tls
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait()

    def _run(self, ready):
        asyncio.set_event_loop(self.loop)

        async def pipe(reader, writer):
            queue = asyncio.Queue()

            async def send():
                while True:
                    due, data = await queue.get()
                    wait = due - self.loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    if data is None:
                        writer.close()
                        return
                    writer.write(data)
                    await writer.drain()

            task = asyncio.ensure_future(send())
            try:
                while True:
                    data = await reader.read(65536)
                    queue.put_nowait((self.loop.time() + self.delay, data or None))
                    if not data:
                        break
            except ConnectionError:
                queue.put_nowait((self.loop.time(), None))
            await task

        async def handle(r1, w1):
            try:
                r2, w2 = await asyncio.open_connection("127.0.0.1", self.target)
            except OSError:
                w1.close()
                return
            await asyncio.gather(pipe(r1, w2), pipe(r2, w1), return_exceptions=True)

        async def main():
            await asyncio.start_server(handle, "127.0.0.1", self.port, ssl=self.tls)
            ready.set()
            await asyncio.Event().wait()

        self.loop.run_until_complete(main())


def link_order_names(binary, order):
    """(names of the link order file `order` that `binary` defines, names in
    the file): how much of it build.rs linked in order (a build whose names
    differ is linked mostly unordered). None when it cannot tell: no file,
    no nm, a stripped binary."""
    if not os.path.exists(order):
        return None
    try:
        nm = subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True)
    except OSError:
        return None
    if nm.returncode != 0:
        return None
    defined = {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()}
    with open(order) as f:
        names = [line.strip() for line in f if line.strip()]
    return sum(1 for n in names if n in defined), len(names)


def proc_cpu_rss(pids):
    """(user+system CPU seconds, RSS bytes) summed over `pids` (from
    /proc/PID/stat and /proc/PID/status)."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu, rss = 0.0, 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / tick
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1]) * 1024
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return cpu, rss


def percentile(values, p):
    s = sorted(values)
    if not s:
        return float("nan")
    # Nearest rank.
    k = max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))
    return s[k]


def machine():
    return f"nproc {os.cpu_count()}, Linux {os.uname().release}, shared 2-core"
