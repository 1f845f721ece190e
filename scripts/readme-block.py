#!/usr/bin/env python3
"""Print one shell block of README.md, or the commands of its command table.

  scripts/readme-block.py setup|run|test   the ```sh block after `<!-- readme-block: NAME -->`
  scripts/readme-block.py commands         one `hipfire SUBCOMMAND...` per line, from the table

CI (.ci/run) runs the README's own blocks through this script, so the commands a new user
copies are the commands CI proves; there is no second copy to drift.
"""
import pathlib
import re
import sys

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def block(text: str, name: str) -> str:
    marker = re.compile(r"<!--\s*readme-block:\s*" + re.escape(name) + r"\b[^>]*-->\s*\n```(?:sh|bash)\n(.*?)```", re.S)
    found = marker.findall(text)
    if len(found) != 1:
        sys.exit(f"README.md: expected one block marked readme-block: {name}, found {len(found)}")
    return found[0]


def commands(text: str) -> list[str]:
    """The subcommand words of every `hipfire ...` row of the command table.

    A row names `hipfire WORD [WORD...]` then arguments (UPPER-case, -flags, [optional]);
    `a/b/c` in the last word stands for alternatives, each a subcommand of its own.
    """
    out = []
    for cell in re.findall(r"^\|\s*`(hipfire[^`]*)`\s*\|", text, re.M):
        words = []
        for tok in cell.split()[1:]:
            if not re.fullmatch(r"[a-z][a-z0-9/-]*", tok):
                break
            words.append(tok)
        if not words:
            out.append("")
            continue
        *head, last = words
        for alt in last.split("/"):
            out.append(" ".join(head + [alt]))
    if not out:
        sys.exit("README.md: the command table lists no `hipfire ...` command")
    return out


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    text = README.read_text()
    if sys.argv[1] == "commands":
        print("\n".join(commands(text)))
    else:
        sys.stdout.write(block(text, sys.argv[1]))


if __name__ == "__main__":
    main()
