"""``focusfl federation``: run an algorithm on a real Flower deployment.

- ``focusfl federation local --nodes N ...``: a SuperLink and N SuperNodes on loopback
  (subprocesses, stopped on exit, Ctrl-C or failure), the run, and its run folder.
- ``focusfl federation app DIR ...``: the Flower app folder and its run config, to submit with
  ``flwr run DIR CONNECTION --run-config DIR/run.toml`` to your own SuperLink.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from pathlib import Path

import numpy as np

from ..argtypes import non_negative_int, positive_float
from ..errors import ConfigError, DataError
from ..runs.cli import add_algorithm_import_option, add_run_options, run_config_of
from .defaults import FEDERATION_DEFAULTS

EXAMPLES = """examples:
  focusfl federation local --nodes 3 --algorithm focus --problem ridge:clients=3 --rounds 20 --out runs/fed
  focusfl federation local --nodes 3 --algorithm fedavg --problem ridge:clients=3 --local-steps 5 --deadline 1=0 --out runs/late
  focusfl run --algorithm fedavg --problem ridge:clients=3 --local-steps 5 --rounds 20 --engine reference \\
      --participation trace:path=runs/late/trace.csv --work trace:path=runs/late/work.csv --out runs/late-replay
  focusfl federation local --nodes 3 --problem ridge:clients=3 --tls --auth --participation bernoulli --out runs/fed-tls
  focusfl federation local --nodes 2 --algorithm fedavg --data-path copies/node{k} --out runs/fed-text \\
      --problem nn:data=hf:/srv/sst2,input=sentence,test_split=validation,tokenizer=/srv/bert,model=hf:/srv/bert,clients=2
  focusfl federation app flower-app --algorithm focus --problem ridge:clients=3 --rounds 50 --out /srv/runs/fed

docs/federation.md: from one laptop to real machines, TLS, node authentication, the commit protocol."""


def add_parser(sub) -> None:
    p = sub.add_parser("federation", help="run an algorithm on a real Flower deployment",
                       description=__doc__.split("\n\n")[0], epilog=EXAMPLES)
    kinds = p.add_subparsers(dest="federation_command", required=True)
    local = kinds.add_parser("local", help="a SuperLink and N SuperNodes on loopback, one run", epilog=EXAMPLES)
    local.add_argument("--nodes", type=int, required=True, help="SuperNodes (node k runs client k)")
    _common(local)
    local.add_argument("--tls", action="store_true", help="TLS with a throwaway CA for 127.0.0.1")
    local.add_argument("--auth", action="store_true", help="SuperNode authentication (keys registered first)")
    local.add_argument("--workdir", help="where Flower's home, logs and node state go (default: a temp folder)")
    local.add_argument("--deadline", metavar="SECONDS|NODE=SECONDS,...",
                       help="a time budget for each round's local work: SECONDS for every node, or NODE=SECONDS,... "
                            "for some (node k runs client k), e.g. 0.5 or 1=0.5,2=0; a node whose budget is spent "
                            "stops after the steps it finished (at least 1) and the server accepts that partial work; "
                            "work.csv records the steps taken (docs/federation.md)")
    local.add_argument("--data-path", metavar="PATH",
                       help="where node k reads its own copy of the data (its node config data-path): {k} in PATH "
                            "is the node's number, e.g. copies/node{k}; a file (an .npz) or a folder (the data set "
                            "and, for data=hf:..., the tokenizer and model folders, by their names); the server "
                            "reads the problem's own paths and refuses a node whose copy differs "
                            "(docs/federation.md)")
    local.add_argument("--dp-min-noise", metavar="SIGMA|NODE=SIGMA,...",
                       help="a node owner's floor on local DP (its node config dp-min-noise): SIGMA for every node, "
                            "or NODE=SIGMA,... for some, e.g. 1.0 or 1=1.0; a node refuses a run whose --dp asks for "
                            "less local noise than SIGMA, or for no local DP, and never trains for it "
                            "(docs/privacy.md)")
    local.set_defaults(handler=_local)
    app = kinds.add_parser("app", help="write the Flower app and run config for `flwr run`", epilog=EXAMPLES)
    app.add_argument("folder", help="folder to write (pyproject.toml, run.toml)")
    _common(app)
    app.set_defaults(handler=_app)


# The run fields a federation takes (runs.config): each node runs its client on the CPU with one
# thread, so device, engine and threads are not among them.
RUN_OPTIONS = ("algorithm", "problem", "participation", "work", "rounds", "local_steps", "lr", "seed", "dtype",
               "eval_every", "schedule", "dp")


def _common(p) -> None:
    add_run_options(p, RUN_OPTIONS, defaults=FEDERATION_DEFAULTS, helps={
        "problem": "problem SPEC; each node builds its client from it",
        "participation": "'available' (every node that answers in time) or a participation SPEC (S_r requested)"})
    p.add_argument("--timeout", type=positive_float, default=60.0,
                   help="seconds a round waits for replies (a positive, finite number)")
    p.add_argument("--min-nodes", type=non_negative_int, default=0, metavar="N",
                   help="wait up to --timeout seconds for N nodes to connect before the first round, else stop "
                        "with an error (default 0: start with the nodes connected)")
    p.add_argument("--out", help="run folder (metrics.csv, config.json, curve.png, trace.csv, ...)")
    add_algorithm_import_option(p, debug=False)  # the algorithm runs in the federation's processes


def _config(args):
    """The CLI edge: the command line as a FederationConfig (its run fields as a RunConfig)."""
    from .server_app import FederationConfig

    out = str(Path(args.out).expanduser().resolve()) if args.out else None
    run = run_config_of(args, RUN_OPTIONS, problem=absolute_paths(args.problem))
    if args.algorithm is not None:
        run = run.replace(algorithm=absolute_algorithm(args.algorithm))
    return FederationConfig(run, timeout=args.timeout, out=out, allow_algorithm_import=args.allow_algorithm_import,
                            min_nodes=args.min_nodes)


def absolute_algorithm(spec):
    """An algorithm of the user's own named by a relative file (``my_prox.py:MyProx``) made
    absolute from this folder, where the user typed it: the ServerApp and the nodes run in
    another one. Registered names, module paths and files not found here are left as given."""
    from ..spec import format_spec, parse_spec

    name, params = parse_spec(spec)
    where, colon, attribute = name.rpartition(":")
    if not colon or not where.endswith(".py"):
        return spec
    path = Path(where).expanduser()
    if path.is_absolute() or not path.is_file():
        return spec
    return format_spec(f"{path.resolve()}:{attribute}", params)


# nn keys that name files or folders: (key, the prefixes a path may carry)
PATH_KEYS = {"data": ("hf:", ""), "data_dir": ("",), "tokenizer": ("",), "model": ("hf:", "hf-config:")}


def absolute_paths(problem):
    """An nn problem's relative paths (an .npz or hf: dataset, data_dir, tokenizer, hf: model)
    made absolute from this folder, where the user typed them: the ServerApp runs in another
    one. Other problems, names (data=mnist) and paths not found here are left as given."""
    from ..spec import parse_spec

    name, params = parse_spec(problem)
    if name != "nn":
        return problem
    changed = dict(params)
    for key, prefixes in PATH_KEYS.items():
        value = params.get(key)
        prefix = next((p for p in prefixes if isinstance(value, str) and value.startswith(p)), None)
        if prefix is None or (key == "data" and not prefix and not value.endswith(".npz")):
            continue
        path = Path(value[len(prefix):]).expanduser()
        if str(path) and not path.is_absolute() and path.exists():
            changed[key] = prefix + str(path.resolve())
    return problem if changed == params else {"name": name, **changed}


def _check(config):
    """Fail on bad input before any process starts; the strategy the ServerApp will build."""
    from .server_app import build_strategy

    strategy, _built = build_strategy(config, log=lambda text: None)
    return strategy


def _deadlines(args, strategy) -> dict[int, float]:
    """``--deadline`` as {node: seconds}; only for algorithms that can take partial work."""
    from .deadline import parse_deadlines

    if args.deadline is None:
        return {}
    deadlines = parse_deadlines(args.deadline, args.nodes)
    if not strategy.algorithm.partial_work:
        raise ConfigError(f"--deadline: {strategy.algorithm.name} cannot take partial work (per-client step "
                          "counts); fedavg, fednova, focus and scaffold can (see `focusfl algorithms`)")
    return deadlines


def _floors(args) -> dict[int, float]:
    """``--dp-min-noise`` as {node: sigma}."""
    from .dp_floor import parse_floors

    return {} if args.dp_min_noise is None else parse_floors(args.dp_min_noise, args.nodes)


def _data_paths(args) -> dict[int, str]:
    """``--data-path`` as {node: its path}, every one checked to exist before any process starts."""
    if args.data_path is None:
        return {}
    if "{k}" not in args.data_path and args.nodes > 1:
        raise ConfigError("--data-path: put {k} (the node's number) in PATH, e.g. copies/node{k}, so that "
                          "each node reads its own copy")
    paths = {k: args.data_path.replace("{k}", str(k)) for k in range(args.nodes)}
    for k, path in paths.items():
        if not Path(path).expanduser().exists():
            raise ConfigError(f"--data-path: node {k}'s copy {path} not found")
    return paths


def _local(args) -> int:
    from .local import LocalFederation, check_tools, signals_interrupt
    from .problems_nodes import check_nodes
    from .server_app import FederationConfig

    # Every option is checked before anything starts or is written.
    if args.nodes < 1:
        raise ConfigError(f"--nodes must be at least 1, got {args.nodes}")
    # A token of its own: the interrupted run folder it may leave is told from an older one.
    given = _config(args)
    config = FederationConfig(given.run, timeout=given.timeout, out=given.out, token=uuid.uuid4().hex,
                              audit=given.audit, allow_algorithm_import=given.allow_algorithm_import,
                              min_nodes=given.min_nodes)
    _check_out(config.out)
    data_paths = _data_paths(args)  # before the problem is built (seconds for a text model)
    floors = _floors(args)
    strategy = _check(config)
    deadlines = _deadlines(args, strategy)
    check_nodes(config, args.nodes)
    check_work_covers(strategy)
    check_tools()
    temporary = args.workdir is None  # focusfl's own folder: removed once the federation has succeeded
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="focusfl-federation-"))
    kept = " (a temporary folder, removed if the federation succeeds; --workdir keeps it)" if temporary else ""
    print(f"federation: {args.nodes} SuperNodes on 127.0.0.1{' with TLS' if args.tls else ''}"
          f"{' and node authentication' if args.auth else ''}; logs in {workdir / 'logs'}{kept}", flush=True)
    try:
        with signals_interrupt(), LocalFederation(workdir, args.nodes, tls=args.tls, auth=args.auth,
                                                  deadlines=deadlines, data_paths=data_paths, floors=floors,
                                                  allow_algorithm_import=args.allow_algorithm_import) as federation:
            result = federation.run(config, timeout=federation_wait(args.rounds, args.timeout))
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP (signals_interrupt)
        raise _kept(exc, config) from None
    print("\n".join(line for line in result.stdout.splitlines() if line.startswith(("focusfl", "audit", "done", "work:"))))
    if result.returncode != 0 or (config.out and not (Path(config.out) / "metrics.csv").is_file()):
        raise ConfigError(f"the federation failed{_server_app_reason(result.stdout)} (flwr run exit "
                          f"{result.returncode}); see {workdir / 'logs'}")
    if temporary:  # nothing in it is needed once the run folder is written; a failure keeps it for its logs
        shutil.rmtree(workdir, ignore_errors=True)
    if config.out:
        print(f"results in {config.out}")
    return 0


def federation_wait(rounds: int, timeout: float) -> float:
    """The longest a federation may take: each round's exchanges (train, finish, handshake) wait
    ``timeout`` each, plus 30 s of slack a round, and 10 minutes at least. A float, however many
    rounds (the waits are split up where they are taken: local.py)."""
    return max(600.0, float(rounds) * (3.0 * float(timeout) + 30.0))


def _check_out(out: str | None) -> None:
    """``--out`` can take a run folder (writable, not a user's folder, not a file or '/'):
    checked before the federation runs, as it is written only when the federation ends."""
    if out is not None:
        from ..io.folders import check_target

        check_target(out)


def check_work_covers(strategy) -> None:
    """A work trace (``--work trace:path=...``) names every client the federation asks in every
    round: else the ServerApp would stop at the first (round, client) it lacks. The trace's own
    check (``TraceWork.active_table``), on the rows the federation asks: all clients, or the
    participation process's draws."""
    work = strategy.work
    if not hasattr(work, "active_table"):
        return
    rounds, clients = strategy.rounds, strategy.problem.num_clients
    if strategy.participation is None:
        asked = np.ones((rounds, clients), dtype=bool)  # every node's client, every round
    else:
        asked = strategy.participation.rows(0, rounds)
    try:
        work.active_table(asked)
    except DataError as exc:
        raise ConfigError(f"--work: {exc}; give a trace that covers the {rounds} rounds of this federation, "
                          "or fewer --rounds") from None


def _kept(exc: KeyboardInterrupt, config):
    """The interruption, saying where the rounds done are (the ServerApp, stopped, wrote them)."""
    from ..runs.folder import Interrupted

    code = getattr(exc, "exit_code", 130)
    what = str(exc) or "interrupted"
    done = _rounds_kept(config)
    if done is None:
        return Interrupted(f"{what}; no round was done, nothing was written", code)
    return Interrupted(f"{what}; the {done} rounds done are in {config.out} (config.json says interrupted; "
                       f"replay them with `focusfl run --config {config.out}/config.json --out DIR`)", code)


def _rounds_kept(config) -> int | None:
    """The rounds this federation (its token) wrote to ``config.out`` when it was stopped, or None."""
    if not config.out:
        return None
    try:
        text = (Path(config.out) / "federation.json").read_text()
        info = json.loads(text) if len(text) < (1 << 20) else {}
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not info.get("interrupted"):
        return None
    if (info.get("federation") or {}).get("token") != config.token:
        return None  # an older federation's folder
    return _rows_done(Path(config.out))


def _rows_done(out: Path) -> int | None:
    from ..runs.folder import read_config

    try:
        done = read_config(out).get("rounds_done")
    except ConfigError:
        return None
    return done if isinstance(done, int) else None


def _server_app_reason(output: str) -> str:
    """The ServerApp's own error, from flwr run's stream (': reason'), or ''."""
    marker = "ServerApp failed with exception: "
    for line in reversed(output.splitlines()):
        if marker in line:
            return ": " + line.split(marker, 1)[1].strip()[:300]
    return ""


def _app(args) -> int:
    from .local import write_app

    config = _config(args)
    _check(config)
    folder = write_app(Path(args.folder))
    (folder / "run.toml").write_text(f"focusfl = {json.dumps(config.to_json())}\n")
    print(f"wrote {folder}/pyproject.toml and run.toml; submit with:\n"
          f"  flwr run {folder} YOUR-SUPERLINK-CONNECTION --run-config {folder}/run.toml --stream")
    return 0
