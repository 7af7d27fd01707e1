"""Pictures a user looks at: validation image grids and reward curves."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


def image_grid(images: np.ndarray, labels: list[str], path: str | Path, *, columns: int = 8,
               scale: int = 4, rewards: np.ndarray | None = None) -> Path:
    """Save (N, 3, H, W) images in [0, 1] as an upscaled grid with a caption under each."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n, _, h, w = images.shape
    cell_w, cell_h, caption = w * scale, h * scale, 12
    rows = (n + columns - 1) // columns
    sheet = Image.new("RGB", (columns * (cell_w + 4), rows * (cell_h + caption + 4)), (32, 32, 32))
    draw = ImageDraw.Draw(sheet)
    for i in range(n):
        r, c = divmod(i, columns)
        tile = Image.fromarray((images[i].transpose(1, 2, 0) * 255).round().astype(np.uint8))
        tile = tile.resize((cell_w, cell_h), Image.NEAREST)
        x, y = c * (cell_w + 4) + 2, r * (cell_h + caption + 4) + 2
        sheet.paste(tile, (x, y))
        text = labels[i][-22:]
        if rewards is not None:
            text = f"{rewards[i]:.2f} {text}"
        draw.text((x, y + cell_h), text[: cell_w // 6], fill=(220, 220, 220))
    sheet.save(path)
    return path


def reward_curve(curves: dict[str, list[dict]], path: str | Path, *, x: str = "iteration",
                 title: str = "validation reward", y: str = "val_reward",
                 ylabel: str = "mean validation reward") -> Path:
    """Plot one or more curves (lists of {x: ..., y: ...}; by default validation rewards)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, curve in curves.items():
        ax.plot([p[x] for p in curve], [p[y] for p in curve], marker="o", label=name)
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
