"""The review as a whole: git diff, lint, place, for the `review` command."""

from __future__ import annotations

import os
from pathlib import Path

from cfgfix.review.gitdiff import changed_files, default_base, git, repo_root
from cfgfix.review.review import Review, place


def _real(path) -> str:
    return os.path.realpath(path)


def linked_files(engine, settings, changed_sfs, tree=None):
    """Files the project model ties to a changed file: a changed launch script brings in the
    script it starts and its accelerate config, and a changed script or config brings in
    the launch scripts that start or use it (their lines only count when changed). With the
    run's SettingsTree, the project is the files that use `settings` (not a subproject's)."""
    from cfgfix.engine import LAUNCH_TOKENS, SHELL_KINDS
    from cfgfix.project import LaunchFacts, _resolve
    from cfgfix.workspace import discover_groups

    groups, _ = discover_groups([settings.root], tree or settings, only=settings)
    project_files = [sf for _, group in groups for sf in group]
    by_real = {_real(sf.path): sf for sf in project_files}
    changed = {_real(sf.path) for sf in changed_sfs}
    extra = {}
    for sf in project_files:
        if sf.kind not in SHELL_KINDS:
            continue
        try:
            data = sf.path.read_bytes()
        except OSError:
            continue
        if not any(token in data for token in LAUNCH_TOKENS):
            continue
        for facts in engine.linter.lint(sf, data).launches:
            launch = LaunchFacts.from_dict(facts)
            group = {_real(sf.path)}
            for written in (launch.script, launch.accelerate_config):
                resolved = _resolve(written, sf.path, settings.root) if written else None
                if resolved is not None:
                    group.add(str(resolved))
            if group & changed:
                extra.update({p: by_real[p] for p in group - changed if p in by_real})
    return list(extra.values())


def build_review(engine, settings, base: str | None, head: str | None, paths: list[Path], cwd: Path,
                 unsafe_fixes: bool = False, tree=None) -> Review:
    """The review of the changed lines. With the run's SettingsTree, each changed file is
    linted with the settings file closest to it (as `check` does), `engine` serving the files
    that use `settings` and an engine per other settings file the others."""
    from cfgfix.documents.text import DecodeError, SourceText
    from cfgfix.engine import Engine, RunResult
    from cfgfix.workspace import discover_groups

    root = repo_root(cwd)
    if head is not None and git(root, "rev-parse", f"{head}^{{commit}}").strip() != git(root, "rev-parse", "HEAD").strip():
        raise ValueError(f"--head {head} is not the checked-out commit: the review reads the files on disk, so check it out first")
    base = base or default_base(root)
    changed = [cf for cf in changed_files(root, base, head)]
    wanted = [_real(p) for p in paths]
    if wanted:
        changed = [cf for cf in changed if any(_inside(_real(root / cf.path), w) for w in wanted)]
    by_path = {cf.path: cf for cf in changed}
    on_disk = [root / cf.path for cf in changed if (root / cf.path).is_file()]
    groups, _ = discover_groups(on_disk, tree or settings) if on_disk else ([], [])
    runs, linted = [], 0
    for group_settings, changed_sfs in groups:
        group_engine = engine if group_settings is settings else Engine(
            group_settings, use_cache=engine.cache is not None, tree=tree)
        files = changed_sfs + linked_files(group_engine, group_settings, changed_sfs, tree)
        runs.append(group_engine.run(files))
        linted += len(files)
    result = RunResult.merged(runs) if runs else None
    commit = git(root, "rev-parse", head or "HEAD").strip()
    review = Review(commit_id=commit, changed=changed, linted=linted)
    review.errors = result.errors if result else []
    if result is None:
        return review
    root_real = _real(root)

    def to_repo(display: str) -> str | None:
        full = _real(Path(display) if os.path.isabs(display) else cwd / display)
        rel = os.path.relpath(full, root_real)
        return None if rel.startswith("..") else Path(rel).as_posix()

    texts: dict[str, str | None] = {}
    from cfgfix.report import stored_sources

    stored = stored_sources(result.sources)  # a notebook: the .ipynb's JSON, as the diff shows it

    def text_of(display: str) -> str | None:
        if display not in texts:
            source = stored.get(display)
            if source is None:
                try:
                    source = SourceText.from_bytes(display, (cwd / display).read_bytes())
                except (OSError, DecodeError):
                    source = None
            texts[display] = source.text if source is not None else None
        return texts[display]

    findings, review.unplaced, review.cells = _stored_findings(result, by_path, to_repo)
    review.comments = place(findings, by_path, to_repo, text_of, unsafe_fixes)
    review.sources = result.sources
    return review


def _stored_findings(result, changed, to_repo):
    """The findings in the positions the diff uses. A notebook's findings move to the lines of
    its JSON that hold their code (its fix becomes an edit of that JSON, so a suggestion
    replaces JSON lines); one whose cell cannot be mapped is never put on a guessed line: when
    its notebook changed, it goes to the review body instead (the second list)."""
    findings, unplaced, cells = [], [], {}
    for finding in result.findings:
        source = result.sources.get(finding.path)
        if getattr(source, "notebook", None) is None:
            findings.append(finding)
            continue
        mapped = source.file_finding(finding)
        if mapped is not None:
            findings.append(mapped)
            cell, line, column = source.cell_position(finding.span.line, finding.span.column)
            cells[id(mapped)] = f"cell {cell}:{line}:{column}"
        elif to_repo(finding.path) in changed:
            unplaced.append(finding)
    return findings, unplaced, cells


def _inside(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip(os.sep) + os.sep)
