"""docs/DECISIONS.md stays a map of current decisions, not a log (issue 46): at most a third of the
1,503 lines it had grown to, no superseded sections kept beside their successors (git keeps the
history), and no citation of a document the repository does not hold."""

from pathlib import Path

DECISIONS = Path(__file__).resolve().parents[2] / "docs" / "DECISIONS.md"
MAX_LINES = 1503 // 3


def test_decisions_is_at_most_a_third_of_its_old_length():
    lines = DECISIONS.read_text().count("\n")
    assert lines <= MAX_LINES, (
        f"docs/DECISIONS.md has {lines} lines, over {MAX_LINES}: say current decisions only, "
        "and leave their history to git")


def test_decisions_keeps_no_superseded_text_and_cites_only_what_the_repo_holds():
    text = DECISIONS.read_text()
    assert "superseded" not in text.lower(), "a superseded decision belongs to git's history, not the doc"
    assert "DESIGN.md" not in text, "DESIGN.md is not in the repository: say what the reader needs here"
