"""Locality-aware loading (issue 20): the shard rule, Algorithm 1, the sampler's schedule,
ThreadedDataset, and Theorem 1 under DDP (gloo)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pcrfs.cluster.shard import Shard, owned, owners, parse_shard
from pcrfs.torch import LocalityAwareBatchSampler, ThreadedDataset, balance


class Fake(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def records_for(n, per_record):
    return [i // per_record for i in range(n)]


# -- the shard rule -------------------------------------------------------------------
def test_shards_are_disjoint_complete_balanced_and_seeded():
    counts = {r: 64 for r in range(40)} | {40: 17}
    for p in (1, 2, 3, 4, 7):
        own = owners(counts, p, seed=3)
        assert set(own) == set(counts) and set(own.values()) <= set(range(p))
        parts = [owned(counts, Shard(i, p, 3)) for i in range(p)]
        assert set().union(*parts) == set(counts)
        assert sum(len(x) for x in parts) == len(counts)
        per_node = [sum(counts[r] for r in part) for part in parts]
        assert max(abs(c - sum(counts.values()) / p) for c in per_node) < 64, per_node
    assert owners(counts, 4, seed=3) == owners(counts, 4, seed=3)
    assert owners(counts, 4, seed=3) != owners(counts, 4, seed=4)


def test_parse_shard_refuses_nonsense():
    assert parse_shard("1/4") == Shard(1, 4, 0)
    for bad in ("4/4", "x", "1/0", "-1/2", ""):
        with pytest.raises(ValueError):
            parse_shard(bad)


# -- Algorithm 1 ------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=16))
def test_balance_reaches_every_target_in_few_transfers(counts):
    p = len(counts)
    total = sum(counts)
    target = total // p
    counts = list(counts)
    counts[0] += p * target - total if p * target < total else 0
    # make the sum divisible: move the rest onto node 0's target
    targets = [target] * p
    targets[0] += sum(counts) - p * target
    moves = balance(counts, targets)
    after = list(counts)
    for src, dst, m in moves:
        assert m > 0 and counts[src] > targets[src] and counts[dst] < targets[dst]
        after[src] -= m
        after[dst] += m
    assert after == targets
    assert len(moves) <= max(p - 1, 0)


# -- the sampler -------------------------------------------------------------------------
def samplers(n, per_record, b, world, per_node, seed=0, **kw):
    recs = records_for(n, per_record)
    return [LocalityAwareBatchSampler(Fake(n), b, world, r, per_node, seed, records=recs, **kw)
            for r in range(world)]


@pytest.mark.parametrize("n,per,b,world,per_node", [
    (1024, 32, 16, 4, 1), (1000, 25, 8, 4, 2), (997, 13, 5, 6, 3), (640, 64, 32, 2, 2)])
def test_every_rank_gets_batch_size_and_ranks_union_is_the_global_batch(n, per, b, world,
                                                                       per_node):
    ss = samplers(n, per, b, world, per_node, seed=7)
    batches = [list(s) for s in ss]
    steps = len(ss[0])
    assert all(len(x) == steps for x in batches)
    order = ss[0].order()
    seen = []
    for j in range(steps):
        got = [batches[r][j] for r in range(world)]
        assert all(len(x) == b for x in got)
        union = sorted(i for x in got for i in x)
        glob = sorted(order[j * b * world : (j + 1) * b * world].tolist())
        assert union == glob                       # Theorem 1: the same global batch
        seen.extend(union)
    # every sample at least once; exactly once where n divides
    assert set(seen) == set(range(n))
    if n % (b * world) == 0:
        assert sorted(seen) == list(range(n))
    # identical schedule from the seed on every rank (each computed its own)
    assert [list(x) for x in ss[1].schedule()] == [list(x) for x in ss[0].schedule()]


def test_ranks_read_mostly_what_their_node_owns():
    ss = samplers(4096, 64, 32, 4, 1, seed=1)
    s = ss[0]
    local = total = 0
    for r, sampler in enumerate(ss):
        for batch in sampler:
            local += int((s.owner[batch] == r).sum())
            total += len(batch)
    beta = s.imbalance()
    assert abs(local / total - (1 - beta)) < 1e-9
    # the paper's closed form for L = 32, p = 4: about 6 %; far below DistributedSampler's 3/4
    assert beta < 0.12


def test_epochs_differ_and_resume_mid_epoch_gives_the_same_rest():
    s = samplers(512, 32, 16, 2, 1, seed=5)[1]
    s.set_epoch(3)
    full = list(s)
    s.set_epoch(4)
    assert list(s) != full
    s.set_epoch(3)
    it = iter(s)
    head = [next(it) for _ in range(5)]
    state = s.state_dict()
    assert state["step"] == 5 and state["epoch"] == 3
    fresh = samplers(512, 32, 16, 2, 1, seed=5)[1]
    fresh.load_state_dict(state)
    assert head + list(fresh) == full
    fresh.set_epoch(3)
    assert list(fresh) == full           # the resume applies to one iteration only
    with pytest.raises(ValueError):
        samplers(512, 32, 16, 2, 1, seed=6)[1].load_state_dict(state)


def test_drop_last_and_bad_arguments():
    s = samplers(1000, 10, 16, 4, 2, drop_last=True)[0]
    assert len(s) == 1000 // 64 and all(len(b) == 16 for b in s)
    with pytest.raises(ValueError):
        samplers(100, 10, 4, 4, 3)
    with pytest.raises(ValueError):
        samplers(100, 10, 4, 2, 1, balance="ring")
    with pytest.raises(ValueError):
        LocalityAwareBatchSampler(Fake(10), 4, 2, 2, 1, records=records_for(10, 5))


# -- ThreadedDataset ----------------------------------------------------------------------
_pairs: dict = {}


class Slow(Fake):
    def __getitem__(self, i):
        # Each call waits for a second loader thread of the same worker to arrive, so a
        # pool that runs items one at a time breaks the barrier instead of passing.
        barrier = _pairs.setdefault(os.getpid(), threading.Barrier(2, timeout=60))
        barrier.wait()
        return i, threading.get_ident(), os.getpid()


def test_threaded_dataset_uses_threads_per_worker_and_keeps_order():
    ds = ThreadedDataset(Slow(64), threads=4)
    assert ds.n == 64                           # attributes pass through
    loader = torch.utils.data.DataLoader(ds, batch_size=16, num_workers=2,
                                         collate_fn=lambda x: x)
    got = [item for batch in loader for item in batch]
    assert [i for i, _, _ in got] == list(range(64))
    pids = {p for _, _, p in got}
    assert len(pids) == 2 and os.getpid() not in pids     # loaded in the workers
    for pid in pids:                    # thread idents repeat across processes: count per pid
        assert len({t for _, t, p in got if p == pid}) >= 2
    with pytest.raises(ValueError):
        ThreadedDataset(Slow(1), threads=0)


# -- Theorem 1 under DDP ---------------------------------------------------------------------
TRAIN = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    from pcrfs.torch import LocalityAwareBatchSampler
    rank, world, mode, port, out, reduction = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                               sys.argv[4], sys.argv[5], sys.argv[6])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(256, 8, generator=g), torch.randn(256, 1, generator=g)
    data = TensorDataset(x, y)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                    torch.nn.Linear(16, 1)).double())
    b = 16
    opt = torch.optim.SGD(model.parameters(), lr=0.05 / (b if reduction == "sum" else 1))
    if mode == "locality":
        s = LocalityAwareBatchSampler(data, b, world, rank, 1, seed=3,
                                      records=[i // 16 for i in range(256)])
        loader = DataLoader(data, batch_sampler=s)
    else:   # regular: the same global batches, dealt round-robin (DistributedSampler's way)
        class Regular(LocalityAwareBatchSampler):
            def step(self, batch):
                return [batch[r::self.num_replicas].tolist()
                        for r in range(self.num_replicas)], []
        s = Regular(data, b, world, rank, 1, seed=3, records=[0] * 256)
        loader = DataLoader(data, batch_sampler=s)
    for epoch in range(3):
        s.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            err = (model(xb.double()) - yb.double()) ** 2
            loss = err.sum() if reduction == "sum" else err.mean()
            loss.backward()
            opt.step()
    if rank == 0:
        torch.save([p.detach() for p in model.parameters()], out)
    dist.barrier()
    dist.destroy_process_group()
    # Gloo's threads can race the interpreter's C++ teardown into an abort after all of
    # the above has finished (CI saw "terminate called without an active exception");
    # the exit code should say whether training did, so skip that teardown.
    sys.stdout.flush()
    os._exit(0)
""")


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_ddp_training_is_the_same_under_locality_aware_loading(tmp_path, reduction):
    """sum: the paper's setting; mean: DDP's default, equal only because every rank gets
    exactly batch_size (the spec's correction)."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    weights = {}
    for mode in ("regular", "locality"):
        out = tmp_path / f"{mode}.pt"
        port = str(_free_port())
        procs = [subprocess.Popen([sys.executable, str(script), str(r), "2", mode, port,
                                   str(out), reduction], cwd="/") for r in range(2)]
        assert [p.wait(timeout=300) for p in procs] == [0, 0]
        weights[mode] = torch.load(out)
    # the sampler did change who trains on what (otherwise this proves nothing)
    recs = [i // 16 for i in range(256)]
    loc = LocalityAwareBatchSampler(Fake(256), 16, 2, 0, 1, seed=3, records=recs)
    rr = [batch[0::2].tolist() for batch in loc.order().split(32)]
    assert [sorted(b) for b in loc] != [sorted(b) for b in rr]
    for a, b in zip(weights["regular"], weights["locality"], strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=0), (a - b).abs().max()
