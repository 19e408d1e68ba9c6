"""README's "Deploy" section is a path from zero to alerts where every step is a file that exists
and that some test checks."""
from __future__ import annotations

import re

from conftest import REPO


def deploy_section() -> str:
    text = (REPO / "README.md").read_text()
    m = re.search(r"^## Deploy\b.*?(?=^## )", text, flags=re.M | re.S)
    assert m, "README.md has no '## Deploy' section"
    return m.group(0)


def test_every_step_names_an_existing_file_that_a_test_checks():
    section = deploy_section()
    paths = sorted(set(re.findall(r"`((?:deploy|rules|grafana|exporter|tests)/[\w./*-]+)`", section)))
    assert len(paths) >= 12, paths
    tests_text = "\n".join(p.read_text() for p in (REPO / "tests").rglob("*.py"))
    for p in paths:
        matches = list(REPO.glob(p.rstrip("/")))
        assert matches, f"README names {p}, which does not exist"
        if p.startswith("deploy/"):
            for f in matches:
                rel = str(f.relative_to(REPO))
                checked = rel in tests_text or f.name in tests_text or f.relative_to(REPO / "deploy").as_posix() in tests_text
                assert checked, f"no test names {rel}"
    steps = re.findall(r"^\d+\. \*\*(.+?)\*\*", section, flags=re.M)
    assert len(steps) >= 7, steps
