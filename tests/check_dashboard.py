#!/usr/bin/python3
"""Checks that the Grafana dashboard and the alert rules name only metric
families the binaries export (the `# TYPE` names of a real scrape, one per
line in --families). A histogram's _bucket/_count/_sum series belong to its
family. Exits 1 listing every unknown name."""
import argparse
import json
import re
import sys

import yaml

NAME = re.compile(r"\b(ckptd_[a-z0-9_]+|ckpt_coordinator_[a-z0-9_]+)\b")


def unknown_names(expr, families):
    bad = []
    for name in NAME.findall(expr):
        base = re.sub(r"_(bucket|count|sum)$", "", name)
        if name not in families and base not in families:
            bad.append(name)
    return bad


def panel_exprs(panels):
    for p in panels:
        yield from panel_exprs(p.get("panels", []))
        if p.get("type") == "row":
            continue
        targets = p.get("targets", [])
        if not targets:
            yield p.get("title", "?"), None
        for t in targets:
            yield p.get("title", "?"), t.get("expr")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", required=True)
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--rules", required=True)
    args = ap.parse_args()
    families = {line.strip() for line in open(args.families) if line.strip()}
    problems = []
    with open(args.dashboard) as f:
        dash = json.load(f)
    count = 0
    for title, expr in panel_exprs(dash["panels"]):
        count += 1
        if not expr:
            problems.append(f"dashboard panel {title!r}: no expr")
            continue
        if not NAME.search(expr):
            problems.append(f"dashboard panel {title!r}: names no ckptd metric: {expr}")
        for name in unknown_names(expr, families):
            problems.append(f"dashboard panel {title!r}: unknown metric {name}")
    for var in dash.get("templating", {}).get("list", []):
        q = var.get("definition", "")
        for name in unknown_names(q, families):
            problems.append(f"dashboard variable {var['name']!r}: unknown metric {name}")
    with open(args.rules) as f:
        rules = yaml.safe_load(f)
    for group in rules["groups"]:
        for rule in group["rules"]:
            for name in unknown_names(rule["expr"], families):
                problems.append(f"rule {rule.get('alert', rule.get('record'))}: unknown metric {name}")
    for p in problems:
        print(p)
    print(f"{count} dashboard queries, {sum(len(g['rules']) for g in rules['groups'])} rules checked")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
