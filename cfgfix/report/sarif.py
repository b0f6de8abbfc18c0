"""SARIF 2.1.0 for GitHub code scanning and other SARIF viewers.

Notes that shape the output:
- Paths are relative URIs against `%SRCROOT%` so code scanning maps them onto the checkout.
- Our columns count characters, so the run declares `columnKind: unicodeCodePoints`
  (SARIF's default is UTF-16 code units).
- `partialFingerprints` hashes code, path and the stripped line text (not the line number),
  with an occurrence suffix, so an alert keeps its identity when lines above it move.
- A notebook's regions are lines and columns of the .ipynb file as stored (its JSON), which
  is what a viewer opens; the cell and the position inside it are the `cell` and
  `cellRegion` properties. Its fixes replace the stretch of JSON the fix changes.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from typing import TYPE_CHECKING
from urllib.parse import quote

from cfgfix.core import Finding, Severity, Span
from cfgfix.report import edit_region, json_text, offered_fix, rule_url, sorted_findings, span_in_cell, stored_finding
from cfgfix.rules.base import doc_sections

if TYPE_CHECKING:
    from cfgfix.report import ReportContext
    from cfgfix.rules.base import Rule

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://github.com/cfgfix/cfgfix"
FINGERPRINT_KEY = "cfgfixLineHash/v1"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def render(findings: list[Finding], ctx: ReportContext) -> str:
    rules = list(ctx.rules)
    index = {rule.code: i for i, rule in enumerate(rules)}
    descriptors = [_rule_descriptor(rule) for rule in rules]
    results = []
    seen: Counter = Counter()
    for finding in sorted_findings(findings):
        if finding.code not in index:  # keep ruleIndex valid for a rule missing from the list
            index[finding.code] = len(descriptors)
            descriptors.append(_minimal_descriptor(finding, ctx))
        results.append(_result(finding, index[finding.code], ctx, seen))
    driver = {"name": "cfgfix", "informationUri": INFORMATION_URI, "rules": descriptors}
    if ctx.tool_version:
        driver["version"] = ctx.tool_version
    log = {
        "$schema": SCHEMA_URI,
        "version": "2.1.0",
        "runs": [
            {"tool": {"driver": driver}, "columnKind": "unicodeCodePoints", "results": results}
        ],
    }
    return json_text(log)


# -- rules ---------------------------------------------------------------------------------
def _rule_descriptor(rule: type[Rule]) -> dict:
    doc = rule.doc()
    summary = rule.summary() or rule.name  # SARIF wants a non-empty short description
    what = " ".join(doc_sections(doc).get("What it does", "").split()) or summary
    tags = [*rule.kinds, f"fix:{rule.fix_availability}"]
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": summary},
        "fullDescription": {"text": what},
        "help": {"text": doc or summary, "markdown": doc or summary},
        "helpUri": rule.url(),
        "defaultConfiguration": {"level": _LEVEL[Severity(rule.severity)]},
        "properties": {"tags": tags},
    }


def _minimal_descriptor(finding: Finding, ctx: ReportContext) -> dict:
    return {
        "id": finding.code,
        "name": finding.name,
        "shortDescription": {"text": finding.name},
        "helpUri": rule_url(ctx, finding.code),
    }


# -- results -------------------------------------------------------------------------------
def _uri(path: str) -> dict:
    """An artifactLocation: relative paths hang off %SRCROOT%, absolute ones become file URIs."""
    if path.startswith("/") or re.match(r"^[A-Za-z]:[/\\]", path):
        return {
            "uri": "file://"
            + ("" if path.startswith("/") else "/")
            + quote(_name_bytes(path.replace("\\", "/")), safe="/:")
        }
    return {"uri": quote(_name_bytes(path)), "uriBaseId": "%SRCROOT%"}


def _name_bytes(path: str) -> bytes:
    # the file name's own bytes, so a name that is not UTF-8 (held as lone surrogates)
    # becomes its percent-escapes (`tr%E9in.py`) rather than an encoding error
    return path.encode("utf-8", "surrogateescape")


def _region(line: int, column: int, end_line: int, end_column: int) -> dict:
    return {"startLine": line, "startColumn": column, "endLine": end_line, "endColumn": end_column}


def _physical(span: Span, ctx: ReportContext, joined: Span | None = None) -> dict:
    """`span` in the file as stored (for a notebook, its JSON lines: what a viewer opens);
    `joined`, the same place in a notebook's joined cells, adds the cell and the position
    inside it as properties (the `cell 3:2:5` of the text and JSON outputs)."""
    region = _region(span.line, span.column, span.end_line, span.end_column)
    location = {"physicalLocation": {"artifactLocation": _uri(span.path), "region": region}}
    if joined is not None:
        cell, line, column, end_line, end_column = span_in_cell(ctx, joined)
        if cell is not None:
            location["properties"] = {"cell": cell, "cellRegion": _region(line, column, end_line, end_column)}
    return location


def _fingerprint(finding: Finding, ctx: ReportContext, seen: Counter) -> str:
    source = ctx.sources.get(finding.path)
    if source is not None and 1 <= finding.span.line <= len(source.line_starts):
        anchor = source.line_text(finding.span.line).strip()
    else:
        anchor = finding.message  # without the text, the message is the next most stable thing
    digest = hashlib.sha256(f"{finding.code}\0{finding.path}\0{anchor}".encode("utf-8", "surrogatepass")).hexdigest()[
        :32
    ]
    seen[digest] += 1  # identical lines in one file get :1, :2 ... in file order
    return f"{digest}:{seen[digest]}"


def _fix(finding: Finding, ctx: ReportContext) -> dict:
    changes: dict[str, list] = {}
    for edit in sorted(finding.fix.edits, key=lambda e: (e.path, e.start, e.end)):
        region = edit_region(ctx, edit, stored=True)
        # Without the file's text, SARIF's character offsets still say exactly what to replace.
        deleted = (
            _region(*region)
            if region
            else {"charOffset": edit.start, "charLength": edit.end - edit.start}
        )
        changes.setdefault(edit.path, []).append(
            {"deletedRegion": deleted, "insertedContent": {"text": edit.content}}
        )
    return {
        "description": {"text": finding.fix.description},
        "artifactChanges": [
            {"artifactLocation": _uri(path), "replacements": replacements}
            for path, replacements in changes.items()
        ],
        "properties": {"applicability": finding.fix.applicability.value},
    }


def _result(finding: Finding, rule_index: int, ctx: ReportContext, seen: Counter) -> dict:
    stored = stored_finding(ctx, finding)  # a notebook's findings in its JSON's own lines
    result = {
        "ruleId": finding.code,
        "ruleIndex": rule_index,
        "level": _LEVEL[finding.severity],
        "message": {"text": finding.message},
        "locations": [_physical(stored.span, ctx, finding.span)],
        "partialFingerprints": {FINGERPRINT_KEY: _fingerprint(finding, ctx, seen)},
    }
    if stored.related:
        result["relatedLocations"] = [
            {"id": i, **_physical(r.span, ctx), "message": {"text": r.message}}
            for i, r in enumerate(stored.related, start=1)
        ]
    fix = offered_fix(stored, ctx.unsafe_fixes)  # a viewer may apply it in one click: safe ones only by default
    if fix is not None and fix.edits:
        result["fixes"] = [_fix(stored, ctx)]
    return result
