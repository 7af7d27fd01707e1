"""Flow-GRPO's OCR reward on real images, read by an OCR engine.

``ocr-text`` scores each image with :func:`~spotlight.rewards.ocr.ocr_score` (the target between
the prompt's quotes; spaces removed, case folded; 1 if the target is contained, else 1 -
min(Levenshtein, len) / len) of the text an :class:`OcrEngine` reads off it. The default engine,
``rapidocr``, runs PP-OCR's detection and recognition models with onnxruntime from the files
inside its own wheel: nothing is downloaded, and a missing model file is an error rather than
a fetch. ``transformers`` reads with a vision-language OCR model the user stages
(``reward.ocr_model``: any model ``AutoModelForImageTextToText`` loads, with a processor that has
a chat template), batched, greedy.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np

from spotlight.config import RewardConfig
from spotlight.models.prompts import Prompt
from spotlight.rewards.ocr import ocr_score
from spotlight.rewards.registry import check_batch, check_rewards, register_reward
from spotlight.staging import staged_folder

# The PP-OCR models the rapidocr-onnxruntime wheel ships (detection, angle, recognition).
RAPIDOCR_MODELS = {"det_model_path": "ch_PP-OCRv4_det_infer.onnx",
                   "cls_model_path": "ch_ppocr_mobile_v2.0_cls_infer.onnx",
                   "rec_model_path": "ch_PP-OCRv4_rec_infer.onnx"}


class OcrEngine(Protocol):
    """Reads the text in one image: (3, H, W) float32 in [0, 1] -> the text, left to right."""

    name: str

    def read(self, image: np.ndarray) -> str: ...


class RapidOcrEngine:
    """PP-OCR through rapidocr-onnxruntime, with the models of its wheel, on the CPU."""

    name = "rapidocr"

    def __init__(self, threads: int = 1) -> None:
        import rapidocr_onnxruntime
        from rapidocr_onnxruntime import RapidOCR

        models = Path(rapidocr_onnxruntime.__file__).parent / "models"
        paths = {key: models / name for key, name in RAPIDOCR_MODELS.items()}
        missing = [str(p) for p in paths.values() if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"rapidocr-onnxruntime's models are missing: {missing}; "
                                    "reinstall the package (its wheel carries them; Spotlight "
                                    "never downloads them)")
        self._ocr = RapidOCR(**{k: str(v) for k, v in paths.items()},
                             intra_op_num_threads=threads, inter_op_num_threads=threads)

    def read(self, image: np.ndarray) -> str:
        pixels = (np.clip(image, 0.0, 1.0).transpose(1, 2, 0) * 255).round().astype(np.uint8)
        found, _ = self._ocr(np.ascontiguousarray(pixels[:, :, ::-1]))   # RGB -> BGR (OpenCV)
        if not found:
            return ""
        # Boxes left to right by their first corner, as a reader would read one line.
        return " ".join(text for _, text, _ in sorted(found, key=lambda f: f[0][0][0]))


class TransformersOcrEngine:
    """A vision-language OCR model through transformers, from a staged folder or URL."""

    name = "transformers"

    def __init__(self, source: str, instruction: str = "Read all the text in the image.",
                 max_new_tokens: int = 32, batch_size: int = 8) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        # vision imports torch, which only this engine needs (rapidocr's path runs without it)
        from spotlight.rewards.vision import PROCESSOR_FILES, needs, quiet_transformers

        quiet_transformers()
        folder = staged_folder(source, "reward.ocr_model", needs("config.json", PROCESSOR_FILES))
        self.processor = AutoProcessor.from_pretrained(folder)
        if not getattr(self.processor, "chat_template", None):
            raise ValueError(f"reward.ocr_model {source!r}: its processor has no chat template, "
                             "so the image and instruction cannot be put into a prompt")
        self.processor.tokenizer.padding_side = "left"   # generation continues every row
        self.model = AutoModelForImageTextToText.from_pretrained(folder).eval()
        messages = [{"role": "user", "content": [{"type": "image"},
                                                 {"type": "text", "text": instruction}]}]
        self.prompt = self.processor.apply_chat_template(messages, add_generation_prompt=True)
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size

    def read(self, image: np.ndarray) -> str:
        return self.read_batch(image[None])[0]

    def read_batch(self, images: np.ndarray) -> list[str]:
        import torch
        from PIL import Image

        from spotlight.rewards.vision import to_uint8  # torch: this engine's alone

        pictures = [Image.fromarray(p) for p in to_uint8(images)]
        texts: list[str] = []
        for start in range(0, len(pictures), self.batch_size):
            batch = pictures[start:start + self.batch_size]
            inputs = self.processor(text=[self.prompt] * len(batch), images=batch,
                                    return_tensors="pt", padding=True)
            with torch.no_grad():
                out = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens,
                                          do_sample=False)
            texts += self.processor.batch_decode(out[:, inputs["input_ids"].shape[1]:],
                                                 skip_special_tokens=True)
        return [t.strip() for t in texts]


def _transformers_engine(config: RewardConfig) -> OcrEngine:
    if not config.ocr_model:
        raise ValueError("reward.ocr_engine = 'transformers' needs reward.ocr_model: a folder or "
                         "object-storage URL of a vision-language OCR model and its processor")
    return TransformersOcrEngine(config.ocr_model)


ENGINES: dict[str, Callable[[RewardConfig], OcrEngine]] = {
    "rapidocr": lambda config: RapidOcrEngine(), "transformers": _transformers_engine}


@register_reward("ocr-text")
class TextOcrReward:
    """Flow-GRPO's OCR reward of real images, read by the engine ``reward.ocr_engine`` names."""

    name = "ocr-text"

    def __init__(self, config: RewardConfig, engine: OcrEngine | None = None) -> None:
        if engine is None:
            if config.ocr_engine not in ENGINES:
                raise ValueError(f"reward.ocr_engine = {config.ocr_engine!r}; choose one of "
                                 f"{sorted(ENGINES)}")
            engine = ENGINES[config.ocr_engine](config)
        self.engine = engine

    @property
    def recognizer_accuracy(self) -> float:
        return float("nan")   # a pretrained engine: no held-out split of ours to report

    def __call__(self, images: np.ndarray, prompts: Sequence[Prompt]) -> np.ndarray:
        check_batch(images, prompts, "ocr", self.name)
        batch = getattr(self.engine, "read_batch", None)
        read = batch(images) if batch is not None else [self.engine.read(i) for i in images]
        values = [ocr_score(text, prompt.target or "") for text, prompt in zip(read, prompts)]
        return check_rewards(np.asarray(values, np.float64), where=f"reward '{self.name}'")
