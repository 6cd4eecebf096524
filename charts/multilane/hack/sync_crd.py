"""Generate the chart's CRD template from the repository's CRD.

``crds/parallelconsumers.multilane.dev.yaml`` (repository root) is the source of truth. The chart
installs the same definition as a *template* (``templates/crd-parallelconsumers.yaml``), because Helm
installs a chart's ``crds/`` folder once and never upgrades it. The template is the source file with:

1. its leading comment block replaced by a "generated" notice,
2. the whole document wrapped in ``{{- if .Values.crds.enabled }}`` ... ``{{- end }}``,
3. the chart's labels and (with ``crds.keep``) ``helm.sh/resource-policy: keep`` added to metadata.

Usage (from anywhere)::

    python charts/multilane/hack/sync_crd.py          # rewrite the template
    python charts/multilane/hack/sync_crd.py --check  # exit 1 when the template is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHART_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = CHART_DIR.parent.parent
SOURCE = REPO_DIR / "crds" / "parallelconsumers.multilane.dev.yaml"
TARGET = CHART_DIR / "templates" / "crd-parallelconsumers.yaml"

HEADER = """\
{{- /*
GENERATED from crds/parallelconsumers.multilane.dev.yaml by charts/multilane/hack/sync_crd.py.
Do not edit: edit the source and run the script (tests/chart checks that both agree).
*/ -}}
{{- if .Values.crds.enabled }}
"""

METADATA_ANCHOR = "metadata:\n  name: parallelconsumers.multilane.dev\n"
METADATA_EXTRA = """\
  labels:
    {{- include "multilane.labels" . | nindent 4 }}
  {{- if .Values.crds.keep }}
  annotations:
    # Keep the CRD (and so every ParallelConsumer) on helm uninstall.
    helm.sh/resource-policy: keep
  {{- end }}
"""


def render_template(source_text: str) -> str:
    """The chart template for ``source_text`` (the CRD file's content)."""
    if "{{" in source_text:
        raise ValueError("the CRD source must not contain '{{' (it would be read as a template action)")
    # 1. Drop the leading comment block.
    lines = source_text.splitlines(keepends=True)
    while lines and (lines[0].startswith("#") or not lines[0].strip()):
        lines.pop(0)
    body = "".join(lines)
    if body.count(METADATA_ANCHOR) != 1:
        raise ValueError(f"expected exactly one {METADATA_ANCHOR!r} in the CRD source")
    # 3. Labels and the keep annotation after metadata.name.
    body = body.replace(METADATA_ANCHOR, METADATA_ANCHOR + METADATA_EXTRA)
    if not body.endswith("\n"):
        body += "\n"
    # 2. The crds.enabled switch around the document.
    return HEADER + body + "{{- end }}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 when stale")
    args = parser.parse_args(argv)
    expected = render_template(SOURCE.read_text(encoding="utf-8"))
    current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
    if args.check:
        if current != expected:
            print(f"{TARGET} is stale; run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    if current != expected:
        TARGET.write_text(expected, encoding="utf-8")
        print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
