"""The torch side of fidelity: FidelityAutotuner on a real mount (tiny CNN, CPU), the
paper's schedule, RecordAwareSampler's order and what it does to the daemon's reads, and
the examples/ training script end to end."""
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")   # the torch extra is part of `make test`
from torch import nn  # noqa: E402
from torchvision import transforms  # noqa: E402
from torchvision.datasets import ImageFolder  # noqa: E402

from pcrfs.control import get_fidelity, set_fidelity  # noqa: E402
from pcrfs.dataset import open_dataset  # noqa: E402
from pcrfs.torch import (  # noqa: E402
    AutotuneSchedule,
    FidelityAutotuner,
    RecordAwareSampler,
    batches_from,
)
from pcrfs.torch.sampler import record_of  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TF = transforms.Compose([transforms.Resize(48), transforms.CenterCrop(48), transforms.ToTensor()])


def _tiny(classes):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, classes))


def test_schedule_follows_the_paper():
    s = AutotuneSchedule()
    assert [e for e in range(60) if s.should_tune(e)] == [5, 25, 45]
    assert [e for e in range(8) if AutotuneSchedule(warmup=1, every=3).should_tune(e)] == [1, 4, 7]


def test_autotuner_on_a_mount(crops_ds, mount):
    ds = open_dataset(str(crops_ds))
    m = mount(crops_ds)
    data = ImageFolder(str(m.mnt / "dynamic"), transform=TF)
    model = _tiny(len(data.classes))
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tuner = FidelityAutotuner(model, nn.CrossEntropyLoss(), m.mnt, transform=TF)
    batches = batches_from(data, n_batches=2, batch_size=8)
    assert len(batches) == 2 and all(len(b) == 8 for b in batches)
    res = tuner.tune(batches, epoch=5)
    G = ds.groups
    assert set(res.similarities) == set(range(1, G + 1))
    assert all(-1.0 <= s <= 1.0 for s in res.similarities.values())
    assert res.similarities[G] == pytest.approx(1.0, abs=1e-5)      # qG against itself
    # the choice is the lowest k at or above the threshold
    assert res.similarities[res.k] >= 0.8
    assert all(res.similarities[k] < 0.8 for k in range(1, res.k))
    assert get_fidelity(m.mnt) == res.k                               # dynamic/ switched
    # frozen: parameters, BatchNorm statistics, .grad and the training mode are untouched
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters()) and model.training
    # images really differ by fidelity: q1 and qG gradients are not the same
    assert res.similarities[1] < 1.0 - 1e-6
    # a stricter threshold never chooses a lower k; plain paths work as items too
    strict = FidelityAutotuner(model, nn.CrossEntropyLoss(), m.mnt, transform=TF,
                               threshold=1.0, switch=False)
    plain = [[p for p, _ in b] for b in batches]
    r2 = strict.tune(plain)
    assert r2.k >= res.k and r2.similarities[G] == pytest.approx(1.0, abs=1e-5)
    assert get_fidelity(m.mnt) == res.k                               # switch=False
    with pytest.raises(ValueError):
        FidelityAutotuner(model, nn.CrossEntropyLoss(), m.mnt, transform=TF, candidates=[0])


def _positions(order, rec_of):
    spans = {}
    for pos, i in enumerate(order):
        r = rec_of[i]
        lo, _ = spans.get(r, (pos, pos))
        spans[r] = (lo, pos)
    return spans


def test_record_aware_sampler_order(crops_ds, mount):
    ds = open_dataset(str(crops_ds))
    m = mount(crops_ds)
    data = ImageFolder(str(m.mnt / "q5"))
    where = [record_of(p) for p, _ in data.samples]
    rec_of = [r for r, _ in where]
    s = RecordAwareSampler(data, shuffle_window=2, seed=3)
    order = list(s)
    assert sorted(order) == list(range(len(data))) and len(s) == len(data)
    assert list(s) == order                                 # same epoch, same order
    s.set_epoch(1)
    assert list(s) != order and sorted(s) == list(range(len(data)))
    # at most shuffle_window records are being read at any point
    spans = _positions(order, rec_of)
    for pos in range(len(order)):
        assert sum(lo <= pos <= hi for lo, hi in spans.values()) <= 2
    # each record is walked in index order, from a random start (cyclically)
    for r in set(rec_of):
        idx = [where[i][1] for i in order if rec_of[i] == r]
        assert sum(b != (a + 1) % len(idx) for a, b in zip(idx, idx[1:], strict=False)) == 0
    # records split between replicas, disjointly and completely
    parts = [list(RecordAwareSampler(data, seed=3, num_replicas=2, rank=r)) for r in (0, 1)]
    assert sorted(parts[0] + parts[1]) == list(range(len(data)))
    assert not {rec_of[i] for i in parts[0]} & {rec_of[i] for i in parts[1]}
    with pytest.raises(ValueError, match="not on a pcrfs mount"):
        RecordAwareSampler(ImageFolder(str(crops_ds.parent / "src")))
    assert ds.manifest["records"] == len(set(rec_of))


@pytest.mark.parametrize("workers", [0, 2])
def test_record_aware_sampler_makes_the_daemon_fetch_extents(crops_ds, mount, workers):
    ds = open_dataset(str(crops_ds))
    # the Python reader's extent policy (remote records; local ones with the lane's cold
    # path off: the lane reads exactly each file's segments, tests/test_dataplane.py)
    m = mount(crops_ds, "-o", "lane_cold=no")
    data = ImageFolder(str(m.mnt / "q5"), loader=lambda p: open(p, "rb").read())
    dl = torch.utils.data.DataLoader(data, batch_size=16, num_workers=workers,
                                     sampler=RecordAwareSampler(data, shuffle_window=2),
                                     collate_fn=lambda b: b)
    served = sum(len(x) for batch in dl for x, _ in batch)
    st = m.stats()
    assert st["served_files"]["q5"] == len(data)
    assert st["extent_fetches"] == ds.manifest["records"]       # one sequential read each
    # before its extent, a record's first images are read segment by segment (5 at q5):
    # SEQUENTIAL_RUN - 1 with one reader, a few more when two workers interleave batches
    from pcrfs.storage.reader import SEQUENTIAL_RUN
    before_extent = SEQUENTIAL_RUN - 1 if workers == 0 else 12
    assert st["backend_reads"] <= ds.manifest["records"] * (before_extent * 5 + 1)
    assert st["backend_bytes"] <= served * (1 + before_extent / 64 + 0.01)


def test_example_trains_and_autotunes(crops_ds, mount):
    m = mount(crops_ds)
    other = open_dataset(str(crops_ds)).groups - 1
    set_fidelity(m.mnt, other)              # another job's choice, given back at exit
    p = subprocess.run([sys.executable, str(REPO / "examples" / "autotune_tiny.py"), str(m.mnt),
                        "--epochs", "3", "--warmup", "1", "--every", "1", "--size", "32",
                        "--workers", "0", "--json"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    G = open_dataset(str(crops_ds)).groups
    assert [r["epoch"] for r in rows] == [0, 1, 2]
    assert rows[0]["k"] == G and not rows[0]["tuned"]                # full fidelity first
    for r in rows[1:]:
        assert r["tuned"]
        sims = {int(k[1:]): v for k, v in r["similarities"].items()}
        assert r["k"] == min([k for k, s in sims.items() if s >= 0.8] or [G])
    assert all(r["loss"] > 0 for r in rows)
    assert get_fidelity(m.mnt) == other
    assert Counter(m.stats()["served_files"]).total() > 3 * 240
