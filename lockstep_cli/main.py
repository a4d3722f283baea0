"""Lockstep from the command line: runs, alerts (live with --follow), compare, ack, silence, check.

Server and credentials from flags or the environment (docs/design.md, The agent): `--url` / LOCKSTEP_URL,
`--token` / LOCKSTEP_TOKEN (a project token reads that project), or `lockstep login` (a user's
projects; needed to acknowledge, silence and follow). Exit codes: lockstep_cli.exits, docs/cli.md.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shutil
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from lockstep_cli import exits, logins, tables
from lockstep_cli.client import Client, path_of
from lockstep_cli.exits import CliError
from lockstep_cli.follow import can_follow, feed, wait_for_run


def _common() -> argparse.ArgumentParser:
    """Options every command takes, before or after its name."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS, help="server URL (default $LOCKSTEP_URL)")
    common.add_argument("--token", default=argparse.SUPPRESS, help="project token (default $LOCKSTEP_TOKEN)")
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON (the API's own) instead of tables"
    )
    common.add_argument(
        "--wide",
        "-w",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print every cell in full, one line per row (a terminal otherwise wraps the last column; a pipe cuts long cells)",
    )
    return common


def parser() -> argparse.ArgumentParser:
    common = _common()
    p = argparse.ArgumentParser(
        prog="lockstep",
        parents=[common],
        description=__doc__.split("\n\n")[0],
        epilog="exit codes: 0 ok, 1 a critical incident open (check), 2 usage, 3 server "
        "unreachable, 4 not authenticated (401), 5 forbidden (403), 6 not found (404), "
        "7 input refused (other 4xx), 8 server error",
    )
    verbs = p.add_subparsers(dest="verb", required=True, metavar="COMMAND")

    def verb(name: str, text: str) -> argparse.ArgumentParser:
        return verbs.add_parser(name, parents=[common], help=text, description=text)

    runs = verb("runs", "your runs, newest first, with their verdict and unresolved alerts")
    runs.add_argument("--status", help="only runs of this status: running, finished, failed or stalled")
    runs.add_argument(
        "--verdict", help="only runs of this verdict: in_lockstep, diverged, failed, stalled or recovered"
    )
    alerts = verb("alerts", "a run's alerts (the ranks named are the dissenters)")
    alerts.add_argument("run", help="run key")
    alerts.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="then print each alert change as it happens (needs a login), until Ctrl-C",
    )
    alerts.add_argument(
        "--wait",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="with --follow: wait this long for a run that has not sent its first batch yet (default 600)",
    )
    incidents = verb("incidents", "a run's incidents: alerts grouped by cause, the root rank first")
    incidents.add_argument("run", help="run key")
    cost = verb("cost", "a run's compile bill: GPU time lost to compilation by frame and cause, and the remedies")
    cost.add_argument("run", help="run key")
    compare = verb("compare", "runs side by side: environment, compile summary, frames, first differing step")
    compare.add_argument("runs", nargs="+", metavar="RUN", help="2 to 8 run keys; the first is the reference")
    ack = verb("ack", "acknowledge an alert: you are on it (needs a login; expires when the alert resolves)")
    ack.add_argument("alert", type=int, help="alert id (see `lockstep alerts RUN`)")
    resolve = verb(
        "resolve",
        "resolve a stale alert by hand, saying why (a login, or a token made with the resolve scope)",
    )
    resolve.add_argument("alert", type=int, help="alert id (see `lockstep alerts RUN`)")
    resolve.add_argument("--reason", required=True, help="why (shown with the alert and sent to its destinations)")
    silence = verb("silence", "mute notifications of matching alerts for a while (needs a login)")
    silence.add_argument("--run", help="only this run's alerts")
    silence.add_argument("--kind", help="only alerts of this kind, e.g. grad_divergence")
    silence.add_argument("--rank", type=int, help="only alerts naming this rank")
    silence.add_argument("--project", help="the project, when no --run names it and you have several")
    silence.add_argument("--hours", type=float, default=2.0, help="how long (default 2)")
    silence.add_argument("--comment", required=True, help="why (shown with the silence)")
    check = verb("check", "exit 1 while a critical incident of RUN is open and unacknowledged, else 0 (for CI)")
    check.add_argument(
        "run", nargs="?", help="run key (default: the newest run you can see, when all of them are of one project)"
    )
    login = verb("login", "log in as a user (kept in ~/.config/lockstep/logins.json, mode 0600)")
    login.add_argument("--user", default=os.environ.get("USER"), help="user name (default $USER)")
    login.add_argument("--password-stdin", action="store_true", help="read the password from stdin, not a prompt")
    verb("logout", "end the stored login, on the server too")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    tables.LAYOUT.wide = getattr(args, "wide", False)
    tables.LAYOUT.columns = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    url = getattr(args, "url", None) or os.environ.get("LOCKSTEP_URL", "")
    try:
        if not url:
            raise CliError("no server: pass --url or set LOCKSTEP_URL", exits.USAGE)
        url = url.rstrip("/")
        client = Client(url, getattr(args, "token", None) or os.environ.get("LOCKSTEP_TOKEN"), logins.load(url))
        return COMMANDS[args.verb](client, args, getattr(args, "json", False))
    except CliError as err:
        print(f"lockstep: {tables.clean(str(err))}", file=sys.stderr)  # errors quote the server
        return err.code
    except KeyboardInterrupt:
        return exits.INTERRUPTED


def _print_json(value: object) -> None:
    print(json.dumps(value, sort_keys=True), flush=True)


def runs_cmd(client: Client, args: argparse.Namespace, as_json: bool) -> int:
    narrowed = {name: value for name in ("status", "verdict") if (value := getattr(args, name))}
    body = client.get("/runs", **narrowed)
    if as_json:
        _print_json(body)
        return exits.OK
    rows = [
        [
            r["key"],
            r["project"],
            r["status"],
            r["world_size"],
            r["torch_version"],
            r["last_step"],
            r["alerts"]["critical"],
            r["alerts"]["warning"],
            r["started_at"][:19],
            r["verdict"]["text"],
        ]
        for r in body["runs"]
    ]
    headers = ("run", "project", "status", "ranks", "torch", "last_step", "critical", "warning", "started", "verdict")
    print(tables.table(headers, rows) if rows else "no runs")
    return exits.OK


def alerts_cmd(client: Client, args: argparse.Namespace, as_json: bool) -> int:
    if not args.follow:
        listed = all_alerts(client, args.run)
        if as_json:
            _print_json({"alerts": listed})
        else:
            print(tables.alerts(listed))
        return exits.OK
    login = can_follow(client)  # a token-only user hears so now, not after waiting for the run
    wait_for_run(client, args.run, args.wait)  # a follower started before the job's first batch
    with feed(client, args.run, login) as messages:  # subscribed before listing: nothing falls in between
        listed = all_alerts(client, args.run)
        if as_json:
            for alert in listed:
                _print_json(alert)
        else:
            print(tables.alerts(listed), flush=True)
            print(f"-- following {args.run} (Ctrl-C to stop)", flush=True)
        for alert in messages():
            if as_json:
                _print_json(alert)
            else:
                print("  ".join(tables.cell(v) for v in tables.alert_row(alert)), flush=True)
    return exits.OK


def all_alerts(client: Client, key: str) -> list[dict[str, Any]]:
    """Every alert of the run: the API answers a page at a time, each naming the next (`alerts_page`)."""
    listed: list[dict[str, Any]] = []
    page = "1"
    while True:
        body = client.get(f"/runs/{path_of(key)}/alerts", page=page)
        listed += body["alerts"]
        following = body.get("alerts_page", {}).get("next")
        if not following:
            return listed
        page = parse_qs(urlsplit(following).query)["page"][0]


def cost_cmd(client: Client, args: argparse.Namespace, as_json: bool) -> int:
    bill = client.get(f"/runs/{path_of(args.run)}/cost")
    if as_json:
        _print_json(bill)
        return exits.OK
    print(tables.cost(bill))
    return exits.OK


def compare_cmd(client: Client, args: argparse.Namespace, as_json: bool) -> int:
    body = client.get("/compare", runs=",".join(args.runs))
    if as_json:
        _print_json(body)
        return exits.OK
    keys = [r["key"] for r in body["runs"]]
    print(
        tables.table(("run", "torch", "ranks"), [[r["key"], r["torch_version"], r["world_size"]] for r in body["runs"]])
    )
    differing = [[row["field"], *row["values"]] for row in body["environment"] if not row["same"]]
    print("\nenvironment: " + ("no differences" if not differing else f"{len(differing)} fields differ"))
    if differing:
        print(tables.table(("field", *keys), differing))
    metrics = list(body["compile_summary"][0]) if body["compile_summary"] else []
    print("\ncompile summary (per rank)")
    print(tables.table(("", *keys), [[m, *(s.get(m) for s in body["compile_summary"])] for m in metrics]))
    unequal = [f for f in body["frames"] if not f["graph_equal"]]
    print(f"\nframes: {len(body['frames'])}, {len(unequal)} with different graphs")
    if unequal:
        print(
            tables.table(
                ("frame", *(f"compiles {k}" for k in keys)),
                [[f["key"], *(c["compiles"] if c else None for c in f["cells"])] for f in unequal],
            )
        )
    print()
    for fp in body["fingerprints"]:
        where = f"first differs at step {fp['first_step']}" if fp["first_step"] is not None else "no step differs"
        print(
            tables.clean(
                f"gradient fingerprints, {keys[0]} vs {fp['run']}: {where} ({fp['steps_compared']} steps compared)"
            )
        )
    return exits.OK


def ack_cmd(client: Client, args: argparse.Namespace, as_json: bool) -> int:
    alert = client.post(f"/alerts/{args.alert}/ack", {})
    if as_json:
        _print_json(alert)
    else:
        print(
            tables.clean(
                f"acknowledged alert {alert['id']} ({alert['kind']}, run {alert['run']}) as {alert['acked_by']}"
            )
        )
    return exits.OK


def resolve_cmd(client: Client, args: argparse.Namespace, as_json: bool) -> int:
    alert = client.post(f"/alerts/{args.alert}/resolve", {"reason": args.reason})
    if as_json:
        _print_json(alert)
    else:
        print(
            tables.clean(
                f"alert {alert['id']} ({alert['kind']}, run {alert['run']}): {alert['resolve_reason']}"
                + (f" by {alert['resolved_by']}" if alert.get("resolved_by") else "")
            )
        )
    return exits.OK


def silence_cmd(client: Client, args: argparse.Namespace, as_json: bool) -> int:
    fields = {"run": args.run, "kind": args.kind, "rank": args.rank, "project": args.project}
    body = {"hours": args.hours, "comment": args.comment, **{k: v for k, v in fields.items() if v is not None}}
    made = client.post("/silences", body)
    if as_json:
        _print_json(made)
    else:
        scope = ", ".join(f"{k} {made[k]}" for k in ("run", "kind", "rank") if made.get(k) is not None) or "everything"
        print(tables.clean(f"silence {made['id']} in project {made['project']} ({scope}) until {made['expires_at']}"))
    return exits.OK


def check_cmd(client: Client, args: argparse.Namespace, as_json: bool) -> int:
    """Fails while a critical incident is open and nobody acknowledged it. An incident stays open
    until the evidence says the ranks agree again (a diverged rank's weights match at a later
    fingerprint); one that only the run's end closed (ended unresolved) still fails the check until
    acknowledged, so a diverged rank never clears itself when the job stops. An acknowledgement lasts
    until it resolves. The run's verdict comes first, named by its key (the newest run without one)."""
    key = args.run or newest_run(client)
    judged = client.get(f"/runs/{path_of(key)}")["verdict"]
    found = client.get(f"/runs/{path_of(key)}/incidents")["incidents"]
    critical = [i for i in found if i["severity"] == "critical" and i["unresolved"]]
    unhandled = [i for i in critical if i["acked_by"] is None]
    if as_json:
        _print_json(
            {
                "run": key,
                "verdict": judged,
                "ok": not unhandled,
                "firing": unhandled,
                "acknowledged": [i for i in critical if i["acked_by"] is not None],
            }
        )
    elif unhandled:
        print(tables.clean(f"{key}: {judged['text']}"))
        print(f"{len(unhandled)} critical incident(s) unresolved and unacknowledged")
        print(tables.incidents(unhandled))
    else:
        acked = len(critical) - len(unhandled)
        print(tables.clean(f"{key}: {judged['text']}"))
        print("no critical incident unresolved" + (f" and unacknowledged ({acked} acknowledged)" if acked else ""))
    return exits.FIRING if unhandled else exits.OK


def newest_run(client: Client) -> str:
    """The newest run the caller sees (a project token: its project's), for `check` without a key (the
    agent's generated one is printed by rank 0 only). Refused when those runs are of several
    projects: which one CI meant would be a guess."""
    runs = client.get("/runs")["runs"]
    projects = sorted({run["project"] for run in runs})
    if len(projects) > 1:
        raise CliError(f"name the run: you see runs of {len(projects)} projects ({', '.join(projects)})", exits.USAGE)
    if not runs:
        raise CliError("no run to check: none has reported yet", exits.NOT_FOUND)
    return str(runs[0]["key"])


def incidents_cmd(client: Client, args: argparse.Namespace, as_json: bool) -> int:
    body = client.get(f"/runs/{path_of(args.run)}/incidents")
    if as_json:
        _print_json(body)
    else:
        print(tables.incidents(body["incidents"]))
    return exits.OK


def login_cmd(client: Client, args: argparse.Namespace, as_json: bool) -> int:
    if not args.user:
        raise CliError("pass --user", exits.USAGE)
    password = (
        sys.stdin.readline().rstrip("\n") if args.password_stdin else getpass.getpass(f"password for {args.user}: ")
    )
    login = client.sign_in(args.user, password)
    logins.save(client.url, login)
    if as_json:
        _print_json({"url": client.url, "user": login.user})
    else:
        print(f"logged in to {client.url} as {login.user}")
    return exits.OK


def logout_cmd(client: Client, args: argparse.Namespace, as_json: bool) -> int:
    if client.login is None:
        print(f"not logged in to {client.url}")
        return exits.OK
    client.sign_out()
    logins.forget(client.url)
    print(f"logged out of {client.url}")
    return exits.OK


COMMANDS: dict[str, Callable[[Client, argparse.Namespace, bool], int]] = {
    "runs": runs_cmd,
    "alerts": alerts_cmd,
    "cost": cost_cmd,
    "compare": compare_cmd,
    "ack": ack_cmd,
    "resolve": resolve_cmd,
    "silence": silence_cmd,
    "check": check_cmd,
    "incidents": incidents_cmd,
    "login": login_cmd,
    "logout": logout_cmd,
}
