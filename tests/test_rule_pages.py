"""The rule reference in rules/ is generated from the rule classes and must not go stale."""

from cfgfix.rulepages import expected_pages
from cfgfix.rules.base import DOC_SECTIONS, OPTIONAL_SECTIONS, SECTION_ORDER, all_rules, doc_sections
from conftest import REPO


def test_docstrings_have_every_section_in_order():
    for rule in all_rules():
        sections = list(doc_sections(rule.doc()))
        expected = [s for s in SECTION_ORDER if s in DOC_SECTIONS or (s in OPTIONAL_SECTIONS and s in sections)]
        assert sections == expected, f"{rule.code}: {sections}"


def test_rule_pages_are_current():
    folder = REPO / "rules"
    expected = expected_pages()
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in folder.glob("*.md")}
    stale = sorted(name for name in expected if on_disk.get(name) != expected[name])
    extra = sorted(set(on_disk) - set(expected))
    assert not stale and not extra, (
        f"rules/ is stale ({stale or extra}); regenerate with `python -m cfgfix.rulepages`"
    )


def test_codes_and_names_are_unique_and_well_formed():
    rules = all_rules()
    assert len({r.name for r in rules}) == len(rules)
    for rule in rules:
        assert rule.code[:3] == "CFX" and rule.code[3:].isdigit() and len(rule.code) == 6
        assert rule.name == rule.name.lower() and " " not in rule.name
