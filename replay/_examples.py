"""Two or three examples at the end of each command's ``--help`` (issue 36).

Each example is a whole command line a user can type as it stands, after
``replay run sgdmf -p synthetic=true --ranks 2`` has made ``traces/latest``
(``tests/replay/test_help_examples.py`` parses every one and runs most of them).
"""

from __future__ import annotations

import click

#: command name -> example command lines (typed literally in a shell)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "run": (
        "replay run sgdmf -p synthetic=true -p epochs=2 --ranks 2",
        "replay run mlr -p synthetic=true --threads 2 --save model.npz",
        "replay run train.py:fit -p lr=0.1 --trace my.sqlite",
    ),
    "demo": ("replay demo", "replay demo --epochs 2"),
    "show": ("replay show traces/latest", "replay show traces/latest --json"),
    "verify": ("replay verify traces/latest", "replay verify traces/latest --json"),
    "cluster": ("replay cluster traces/latest", "replay cluster traces/latest --json"),
    "single": (
        "replay single traces/latest",
        "replay single traces/latest --break sgd:1:500@1",
        "replay single traces/latest --from sgd:1 --until sgd:1",
    ),
    "dual": (
        "replay dual sgdmf -p synthetic=true -p epochs=1",
        "replay dual mlr -p synthetic=true -p epochs=1 --direction both --order random",
    ),
    "chaos": (
        "replay chaos sgdmf -p synthetic=true -p epochs=1 --runs 3 --chaos-seed 1",
        "replay chaos mlr -p synthetic=true -p epochs=1 --runs 3 --chaos-seed 1 --check dual",
    ),
    "history": (
        "replay history traces/latest 'W[17]'",
        "replay history traces/latest 'W[17]' --between sgd:0 sgd:1 --json",
    ),
    "watch": (
        "replay watch traces/latest 'abs(W[3]).max() > 1'",
        "replay watch traces/latest 'np.isnan(H[0]).any()' --json",
    ),
    "resume": ("replay resume traces/latest", "replay resume traces/latest --json"),
    "export": (
        "replay export traces/latest -o timeline.json",
        "replay export traces/latest -o timeline.json --force",
        "replay export traces/latest --model model.npz --checkpoint 0",
    ),
    "ls": ("replay ls", "replay ls traces --json"),
    "browse": ("replay browse", "replay browse traces/latest"),
}


def attach(group: click.Group) -> None:
    """End the help of each command of ``group`` with its examples."""
    for name, cmd in group.commands.items():
        lines = "\n".join(f"  {line}" for line in EXAMPLES[name])
        # \b: click keeps the paragraph's lines as they are (no rewrapping)
        cmd.epilog = f"\b\nExamples:\n{lines}"


__all__ = ["EXAMPLES", "attach"]
