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

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from pydantic import BaseModel, Field

from .records import SEVERITY_RANK

TIMEOUT_S = 10.0
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
    """Prometheus could not be asked, or answered with an error."""


def query(base: str, promql: str, timeout_s: float = TIMEOUT_S) -> list[dict[str, Any]]:
    """One instant query; the result vector as ``[{"metric": {...}, "value": float}]``."""
    url = base.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:  # a bad query answers 400 with a JSON error
        try:
            body = json.loads(exc.read().decode("utf-8"))
        except Exception:
            raise FleetError(f"{base}: HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise FleetError(f"cannot ask {base}: {exc}") from None
    if body.get("status") != "success":
        raise FleetError(f"{base}: {body.get('errorType', 'error')}: {body.get('error', 'no reason given')}")
    out = []
    for item in body.get("data", {}).get("result", []):
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        out.append({"metric": item.get("metric", {}), "value": value})
    return out


def _key(metric: dict[str, str]) -> tuple[str, str]:
    return metric.get("instance", ""), metric.get("job", "")


def collect(base: str, job: str | None = None) -> Fleet:
    """What the fleet reports now, from a few instant queries."""
    sel = "{" + f'job="{job}"' + "}" if job else ""
    fleet = Fleet(prometheus=base)
    instances: dict[tuple[str, str], Instance] = {}
    for item in query(base, f"up{sel}"):
        key = _key(item["metric"])
        instances[key] = Instance(instance=key[0], job=key[1], up=item["value"] == 1, traced=False)
    for item in query(base, f"max by ({LABELS}) (spectrace_info{sel})"):
        key = _key(item["metric"])
        inst = instances.setdefault(key, Instance(instance=key[0], job=key[1], up=True, traced=True))
        inst.traced = True
        inst.ranks = sorted({*inst.ranks, item["metric"].get("rank", "")})
    # (instance, job), code, rank -> (count, severity)
    counts = {
        (_key(i["metric"]), i["metric"].get("code", ""), i["metric"].get("rank", "")): (i["value"], i["metric"].get("severity", "info"))
        for i in query(base, f"sum by ({LABELS}, code, severity) (spectrace_findings_total{sel})")
    }
    roots = {
        (_key(i["metric"]), i["metric"].get("code", ""), i["metric"].get("rank", "")): i["value"] > 0
        for i in query(base, f"max by ({LABELS}, code, severity) (spectrace_root_cause{sel})")
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
    for item in query(base, mean):
        reporting = instances.get(_key(item["metric"]))
        if reporting is not None and item["value"] == item["value"]:  # NaN: no verify step yet
            reporting.accept_length = item["value"]
    whole = query(base, f"sum(spectrace_accept_length_sum{sel}) / sum(spectrace_accept_length_count{sel})")
    if whole and whole[0]["value"] == whole[0]["value"]:
        fleet.accept_length = whole[0]["value"]
    fleet.instances = sorted(instances.values(), key=lambda i: (not any(c.root for c in i.findings), not i.traced, i.job, i.instance))
    fleet.silent = [i.instance for i in fleet.instances if not i.up or not i.traced]
    return fleet


def worst(fleet: Fleet) -> int | None:
    """The rank (records.SEVERITY_RANK) of the worst root cause in the fleet, None with none."""
    ranks = [SEVERITY_RANK.get(c.severity, 3) for i in fleet.instances for c in i.findings if c.root]
    return min(ranks) if ranks else None


def render(fleet: Fleet) -> str:
    """One screen: root causes first (where and the fix), then the instances, then the silent."""
    lines: list[str] = []
    traced = [i for i in fleet.instances if i.traced]
    causes: dict[tuple[str, str], list[str]] = {}
    fixes: dict[str, str] = {}
    for inst in traced:
        for c in inst.findings:
            if c.root:
                where = inst.instance + (f" rank {c.rank}" if c.rank else "")
                causes.setdefault((c.severity, c.code), []).append(where)
                fixes[c.code] = c.fix
    bad = {i.instance for i in traced if any(c.root for c in i.findings)}
    lines.append(f"spectrace fleet: {len(traced)} traced instances, {len(bad)} with root causes, {len(fleet.silent)} silent")
    lines.append(f"  from {fleet.prometheus}")
    lines.append("")
    for (severity, code), places in sorted(causes.items(), key=lambda kv: (SEVERITY_RANK.get(kv[0][0], 3), kv[0][1])):
        lines.append(f"{severity.upper():7} {code} on {len(places)} instance{'s' if len(places) != 1 else ''}: {', '.join(places)}")
        if fixes.get(code):
            lines.append(f"        fix: {fixes[code]}")
    if not causes:
        lines.append("no root causes reported")
    lines.append("")
    fleet_mean = "-" if fleet.accept_length is None else f"{fleet.accept_length:.2f}"
    width = max([len(i.instance) for i in fleet.instances] + [8])
    lines.append(f"{'instance':<{width}}  {'job':<12} {'accept':>6}  findings (fleet accept length {fleet_mean})")
    for inst in traced:
        accept = "-" if inst.accept_length is None else f"{inst.accept_length:.2f}"
        said = [f"{c.code}{'' if c.root else ' (follows)'}" for c in inst.findings] or ["clean"]
        lines.append(f"{inst.instance:<{width}}  {inst.job:<12} {accept:>6}  {', '.join(said)}")
    for inst in fleet.instances:
        if not inst.traced or not inst.up:
            why = "down" if not inst.up else "up, not traced"
            lines.append(f"{inst.instance:<{width}}  {inst.job:<12} {'-':>6}  reports nothing ({why})")
    return "\n".join(lines)
