"""Examples of driftkv in a model: `python3 -m driftkv.examples.generate`
(a Llama decoding through driftkv, side by side with exact attention)."""
