"""A real Flower deployment on loopback: one SuperLink and N SuperNodes as subprocesses.

``LocalFederation`` starts ``flower-superlink`` and ``flower-supernode`` processes on free ports
of 127.0.0.1 (drawn outside the system's ephemeral range, and drawn again for a process that
finds its port taken by then, so that federations started side by side never collide), each in its own process group, with their own ``FLWR_HOME`` and telemetry off;
writes the Flower app (a pyproject naming focusfl's ServerApp and ClientApp) and a SuperLink
connection; submits the run with ``flwr run``; and stops everything it started when it is
closed, also on Ctrl-C and on errors, so no process outlives it. Stopping by process group is
not enough: the SuperLink starts its SuperExec in a session of its own (Flower's
``get_popen_detach_kwargs``), and the SuperExec starts each ``flwr-serverapp`` there, so
killing the SuperLink's group orphans a running ServerApp. Every process started here is
therefore tagged with ``FOCUSFL_FEDERATION=<id>`` in its environment, which Flower passes on
to the processes it starts, and ``stop`` ends every process that carries the tag
(``federation_processes``: psutil if installed, else ``/proc``). SuperNode k runs client
k (``--node-config partition-id=k``) and keeps durable state in its own ``state-dir``, so a
node killed with SIGKILL can be restarted and continue (node.py).
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..runs.folder import Interrupted
from ..signals import handled

APP_PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "focusfl-federation"
version = "1.0.0"
description = "focusfl algorithms on Flower"
license = "MIT"
dependencies = ["focusfl[flower]"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "focusfl"

[tool.flwr.app.components]
serverapp = "focusfl.flower.server_app:app"
clientapp = "focusfl.flower.client_app:app"

[tool.flwr.app.config]
focusfl = "{}"
"""


TAG = "FOCUSFL_FEDERATION"  # environment variable naming the federation a process belongs to
GRACE = 3.0  # seconds processes get to exit after SIGTERM before SIGKILL (node state is durable)
# Seconds a stopped ServerApp gets to write the rounds done (run folder, figures) before the rest stops.
SERVER_APP_GRACE = 30.0
SERVER_APP = "flwr-serverapp"
WAIT_CHUNK = 3600.0  # a wait is split into waits of at most this long: poll() takes milliseconds in a C int
# Flower's executables a local federation starts, directly or through the SuperLink's SuperExec
# (which finds them on PATH): warm nodes run in this Python (warm.py), cold ones start their own.
TOOLS = ("flower-superlink", "flower-superexec", "flwr", SERVER_APP)
COLD_NODE_TOOLS = ("flower-supernode", "flwr-clientapp")
# Seconds between the SuperLink's SuperExec asks for a ServerApp task (Flower: 1 s) in a warm
# federation: paid once, at start, and a faster poll would take CPU from the rounds all along.
SUPEREXEC_POLL = "0.2"


def write_app(folder: Path) -> Path:
    """The Flower app folder that ``flwr run`` submits (focusfl must be installed where it runs)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(APP_PYPROJECT)
    return folder


# A SuperLink or SuperNode binds the port it is given when it starts, seconds after focusfl chose
# it; another process may take it in between (a second federation on this machine, or any
# outgoing connection, which gets a port of the system's ephemeral range). Ports are therefore
# chosen at random below that range, where the system hands out none, and a process that finds
# its port taken is started again on another, up to PORT_TRIES times.
PORT_TRIES = 8
LOWEST_PORT = 10000
TAKEN = ("address already in use", "errno 98", "failed to bind")


def _ephemeral_range() -> tuple[int, int]:
    """The ports the system gives outgoing connections (Linux's ip_local_port_range; else its default)."""
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port of 127.0.0.1 free now, drawn at random outside the ephemeral range (see PORT_TRIES)."""
    low, high = _ephemeral_range()
    spans = [(LOWEST_PORT, low)] if low - LOWEST_PORT >= 1000 else [(high + 1, 65536)] if high < 64535 else []
    draw = random.SystemRandom()
    for start, stop in spans:
        for _ in range(64):
            port = draw.randrange(start, stop)
            if _bindable(port):
                return port
    with socket.socket() as probe:  # no room outside the ephemeral range: one the system picks
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _port_taken(log: Path, process: subprocess.Popen) -> bool:
    """Whether ``process`` exited because the port it was given was taken (its log says so)."""
    if process.poll() is None or not log.is_file():
        return False
    text = log.read_text(errors="replace").lower()
    return any(words in text for words in TAKEN)


def _wait_for(path: Path, text: str, seconds: float, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.is_file() and text in path.read_text(errors="replace"):
            return
        if process.poll() is not None:
            raise ConfigError(f"{process.args[0]} exited with status {process.returncode}; see {path}")
        time.sleep(0.2)
    raise ConfigError(f"{process.args[0]} did not start within {seconds:g} s; see {path}")


class LocalFederation:
    """Context manager: ``with LocalFederation(workdir, nodes=3) as fed: fed.run(config)``."""

    def __init__(self, workdir: str | Path, nodes: int, *, tls: bool = False, auth: bool = False,
                 durable: bool = True, warm: bool = True, start_timeout: float = 90.0,
                 deadlines: dict[int, float] | None = None, data_paths: dict[int, str] | None = None,
                 allow_algorithm_import: bool = False, floors: dict[int, float] | None = None) -> None:
        if nodes < 1:
            raise ConfigError("a federation needs at least one node")
        self.deadlines = dict(deadlines or {})  # node k -> seconds of local work per round (deadline.py)
        self.floors = dict(floors or {})  # node k -> its owner's floor on local noise (dp_floor.py)
        # node k -> its copy of the data (node config data-path, node.py); absolute: nodes run in workdir
        self.data_paths = {k: str(Path(path).expanduser().resolve()) for k, path in (data_paths or {}).items()}
        self.workdir = Path(workdir).resolve()
        self.allow_algorithm_import = allow_algorithm_import  # the nodes' permission (node.ALLOW_IMPORT)
        self.nodes, self.tls, self.auth, self.durable, self.warm = nodes, tls, auth, durable, warm
        self.start_timeout = start_timeout
        self.processes: dict[str, subprocess.Popen] = {}
        self.retired: list[subprocess.Popen] = []  # processes of nodes that were restarted
        self.home = self.workdir / "flwr-home"
        self.logs = self.workdir / "logs"
        self.port = 0
        self.certs: dict[str, Path] = {}
        self.keys: dict[int, Path] = {}
        self.tag = uuid.uuid4().hex  # in every started process's environment (see stop)

    # -- environment -----------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(FLWR_HOME=str(self.home), FLWR_TELEMETRY_ENABLED="0", PYTHONUNBUFFERED="1")
        # Flower starts flower-superexec and flwr-serverapp by name: the ones beside this Python
        # come first, so an unactivated venv (or a pipx install) called by its full path works.
        env["PATH"] = os.pathsep.join([tools_folder(), *filter(None, [env.get("PATH", os.defpath)])])
        env[TAG] = self.tag  # inherited by the SuperExec and the flwr-serverapp it starts
        if self.warm:  # the SuperLink's SuperExec asks for the ServerApp task every 0.2 s, not 1 s
            env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = SUPEREXEC_POLL
        # The processes import the same focusfl as this one (a source checkout included).
        import focusfl

        source = str(Path(focusfl.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([source, *filter(None, [env.get("PYTHONPATH")])])
        return env

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")
        try:
            process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                       cwd=self.workdir, start_new_session=True)
        finally:
            log.close()
        self.processes[name] = process
        return process

    # -- life cycle ------------------------------------------------------------------------
    def __enter__(self) -> "LocalFederation":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def start(self) -> None:
        check_tools(self.warm)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        write_app(self.workdir / "app")
        if self.tls:
            from .tls import make_certificates

            self.certs = make_certificates(self.workdir / "certs")
        self._start_superlink()
        self._write_connection()
        for k in range(self.nodes):
            if self.auth:
                self.register_node(k)
            self.start_node(k)
        for k in range(self.nodes):
            self._wait_for_node(k)

    def _superlink_args(self) -> list[str]:
        args = [_tool("flower-superlink"), "--disable-runtime-dependency-installation",
                "--host", "127.0.0.1", "--port", str(self.port)]
        if self.tls:
            args += ["--ssl-ca-certfile", str(self.certs["ca"]), "--ssl-certfile", str(self.certs["cert"]),
                     "--ssl-keyfile", str(self.certs["key"])]
        else:
            args += ["--insecure"]
        if self.auth:
            args += ["--enable-supernode-auth"]
        return args

    def _start_superlink(self) -> None:
        """The SuperLink on a free port: another one when the chosen port was taken meanwhile."""
        log = self.logs / "superlink.log"
        for attempt in range(PORT_TRIES):
            self.port = free_port()
            link = self._spawn("superlink", self._superlink_args())
            try:
                _wait_for(log, "Uvicorn running", self.start_timeout, link)
                return
            except ConfigError:
                if attempt == PORT_TRIES - 1 or not _port_taken(log, link):
                    raise
                self.retired.append(self.processes.pop("superlink"))
                log.rename(self.logs / f"superlink.port-{self.port}-taken.log")

    def _wait_for_node(self, k: int) -> None:
        """Wait until node k has joined; restart it on another port when its port was taken."""
        for attempt in range(PORT_TRIES):
            log, process = self.logs / f"node{k}.log", self.processes[f"node{k}"]
            try:
                _wait_for(log, "SuperNode ID", self.start_timeout, process)
                return
            except ConfigError:
                if attempt == PORT_TRIES - 1 or not _port_taken(log, process):
                    raise
                self.start_node(k)  # its old log moves aside; node_args draws a new port

    def _write_connection(self) -> None:
        lines = ['[superlink]', 'default = "focusfl-local"', '', '[superlink.focusfl-local]',
                 f'address = "127.0.0.1:{self.port}"']
        lines += [f'root-certificates = "{self.certs["ca"]}"'] if self.tls else ["insecure = true"]
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")

    def node_args(self, k: int, *, tls: bool | None = None, key: Path | bool | None = None) -> list[str]:
        """flower-supernode's command line for node k; ``tls`` and ``key`` (a private key file,
        or False for none) override the federation's settings (tests of refused nodes)."""
        config = f"partition-id={k} num-partitions={self.nodes}"
        if self.durable:
            config += f' state-dir="{self.workdir / "node-state" / f"node{k}"}"'
        if k in self.deadlines:
            config += f" deadline={float(self.deadlines[k])!r}"
        if k in self.data_paths:
            config += f" data-path={json.dumps(self.data_paths[k])}"
        if k in self.floors:
            config += f" dp-min-noise={float(self.floors[k])!r}"
        if self.allow_algorithm_import:
            config += " allow-algorithm-import=true"
        # warm (the default): one process per node runs the SuperNode and its ClientApp calls (warm.py)
        start = [sys.executable, "-m", "focusfl.flower.warm"] if self.warm else [_tool("flower-supernode")]
        args = [*start, "--superlink", f"127.0.0.1:{self.port}", "--port", str(free_port()), "--node-config", config]
        if self.tls if tls is None else tls:
            args += ["--root-certificates", str(self.certs["ca"])]
        else:
            args += ["--insecure"]
        key = self.keys.get(k) if key is None or key is True else key
        if key:
            args += ["--auth-supernode-private-key", str(key)]
        return args

    def start_node(self, k: int, *, name: str | None = None, **kwargs: Any) -> subprocess.Popen:
        """Start (or restart) SuperNode k; ``name`` starts another one for client k beside it
        (logs/NAME.log; tests of nodes the SuperLink must refuse). Stopped in stop()."""
        name = name or f"node{k}"
        if name in self.processes:
            if self.processes[name].poll() is None:
                raise ConfigError(f"node {k} is running")
            self.retired.append(self.processes.pop(name))  # reaped (and its group checked) in stop()
        log = self.logs / f"{name}.log"
        if log.exists():  # a restart: keep the old log beside the new one
            log.rename(self.logs / f"{name}.{int(time.time() * 1000)}.log")
        return self._spawn(name, self.node_args(k, **kwargs))

    def register_node(self, k: int) -> None:
        """Node authentication: a key pair for node k, its public key registered with the SuperLink."""
        from .tls import make_node_key

        private, public = make_node_key(self.workdir / "node-keys", k)
        self.keys[k] = private
        result = subprocess.run([_tool("flwr"), "supernode", "register", str(public), "focusfl-local"],
                                env=self.env(), cwd=self.workdir, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise ConfigError(f"could not register node {k}: {(result.stdout + result.stderr).strip()[-300:]}")

    def pids(self) -> list[int]:
        """Process-group ids of everything started here (each process leads its own group)."""
        return [p.pid for p in (*self.retired, *self.processes.values())]

    def kill_node(self, k: int, sig: int = signal.SIGKILL) -> None:
        process = self.processes[f"node{k}"]
        _kill_group(process, sig)

    def run(self, config, *, timeout: float = 1800.0) -> subprocess.CompletedProcess:
        """Submit ``config`` (a FederationConfig) with ``flwr run`` and stream until it ends."""
        run_toml = self.workdir / "run.toml"
        run_toml.write_text(f"focusfl = {json.dumps(config.to_json())}\n")
        args = [_tool("flwr"), "run", str(self.workdir / "app"), "focusfl-local", "--run-config", str(run_toml),
                "--stream"]
        process = subprocess.Popen(args, env=self.env(), cwd=self.workdir, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.processes["flwr-run"] = process
        try:
            output = _communicate(process, timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process, signal.SIGKILL)
            output, _ = process.communicate()
            raise ConfigError(f"the federation did not finish within {timeout:g} s") from None
        (self.logs / "flwr-run.log").write_text(output)
        return subprocess.CompletedProcess(args, process.returncode, output, "")

    def stop(self) -> None:
        """Stop everything started here: SIGTERM to each process group and to every process
        tagged with this federation (the ServerApp that Flower starts in a session of its own
        included), SIGKILL to what is left after GRACE seconds. A second Ctrl-C or SIGTERM
        while this runs is held off, so that it cannot leave orphans behind."""
        every = [*self.retired, *self.processes.values()]
        with _signals_held():
            self._stop_server_app()
            self._signal_all(every, signal.SIGTERM)
            deadline = time.monotonic() + GRACE
            while time.monotonic() < deadline and (federation_processes(self.tag)
                                                   or any(p.poll() is None for p in every)):
                time.sleep(0.1)
            deadline = time.monotonic() + 10
            while True:  # again until none is left: a process may start another as it goes
                self._signal_all(every, signal.SIGKILL)
                for process in every:
                    try:
                        process.wait(timeout=max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        pass
                if not federation_processes(self.tag) or time.monotonic() > deadline:
                    break
                time.sleep(0.1)

    def _stop_server_app(self) -> None:
        """SIGTERM to the running ServerApp first, and time to write the rounds done
        (server_app.py keeps them as an interrupted run folder) while the SuperLink still runs."""
        apps = [pid for pid in federation_processes(self.tag) if SERVER_APP in _command_line(pid)]
        for pid in apps:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + SERVER_APP_GRACE
        while apps and time.monotonic() < deadline:
            apps = [pid for pid in apps if _alive(pid)]
            time.sleep(0.1)

    def _signal_all(self, processes: list[subprocess.Popen], sig: int) -> None:
        for process in processes:
            _kill_group(process, sig)
        for pid in federation_processes(self.tag):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def federation_processes(tag: str) -> list[int]:
    """Live processes whose environment has ``FOCUSFL_FEDERATION=tag`` (never this process).

    psutil when installed, else Linux's ``/proc``; elsewhere without psutil: none (the
    process groups are still stopped)."""
    try:
        import psutil
    except ImportError:
        psutil = None
    found = []
    if psutil is not None:
        for process in psutil.process_iter():
            try:
                if process.pid != os.getpid() and process.environ().get(TAG) == tag:
                    found.append(process.pid)
            except (psutil.Error, OSError):
                continue
        return found
    wanted = f"{TAG}={tag}".encode()
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()  # empty for a zombie: it is reaped by its parent
        except OSError:
            continue
        if wanted in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _signals_held():
    """SIGINT and SIGTERM ignored inside (main thread only; elsewhere signals cannot be set)."""
    return handled((signal.SIGINT, signal.SIGTERM), signal.SIG_IGN)


def signals_interrupt():
    """SIGTERM and SIGHUP raise KeyboardInterrupt (exit status 128+N) as Ctrl-C does, so that a
    federation killed by its caller stops its processes (``with LocalFederation``) instead of
    leaving them running. Main thread only; signals ignored when focusfl started stay ignored."""
    def handler(signum, frame) -> None:
        raise Interrupted(f"interrupted by {signal.Signals(signum).name}", 128 + signum)

    return handled((signal.SIGTERM, signal.SIGHUP), handler, keep_ignored=True)


def _kill_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)  # the group: flwr-serverapp / flwr-clientapp children too
    except (ProcessLookupError, PermissionError):
        pass


def tools_folder() -> str:
    """The folder of this Python's console scripts (a venv's bin, not the interpreter it links to)."""
    return str(Path(sys.executable).parent)


def _tool(name: str) -> str:
    """A Flower console script next to this Python (the one focusfl runs in), else on PATH."""
    candidate = Path(tools_folder()) / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise ConfigError(f"Flower's executable {name!r} was found neither next to this Python "
                          f"({tools_folder()}) nor on PATH; install Flower into the Python that runs focusfl: "
                          f"{sys.executable} -m pip install 'focusfl[flower]'")
    return found


def check_tools(warm: bool = True) -> None:
    """Every Flower executable a local federation needs is there: one line naming a missing one,
    before any process starts."""
    for name in (*TOOLS, *(() if warm else COLD_NODE_TOOLS)):
        _tool(name)


def _communicate(process: subprocess.Popen, timeout: float) -> str:
    """``process.communicate(timeout)`` in waits of at most WAIT_CHUNK seconds: one wait of more
    than about 24 days overflows poll()'s millisecond argument (OverflowError); an infinite
    ``timeout`` waits for ever."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            output, _ = process.communicate(timeout=max(0.0, min(left, WAIT_CHUNK)))
            return output
        except subprocess.TimeoutExpired:
            if left <= WAIT_CHUNK:
                raise


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        try:
            import psutil

            return " ".join(psutil.Process(pid).cmdline())
        except Exception:  # psutil missing, or the process is gone
            return ""


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, exited and waiting for its parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
