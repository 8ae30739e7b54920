#!/usr/bin/env python3
"""Checks that the Grafana dashboard and the alert rules query only metrics
Mesh exports.

  scripts/check_dashboard.py [--dashboard FILE]... [--rules FILE]...
                             (--metrics DUMP... | --docs docs/metrics.md)

Metric names are taken from every PromQL `expr` of the dashboards' panels
and the rules files, and from the dashboards' `label_values(metric, label)`
variables. Each must be in the reference:

  --metrics DUMP  text exposition files (what /metrics served, several
                  binaries' outputs concatenated or one file each);
  --docs FILE     the tables of docs/metrics.md.

With --prometheus URL, every query is also evaluated by that Prometheus
(/api/v1/query, Grafana's variables replaced by `.*` and 1m), so a query
that does not parse is reported too.

--absent-ok NAME (repeatable) accepts NAME although the reference lacks it,
for a family that the binaries export only after an event a test cannot
cause; it is still reported, as a note.

A histogram's `_bucket`, `_sum` and `_count` series match its family. The
series Prometheus makes itself (`up`, `scrape_*`) always match.

The dashboard must also hold together: valid JSON, unique panel ids, a
`datasource` variable that every panel and query uses, a refId and an expr
on every query. Exits 0 when everything checks, 1 with one line per problem
otherwise (also when no metric name was found at all, so that a broken
extractor cannot pass), 2 for bad arguments or unreadable files.

Python 3 standard library only: the alert rules are read with a small
line-based reader that understands `expr:` as a plain, quoted or block
(`|`, `>`, `>-`) scalar, which is all alerts.yml uses.
"""

import argparse
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

# Series Prometheus adds to every target itself.
SYNTHETIC = {
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
}
SUFFIXES = ("_bucket", "_sum", "_count")
KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
    "group_left", "group_right", "inf", "nan", "atan2",
}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w.:])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_LABEL_VALUES = re.compile(r"label_values\s*\(\s*([^,()]+?)\s*,")


def metric_names(expr):
    """Metric names in a PromQL expression (a set)."""
    text = _STRING.sub(" ", expr)
    text = _VARIABLE.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names


def read_reference_metrics(paths):
    """{family or series name: type} from text exposition dumps."""
    known = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line.startswith("# TYPE "):
                    parts = line.split()
                    if len(parts) >= 4:
                        known[parts[2]] = parts[3]
                elif line and not line.startswith("#"):
                    name = re.split(r"[{\s]", line, maxsplit=1)[0]
                    known.setdefault(name, "sample")
    return known


def read_reference_docs(path):
    """{family: type} from docs/metrics.md's tables: | `name` | type | ..."""
    known = {}
    row = re.compile(r"^\|\s*`([a-z_:][a-z0-9_:]*)`\s*\|\s*(\w+)\s*\|")
    with open(path, encoding="utf-8") as f:
        for line in f:
            match = row.match(line)
            if match:
                known[match.group(1)] = match.group(2)
    return known


def is_known(name, known):
    if name in SYNTHETIC or name in known:
        return True
    for suffix in SUFFIXES:
        if name.endswith(suffix) and known.get(name[: -len(suffix)]) in ("histogram", "summary"):
            return True
    return False


def rule_exprs(path):
    """[(where, expr)] for every `expr:` in a Prometheus rules file."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    exprs = []
    name = "?"
    i = 0
    while i < len(lines):
        line = lines[i]
        named = re.match(r"^\s*-?\s*(?:alert|record):\s*(\S+)", line)
        if named:
            name = named.group(1)
        match = re.match(r"^(\s*)-?\s*expr:\s*(.*?)\s*$", line)
        i += 1
        if not match:
            continue
        indent, value = len(match.group(1)), match.group(2)
        if value[:1] in ("|", ">"):
            block = []
            while i < len(lines) and (not lines[i].strip() or
                                      len(lines[i]) - len(lines[i].lstrip()) > indent):
                block.append(lines[i].strip())
                i += 1
            value = " ".join(block)
        elif value[:1] in ("'", '"') and value[-1:] == value[:1]:
            value = value[1:-1]
        exprs.append((f"{path}: {name}", value))
    return exprs


def dashboard_exprs(path, problems):
    """[(where, expr)] for a dashboard's queries; structural problems appended."""
    try:
        with open(path, encoding="utf-8") as f:
            dash = json.load(f)
    except json.JSONDecodeError as e:
        problems.append(f"{path}: not valid JSON: {e}")
        return []
    exprs = []
    variables = dash.get("templating", {}).get("list", [])
    if not any(v.get("type") == "datasource" and v.get("name") == "datasource"
               for v in variables):
        problems.append(f"{path}: no 'datasource' variable of type datasource")
    for v in variables:
        if v.get("type") != "query":
            continue
        query = v.get("query")
        query = query.get("query", "") if isinstance(query, dict) else (query or "")
        for selector in _LABEL_VALUES.findall(query):
            exprs.append((f"{path}: variable {v.get('name')}", selector))
        if "${datasource}" not in json.dumps(v.get("datasource")):
            problems.append(f"{path}: variable {v.get('name')} does not use ${{datasource}}")

    def walk(panels):
        for panel in panels:
            yield panel
            yield from walk(panel.get("panels", []))

    ids = set()
    for panel in walk(dash.get("panels", [])):
        where = f"{path}: panel {panel.get('id')} '{panel.get('title')}'"
        if panel.get("id") in ids:
            problems.append(f"{where}: duplicate panel id")
        ids.add(panel.get("id"))
        grid = panel.get("gridPos", {})
        if not all(k in grid for k in ("h", "w", "x", "y")) or grid["x"] + grid["w"] > 24:
            problems.append(f"{where}: gridPos missing or wider than 24 columns: {grid}")
        if panel.get("type") == "row":
            continue
        targets = panel.get("targets", [])
        if not targets:
            problems.append(f"{where}: no queries")
        if "${datasource}" not in json.dumps(panel.get("datasource")):
            problems.append(f"{where}: datasource is not ${{datasource}}")
        refs = set()
        for target in targets:
            if not target.get("expr"):
                problems.append(f"{where}: a query without expr")
                continue
            if not target.get("refId") or target["refId"] in refs:
                problems.append(f"{where}: query refId missing or repeated")
            refs.add(target.get("refId"))
            if "${datasource}" not in json.dumps(target.get("datasource", panel.get("datasource"))):
                problems.append(f"{where}: query {target.get('refId')} datasource is not ${{datasource}}")
            exprs.append((where, target["expr"]))
    return exprs


def grafana_to_promql(expr):
    """Replaces Grafana's variables with values Prometheus accepts."""
    for interval in ("$__rate_interval", "$__interval", "$__range"):
        expr = expr.replace(interval, "1m")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def evaluate(url, expr, timeout):
    """None if Prometheus at `url` evaluates `expr`, else its error."""
    query = urllib.parse.urlencode({"query": grafana_to_promql(expr)})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=timeout) as reply:
            body = json.load(reply)
    except urllib.error.HTTPError as e:
        try:
            body = json.load(e)
        except ValueError:
            return f"HTTP {e.code}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        return f"query failed: {e}"
    if body.get("status") != "success":
        return f"{body.get('errorType')}: {body.get('error')}"
    return None


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dashboard", action="append", default=[], help="Grafana dashboard JSON")
    parser.add_argument("--rules", action="append", default=[], help="Prometheus rules YAML")
    reference = parser.add_mutually_exclusive_group(required=True)
    reference.add_argument("--metrics", action="append", help="/metrics text exposition dump")
    reference.add_argument("--docs", help="docs/metrics.md")
    parser.add_argument("--absent-ok", action="append", default=[], metavar="NAME",
                        help="accept this family although the reference lacks it")
    parser.add_argument("--prometheus", help="also evaluate every query here (http://host:port)")
    args = parser.parse_args(argv)
    if not args.dashboard and not args.rules:
        parser.error("nothing to check: give --dashboard and/or --rules")

    try:
        known = read_reference_metrics(args.metrics) if args.metrics else read_reference_docs(args.docs)
        problems = []
        exprs = []
        for path in args.dashboard:
            exprs += dashboard_exprs(path, problems)
        for path in args.rules:
            exprs += rule_exprs(path)
    except OSError as e:
        print(f"check_dashboard.py: {e}", file=sys.stderr)
        return 2

    if not known:
        problems.append("the reference lists no metric at all")
    used = {}
    for where, expr in exprs:
        for name in metric_names(expr):
            used.setdefault(name, []).append(where)
    if not used:
        problems.append("no metric name found in any query")
    reference_name = " + ".join(args.metrics) if args.metrics else args.docs
    notes = []
    for name in sorted(used):
        if not is_known(name, known) and any(
                name == ok or (name.startswith(ok) and name[len(ok):] in SUFFIXES)
                for ok in args.absent_ok):
            notes.append(f"note: {name} is not in {reference_name}, accepted (--absent-ok)")
        elif not is_known(name, known):
            problems.append(f"unknown metric {name} (not in {reference_name}), used by: "
                            + "; ".join(sorted(set(used[name]))))

    if args.prometheus:
        for where, expr in exprs:
            if where.split(": ", 1)[-1].startswith("variable "):
                continue  # a metric selector, not a query
            error = evaluate(args.prometheus.rstrip("/"), expr, timeout=10)
            if error:
                problems.append(f"{where}: Prometheus rejects {expr!r}: {error}")

    for line in notes + problems:
        print(f"check_dashboard.py: {line}")
    if problems:
        return 1
    print(f"check_dashboard.py: OK: {len(used)} metric names in {len(exprs)} queries, "
          f"all exported ({', '.join(sorted(used))})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
