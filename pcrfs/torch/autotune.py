"""FidelityAutotuner: the PCR paper's gradient-similarity rule for choosing a fidelity.

With the model's parameters frozen (nothing is updated, BatchNorm and dropout in eval
mode), compute the loss gradient on the same images read from MNT/qk and from MNT/qG;
the cosine similarity of the two flattened gradients says whether training at qk points
the same way as training at full fidelity.  Pick the lowest k at or above the threshold
(0.8 in the paper) and switch MNT/dynamic to it.  AutotuneSchedule is the paper's
policy: never in the first 5 epochs, then every 20."""
from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from PIL import Image

from pcrfs.control import read_manifest, set_fidelity

log = logging.getLogger("pcrfs.autotune")

Item = str | tuple[str, int]   # a path relative to a view ("cls/x.jpg"), or (path, target)


@dataclass
class AutotuneSchedule:
    """Epochs are counted from 0: with the defaults, tune at epochs 5, 25, 45, ..."""
    warmup: int = 5
    every: int = 20

    def should_tune(self, epoch: int) -> bool:
        return epoch >= self.warmup and (epoch - self.warmup) % self.every == 0


@dataclass
class TuneResult:
    k: int                                  # the chosen fidelity
    similarities: dict[int, float]          # k -> mean cosine similarity over the batches
    threshold: float
    seconds: float
    seconds_per_candidate: dict[int, float] = field(default_factory=dict)


def batches_from(dataset, n_batches: int = 2, batch_size: int = 16, seed: int = 0) -> list[list[Item]]:
    """A few random batches of (path relative to the view, target) from an ImageFolder
    over any view of a mount (MNT/dynamic, MNT/qk)."""
    root = os.fspath(dataset.root)
    samples = list(dataset.samples)
    pick = random.Random(seed).sample(range(len(samples)), min(len(samples), n_batches * batch_size))
    items = [(os.path.relpath(samples[i][0], root), int(samples[i][1])) for i in pick]
    return [items[i : i + batch_size] for i in range(0, len(items), batch_size)]


def _pil_rgb(path: str) -> Image.Image:
    with open(path, "rb") as f:
        img = Image.open(f)
        return img.convert("RGB")


class FidelityAutotuner:
    """model, loss_fn(output, target) -> scalar, mnt: the mount point.
    transform: PIL image -> tensor (the user's own; images in a batch must end up the
    same shape).  candidates: the ks to try (default 1..G); qG is always the reference."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable, mnt: str | os.PathLike, *,
                 transform: Callable, candidates: Sequence[int] | None = None,
                 threshold: float = 0.8, device: str | torch.device | None = None,
                 loader: Callable[[str], object] = _pil_rgb, switch: bool = True):
        self.model, self.loss_fn, self.mnt = model, loss_fn, os.fspath(mnt)
        manifest = read_manifest(self.mnt)
        self.groups = int(manifest["groups"])
        self.classes = sorted(manifest["classes"])
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.candidates = sorted(set(candidates or range(1, self.groups + 1)))
        if not all(1 <= k <= self.groups for k in self.candidates):
            raise ValueError(f"candidates must lie in 1..{self.groups}")
        if not 0 < threshold <= 1:
            raise ValueError("threshold must be in (0, 1]")
        self.transform, self.threshold, self.loader, self.switch = transform, threshold, loader, switch
        self.device = torch.device(device) if device else next(model.parameters()).device
        self.history: list[tuple[int | None, TuneResult]] = []

    # -- pieces --------------------------------------------------------------------
    def _target(self, item: Item) -> tuple[str, int]:
        if isinstance(item, tuple):
            return item[0], int(item[1])
        cls = item.split("/")[0]
        return item, self.class_to_idx[cls]

    def load(self, k: int, batch: Sequence[Item]) -> tuple[torch.Tensor, torch.Tensor]:
        paths, targets = zip(*(self._target(i) for i in batch), strict=True)
        x = torch.stack([self.transform(self.loader(os.path.join(self.mnt, f"q{k}", p)))
                         for p in paths])
        return x.to(self.device), torch.tensor(targets, device=self.device)

    def gradient(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The flattened loss gradient with respect to the trainable parameters."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        loss = self.loss_fn(self.model(x), y)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                          for g, p in zip(grads, params, strict=True)])

    # -- the rule --------------------------------------------------------------------
    def similarities(self, batches: Sequence[Sequence[Item]]) -> tuple[dict[int, float], dict[int, float]]:
        """k -> mean cosine similarity of the qk and qG gradients over the batches, and
        k -> seconds spent on k (reading, forward, backward)."""
        if not batches or not all(batches):
            raise ValueError("need at least one non-empty batch")
        was_training = self.model.training
        self.model.eval()              # frozen: no BatchNorm statistics move, no dropout
        sims = {k: 0.0 for k in self.candidates}
        secs = dict.fromkeys(self.candidates, 0.0)
        try:
            for batch in batches:
                ref = self.gradient(*self.load(self.groups, batch))
                for k in self.candidates:
                    t0 = time.perf_counter()
                    g = self.gradient(*self.load(k, batch))
                    cos = torch.nn.functional.cosine_similarity(g, ref, dim=0, eps=1e-12)
                    sims[k] += float(cos.clamp(-1.0, 1.0))
                    secs[k] += time.perf_counter() - t0
        finally:
            self.model.train(was_training)
        return {k: v / len(batches) for k, v in sims.items()}, secs

    def choose(self, sims: dict[int, float]) -> int:
        """The lowest k at or above the threshold (qG, the reference, always qualifies)."""
        return min([k for k, s in sims.items() if s >= self.threshold] or [self.groups])

    def tune(self, batches: Sequence[Sequence[Item]], epoch: int | None = None) -> TuneResult:
        t0 = time.perf_counter()
        sims, secs = self.similarities(batches)
        k = self.choose(sims)
        res = TuneResult(k, sims, self.threshold, time.perf_counter() - t0, secs)
        if self.switch:
            set_fidelity(self.mnt, k)
        self.history.append((epoch, res))
        log.info("autotune%s: q%d (%s)", f" epoch {epoch}" if epoch is not None else "", k,
                 ", ".join(f"q{kk} {s:.3f}" for kk, s in sorted(sims.items())))
        return res

    def maybe_tune(self, epoch: int, batches: Sequence[Sequence[Item]],
                   schedule: AutotuneSchedule | None = None) -> TuneResult | None:
        """tune() if the schedule says so for this epoch, else None."""
        return self.tune(batches, epoch) if (schedule or AutotuneSchedule()).should_tune(epoch) else None
