"""``rredcot tracking ui|runs|server``: the MLflow UI, a table of runs, a tracking server for clusters.

The store is the one jobs write to (:func:`rredcot.infra.tracking.tracking_uri`): ``MLFLOW_TRACKING_URI``
when set, else ``<results_dir>/mlflow.db``.

``ui`` also prints, for each experiment with workflow runs, the link that opens its runs grouped by
invocation, the last invocation first, each group unfolded. Opened from the home page, MLflow 3.17's
UI shows an experiment's GenAI overview instead, with the runs one click away and folded under their
invocation's parent run. The link asks for the UI's model-training pages (``workflowType``) and a
saved view (``viewStateShareKey``, an experiment tag in the form the UI's "Views" menu writes) that
groups the runs by the ``rredcot.invocation`` tag.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

from mlflow import MlflowClient

from rredcot.infra.logs import setup_logging
from rredcot.infra.tracking import TAG_PREFIX, retry, sqlite_path, tracking_uri
from rredcot.settings.config import defaults

# The saved view of the runs, by the id the UI's link names it with (``viewStateShareKey``).
RUNS_VIEW = "runs-by-invocation"
_VIEW_TAG = "mlflow.sharedViewState."
_VIEW_NAME = "Runs by invocation"
_VIEW_STATE = {
    "groupBy": {
        "aggregateFunction": "average",
        "groupByKeys": [{"mode": "tag", "groupByData": f"{TAG_PREFIX}invocation"}],
    }
}


def _ui_command(uri: str, port: int) -> list[str]:
    return ["mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port)]


def runs_url(base: str, experiment_id: str) -> str:
    """The UI link that opens an experiment's runs in the saved view :data:`RUNS_VIEW`."""
    query = urlencode({"workflowType": "machine_learning", "viewStateShareKey": RUNS_VIEW})
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"


def runs_view_tag() -> tuple[str, str]:
    """The experiment tag (key, value) that holds the saved view :data:`RUNS_VIEW`, in the envelope
    MLflow 3.17's UI writes: a name, times in ms and the view state as a JSON string."""
    now = int(time.time() * 1000)
    envelope = {"name": _VIEW_NAME, "createdAt": now, "updatedAt": now, "state": json.dumps(_VIEW_STATE)}
    return f"{_VIEW_TAG}{RUNS_VIEW}", json.dumps(envelope)


def _print_links(uri: str, base: str) -> None:
    """Print the runs link of each experiment with workflow runs (the latest invocation's first),
    saving the view the link opens on an experiment that lacks it."""
    db = sqlite_path(uri)
    if db is not None and not db.exists():  # nothing logged yet: don't create the database
        print(f"no runs yet: open {base}")
        return
    client = MlflowClient(uri)
    found = []
    for exp in retry(client.search_experiments):
        last = retry(
            client.search_runs,
            [exp.experiment_id],
            f"tags.`{TAG_PREFIX}kind` = 'invocation'",
            max_results=1,
            order_by=["attributes.start_time DESC"],
        )
        if last:
            found.append((last[0].info.start_time, exp))
    if not found:
        print(f"no workflow runs yet: open {base}")
    key, value = runs_view_tag()
    for _, exp in sorted(found, key=lambda pair: pair[0], reverse=True):
        if key not in exp.tags:
            retry(client.set_experiment_tag, exp.experiment_id, key, value)
        print(f"experiment {exp.name}: open {runs_url(base, exp.experiment_id)}", flush=True)


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
    ui.add_argument("--print-only", action="store_true", help="only print the command and the links")
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
    results_dir = defaults()["results_dir"]  # the config's own default: the folder jobs write to
    for p in (ui, runs, server):
        p.add_argument("--results-dir", default=results_dir, help=f"the config's results_dir ({results_dir})")
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
        print(f"tracking server {uri}:")
        _print_links(uri, uri)
        return 0
    cmd = _ui_command(uri, args.port)
    print(shlex.join(cmd), flush=True)
    _print_links(uri, f"http://127.0.0.1:{args.port}")
    if args.print_only:
        return 0
    # Run the mlflow of this interpreter, whatever is first on PATH.
    return subprocess.call([sys.executable, "-m", "mlflow", *cmd[1:]])


if __name__ == "__main__":
    setup_logging()
    sys.exit(main())
