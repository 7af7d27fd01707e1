"""``spotlight check-gpu``: what Spotlight does on a real GPU, measured against what it predicts.

Three parts, each run in a process of its own (a part that hangs or runs out of memory is ended
without losing the others): ``steps`` (a rollout denoising step and a LoRA training step of the
Qwen-Image transformer at two resolutions, seconds and peak memory next to the sizing model's),
``pipeline`` (two iterations of the tiny Qwen-Image pipeline on the device and a request killed
and resumed), ``determinism`` (the same request twice, and resumed from a committed step, with
and without deterministic algorithms). Everything measured goes into one JSON file as soon as
it is measured (:mod:`.record`). The wheels a bare GPU machine lacks: :mod:`.bundle`.
"""
