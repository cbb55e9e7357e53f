"""Frames and labels from the scene: images normalised for the backbone, class ids
downsampled to the label grid, and mIoU."""
from __future__ import annotations

import numpy as np

from .model import MEAN, STD


def normalize(rgb: np.ndarray) -> np.ndarray:
    """uint8 [H, W, 3] (sRGB bytes) -> float32 [3, H, W] with ImageNet mean and std."""
    x = rgb.astype(np.float32) / 255.0
    return ((x - np.asarray(MEAN, np.float32)) / np.asarray(STD, np.float32)).transpose(2, 0, 1)


def downsample_ids(ids: np.ndarray, stride: int) -> np.ndarray:
    """Nearest sampling at the centre of each stride x stride block (as the GPU does)."""
    o = stride // 2
    return ids[o::stride, o::stride]


def confusion(pred: np.ndarray, target: np.ndarray, classes: int) -> np.ndarray:
    idx = target.astype(np.int64).ravel() * classes + pred.astype(np.int64).ravel()
    return np.bincount(idx, minlength=classes * classes).reshape(classes, classes)


def miou(conf: np.ndarray) -> float:
    """Mean IoU over the classes present in the targets or the predictions."""
    inter = np.diag(conf).astype(np.float64)
    union = conf.sum(0) + conf.sum(1) - inter
    present = union > 0
    return float((inter[present] / union[present]).mean()) if present.any() else 0.0


def iou(conf: np.ndarray, cls: int) -> float:
    inter = conf[cls, cls]
    union = conf[cls].sum() + conf[:, cls].sum() - inter
    return float(inter / union) if union else 0.0


def render_dataset(scene, items, progress=None):
    """[(seed, t)] -> (images float32 [n, 3, H, W], ids uint8 [n, H, W])."""
    images, ids = [], []
    for i, (seed, t) in enumerate(items):
        if scene.seed != seed:
            scene.reseed(seed)
        rgb, lab = scene.read_frame(t)
        images.append(normalize(rgb))
        ids.append(lab)
        if progress:
            progress(i)
    return np.stack(images), np.stack(ids)
