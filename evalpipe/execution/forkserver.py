"""A pre-imported interpreter that forks a worker per request, and the client that asks it.

    python FORKSERVER serve SOCKET [MODULE ...]     import the MODULEs once, then fork on request
    python -I FORKSERVER run SOCKET -- COMMAND ...  COMMAND forked from there, else exec'd here

Why: every variant's worker is a new interpreter that imports torch, transformers and lm-eval
(through vLLM) before its engine starts; on a small CPU machine that import is half of an
engine start (docs/measured.md). The server imports those third-party modules once and forks
a child per worker, which then runs as a fresh interpreter would have: the request's
environment, working directory and argv, its PYTHONPATH at the head of sys.path, its
`sitecustomize` (evalpipe's path probes) run, then `-m MODULE` as __main__. vLLM and evalpipe
are never imported by the server: the path probes must see them imported, as they do in a new
interpreter.

The server forks only what it can start faithfully, else it refuses and the client execs
COMMAND itself (a new interpreter, as without the server; so does a client that finds no
server, or one that died):
- the same interpreter, as `PYTHON -m MODULE ...`;
- the same environment as the server's but for PYTHONPATH and evalpipe's own variables
  (EVALPIPE_*, which nothing the server imported reads; the run's mark, EVALPIPE_RUN_ID,
  must match, since /proc shows a forked child with the server's environment);
- no PYTHONPATH entry that provides a module the server has imported (another torch).

Lifecycle (evalpipe starts both under its guard, evalpipe/execution/guard.py):
- the client forwards SIGTERM and SIGINT to its child's process group and exits with the
  child's code (128 + N for a child killed by signal N), as the worker itself would;
- a client that dies first (its guard's SIGKILL) has its child's group killed by the server;
- the server, sent SIGTERM, stops its children's groups first; a child also dies with the
  server (PR_SET_PDEATHSIG), and the server's guard takes down its whole session.

Standard library only at module level: the client runs with -I and must start in no time.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, Mapping

RUN_MARK = "EVALPIPE_RUN_ID"  # evalpipe.process_table.RUN_ID_ENV (this script runs without evalpipe)
MESSAGE_MAX = 1 << 20  # one request: argv, environment and working directory
READY_TIMEOUT_S = 900.0  # the client waits this long for a server still importing, then starts alone
STOP_GRACE_S = 10.0
REQUEST_TIMEOUT_S = 10.0  # a client sends its request as soon as it connects  # the server's children, between SIGTERM and SIGKILL when it is stopped


def comparable_env(env: Mapping[str, str]) -> dict[str, str]:
    """What of a process environment must be the server's for a child to be forked from it."""
    return {k: v for k, v in env.items() if k != "PYTHONPATH" and (not k.startswith("EVALPIPE_") or k == RUN_MARK)}


def exit_code(status: int) -> int:
    """A child's wait status as a shell reports it (128 + N for signal N), as the guard does."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def provided_names(entry: str) -> set[str]:
    """The top-level module names a sys.path entry can provide."""
    try:
        names = os.listdir(entry or os.curdir)
    except OSError:
        return set()
    found = set()
    for name in names:
        stem = name.split(".", 1)[0]
        if stem.isidentifier() and (name.endswith((".py", ".pyc", ".so", ".pyd")) or "." not in name):
            found.add(stem)
    return found


# ------------------------------------------------------------------------------ the server


class Server:
    def __init__(self, listener: socket.socket, python: str, base_path: list[str], env: dict[str, str]):
        self.listener = listener
        self.python = python
        self.base_path = base_path
        self.env = comparable_env(env)
        # what importing the modules set (torch sets KMP_* and a compile cache's path): a new
        # interpreter would have set it too, by the time it imported them
        self.set_by_imports = {k: v for k, v in os.environ.items() if k not in env}
        self.imported = {name.partition(".")[0] for name in sys.modules}
        self.children: dict[int, socket.socket | None] = {}  # pid -> its client's connection (None: client gone)
        self.stopping = False

    def refusal(self, request: dict[str, Any]) -> str | None:
        argv, env = request["argv"], request["env"]
        if os.path.abspath(argv[0]) != self.python or len(argv) < 3 or argv[1] != "-m":
            return f"the server runs `{self.python} -m MODULE`, not `{' '.join(argv[:3])}`"
        if comparable_env(env) != self.env:
            differ = sorted(k for k in set(self.env) | set(comparable_env(env)) if self.env.get(k) != env.get(k))
            return f"its environment differs from the server's in {', '.join(differ[:5])}"
        for entry in env.get("PYTHONPATH", "").split(os.pathsep):
            shadowed = provided_names(entry) & self.imported if entry else set()
            if shadowed:
                return f"PYTHONPATH entry {entry} provides {', '.join(sorted(shadowed)[:3])}, imported here already"
        return None

    def serve(self) -> None:
        while not self.stopping:
            watched = [self.listener, *(c for c in self.children.values() if c is not None)]
            readable, _, _ = select.select(watched, [], [], 0.2)
            for sock in readable:
                if sock is self.listener:
                    self.accept()
                    continue
                # a client's connection says nothing until it closes: its client is gone (killed)
                pid = next(p for p, c in self.children.items() if c is sock)
                kill_group(pid, signal.SIGKILL)
                sock.close()
                self.children[pid] = None
            self.reap()
        self.stop_children()

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(REQUEST_TIMEOUT_S)  # a client that connected and died must not stop the server
        fds: list[int] = []
        try:
            data, fds, _, _ = socket.recv_fds(conn, MESSAGE_MAX, 3)
            request = json.loads(data)
        except (OSError, ValueError):
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        conn.settimeout(None)
        why = self.refusal(request) if len(fds) == 3 else "it sent no standard streams"
        if why is not None:
            for fd in fds:
                os.close(fd)
            reply(conn, {"refused": why})
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            request["env"] = {**request["env"], **self.set_by_imports}
            become(request, fds, [self.listener, conn, *(c for c in self.children.values() if c is not None)], self.base_path)
        for fd in fds:
            os.close(fd)  # the child's now: the client's pipes must see EOF when the child ends
        self.children[pid] = conn
        reply(conn, {"pid": pid})

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                reply(conn, {"exit": exit_code(status)})
                conn.close()

    def stop_children(self) -> None:
        for pid in self.children:
            kill_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while self.children and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.1)
        for pid in list(self.children):
            kill_group(pid, signal.SIGKILL)
        while self.children:
            self.reap()
            time.sleep(0.05)


def reply(conn: socket.socket, message: dict[str, Any]) -> None:
    try:
        conn.sendall(json.dumps(message).encode())
    except OSError:
        pass  # its client is gone; the connection's close says so to the loop


def kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def become(request: dict[str, Any], fds: list[int], sockets: list[socket.socket], base_path: list[str]) -> None:
    """The forked child: the process a new interpreter would have been. Never returns."""
    code = 1
    try:
        os.setpgid(0, 0)  # its own group, which the client and the server stop as a whole
        _die_with_parent()
        for sock in sockets:
            sock.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        entries = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.getcwd(), *entries, *base_path]  # as `python -m` sets it up
        sys.path_importer_cache.clear()
        _run_sitecustomize()
        code = _run_module(request["argv"][2], request["argv"][3:])
    except BaseException:  # noqa: BLE001 - whatever it was, the child must not go back into the server's loop
        traceback.print_exc()
    finally:
        os._exit(_finish(code))


def _die_with_parent() -> None:
    """SIGKILL when the server dies (Linux prctl PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)


def _run_sitecustomize() -> None:
    """What site.py does at a new interpreter's start, now that sys.path is the child's."""
    sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401, PLC0415 - site.py's import, after the child's sys.path is set
    except ImportError as err:
        if err.name != "sitecustomize":
            raise
    except Exception as err:  # noqa: BLE001 - site.py reports it and goes on
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(err).__name__}: {err}", file=sys.stderr)


def _run_module(module: str, args: list[str]) -> int:
    sys.argv = ["-m", *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return 128 + signal.SIGINT
    return 0


def _finish(code: int) -> int:
    """Interpreter shutdown's steps that matter to a worker: its threads joined, atexit run, streams flushed."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx does first
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - a closed pipe at exit changes nothing
                pass
    return code


def serve_main(socket_path: str, modules: list[str]) -> int:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(socket_path)
    listener.listen(64)  # clients wait in the backlog while the modules import
    env = dict(os.environ)
    for name in modules:
        try:
            __import__(name)
        except ImportError as err:  # not in this interpreter: its workers will not import it either
            print(f"forkserver: {name} not imported ({err})", file=sys.stderr)
    foreign = sorted({m.partition(".")[0] for m in sys.modules} & {"vllm", "evalpipe"})
    if foreign:
        print(f"forkserver: importing {', '.join(modules)} imported {', '.join(foreign)}; not serving", file=sys.stderr)
        return 1
    server = Server(listener, os.path.abspath(sys.executable), sys.path[1:], env)

    def stop(*_: Any) -> None:
        server.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"forkserver: ready, {len(sys.modules)} modules imported", file=sys.stderr, flush=True)
    server.serve()
    return 0


# ------------------------------------------------------------------------------ the client


def run_main(socket_path: str, command: list[str]) -> int:
    what = command[2] if len(command) > 2 and command[1] == "-m" else command[0]  # for the log: the worker, a server
    why = "no answer"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.connect(socket_path)
            request = {"argv": command, "env": dict(os.environ), "cwd": os.getcwd()}
            socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2])
            sock.settimeout(READY_TIMEOUT_S)
            answer = json.loads(sock.recv(MESSAGE_MAX) or b"null")
            if isinstance(answer, dict) and "pid" in answer:
                sock.settimeout(None)
                return _follow(sock, int(answer["pid"]), what)
            why = answer["refused"] if isinstance(answer, dict) and "refused" in answer else "the server is gone"
    except (OSError, ValueError) as err:
        why = f"{type(err).__name__}: {err}"
    print(f"evalpipe: a new interpreter for {what} ({why})", file=sys.stderr, flush=True)
    os.execvp(command[0], command)
    return 127  # not reached


def _follow(sock: socket.socket, child: int, what: str) -> int:
    def forward(signum: int, _frame: Any) -> None:
        kill_group(child, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    print(f"evalpipe: {what} runs as process {child}, forked from a pre-imported interpreter", file=sys.stderr, flush=True)
    data = sock.recv(MESSAGE_MAX)
    answer = json.loads(data) if data else None
    if isinstance(answer, dict) and "exit" in answer:
        return int(answer["exit"])
    kill_group(child, signal.SIGKILL)  # the server died first: its children die with it
    print("evalpipe: the pre-imported interpreter died under this worker", file=sys.stderr, flush=True)
    return 1


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "serve":
        return serve_main(argv[1], argv[2:])
    if len(argv) >= 4 and argv[0] == "run" and argv[2] == "--":
        return run_main(argv[1], argv[3:])
    print("usage: forkserver.py serve SOCKET [MODULE ...] | run SOCKET -- COMMAND ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
