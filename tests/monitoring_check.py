#!/usr/bin/python3
"""Evaluates every expression of the Grafana dashboard and of the rule file
through a running Prometheus' HTTP API and requires each to return data.

  monitoring_check.py --prometheus http://127.0.0.1:PORT \
      --dashboard deploy/monitoring/driftkv-dashboard.json \
      --rules deploy/monitoring/driftkv-rules.yml \
      [--expect-alerts DriftkvPoolNearlyFull,...] [--rate-interval 30s]

Dashboard: the variable queries (label_values(...)) first, then every
panel target, with the Grafana variables substituted as Grafana would:
$device and $instance by the regex of all their values ("All") and again
by each single instance, $__rate_interval and $__interval by
--rate-interval. Each must return at least one sample; samples must not all
be NaN, except in panels whose title ends in "(cuda)" (the Attend batcher
observes nothing on the CPU backend; docs/operations.md).

Rules: every recording rule's expression and its recorded series; every
alert's expression, or where its threshold is not crossed by this
workload, the expression's left-hand side (its signal) must return data.
The alerts named by --expect-alerts must be pending or firing.

Also checks the dashboard's structure: the ${DS_PROMETHEUS} input is the
datasource of every panel and target, the variables instance and device
exist, panel ids are unique. Prints one line per expression; exits 1 on any
failure.
"""
import argparse
import json
import math
import re
import sys
import urllib.parse
import urllib.request

import yaml


def query(base, expr):
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]


def samples(data):
    """(labels, float value) of a vector or scalar result."""
    if data["resultType"] == "vector":
        return [(s["metric"], float(s["value"][1])) for s in data["result"]]
    if data["resultType"] == "scalar":
        return [({}, float(data["result"][1]))]
    if data["resultType"] == "matrix":
        return [(s["metric"], float(v[1])) for s in data["result"] for v in s["values"]]
    return []


COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")


def signal_of(expr):
    """The left-hand side of expr's first top-level comparison, or None."""
    depth, quote, i = 0, None, 0
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            for op in COMPARISONS:
                if expr.startswith(op, i):
                    return expr[:i].strip()
        i += 1
    return None


def grafana_regex(values):
    """Grafana's formatting of a multi-value variable for Prometheus."""
    esc = [re.sub(r"([\\.^$*+?()\[\]{}|])", r"\\\\\1", v) for v in values]
    return esc[0] if len(esc) == 1 else "(" + "|".join(esc) + ")"


def substitute(expr, variables, rate_interval):
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__interval", rate_interval)
    for name, value in variables.items():
        expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
    return expr


def label_values(base, q, variables, rate_interval):
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", q)
    if not m:
        raise RuntimeError(f"unsupported variable query {q}")
    selector, label = substitute(m.group(1), variables, rate_interval), m.group(2)
    return sorted({s[0].get(label) for s in samples(query(base, selector)) if s[0].get(label)})


class Checker:
    def __init__(self, base):
        self.base, self.failures, self.count = base, 0, 0

    def expect_data(self, what, expr, allow_nan=False):
        self.count += 1
        try:
            got = samples(query(self.base, expr))
        except Exception as e:  # a bad expression is a failure, not a crash
            print(f"FAIL  {what}: {e}")
            self.failures += 1
            return False
        finite = [v for _, v in got if not math.isnan(v)]
        if not got or (not finite and not allow_nan):
            print(f"FAIL  {what}: {'no data' if not got else 'only NaN'}\n      {expr}")
            self.failures += 1
            return False
        note = "" if finite else " (NaN only: allowed, cuda-only panel)"
        print(f"ok    {what}: {len(got)} series{note}")
        return True


def check_dashboard(c, path, rate_interval):
    dash = json.load(open(path))
    inputs = [i["name"] for i in dash.get("__inputs", [])]
    if "DS_PROMETHEUS" not in inputs:
        print("FAIL  dashboard: no DS_PROMETHEUS input")
        c.failures += 1
    ids = set()
    panels = [p for p in dash["panels"] if p.get("type") != "row"]
    for p in dash["panels"]:
        if p["id"] in ids:
            print(f"FAIL  dashboard: panel id {p['id']} twice")
            c.failures += 1
        ids.add(p["id"])
    for p in panels:
        for ds in [p.get("datasource")] + [t.get("datasource") for t in p["targets"]]:
            if not ds or ds.get("uid") != "${DS_PROMETHEUS}":
                print(f"FAIL  dashboard: panel {p['title']!r} datasource {ds}")
                c.failures += 1
    var = {v["name"]: v for v in dash["templating"]["list"]}
    for name in ("device", "instance"):
        if name not in var:
            print(f"FAIL  dashboard: no variable {name}")
            c.failures += 1
            return
    # Variables in order (instance depends on device), each must list values.
    values = {}
    subst = {}
    for name in ("device", "instance"):
        q = var[name]["query"]["query"] if isinstance(var[name]["query"], dict) else var[name]["query"]
        c.count += 1
        values[name] = label_values(c.base, q, subst, rate_interval)
        if not values[name]:
            print(f"FAIL  variable {name}: {q} lists nothing")
            c.failures += 1
            return
        print(f"ok    variable {name}: {values[name]}")
        subst[name] = grafana_regex(values[name])
    passes = [("All", dict(subst))] + [
        (f"instance={v}", dict(subst, instance=grafana_regex([v]))) for v in values["instance"]]
    for label, variables in passes:
        for p in panels:
            allow_nan = p["title"].endswith("(cuda)")
            for t in p["targets"]:
                c.expect_data(f"panel {p['title']!r} {t['refId']} [{label}]",
                              substitute(t["expr"], variables, rate_interval), allow_nan)
    return len(panels)


def check_rules(c, path, expect_alerts):
    groups = yaml.safe_load(open(path))["groups"]
    for g in groups:
        for r in g["rules"]:
            expr = r["expr"]
            if "record" in r:
                c.expect_data(f"record {r['record']} (expr)", expr)
                c.expect_data(f"record {r['record']} (series)", r["record"])
                continue
            name = r["alert"]
            c.count += 1
            if samples(query(c.base, expr)):
                print(f"ok    alert {name}: its expression returns data (threshold crossed)")
                continue
            lhs = signal_of(expr)
            if lhs is None:
                print(f"FAIL  alert {name}: no data and no comparison to take the signal from")
                c.failures += 1
                continue
            c.count -= 1
            c.expect_data(f"alert {name} (signal, threshold not crossed)", lhs)
    with urllib.request.urlopen(c.base + "/api/v1/alerts", timeout=30) as r:
        active = {(a["labels"]["alertname"], a["state"]) for a in json.load(r)["data"]["alerts"]}
    for name in expect_alerts:
        c.count += 1
        states = sorted(s for n, s in active if n == name)
        if states:
            print(f"ok    alert {name} is {'/'.join(states)}")
        else:
            print(f"FAIL  alert {name} is neither pending nor firing (active: {sorted(active)})")
            c.failures += 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--rules", required=True)
    ap.add_argument("--expect-alerts", default="")
    ap.add_argument("--rate-interval", default="30s")
    a = ap.parse_args()
    c = Checker(a.prometheus.rstrip("/"))
    check_dashboard(c, a.dashboard, a.rate_interval)
    check_rules(c, a.rules, [n for n in a.expect_alerts.split(",") if n])
    print(f"{c.count - c.failures} of {c.count} expressions returned data, {c.failures} failed")
    sys.exit(1 if c.failures else 0)


if __name__ == "__main__":
    main()
