"""multilane.testing.doc_blocks: every bash block of the docs the cluster tier runs carries a marker,
and the parser and the in-order matcher refuse what they must."""

from __future__ import annotations

from pathlib import Path

import pytest

from multilane.testing.doc_blocks import DocBlockError, extract, match_in_order

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("doc", ["README.md", "docs/operator-install.md", "docs/runbook.md"])
def test_every_bash_block_is_run_or_says_why_not(doc: str) -> None:
    text = (ROOT / doc).read_text(encoding="utf-8")
    blocks = extract(doc, text)  # raises on a block without a marker
    assert len(blocks) == text.count("```bash")
    for block in blocks:
        assert block.runnable or len(block.reason) > 20, block.name


def test_a_block_without_a_marker_is_refused() -> None:
    with pytest.raises(DocBlockError, match=r"doc\.md:2: bash block without"):
        extract("doc.md", "text\n```bash\nls\n```\n")


def test_a_bad_marker_and_an_open_fence_are_refused() -> None:
    with pytest.raises(DocBlockError, match="not-runnable needs a reason"):
        extract("d", "<!-- block: not-runnable -->\n```bash\nls\n```\n")
    with pytest.raises(DocBlockError, match="is not KEY=value"):
        extract("d", "<!-- block: run needs -->\n```bash\nls\n```\n")
    with pytest.raises(DocBlockError, match="unterminated"):
        extract("d", "```yaml\na: 1\n``` trailing text is no closing fence\n")


def test_markers_placeholders_and_expected_output() -> None:
    text = (
        "- step\n"
        "  <!-- block: run needs=crd,pc NS=@ns NAME=orders -->\n"
        "  ```bash\n"
        "  kubectl get pcon -n NS NAME   # NAMES stays\n"
        "  ```\n"
        "\n"
        "  ```text\n"
        "  NAME ... AGE\n"
        "  ```\n"
    )
    [block] = extract("d", text)
    assert block.needs == ("crd", "pc")
    assert block.script("team-a") == "kubectl get pcon -n team-a orders   # NAMES stays\n"
    assert block.expected == ("NAME ... AGE",)


def test_expected_lines_match_in_order_only() -> None:
    output = "a\nnoise\nb 1 c\n"
    assert match_in_order(("a", "b ... c"), output) is None
    assert match_in_order(("b ... c", "a"), output) == "expected line not found in order: 'a'"
    assert match_in_order(("b",), output) is not None  # a whole line, not a substring


def test_the_markers_substitutions_are_the_only_changes_to_a_block() -> None:
    text = (
        "<!-- block: run needs=kubelet helm-values=v.yaml watch=20 -->\n"
        "```bash\n"
        "helm upgrade --install multilane charts/multilane \\\n"
        "  --set a=b   # comment\n"
        "kubectl get pcon -A -w\n"
        "kubectl get pcon -A   # no -w here\n"
        "```\n"
    )
    [block] = extract("d", text)
    assert block.script("ns") == (
        "helm upgrade --install --values v.yaml multilane charts/multilane \\\n"
        "  --set a=b   # comment\n"
        "kubectl get pcon -A -w --request-timeout=20s\n"
        "kubectl get pcon -A   # no -w here\n"
    )
    with pytest.raises(DocBlockError, match="whole number of seconds"):
        extract("d", "<!-- block: run watch=soon -->\n```bash\nls\n```\n")
