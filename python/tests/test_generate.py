"""A short run of the demo (python/examples/generate.py): the eval model
decoding through a driftkv-server, side by side with exact attention.
Skipped without torch or the eval model (eval_data.eval_dir())."""
import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import generate  # noqa: E402
from eval_data import eval_dir  # noqa: E402

TEXT = """The committee met on a grey morning in the old library, where the long
windows looked out over the river and the bridge. Nobody had expected the
letter to arrive so soon, and the secretary, who had been reading it aloud,
paused twice to ask whether anyone wished her to stop. Nobody did. The
proposal was simple enough: the town would sell the mill, divide the land
among the families who had worked it, and keep only the road to the chapel
for itself. Mr Hale thought it generous; his sister thought it foolish, and
said so with a warmth that surprised them all. The vicar, who rarely spoke
at these meetings, observed that a town which sells its mill must expect to
buy its bread, and that bread bought is seldom as good as bread made. There
was a silence after this, and then a great deal of talk at once, and at the
end of an hour they had agreed only that they would meet again on Thursday.
"""


@pytest.mark.skipif(not os.path.isdir(os.path.join(eval_dir(), "model")),
                    reason="no eval model in $DRIFTKV_EVAL_DIR or ../shared/eval")
def test_generate_smoke(server, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text(TEXT * 2)
    out = tmp_path / "metrics.json"
    rc = generate.main(["--server", server.target, "--text", str(text), "--prompts", "2", "--prompt-tokens", "200",
                        "--new-tokens", "8", "--threads", "1", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    m = json.loads(out.read_text())
    assert m["attend_calls"] == 4 * (8 + 7 + 7)  # a batched Attend per layer and decode step
    assert m["top1_agreement"] >= 0.75 and m["mean_kl"] < 0.1
    for line in ("top-1 agreement with exact attention", "mean per-token KL(exact || driftkv)", "greedy, exact attention",
                 "greedy, driftkv", ") latency: p50", "decode: driftkv", "decode worker's transport: "):
        assert line in printed, line
