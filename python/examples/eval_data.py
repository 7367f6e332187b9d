"""Where the eval data is, and the held-out text, for the demo and the
bench/ scripts.

The eval folder (model/, fixture_public.*; docs/quality.md) is
$DRIFTKV_EVAL_DIR when set, else ../shared/eval relative to the repository
root (a sibling of the checkout, as for every worktree of the project).
No absolute path: the C++ tests find it the same way (tests/eval_data.h).

The held-out text is Persuasion (Austen; never seen in the model's
training) as Debian's r-cran-janeaustenr stores it (lines joined by
newlines), written once to $TMPDIR/persuasion.txt.
"""
import json
import os
import subprocess
import tempfile
from typing import List, Optional

# python/examples/ -> the repository root.
REPO_ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", ".."))


def eval_dir() -> str:
    return os.path.normpath(os.environ.get("DRIFTKV_EVAL_DIR") or os.path.join(REPO_ROOT, "..", "shared", "eval"))


def persuasion_text(path: Optional[str] = None) -> str:
    """The novel, read from `path` if given and present, else written there
    (default $TMPDIR/persuasion.txt) from r-cran-janeaustenr first."""
    out = path or os.path.join(tempfile.gettempdir(), "persuasion.txt")
    if not os.path.exists(out):
        if not os.path.exists("/usr/lib/R/site-library/janeaustenr"):
            raise SystemExit("the held-out text comes from Debian's r-cran-janeaustenr: "
                             "apt-get install r-cran-janeaustenr (or pass a text file)")
        subprocess.run(["Rscript", "-e", f'writeLines(janeaustenr::persuasion, "{out}")'], check=True,
                       stdout=subprocess.DEVNULL)
    with open(out) as f:
        return f.read()


def check_tokens(ids: List[int], fixture_json: str) -> None:
    """The fixture's token ids index the tokenized novel: the tokenizer and
    the text must reproduce them exactly."""
    with open(fixture_json) as f:
        fx = json.load(f)
    for s in fx["sequences"]:
        a, b = s["text_token_range"]
        if ids[a:b] != s["token_ids"][1:]:
            raise SystemExit(f"tokenizer/text mismatch on fixture sequence {s['index']}")
