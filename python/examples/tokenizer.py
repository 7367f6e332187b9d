"""Byte-level BPE of the eval model's tokenizer.json: encode and decode,
for the demo (generate.py) and the bench/ KL scripts.

The GPT-2 byte-level pre-tokenizer (regex split, bytes mapped to printable
unicode), then BPE merges by rank. No normalizer, no added-token splitting
(the text never contains <|endoftext|>). Python's `re` has no \\p{L}/\\p{N};
letters are [^\\W\\d_] and numbers \\d, which differs from the reference
only on non-decimal numeric characters (none in the held-out novel);
eval_data.check_tokens checks the result against the fixture's token ids.
decode() maps tokens back to bytes, then UTF-8."""
import json
import re
from typing import Dict, List

_PATTERN = re.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")


def _bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's reversible map from the 256 bytes to printable characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class Tokenizer:
    def __init__(self, path: str):
        with open(path) as f:
            spec = json.load(f)
        model = spec["model"]
        if model["type"] != "BPE" or spec["pre_tokenizer"]["type"] != "ByteLevel":
            raise ValueError(f"{path}: not a byte-level BPE tokenizer")
        self.vocab = model["vocab"]
        self.tokens = {i: t for t, i in self.vocab.items()}
        for added in spec.get("added_tokens", []):
            self.tokens[added["id"]] = added["content"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        self.byte_map = _bytes_to_unicode()
        self.unbyte = {c: b for b, c in self.byte_map.items()}
        self.cache: Dict[str, List[int]] = {}

    def _bpe(self, word: str) -> List[int]:
        if word in self.cache:
            return self.cache[word]
        parts = list(word)
        while len(parts) > 1:
            best, best_rank = None, None
            for i in range(len(parts) - 1):
                r = self.ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best is None:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        ids = [self.vocab[p] for p in parts]
        self.cache[word] = ids
        return ids

    def encode(self, text: str) -> List[int]:
        ids: List[int] = []
        for piece in _PATTERN.findall(text):
            ids.extend(self._bpe("".join(self.byte_map[b] for b in piece.encode("utf-8"))))
        return ids

    def decode(self, ids: List[int]) -> str:
        out = bytearray()
        for i in ids:
            token = self.tokens.get(int(i), "")
            if token.startswith("<|") and token.endswith("|>"):
                continue  # special tokens (BOS) print as nothing
            out.extend(self.unbyte[c] for c in token if c in self.unbyte)
        return out.decode("utf-8", errors="replace")
