"""``rredcot tracking ui|runs|server|sync``: the MLflow UI, a table of runs, a tracking server for
clusters, and the delivery of what jobs logged while their store was away (their journals).

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
import configparser
import io
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

from rredcot.infra.journal import deliver_pending, held, journals
from rredcot.infra.logs import setup_logging
from rredcot.infra.tracking import (
    TAG_PREFIX,
    deliver_record,
    pending_summary,
    retry,
    sqlite_path,
    tracking_uri,
)
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


# Authentication (MLflow's basic-auth app): its files live in ``<results_dir>/tracking-auth/``.
AUTH_DIR = "tracking-auth"
ADMIN_USER = "admin"
JOBS_USER = "rredcot-jobs"
# Authenticated users without a grant on an experiment may read it, not change it. The jobs' user
# holds EDIT on every experiment (create runs, log, set tags; not delete), so jobs also log into
# experiments that were created before authentication was on, or by another user.
DEFAULT_PERMISSION = "READ"
JOBS_PERMISSION = "EDIT"
# MLflow verifies a password with a deliberately slow KDF (PBKDF2) on every request; its auth app
# can cache a verified (user, password) pair, keyed by an HMAC of the password under a per-process
# random key, so a wrong password never matches an entry. With sqlite there is one server process,
# which drops a user's entries as soon as their password changes or they are deleted.
AUTH_CACHE_SECONDS = 60


def _loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1")


def auth_paths(results_dir: str | Path) -> dict[str, Path]:
    """The files of the tracking server's authentication, by role: the folder, the server's ini
    (admin password, auth database), the jobs' environment file and the auth database."""
    folder = Path(results_dir).resolve() / AUTH_DIR
    return {
        "folder": folder,
        "ini": folder / "server.ini",
        "jobs_env": folder / "jobs.env",
        "database": folder / "auth.db",
    }


def _write_private(path: Path, text: str) -> None:
    """Create ``path`` readable by its owner only (mode 0600 from the start: never briefly wider)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def check_private(paths: dict[str, Path]) -> None:
    """Refuse (SystemExit) when the auth folder or a file in it is not this user's alone: anyone
    who can read them can log in as the admin or as the jobs."""
    for path in paths.values():
        if not path.exists():
            continue
        st = path.lstat()
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            want = "700" if path.is_dir() else "600"
            raise SystemExit(
                f"refusing to start the tracking server: {path} (mode {st.st_mode & 0o777:o}, owner uid "
                f"{st.st_uid}) holds credentials but is open to others; make it yours alone "
                f"(chmod {want} {path}) and start again"
            )


def read_env_file(path: Path) -> dict[str, str]:
    """The ``KEY=value`` lines of an env file such as ``jobs.env``."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): shlex.split(value)[0] if value.strip() else "" for key, value in pairs}


def prepare_auth(results_dir: str | Path) -> dict[str, Path]:
    """Make the server's credentials on first start and check them on every start.

    The first start writes, in a folder only its owner can enter: the ini of MLflow's auth app
    (admin user and a random password, the auth database beside it, :data:`DEFAULT_PERMISSION`,
    the credential cache, the Flask secret of its CSRF protection) and ``jobs.env`` with the
    credentials of :data:`JOBS_USER`, a user without admin rights that holds
    :data:`JOBS_PERMISSION` on every experiment. The users are created in the auth database here,
    before the server starts, so no password passes through a command line or a request."""
    import secrets

    paths = auth_paths(results_dir)
    folder = paths["folder"]
    if not paths["ini"].exists():
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.chmod(0o700)  # mkdir's mode is cut by the umask; an existing folder keeps its own
        ini = configparser.ConfigParser()
        ini["mlflow"] = {
            "default_permission": DEFAULT_PERMISSION,
            "database_uri": f"sqlite:///{paths['database']}",
            "admin_username": ADMIN_USER,
            "admin_password": secrets.token_urlsafe(24),
            "auth_cache_ttl_seconds": str(AUTH_CACHE_SECONDS),
        }
        ini["rredcot"] = {"flask_secret_key": secrets.token_urlsafe(32)}
        jobs = {"MLFLOW_TRACKING_USERNAME": JOBS_USER, "MLFLOW_TRACKING_PASSWORD": secrets.token_urlsafe(24)}
        paths["jobs_env"].unlink(missing_ok=True)  # a stale one from a removed ini
        _write_private(paths["jobs_env"], "".join(f"{k}={v}\n" for k, v in jobs.items()))
        text = io.StringIO()
        ini.write(text)
        _write_private(paths["ini"], text.getvalue())
    check_private(paths)
    if not paths["jobs_env"].exists():
        raise SystemExit(f"{paths['jobs_env']} is missing: remove {folder} to make new credentials")

    from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

    ini = configparser.ConfigParser()
    ini.read(paths["ini"])
    store = SqlAlchemyStore()
    store.init_db(ini["mlflow"]["database_uri"])
    try:
        jobs = read_env_file(paths["jobs_env"])
        user = jobs["MLFLOW_TRACKING_USERNAME"]
        if not store.has_user(user, use_primary=True):
            store.create_user(user, jobs["MLFLOW_TRACKING_PASSWORD"])
            store.grant_user_permission(user, "experiment", "*", JOBS_PERMISSION)
        if not store.has_user(ini["mlflow"]["admin_username"], use_primary=True):
            admin = ini["mlflow"]["admin_username"]
            store.create_user(admin, ini["mlflow"]["admin_password"], is_admin=True)
    finally:
        store.engine.dispose()
    if paths["database"].stat().st_mode & 0o077:  # made by the store under the umask
        paths["database"].chmod(0o600)  # (sqlite gives its journal files the database's mode)
    return paths


def auth_required(args: argparse.Namespace) -> bool:
    """Authentication is on whenever the server listens beyond this machine, or when asked for."""
    return args.auth or not _loopback(args.host)


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
    local = _loopback(args.host)
    if auth_required(args):
        # The ini it reads comes from MLFLOW_AUTH_CONFIG_PATH: no credential on the command line.
        cmd += ["--app-name", "basic-auth"]
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


def sync(results_dir: str | Path) -> int:
    """Deliver the pending records of every journal under ``results_dir`` (``rredcot tracking sync``),
    each to the store its job logged to; a journal that a running job holds is left to that job.
    Exit status 1 if some could not be delivered."""
    failed = 0
    for journal in journals(results_dir):
        pending = journal.pending()
        if not pending:
            continue
        if held(journal.path):
            print(f"{journal.id}: skipped, a running job holds it ({pending_summary(pending)} pending)")
            continue
        try:
            deliver_pending(journal, deliver_record)
        except Exception as exc:  # the store is still away: say so, try the other journals
            failed += 1
            left = journal.pending()
            print(
                f"{journal.id}: delivered {pending_summary(pending[: len(pending) - len(left)])}, "
                f"{pending_summary(left)} still pending: {str(exc).splitlines()[0][:300]}"
            )
            continue
        print(f"{journal.id}: delivered {pending_summary(pending)} to run {journal.state().get('run_id')}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m rredcot.infra.tracking {ui,runs,server} [--results-dir results]``."""
    parser = argparse.ArgumentParser(prog="rredcot tracking", description=__doc__.split("\n")[0])
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
    server.add_argument(
        "--auth",
        action="store_true",
        help=f"require a user and password also on loopback (always on for other hosts; "
        f"credentials in <results-dir>/{AUTH_DIR}/)",
    )
    server.add_argument("--print-only", action="store_true", help="only print the command and URI")
    sub_sync = sub.add_parser(
        "sync", help="deliver what jobs logged while the tracking store was away (their journals)"
    )
    results_dir = defaults()["results_dir"]  # the config's own default: the folder jobs write to
    for p in (ui, runs, server, sub_sync):
        p.add_argument("--results-dir", default=results_dir, help=f"the config's results_dir ({results_dir})")
    args = parser.parse_args(argv)

    if args.cmd == "server":
        cmd, uri = _server_command(args)
        print(shlex.join(cmd))
        if args.print_only:
            print(f"export MLFLOW_TRACKING_URI={uri}", flush=True)
            return 0
        Path(args.results_dir).mkdir(parents=True, exist_ok=True)  # for the default sqlite file
        if auth_required(args):
            paths = prepare_auth(args.results_dir)
            os.environ["MLFLOW_AUTH_CONFIG_PATH"] = str(paths["ini"])
            secret = configparser.ConfigParser()
            secret.read(paths["ini"])
            # Flask's CSRF secret: in the environment, which only this user can read (/proc/*/environ).
            os.environ["MLFLOW_FLASK_SERVER_SECRET_KEY"] = secret["rredcot"]["flask_secret_key"]
            print(f"authentication on: jobs log as {JOBS_USER}; the admin's password is in {paths['ini']}")
            print(f"in a job's shell (sbatch passes it on): set -a; . {paths['jobs_env']}; set +a")
        print(f"export MLFLOW_TRACKING_URI={uri}", flush=True)
        # MLflow 3 also starts a pool of job-runner processes (GenAI scorers, trace rollups), which
        # experiment tracking doesn't use: spare the login node them unless asked for.
        os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
        # Become the server (the mlflow of this interpreter), so that signals reach it directly.
        os.execv(sys.executable, [sys.executable, "-m", "mlflow", *cmd[1:]])

    if args.cmd == "sync":
        return sync(args.results_dir)
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
