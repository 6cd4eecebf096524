"""The docs' shell blocks as a contract: find each fenced ``bash`` block with the marker comment
that says how it is checked, its placeholders and its expected output. Pure: no I/O (the caller
reads the file and runs the block; ``tests/cluster/test_doc_blocks.py`` does both).

A marker is an HTML comment on the line before the fence, at the fence's indentation:

- ``<!-- block: run needs=crd,pc NS=@ns NAME=orders -->``: the block runs in the real-cluster tier as
  written, with ``KUBECONFIG`` set. ``needs`` names what the runner provides first (a comma list);
  ``KEY=value`` replaces the placeholder word ``KEY`` (``@ns`` = the test's own namespace).
- Two substitutions, each named in the marker, for what the tier cannot be as a user's cluster is:
  ``helm-values=FILE`` adds ``--values FILE`` to each ``helm install``/``helm upgrade`` of the block
  (the process kubelet's pods share the host's network), and ``watch=SECONDS`` ends each
  ``kubectl ... -w`` after SECONDS (``--request-timeout``, where a reader presses Ctrl-C).
- ``<!-- block: not-runnable REASON -->``: it cannot run here, and REASON says why (and what checks it
  instead, if anything).

A ``text`` fence right after a block (blank lines allowed between) is its expected output: each line
must be a line of the output, in that order, other lines allowed between; ``...`` in an expected line
matches any text.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from dataclasses import dataclass, field

_FENCE = re.compile(r"^( *)```(\w*)\s*$")
_MARKER = re.compile(r"^ *<!-- block: (.*?) -->\s*$")


class DocBlockError(ValueError):
    """A block without a marker, a malformed marker, or an unterminated fence."""


@dataclass(frozen=True)
class DocBlock:
    """One fenced bash block of a document.

    Invariant: ``runnable`` iff ``reason`` is empty; a runnable block's ``needs`` and ``placeholders``
    come from its marker, a not-runnable one has neither.
    """

    doc: str
    line: int  # 1-based line of the opening fence
    body: str  # dedented, as written
    runnable: bool
    reason: str = ""
    needs: tuple[str, ...] = ()
    placeholders: dict[str, str] = field(default_factory=dict)
    expected: tuple[str, ...] = ()
    helm_values: str = ""  # a values file added to each helm install/upgrade ("" = none)
    watch_s: int = 0  # a bound on each `kubectl ... -w` (0 = none)

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"

    def script(self, namespace: str) -> str:
        """The body with each placeholder word replaced (``@ns`` -> ``namespace``) and the marker's
        substitutions made (``helm-values``, ``watch``)."""
        out = self.body
        for key, value in self.placeholders.items():
            out = re.sub(rf"\b{re.escape(key)}\b", namespace if value == "@ns" else value, out)
        if self.helm_values:
            helm = r"\bhelm (upgrade --install|install|upgrade)\b"
            out = re.sub(helm, rf"helm \1 --values {self.helm_values}", out)
        if self.watch_s:
            watch = r"^(\s*kubectl\b[^\n#]*\s-w)(?=\s|$)"
            out = re.sub(watch, rf"\1 --request-timeout={self.watch_s}s", out, flags=re.M)
        return out


def _parse_marker(doc: str, line: int, text: str) -> dict[str, object]:
    kind, _, rest = text.partition(" ")
    if kind == "not-runnable":
        if not rest.strip():
            raise DocBlockError(f"{doc}:{line}: not-runnable needs a reason")
        return {"runnable": False, "reason": rest.strip()}
    if kind != "run":
        raise DocBlockError(f"{doc}:{line}: marker must be 'run ...' or 'not-runnable REASON', got {text!r}")
    fields: dict[str, object] = {"runnable": True}
    placeholders: dict[str, str] = {}
    for word in rest.split():
        key, eq, value = word.partition("=")
        if not eq or not value:
            raise DocBlockError(f"{doc}:{line}: {word!r} is not KEY=value")
        if key == "needs":
            fields["needs"] = tuple(value.split(","))
        elif key == "helm-values":
            fields["helm_values"] = value
        elif key == "watch":
            if not value.isdigit() or int(value) == 0:
                raise DocBlockError(f"{doc}:{line}: watch= takes a whole number of seconds, got {value!r}")
            fields["watch_s"] = int(value)
        else:
            placeholders[key] = value
    return {**fields, "placeholders": placeholders}


def extract(doc: str, text: str) -> list[DocBlock]:
    """Every ``bash`` block of ``text`` (the document named ``doc``), with its marker and expected
    output. Raises :class:`DocBlockError` on a bash block without a marker."""
    lines = text.splitlines()
    blocks: list[DocBlock] = []
    i = 0
    after_bash: int | None = None  # the closing line of the last fence, when that fence was bash
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match or not match.group(2):
            i += 1
            continue
        indent, lang, start = match.group(1), match.group(2), i
        end = start + 1
        while end < len(lines) and lines[end].rstrip() != f"{indent}```":
            end += 1
        if end == len(lines):
            raise DocBlockError(f"{doc}:{start + 1}: unterminated ```{lang} fence")
        body = textwrap.dedent("\n".join(line[len(indent) :] for line in lines[start + 1 : end])) + "\n"
        if lang == "bash":
            marker = _MARKER.match(lines[start - 1]) if start else None
            if marker is None:
                raise DocBlockError(f"{doc}:{start + 1}: bash block without a '<!-- block: ... -->' marker")
            fields = _parse_marker(doc, start + 1, marker.group(1))
            blocks.append(DocBlock(doc, start + 1, body, **fields))  # type: ignore[arg-type]
            after_bash = end
        elif lang == "text" and after_bash is not None:
            if all(not line.strip() for line in lines[after_bash + 1 : start]):
                expected = tuple(line.rstrip() for line in body.splitlines() if line.strip())
                blocks[-1] = dataclasses.replace(blocks[-1], expected=expected)
            after_bash = None
        else:
            after_bash = None
        i = end + 1
    return blocks


def _line_matches(expected: str, actual: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, actual.rstrip()) is not None


def match_in_order(expected: tuple[str, ...], output: str) -> str | None:
    """None when every expected line is a line of ``output`` in order; else what is missing."""
    actual = output.splitlines()
    pos = 0
    for want in expected:
        while pos < len(actual) and not _line_matches(want, actual[pos]):
            pos += 1
        if pos == len(actual):
            return f"expected line not found in order: {want!r}"
        pos += 1
    return None
