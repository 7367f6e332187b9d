#!/usr/bin/python3
"""Times one window of bench/kl_eval.py's model work on the CPU: the
reference pass (forward_full of 1024 tokens) and one configuration's
continuation pass (forward_continuation of positions 768..1023 over a
768-token cache), and a 1024^3 float32 matmul in numpy and torch. The
standard KL run is 24 reference and 360 continuation passes
(docs/quality.md, "BLAS and the CPU KL run"). Run it once per BLAS, e.g.
with the reference BLAS selected for this process only:

    LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/blas /usr/bin/python3 bench/kl_window_time.py
"""
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "examples"))
from eval_data import eval_dir  # noqa: E402
from llama import Llama  # noqa: E402


def best_of(f, n=3):
    f()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    torch.set_num_threads(2)  # kl_eval.py's default --threads
    a, b = (np.random.default_rng(i).random((1024, 1024), dtype=np.float32) for i in (0, 1))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    print(f"1024^3 float32 matmul: numpy {best_of(lambda: a @ b):.3f} s, torch {best_of(lambda: ta @ tb):.3f} s")
    m = Llama(os.path.join(eval_dir(), "model"))
    ids = torch.randint(0, m.vocab, (1024,), generator=torch.Generator().manual_seed(0))
    m.forward_full(ids[:64])  # warm-up
    t = time.perf_counter()
    _, kv = m.forward_full(ids)
    full = time.perf_counter() - t
    past = [(k[:768], v[:768]) for k, v in kv]
    t = time.perf_counter()
    m.forward_continuation(ids[768:], 768, past)
    cont = time.perf_counter() - t
    print(f"forward_full {full:.2f} s, forward_continuation {cont:.2f} s; "
          f"standard KL run's model work ~ {(24 * full + 360 * cont) / 60:.0f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
