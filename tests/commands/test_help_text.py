"""Every sub-command's `--help` opens with whole sentences: the description argparse prints is a
docstring's first paragraph, never its first line cut mid-sentence."""
from __future__ import annotations

import pytest

from exporter.cli import COMMANDS, build_parser


@pytest.mark.parametrize("command", COMMANDS)
def test_description_ends_a_sentence(command):
    sub = build_parser(command)._subparsers._group_actions[0].choices[command]
    text = " ".join((sub.description or "").split())
    assert len(text) > 20, f"{command}: no description"
    assert text.endswith((".", "?", ")", ":")), f"{command} --help description is cut: ...{text[-60:]!r}"
