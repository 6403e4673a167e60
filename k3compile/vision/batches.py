"""Synthetic image batches for the vision encoder's planners and benches: the issue's
distribution (log-normal patch counts clipped to 256 .. 65,536, aspect ratios between 1:2 and 2:1,
a few long videos)."""

from __future__ import annotations

import math
import random

FEWEST, MOST = 256, 65536


def synthetic_images(count: int, seed: int = 0, videos: int = 0, median: int = 2048, sigma: float = 1.2) -> list[str]:
    """`count` images as 'HxW' patch grids (log-normal patch counts, median `median`, clipped to
    256 .. 65,536) and `videos` videos 'FxHxW' (8 .. 64 frames of 16x16 .. 32x32 patches)."""
    rng = random.Random(seed)
    images = []
    for _ in range(count):
        patches = min(max(rng.lognormvariate(math.log(median), sigma), FEWEST), MOST)
        aspect = math.exp(rng.uniform(math.log(0.5), math.log(2.0)))
        height = max(1, round(math.sqrt(patches * aspect)))
        width = max(1, min(round(patches / height), MOST // height))
        height = max(height, -(-FEWEST // width))
        images.append(f"{height}x{width}")
    for _ in range(videos):
        side = rng.choice((16, 24, 32))
        images.append(f"{rng.randint(8, MOST // (side * side))}x{side}x{side}")
    return images
