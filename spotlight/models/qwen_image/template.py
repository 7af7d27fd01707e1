"""Qwen-Image's prompt template: what the text encoder reads around a prompt, and how many
tokens of its output (the template's prefix) the pipeline drops. The real weights and the
project's tiny ones share it; the tiny tokenizer is built so the prefix has the same length."""
from __future__ import annotations

PROMPT_TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, "
                   "texture, quantity, text, spatial relationships of the objects and "
                   "background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
                   "<|im_start|>assistant\n")
TEMPLATE_DROP = 34
