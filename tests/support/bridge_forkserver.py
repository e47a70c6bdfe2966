"""A fork server for the Megatron-Bridge test environment, run by that environment's Python: NVIDIA's packages are
imported once, and each program a test runs is then a forked child of this process, so that a run costs a fork
instead of the 20 CPU-seconds that importing megatron.bridge takes on this machine (tests/support/bridge_venv.py
`run_bridge` is the client).

    python bridge_forkserver.py SOCKET

A request is one JSON line over the Unix socket: {"argv", "env", "cwd", "stdout", "stderr"}, `argv` as it would
follow `python` (a script and its arguments, or "-c", code and its arguments). The server answers {"pid"} at once,
then {"returncode"} when the child has ended. The child runs the program as `python ARGV...` would: as __main__,
with that process's sys.argv, sys.orig_argv and sys.path, in `cwd`, with exactly `env`, its output in the two files.

How a child differs from a fresh process, and why that is safe here: the packages in WARM are already imported, as
the server's environment had it; the client starts one server per value of the variables those packages read at
import (IMPORT_TIME_PREFIXES), and a test of import-time behaviour gets a fresh process anyway, because the
program's own start-again (`os.execv`) replaces the child. A program that must act before those packages are
imported (the build probe puts its Transformer Engine stand-in in place first) needs a process of its own. Nothing
of the project is imported here, so each child imports the checkout's code as it is. The server exits when the
process that started it has gone.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import json
import os
import runpy
import socket
import sys
import traceback
import warnings

# What the programs the tests run import (stages/bridge_pretrain.py, the build probe, the index job and probe, the
# checkpoint scripts): third-party modules only.
WARM = (
    "torch",
    "megatron.core",
    "megatron.bridge.recipes",
    "megatron.bridge.training.config",
    "megatron.bridge.training.utils.omegaconf_utils",
    "megatron.bridge.training.checkpointing",
    "megatron.bridge.training.utils.checkpoint_utils",
    "megatron.bridge.training.setup",
    "megatron.bridge.models.gpt_provider",
)
# Variables the warmed packages read when imported (Hugging Face's cache and offline switches, torch's and TE's
# settings): a request whose values differ needs a server started with them (the client keys servers by these).
IMPORT_TIME_PREFIXES = (
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "TORCH",
    "NVTE_",
    "CUDA",
    "PYTORCH",
    "PYTHONWARNINGS",
    "HOME",
    "XDG_CACHE_HOME",
)  # the last two: where Hugging Face's cache is, by default
BASE_PATH = sys.path[1:]  # the interpreter's own path, without this file's folder


def interpreter_options(argv: list[str]) -> list[str]:
    """The interpreter's own options a rendered command gives (`python3 -u prog.py`), applied as the interpreter
    would; what follows them. An option this server cannot apply after start-up is refused, not ignored."""
    while argv and argv[0].startswith("-") and argv[0] not in ("-c", "-m"):
        option = argv.pop(0)
        if option == "-u":  # unbuffered: every write reaches the file at once
            sys.stdout.reconfigure(line_buffering=False, write_through=True)
            sys.stderr.reconfigure(line_buffering=False, write_through=True)
        elif option == "-W":
            warnings.simplefilter(argv.pop(0).split(":", 1)[0])  # type: ignore[arg-type]
        elif option != "-B":  # -B: no .pyc written; nothing of this kind is at stake in a test
            raise SystemExit(f"bridge_forkserver: the interpreter option {option} is not supported here")
    return argv


def run_child(request: dict) -> int:
    """In the forked child: run the request's program as `python ARGV...` would; its exit status."""
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if request["env"].get("PYTHONWARNINGS") == "ignore":
        warnings.simplefilter("ignore")
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.orig_argv = [sys.executable, *request["argv"]]
    try:
        argv = interpreter_options(list(request["argv"]))
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[:] = ["", *extra, *BASE_PATH]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[:] = [os.getcwd(), *extra, *BASE_PATH]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(argv[0])
            sys.argv = list(argv)
            sys.path[:] = [os.path.dirname(script), *extra, *BASE_PATH]
            runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or 0
        print(exit_.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - as the interpreter does: the traceback, status 1
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def serve(path: str) -> None:
    for name in WARM:
        importlib.import_module(name)
    starter = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".partial")
    server.listen(4)
    os.replace(path + ".partial", path)  # the client waits for the socket's name: it appears ready
    server.settimeout(5)
    while os.getppid() == starter:
        try:
            connection, _ = server.accept()
        except TimeoutError:
            continue
        with connection:
            connection.settimeout(None)
            request = json.loads(connection.makefile("r").readline())
            pid = os.fork()
            if pid == 0:  # the child never returns into this loop, whatever happens in it
                code = 1
                try:
                    server.close()
                    connection.close()
                    code = run_child(request)
                finally:
                    os._exit(code)
            # A client gone (its test timed out and killed the child) must not end the server.
            with contextlib.suppress(OSError):
                connection.sendall((json.dumps({"pid": pid}) + "\n").encode())
            _, status = os.waitpid(pid, 0)
            with contextlib.suppress(OSError):
                connection.sendall((json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n").encode())


if __name__ == "__main__":
    serve(sys.argv[1])
