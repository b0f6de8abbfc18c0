"""The rule reference: one Markdown page per rule from its docstring, plus an index table.
`python -m cfgfix.rulepages` regenerates `rules/`; a test fails when the pages are stale."""

from __future__ import annotations

import sys
from pathlib import Path

from cfgfix.rules.base import DOC_SECTIONS, SECTION_ORDER, all_rules, doc_sections

FIX_LABEL = {
    "safe": "safe",
    "unsafe": "unsafe",
    "mixed": "safe or unsafe (see Fix safety)",
    "sometimes": "sometimes",
    "none": "none",
}


def rule_page(rule) -> str:
    sections = doc_sections(rule.doc())
    missing = [s for s in DOC_SECTIONS if s not in sections]
    if missing:
        raise ValueError(f"{rule.code} docstring lacks sections: {', '.join(missing)}")
    header = [
        f"# {rule.code} {rule.name}",
        "",
        f"Severity: **{rule.severity.value}** · Fix: **{FIX_LABEL[rule.fix_availability]}**"
        + ("" if rule.default_enabled else " · Off by default"),
        "",
    ]
    body = []
    for name in SECTION_ORDER:
        if name in sections:
            body += [f"## {name}", "", sections[name], ""]
    examples = _examples(rule)
    return "\n".join(header + body + examples).rstrip() + "\n"


def _examples(rule) -> list[str]:
    lines = []
    if rule.INVALID or rule.VALID:
        lines += ["## Tested cases", "", "Every case below runs in cfgfix's test suite.", ""]
    for title, examples in (("Flagged", rule.INVALID), ("Not flagged (near misses)", rule.VALID)):
        if examples:
            lines += [f"### {title}", ""]
            for example in examples:
                lines.append(f"- {example.why}")
    if lines:
        lines.append("")
    return lines


def rules_table(rules, markdown: bool = True) -> str:
    rows = [(r.code, r.name, r.severity.value, r.fix_availability, r.summary()) for r in rules]
    if markdown:
        out = ["| code | name | severity | fix | what it flags |", "| --- | --- | --- | --- | --- |"]
        out += [f"| [{c}]({c}.md) | {n} | {s} | {f} | {w} |" for c, n, s, f, w in rows]
        return "\n".join(out) + "\n"
    width = max(len(n) for _, n, *_ in rows)
    return "\n".join(f"{c}  {n:<{width}}  {s:<7}  fix: {f}" for c, n, s, f, _ in rows)


def index_page(rules) -> str:
    return (
        "# cfgfix rules\n\n"
        "Generated from the rule classes by `python -m cfgfix.rulepages`; do not edit by hand.\n"
        "`cfgfix rule CODE` prints a page in the terminal.\n\n" + rules_table(rules)
    )


def expected_pages() -> dict[str, str]:
    rules = all_rules()
    pages = {f"{r.code}.md": rule_page(r) for r in rules}
    pages["README.md"] = index_page(rules)
    return pages


def write_pages(folder: Path) -> list[str]:
    folder.mkdir(exist_ok=True)
    pages = expected_pages()
    for stale in folder.glob("CFX*.md"):
        if stale.name not in pages:
            stale.unlink()
    for name, text in pages.items():
        (folder / name).write_text(text, encoding="utf-8")
    return sorted(pages)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "rules"
    written = write_pages(target)
    print(f"wrote {len(written)} pages to {target}")
