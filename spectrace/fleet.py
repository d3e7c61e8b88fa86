"""``spectrace fleet``: which servers of a fleet report which root causes, from Prometheus.

Prometheus already scrapes the engines' ``/metrics`` (and ``SPECTRACE_METRICS_PORT``);
spectrace's series ride along (spectrace/sinks/prometheus.py). This command asks the
server's HTTP query API (``/api/v1/query``) a few instant queries and prints one screen,
findings first as ``spectrace view`` does: each root cause with the instances and ranks
that report it and its fix, then every instance's accept length against the fleet's, then
the instances that report nothing (down, or up but not traced).

    $ spectrace fleet --prometheus http://prometheus:9090
    $ spectrace fleet --prometheus http://prometheus:9090 --json | jq '.instances[]'
    $ spectrace fleet --prometheus http://prometheus:9090 --fail-on error   # exit 1 on an error root cause

The command's arguments and exit status are ``cli/fleet.py``'s.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from pydantic import BaseModel, Field

from .records import SEVERITY_RANK
from .settings import redact_url, redact_urls
from .viewers.terminal import printable

TIMEOUT_S = 10.0  # every query of one command together
MAX_ANSWER_BYTES = 32 << 20  # one query's answer: a fleet of 10,000 instances is a few MiB
MAX_ROWS = 50  # instances, and places of one root cause, printed (--json has them all)
MAX_LABEL = 80  # characters of a label value printed
LABELS = "instance, job, rank"


class Cause(BaseModel):
    code: str
    severity: str
    rank: str = Field("", description="the traced process's rank ('' when it has none)")
    root: bool = Field(description="a root cause of that process's findings (else it follows from one)")
    count: float = Field(0, description="finding records with this code, all processes of the instance")
    fix: str = ""


class Instance(BaseModel):
    instance: str
    job: str
    up: bool = Field(description="Prometheus' last scrape of it succeeded")
    traced: bool = Field(description="it reports spectrace_info (a process traced with spectrace)")
    ranks: list[str] = []
    accept_length: float | None = Field(None, description="mean accept length since its processes started")
    findings: list[Cause] = []


class Fleet(BaseModel):
    prometheus: str
    accept_length: float | None = Field(None, description="the fleet's mean accept length")
    instances: list[Instance] = []
    silent: list[str] = Field([], description="instances that report nothing of spectrace: down, or not traced")


class FleetError(Exception):
    """Prometheus could not be asked, or answered with an error or something else than an answer."""


class Server:
    """A Prometheus base URL split into what is sent and what may be shown.

    ``http://user:token@host:9090/prefix?api_key=...``: the user and token go as HTTP basic
    authentication (never in the URL sent, never printed), the query string is sent with
    each query; what is printed is :func:`~spectrace.settings.redact_url`'s (no user, no
    query values), as for the OTLP endpoint."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise FleetError(f"--prometheus {redact_url(url)}: not an http:// or https:// URL")
        try:
            port = parts.port
        except ValueError:
            raise FleetError(f"--prometheus {redact_url(url)}: the port is not a number") from None
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        netloc = host + (f":{port}" if port is not None else "")
        self.params = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        self.base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self.auth: str | None = None
        if parts.username is not None:
            pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            self.auth = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        self.shown = redact_url(url)

    def url(self, promql: str) -> str:
        return self.base + "/api/v1/query?" + urllib.parse.urlencode([("query", promql), *self.params])


class Deadline:
    """One deadline for all the queries of a command (:data:`TIMEOUT_S`)."""

    def __init__(self, seconds: float = TIMEOUT_S) -> None:
        self.seconds, self.end = seconds, time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def _fetch(server: Server, promql: str, deadline: Deadline) -> tuple[int, bytes]:
    """(HTTP status, body) of one query, at most :data:`MAX_ANSWER_BYTES`, before the deadline."""
    request = urllib.request.Request(server.url(promql), headers={"Authorization": server.auth} if server.auth else {})
    try:
        response = urllib.request.urlopen(request, timeout=max(0.05, deadline.left()))
    except urllib.error.HTTPError as exc:  # a bad query answers 400 with a JSON error
        response = exc
    with response:
        declared = response.headers.get("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
            raise FleetError(f"{server.shown} answered {int(declared)} bytes; an answer is read up to {MAX_ANSWER_BYTES >> 20} MiB")
        body = bytearray()
        while True:
            if deadline.left() <= 0:
                raise TimeoutError
            chunk = response.read1(65536) if hasattr(response, "read1") else response.read(65536)
            if not chunk:
                return response.status if response.status is not None else response.code, bytes(body)
            body += chunk
            if len(body) > MAX_ANSWER_BYTES:
                raise FleetError(f"{server.shown} answered more than {MAX_ANSWER_BYTES >> 20} MiB; an answer is read up to that")


def query(base: str | Server, promql: str, timeout_s: float = TIMEOUT_S, deadline: Deadline | None = None) -> list[dict[str, Any]]:
    """One instant query; the result vector as ``[{"metric": {...}, "value": float}]``.

    Bounded: the whole command shares one ``deadline`` (a server that trickles bytes is cut
    there, each read's socket timeout is the time left), an answer is read up to
    :data:`MAX_ANSWER_BYTES`, and an answer of another shape than Prometheus' is one
    :class:`FleetError`."""
    server = base if isinstance(base, Server) else Server(base)
    deadline = deadline or Deadline(timeout_s)
    done: dict[str, Any] = {}

    def ask() -> None:  # in a thread: the deadline holds whatever the socket does
        try:
            done["answer"] = _fetch(server, promql, deadline)
        except BaseException as exc:  # handed to the caller
            done["error"] = exc

    worker = threading.Thread(target=ask, name="spectrace-fleet-query", daemon=True)
    worker.start()
    worker.join(max(0.0, deadline.left()))
    error = done.get("error")
    if "answer" not in done and (error is None or isinstance(error, TimeoutError)):
        raise FleetError(f"{server.shown} gave no whole answer within {deadline.seconds:g} s (all queries together)")
    if isinstance(error, FleetError):
        raise error
    if error is not None:
        reason = getattr(error, "reason", None) or error
        raise FleetError(f"cannot ask {server.shown}: {redact_urls(' '.join(str(reason).split()))[:200]}")
    status, raw = done["answer"]
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise FleetError(f"{server.shown}: HTTP {status}, the answer is not JSON (cut short, or not Prometheus)") from None
    if isinstance(body, dict) and body.get("status") == "error":
        raise FleetError(f"{server.shown}: {_text(body.get('errorType', 'error'))}: {_text(body.get('error', 'no reason given'))}")
    return _vector(server, body)


def _text(value: Any, limit: int = 200) -> str:
    return printable(str(value))[:limit]


def _vector(server: Server, body: Any) -> list[dict[str, Any]]:
    """The instant vector of a query's answer, or :class:`FleetError` naming what is not as
    Prometheus' HTTP API answers (``{"status": "success", "data": {"resultType": "vector",
    "result": [{"metric": {label: value}, "value": [time, "number"]}]}}``)."""
    data = body.get("data") if isinstance(body, dict) and body.get("status") == "success" else None
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list):
        what = type(body).__name__ if not isinstance(body, dict) else "data" if not isinstance(data, dict) else "data.result"
        raise FleetError(f"{server.shown}: not a Prometheus query answer ({what} is not what the query API returns)")
    out = []
    for item in result:
        metric = item.get("metric") if isinstance(item, dict) else None
        if not isinstance(metric, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
            raise FleetError(f"{server.shown}: not a Prometheus query answer (a series' metric is not labels of text)")
        value = item.get("value")
        try:
            number = float(value[1])  # type: ignore[index]
        except (IndexError, KeyError, TypeError, ValueError):
            continue  # a sample that is no number: skipped, as Prometheus never sends one
        out.append({"metric": metric, "value": number})
    return out


def _key(metric: dict[str, str]) -> tuple[str, str]:
    return metric.get("instance", ""), metric.get("job", "")


def collect(base: str, job: str | None = None, timeout_s: float = TIMEOUT_S) -> Fleet:
    """What the fleet reports now, from a few instant queries within one deadline."""
    quoted = job.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") if job else ""
    sel = "{" + f'job="{quoted}"' + "}" if job else ""
    server, deadline = Server(base), Deadline(timeout_s)
    fleet = Fleet(prometheus=server.shown)

    def ask(promql: str) -> list[dict[str, Any]]:
        return query(server, promql, deadline=deadline)

    instances: dict[tuple[str, str], Instance] = {}
    for item in ask(f"up{sel}"):
        key = _key(item["metric"])
        instances[key] = Instance(instance=key[0], job=key[1], up=item["value"] == 1, traced=False)
    for item in ask(f"max by ({LABELS}) (spectrace_info{sel})"):
        key = _key(item["metric"])
        inst = instances.setdefault(key, Instance(instance=key[0], job=key[1], up=True, traced=True))
        inst.traced = True
        inst.ranks = sorted({*inst.ranks, item["metric"].get("rank", "")})
    # (instance, job), code, rank -> (count, severity)
    counts = {
        (_key(i["metric"]), i["metric"].get("code", ""), i["metric"].get("rank", "")): (i["value"], i["metric"].get("severity", "info"))
        for i in ask(f"sum by ({LABELS}, code, severity) (spectrace_findings_total{sel})")
    }
    roots = {
        (_key(i["metric"]), i["metric"].get("code", ""), i["metric"].get("rank", "")): i["value"] > 0
        for i in ask(f"max by ({LABELS}, code, severity) (spectrace_root_cause{sel})")
    }
    from .rules.catalogue import CATALOGUE

    for (key, code, rank), (count, severity) in counts.items():
        inst = instances.setdefault(key, Instance(instance=key[0], job=key[1], up=True, traced=True))
        entry = CATALOGUE.get(code)
        inst.findings.append(
            Cause(
                code=code,
                severity=severity,
                rank=rank,
                root=roots.get((key, code, rank), False),
                count=count,
                fix=entry.fix if entry else "",
            )
        )
    for inst in instances.values():
        inst.findings.sort(key=lambda c: (not c.root, SEVERITY_RANK.get(c.severity, 3), c.code, c.rank))
    mean = f"sum by (instance, job) (spectrace_accept_length_sum{sel}) / sum by (instance, job) (spectrace_accept_length_count{sel})"
    for item in ask(mean):
        reporting = instances.get(_key(item["metric"]))
        if reporting is not None and item["value"] == item["value"]:  # NaN: no verify step yet
            reporting.accept_length = item["value"]
    whole = ask(f"sum(spectrace_accept_length_sum{sel}) / sum(spectrace_accept_length_count{sel})")
    if whole and whole[0]["value"] == whole[0]["value"]:
        fleet.accept_length = whole[0]["value"]
    fleet.instances = sorted(instances.values(), key=lambda i: (not any(c.root for c in i.findings), not i.traced, i.job, i.instance))
    fleet.silent = [i.instance for i in fleet.instances if not i.up or not i.traced]
    return fleet


def worst(fleet: Fleet) -> int | None:
    """The rank (records.SEVERITY_RANK) of the worst root cause in the fleet, None with none."""
    ranks = [SEVERITY_RANK.get(c.severity, 3) for i in fleet.instances for c in i.findings if c.root]
    return min(ranks) if ranks else None


def _label(value: str) -> str:
    """A label value as the screen prints it: control characters written out, cut to :data:`MAX_LABEL`."""
    text = printable(value)
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 3] + "..."


def _places(places: list[str]) -> str:
    shown = ", ".join(places[:MAX_ROWS])
    return shown + (f", and {len(places) - MAX_ROWS} more (--json has them all)" if len(places) > MAX_ROWS else "")


def render(fleet: Fleet) -> str:
    """One screen: root causes first (where and the fix), then the instances, then the silent.

    Every label value is escaped and cut (:data:`MAX_LABEL`), and at most :data:`MAX_ROWS`
    instances (and places of one root cause) are listed, the rest said as a count."""
    lines: list[str] = []
    traced = [i for i in fleet.instances if i.traced]
    causes: dict[tuple[str, str], list[str]] = {}
    fixes: dict[str, str] = {}
    for inst in traced:
        for c in inst.findings:
            if c.root:
                where = _label(inst.instance) + (f" rank {_label(c.rank)}" if c.rank else "")
                causes.setdefault((_label(c.severity), _label(c.code)), []).append(where)
                fixes[_label(c.code)] = printable(c.fix)
    bad = {i.instance for i in traced if any(c.root for c in i.findings)}
    lines.append(f"spectrace fleet: {len(traced)} traced instances, {len(bad)} with root causes, {len(fleet.silent)} silent")
    lines.append(f"  from {printable(fleet.prometheus)}")
    lines.append("")
    ordered = sorted(causes.items(), key=lambda kv: (SEVERITY_RANK.get(kv[0][0], 3), kv[0][1]))
    for (severity, code), places in ordered[:MAX_ROWS]:
        lines.append(f"{severity.upper():7} {code} on {len(places)} instance{'s' if len(places) != 1 else ''}: {_places(places)}")
        if fixes.get(code):
            lines.append(f"        fix: {fixes[code]}")
    if len(ordered) > MAX_ROWS:
        lines.append(f"... and {len(ordered) - MAX_ROWS} more root causes (--json has them all)")
    if not causes:
        lines.append("no root causes reported")
    lines.append("")
    fleet_mean = "-" if fleet.accept_length is None else f"{fleet.accept_length:.2f}"
    rows = [(i, "") for i in traced] + [(i, "down" if not i.up else "up, not traced") for i in fleet.instances if not i.traced or not i.up]
    width = max([len(_label(i.instance)) for i, _ in rows[:MAX_ROWS]] + [8])
    lines.append(f"{'instance':<{width}}  {'job':<12} {'accept':>6}  findings (fleet accept length {fleet_mean})")
    for inst, why in rows[:MAX_ROWS]:
        if why:
            lines.append(f"{_label(inst.instance):<{width}}  {_label(inst.job):<12} {'-':>6}  reports nothing ({why})")
            continue
        accept = "-" if inst.accept_length is None else f"{inst.accept_length:.2f}"
        said = [f"{_label(c.code)}{'' if c.root else ' (follows)'}" for c in inst.findings[:MAX_ROWS]] or ["clean"]
        if len(inst.findings) > MAX_ROWS:
            said.append(f"{len(inst.findings) - MAX_ROWS} more")
        lines.append(f"{_label(inst.instance):<{width}}  {_label(inst.job):<12} {accept:>6}  {', '.join(said)}")
    if len(rows) > MAX_ROWS:
        lines.append(f"... and {len(rows) - MAX_ROWS} more instances (--json has them all)")
    return "\n".join(lines)
