"""Every sub-command's `--help` opens with whole sentences: the description argparse prints is a
docstring's first paragraph, never its first line cut mid-sentence."""
from __future__ import annotations

import pytest

from exporter.cli import COMMANDS, main


@pytest.mark.parametrize("command", COMMANDS)
def test_description_ends_a_sentence(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    # as a person reads it: the usage block, a blank line, then the description paragraph
    paragraphs = capsys.readouterr().out.split("\n\n")
    text = " ".join(paragraphs[1].split()) if len(paragraphs) > 1 else ""
    assert len(text) > 20, f"{command}: no description"
    assert text.endswith((".", "?", ")", ":")), f"{command} --help description is cut: ...{text[-60:]!r}"
