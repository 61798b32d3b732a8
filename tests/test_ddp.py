"""Both fast loaders under DDP: DistributedSampler's split, equal steps on every rank (a
damaged file included), set_epoch, mid-epoch resume, any sampler, and the torchrun
example (examples/train_ddp.py) on gloo over a mount."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_fused import _folder, encode, photo
from torch.utils.data import DistributedSampler

from pcrfs.torch import FastImageFolder, GPUImageFolder, RecordAwareSampler
from pcrfs.torch.loading import SampleError, world

from conftest import run_pcrfs

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py"


def _ranks(make, world_size):
    """make(rank) -> loader; every rank's batches (lists of sample indices) of the epoch."""
    return [make(r).batches() for r in range(world_size)]


@pytest.mark.parametrize("n_ranks,drop_last", [(2, False), (3, False), (3, True)])
def test_ranks_split_one_permutation_as_distributedsampler(tmp_path, n_ranks, drop_last):
    root = _folder(tmp_path / "ds")              # 21 samples: 3 ranks pad or drop
    ds = FastImageFolder(root, size=32, seed=5)
    n = len(ds)
    for epoch in (0, 1):
        def make(r, epoch=epoch):
            lo = ds.loader(4, num_replicas=n_ranks, rank=r, drop_last=drop_last)
            lo.set_epoch(epoch)
            return lo
        per_rank = _ranks(make, n_ranks)
        assert len({len(b) for b in per_rank}) == 1               # the same steps everywhere
        assert len({len(make(r)) for r in range(n_ranks)}) == 1
        assert len(per_rank[0]) == len(make(0))
        for r, batches in enumerate(per_rank):
            ref = DistributedSampler(range(n), n_ranks, r, shuffle=True, seed=5,
                                     drop_last=drop_last)
            ref.set_epoch(epoch)
            flat = [i for b in batches for i in b]
            want = list(ref)
            if drop_last:                  # the last short batch of the rank is dropped
                want = want[: len(want) // 4 * 4]
            assert flat == want
        every = [i for b in per_rank for batch in b for i in batch]
        if not drop_last:
            assert set(every) == set(range(n))                  # every sample, once ...
            assert len(every) - n == -n % n_ranks               # ... plus the padding
        else:
            assert len(every) == len(set(every))                 # disjoint
    a, b = make(0), ds.loader(4, num_replicas=n_ranks, rank=0, drop_last=drop_last)
    assert a.batches() != b.batches()                            # set_epoch moves the order


def test_world_comes_from_the_process_group(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert world() == (1, 0)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert world() == (4, 3) and world(2, 1) == (2, 1)     # torchrun's env before init
    with pytest.raises(ValueError):
        world(2, 2)
    import torch.distributed as dist
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        assert world() == (1, 0)                              # the group wins over the env
        lo = FastImageFolder(_folder(tmp_path / "ds"), size=32).loader(4)
        assert (lo.plan.num_replicas, lo.plan.rank) == (1, 0)
    finally:
        dist.destroy_process_group()


def test_a_damaged_file_leaves_its_rank_in_step(tmp_path):
    """One rank's broken file: that rank still yields as many batches, each as large, as
    the others; the slot is replaced and counted.  A batch of nothing but broken files
    draws other samples; a folder of nothing but broken files raises, never hangs."""
    root = _folder(tmp_path / "ds", corrupt="broken.jpg")
    ds = FastImageFolder(root, size=32, seed=1)
    bad = next(i for i, (p, _) in enumerate(ds.samples) if p.endswith("broken.jpg"))
    loaders = [ds.loader(4, num_replicas=2, rank=r, threads=2) for r in range(2)]
    owner = next(r for r, lo in enumerate(loaders) if bad in sum(lo.batches(), []))
    shapes = [[tuple(x.shape) for x, _ in lo] for lo in loaders]
    assert shapes[0] == shapes[1] and len(shapes[0]) == len(loaders[0])
    assert loaders[owner].failed == loaders[owner].replaced == 1
    assert loaders[1 - owner].failed == 0
    # GPUImageFolder keeps the same contract
    gl = [GPUImageFolder(root, 4, device="cpu", size=32, threads=2, num_replicas=2, rank=r)
          for r in range(2)]
    gshapes = [[tuple(x.shape) for x, _ in g] for g in gl]
    assert gshapes[0] == gshapes[1] and len(gshapes[0]) == len(gl[0])
    assert sum(g.failed for g in gl) == 1 and sum(g.replaced for g in gl) == 1
    # a batch whose every file is broken: other samples fill it
    for name in ("0.jpg", "1.jpg", "2.jpg"):
        (root / "cat" / name).write_bytes(encode(photo(80, 80))[:150])
    cats = sorted(i for i, (p, _) in enumerate(ds.samples) if "/cat/" in p and "broken" not in p)
    lo = FastImageFolder(root, size=32).loader(4, shuffle=False, threads=2,
                                               sampler=torch.utils.data.BatchSampler(
                                                   [bad] + cats[:3], 4, False))
    x, y = next(iter(lo))
    assert len(y) == 4 and lo.failed >= 4 and lo.replaced == 4
    broken = tmp_path / "broken" / "c"
    broken.mkdir(parents=True)
    for i in range(3):
        (broken / f"{i}.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    with pytest.raises(SampleError, match="no sample"):
        list(FastImageFolder(broken.parent, size=32).loader(2, threads=1))


def test_mid_epoch_resume_on_every_rank(tmp_path):
    root = _folder(tmp_path / "ds")
    ds = FastImageFolder(root, size=32, seed=2)
    for r in range(2):
        full = [(x, y) for x, y in ds.loader(3, num_replicas=2, rank=r, threads=2)]
        first = FastImageFolder(root, size=32, seed=2).loader(3, num_replicas=2, rank=r)
        it = iter(first)
        next(it)
        next(it)
        state = first.state_dict()
        assert (state["epoch"], state["next_batch"]) == (0, 2)
        again = FastImageFolder(root, size=32, seed=2).loader(3, num_replicas=2, rank=r)
        again.load_state_dict(state)
        rest = list(again)
        assert len(rest) == len(full) - 2
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                   for a, b in zip(full[2:], rest, strict=True))
        assert again.epoch == 1
        with pytest.raises(ValueError, match="world size"):
            ds.loader(3, num_replicas=3, rank=0).load_state_dict(state)


def test_device_normalisation_equals_the_c_pass(tmp_path):
    """The arithmetic the CUDA path runs on the device (uint8 up, normalised there), run
    on the CPU: the same batches as normalising in the C pass."""
    root = _folder(tmp_path / "ds")
    mean_std = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    ref = list(FastImageFolder(root, size=32, seed=3, normalize=mean_std).loader(5, threads=2))
    lo = FastImageFolder(root, size=32, seed=3, normalize=mean_std).loader(5, threads=2)
    lo._device_normalize = True
    got = list(lo)
    assert all(a[0].dtype == b[0].dtype == torch.float32 for a, b in zip(ref, got, strict=True))
    assert max(float((a[0] - b[0]).abs().max()) for a, b in zip(ref, got, strict=True)) < 1e-5


def test_samplers_drive_the_fused_path(small_src, tmp_path, mount):
    from pcrfs.torch import LocalityAwareBatchSampler
    ds_path = tmp_path / "ds"
    run_pcrfs("build", small_src, ds_path, "-q", "--images-per-record", "4")
    m = mount(ds_path)
    ds = FastImageFolder(m.mnt / "q3", size=32, seed=0)
    for r in range(2):
        s = RecordAwareSampler(ds, shuffle_window=2, seed=4, num_replicas=2, rank=r)
        s.set_epoch(1)
        order = list(s)
        lo = ds.loader(5, sampler=RecordAwareSampler(ds, shuffle_window=2, seed=4,
                                                     num_replicas=2, rank=r), threads=2)
        lo.set_epoch(1)
        assert [i for b in lo.batches() for i in b] == order
        assert sum(len(y) for _, y in lo) == len(order) and lo.failed == 0
    bs = LocalityAwareBatchSampler(ds, 4, num_replicas=2, rank=1, ranks_per_node=1)
    lo = ds.loader(4, sampler=LocalityAwareBatchSampler(ds, 4, num_replicas=2, rank=1,
                                                        ranks_per_node=1), threads=2)
    assert lo.batches() == [list(b) for b in bs] and len(lo) == len(bs)
    got = [y.tolist() for _, y in lo]
    assert got == [[ds.targets[i] for i in b] for b in bs]
    with pytest.raises(ValueError, match="sampler"):
        ds.loader(4, sampler=bs, num_replicas=2)


def test_torchrun_example_sees_each_sample_once_and_resumes(small_src, tmp_path, mount):
    """examples/train_ddp.py, 2 ranks on gloo over MNT/q4: stopped after 2 steps with a
    checkpoint, then resumed from it to the end of the epoch."""
    ds_path = tmp_path / "ds"
    run_pcrfs("build", small_src, ds_path, "-q", "--images-per-record", "6")
    m = mount(ds_path)
    log, ck = tmp_path / "steps.jsonl", tmp_path / "ck.pt"
    env = os.environ | {"OMP_NUM_THREADS": "1"}

    def torchrun(*extra):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", str(EXAMPLE), str(m.mnt / "q4"), "--device", "cpu",
               "--batch-size", "3", "--size", "32", "--threads", "1", "--seed", "9",
               "--checkpoint", str(ck), "--sample-log", str(log), *extra]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout
    torchrun("--max-steps", "2")
    before = [json.loads(s) for s in log.read_text().splitlines()]
    out = torchrun()
    assert "resumed from" in out and "epoch 0" in out
    steps = [json.loads(s) for s in log.read_text().splitlines()]
    after = steps[len(before):]
    n = 24                                      # small_src: 24 images, 4 steps x 3 x 2 ranks
    for r in range(2):
        mine_before = [s["step"] for s in before if s["rank"] == r]
        mine_after = [s["step"] for s in after if s["rank"] == r]
        assert mine_before == [0, 1] and mine_after == [2, 3]     # the same steps per rank
    seen = [i for s in steps for i in s["samples"]]
    assert sorted(seen) == list(range(n))                          # each sample once
    # the resume saw exactly the rest: DistributedSampler's split of epoch 0
    for r in range(2):
        ref = DistributedSampler(range(n), 2, r, shuffle=True, seed=9)
        want = list(ref)[6:]
        assert [i for s in after if s["rank"] == r for i in s["samples"]] == want


def test_torchrun_example_trains_on_train_and_validates_on_val(tmp_path):
    """A root holding train/ and val/ (torchvision's references' layout): the example trains
    on train/, names its classes and counts, and ends each epoch with a validation pass
    over val/ summed over both ranks.  A root whose only classes are splits is refused in
    one line, before any process group starts."""
    root = tmp_path / "splits"
    _folder(root / "train")
    _folder(root / "val", n_per_class=2)
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", str(EXAMPLE), str(root), "--device", "cpu", "--batch-size", "4", "--size", "32",
           "--threads", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (f"train: {root / 'train'}, 20 images in 3 classes (cat, dog, eel); "
            f"val: {root / 'val'}, 8 images") in p.stdout
    line = next(x for x in p.stdout.splitlines() if x.startswith("epoch 0 val: top-1"))
    assert line.endswith("of 8)")                        # 8 images, 4 per rank
    bad = tmp_path / "only-splits"
    _folder(bad / "val", n_per_class=1)
    _folder(bad / "test", n_per_class=1)
    p = subprocess.run([sys.executable, str(EXAMPLE), str(bad), "--device", "cpu"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "its only classes are ['test', 'val'], which name splits" in p.stderr


def test_loaders_match_dataloader_with_distributedsampler_under_torchrun(tmp_path):
    """tests/ddp_parity.py on 2 gloo ranks: each rank's FastLoader batches equal a
    DataLoader's over the same dataset with DistributedSampler (pixels and labels) after
    a peek, after a break and across a resume, and GPUImageFolder's labels follow the
    same split (issue 83)."""
    root = _folder(tmp_path / "ds")
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    script = Path(__file__).resolve().parent / "ddp_parity.py"
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node", "2", str(script), str(root)],
                       capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(line for line in p.stdout.splitlines() if " ok " in line) == \
        ["rank 0 ok 5", "rank 1 ok 5"]
