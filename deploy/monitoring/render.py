"""Write prometheusrule.yaml (the monitoring overlay's PrometheusRule) from onnxpool-rules.yml.

The plain rules file is the one source of onnxpool's alerts (VMs load it as it is, and
`promtool check rules` checks it); the PrometheusRule carries the same `groups:` text under
`spec:`. Run after editing the rules: `python deploy/monitoring/render.py` (`--check` exits 1
when prometheusrule.yaml is stale; tests/test_monitoring.py checks it too).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
RULES = HERE / "onnxpool-rules.yml"
TARGET = HERE / "prometheusrule.yaml"

HEADER = """\
# GENERATED from onnxpool-rules.yml by `python deploy/monitoring/render.py`: edit that file.
# onnxpool's alerts for the prometheus-operator. A Prometheus of kube-prometheus-stack loads
# only rules whose labels match its ruleSelector (often `release: <its release name>`):
# add that label here, or set ruleSelectorNilUsesHelmValues=false.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: onnxpool
spec:
"""


def rendered() -> str:
    text = RULES.read_text(encoding="utf-8")
    groups = text[text.index("\ngroups:") + 1 :]  # the rules themselves, without the file's comments
    return HEADER + textwrap.indent(groups, "  ")


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        if TARGET.read_text(encoding="utf-8") != rendered():
            print(f"{TARGET} is stale: run python {Path(__file__).relative_to(Path.cwd())}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(rendered(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
