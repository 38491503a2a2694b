"""``rredcot tracking ui|runs|server``: the MLflow UI, a table of runs, a tracking server for clusters.

The store is the one jobs write to (:func:`rredcot.infra.tracking.tracking_uri`): ``MLFLOW_TRACKING_URI``
when set, else ``<results_dir>/mlflow.db``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

from mlflow import MlflowClient

from rredcot.infra.logs import setup_logging
from rredcot.infra.tracking import TAG_PREFIX, sqlite_path, tracking_uri


def _ui_command(uri: str, port: int) -> list[str]:
    return ["mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port)]


def _host_name() -> str:
    """This machine's name as other nodes know it: the FQDN, unless it only resolves to localhost."""
    fqdn = socket.getfqdn()
    return socket.gethostname() if fqdn.startswith("localhost") else fqdn


def _server_command(args: argparse.Namespace) -> tuple[list[str], str]:
    """The ``mlflow server`` command line of ``rredcot tracking server`` and the URI jobs should use.

    Defaults keep everything in ``results_dir``, as the local store does: the same ``mlflow.db`` and
    artifacts under ``mlartifacts/`` (the server proxies them, so jobs need no access to that folder)."""
    root = Path(args.results_dir).resolve()
    backend = args.backend_store_uri or f"sqlite:///{root}/mlflow.db"
    artifacts = args.artifacts_destination or str(root / "mlartifacts")
    # sqlite serialises writers anyway; more workers would only contend for its lock.
    workers = args.workers or (1 if backend.startswith("sqlite:") else 4)
    cmd = ["mlflow", "server", "--backend-store-uri", backend, "--artifacts-destination", artifacts]
    cmd += ["--serve-artifacts", "--host", args.host, "--port", str(args.port), "--workers", str(workers)]
    local = args.host in ("127.0.0.1", "localhost", "::1")
    # Jobs on other nodes reach us by this machine's name: MLflow rejects Host headers it doesn't
    # know (DNS-rebinding protection; its default allows only localhost and private IPs).
    name = args.host if args.host not in ("0.0.0.0", "::", "") else _host_name()
    if args.allowed_hosts:
        cmd += ["--allowed-hosts", args.allowed_hosts]
    elif not local:
        from mlflow.server.security_utils import get_default_allowed_hosts

        names = sorted({socket.gethostname(), socket.getfqdn(), name})
        allowed = [*get_default_allowed_hosts(), *names, *(f"{n}:*" for n in names)]
        cmd += ["--allowed-hosts", ",".join(dict.fromkeys(allowed))]
    return cmd, f"http://{name}:{args.port}"


def _print_runs(uri: str, experiment: str | None, invocation: str | None) -> int:
    db = sqlite_path(uri)
    if db is not None and not db.exists():  # don't create an empty database just to list it
        print(f"no tracking database at {db}")
        return 1
    client = MlflowClient(uri)
    exps = [e for e in client.search_experiments() if experiment in (None, e.name)]
    if not exps:
        print("no experiments")
        return 1
    where = f"tags.`{TAG_PREFIX}invocation` = '{invocation}'" if invocation else ""
    rows = [("experiment", "run", "rule", "arm", "seed", "status", "#metrics")]
    names = {e.experiment_id: e.name for e in exps}  # runs come newest first (MLflow default)
    token = None
    while True:
        page = client.search_runs(list(names), where, max_results=1000, page_token=token)
        for r in page:
            tag = {k.removeprefix(TAG_PREFIX): v for k, v in r.data.tags.items()}
            rule = tag.get("rule", "(invocation)" if tag.get("kind") == "invocation" else "")
            run = (r.info.run_name or r.info.run_id, rule, tag.get("arm", ""), tag.get("seed", ""))
            rows.append((names[r.info.experiment_id], *run, r.info.status, str(len(r.data.metrics))))
        if not (token := page.token):
            break
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m rredcot.infra.tracking {ui,runs,server} [--results-dir results]``."""
    parser = argparse.ArgumentParser(
        prog="python -m rredcot.infra.tracking", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    ui = sub.add_parser("ui", help="start the MLflow UI on the tracking store")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--print-only", action="store_true", help="only print the command")
    runs = sub.add_parser("runs", help="print a table of runs")
    runs.add_argument("--experiment", help="only this experiment")
    runs.add_argument("--invocation", help="only runs of this invocation id")
    server = sub.add_parser(
        "server",
        help="run an MLflow tracking server (for jobs on other nodes); prints the URI to export",
    )
    server.add_argument("--host", default="127.0.0.1", help="interface; 0.0.0.0 to serve other nodes")
    server.add_argument("--port", type=int, default=5000)
    server.add_argument(
        "--backend-store-uri",
        help="database (default: sqlite:///<results-dir>/mlflow.db; or postgresql://...)",
    )
    server.add_argument("--artifacts-destination", help="artifact root (default: <results-dir>/mlartifacts)")
    server.add_argument("--workers", type=int, help="server processes (default: 1 for sqlite, else 4)")
    server.add_argument("--allowed-hosts", help="Host headers to accept (default: this machine's names)")
    server.add_argument("--print-only", action="store_true", help="only print the command and URI")
    for p in (ui, runs, server):
        p.add_argument("--results-dir", default="results")
    args = parser.parse_args(argv)

    if args.cmd == "server":
        cmd, uri = _server_command(args)
        print(shlex.join(cmd))
        print(f"export MLFLOW_TRACKING_URI={uri}", flush=True)
        if args.print_only:
            return 0
        Path(args.results_dir).mkdir(parents=True, exist_ok=True)  # for the default sqlite file
        # MLflow 3 also starts a pool of job-runner processes (GenAI scorers, trace rollups), which
        # experiment tracking doesn't use: spare the login node them unless asked for.
        os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
        # Become the server (the mlflow of this interpreter), so that signals reach it directly.
        os.execv(sys.executable, [sys.executable, "-m", "mlflow", *cmd[1:]])

    uri = tracking_uri(args.results_dir)
    if args.cmd == "runs":
        return _print_runs(uri, args.experiment, args.invocation)
    if uri.startswith(("http://", "https://")):
        print(f"tracking server: open {uri} in a browser")
        return 0
    cmd = _ui_command(uri, args.port)
    print(shlex.join(cmd), flush=True)
    if args.print_only:
        return 0
    # Run the mlflow of this interpreter, whatever is first on PATH.
    return subprocess.call([sys.executable, "-m", "mlflow", *cmd[1:]])


if __name__ == "__main__":
    setup_logging()
    sys.exit(main())
