"""What the fast loaders share: ImageFolder's samples, this rank's batches of an epoch,
the reading threads that keep batches in flight, the bad-sample policy and resumable state.

FastImageFolder's loader (the fused C path) and GPUImageFolder differ only in how a batch
of files becomes tensors (`BatchLoader._submit` / `_result`); everything a training job
relies on across ranks and restarts is here, written once:

- `world()`: num_replicas and rank from the process group (torch.distributed), else from
  torchrun's WORLD_SIZE / RANK, else 1 and 0.
- `EpochPlan`: DistributedSampler's split.  Each epoch draws one permutation from
  (seed, epoch) (torch's DistributedSampler itself does the drawing), pads it by repeating
  its head to a multiple of the ranks (drop_last: truncates), and deals it out
  rank::num_replicas, so every rank has the same number of samples and batches and the
  ranks together cover every sample once (the padding aside).  `sampler=` takes any torch
  Sampler of indices or batch sampler (lists) instead: it then decides the split.
- `BatchLoader`: `prefetch` batches in flight on `threads` threads; a sample that cannot
  be read or decoded never changes the number of batches (`on_error`, below), so it cannot
  leave one DDP rank a step short and its peers waiting in an all-reduce.

Iteration is torch's DataLoader contract:
- every `iter(loader)` is a pass of its own over the current epoch, from its first batch:
  a batch peeked with `next(iter(loader))`, or a pass left with `break`, takes nothing
  from the next pass;
- two live iterators are independent (each its own position and batches in flight);
- a pass that runs to its end moves the loader to the next epoch (a new shuffle, as a
  DataLoader's RandomSampler draws one per pass); `set_epoch(e)` sets it, as
  DistributedSampler's does;
- `state_dict()` is where the latest iterator stands (torchdata's StatefulDataLoader
  convention): taken after k batches and given to `load_state_dict()` in a new process,
  the next `iter()` starts at batch k + 1 of that epoch; later ones start from the first."""
from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.utils.data

# ImageNet's per-channel mean and std on 0..1 (torchvision's references): both loaders'
# default normalisation
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGENET = (IMAGENET_MEAN, IMAGENET_STD)

ON_ERROR = ("replace", "skip", "raise")


# The keyword arguments both loaders take, in the order their old positional calls gave
# them after (root, batch_size); FastLoader adds `fast`.  GPUImageFolder(root, 4, "cpu")
# still works, with a DeprecationWarning.
LOADER_ARGS = ("device", "size", "scale", "ratio", "flip", "train", "normalize", "shuffle",
               "seed", "drop_last", "threads", "prefetch", "on_error", "num_replicas", "rank",
               "sampler")


def positional(init, args: tuple, here: dict, order=LOADER_ARGS) -> list:
    """The values of `order` in a call of init (a loader's __init__, whose locals are
    `here`) that gave args after (root, batch_size): each arg by its place in `order`,
    warned; a name also given by keyword (not at its default) is a TypeError."""
    import inspect
    import warnings
    cls = init.__qualname__.split(".")[0]
    if len(args) > len(order):
        raise TypeError(f"{cls}: {len(args) + 2} positional arguments, at most {len(order) + 2}")
    names = order[: len(args)]
    defaults = inspect.signature(init).parameters
    for k in names:
        if here[k] is not defaults[k].default and here[k] != defaults[k].default:
            raise TypeError(f"{cls}: {k} given twice")
    warnings.warn(f"{cls}(root, batch_size, {', '.join(names)}): pass {', '.join(names)} "
                  f"by keyword", DeprecationWarning, stacklevel=3)
    given = dict(zip(names, args, strict=True))
    return [given.get(k, here[k]) for k in order]


def epoch_seed(seed: int, epoch: int) -> int:
    """The one number an epoch's orders and boxes are drawn from, in every pcrfs loader and
    sampler: a seed's epochs never collide with another seed's first million."""
    return seed * 1_000_003 + epoch


def draw_box(rng, width: int, height: int, train: bool, size: int, scale, ratio):
    """(top, left, height, width) of one sample: RandomResizedCrop's box drawn from rng when
    training, else the evaluation transform's centre square."""
    from pcrfs.jpeg.crop import center_box, random_resized_box
    if not train:
        return center_box(width, height, size)
    return random_resized_box(rng, width, height, scale, ratio)


def normalizer(mean, std, device):
    """x (uint8 or float on 0..255, [B, 3, H, W]) -> float32 (x / 255 - mean) / std on
    `device`, with the constants made once."""
    m = torch.tensor(mean, dtype=torch.float32, device=device).view(1, 3, 1, 1) * 255
    d = torch.tensor(std, dtype=torch.float32, device=device).view(1, 3, 1, 1) * 255
    return lambda x: x.float().sub_(m).div_(d) if x.dtype != torch.float32 else (x - m) / d
SUBSTITUTE_ROUNDS = 3     # a batch none of whose samples decode: fresh samples, this often
MAX_ERRORS_KEPT = 1000


class SampleError(Exception):
    """A sample that could not be read or decoded: its index and path, and why."""

    def __init__(self, index: int, path: str, reason: str):
        self.index, self.path = index, path
        super().__init__(f"{path}: {reason}")


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def list_samples(root, extensions) -> tuple[str, list[str], dict[str, int], list]:
    """(root, classes, class_to_idx, samples) as torchvision's ImageFolder finds them; a
    pcrfs mount's root or a dataset directory, given where a view was meant, is refused
    with the path to use (their `.pcrfs`, `l3`, `records` are not classes)."""
    from torchvision.datasets.folder import find_classes, make_dataset
    root = os.fspath(root)
    check_root(root)
    classes, class_to_idx = find_classes(root)
    return root, classes, class_to_idx, make_dataset(root, class_to_idx, extensions=extensions)


def check_root(root: str) -> None:
    """ValueError, in one line with the fix, for a mount root or a dataset directory."""
    from pcrfs.control import is_mount
    from pcrfs.format import INDEX_DIR, MANIFEST
    if is_mount(root):
        views = sorted(d for d in os.listdir(root) if not d.startswith("."))
        q = [v for v in views if v[:1] == "q" and v[1:].isdigit()]
        pick = f"q{min(5, len(q))}" if q else (views[0] if views else "q5")
        raise ValueError(f"{root} is a pcrfs mount's root: give a view, e.g. "
                         f"{os.path.join(root, pick)} (views: {', '.join(views)})")
    if os.path.isfile(os.path.join(root, MANIFEST)) and os.path.isdir(os.path.join(root, INDEX_DIR)):
        raise ValueError(f"{root} is a pcrfs dataset directory, not images: mount it "
                         f"(pcrfs mount {root} MNT) and give a view, e.g. MNT/q5")


def check_device(device, who: str) -> torch.device:
    """The device, or one ValueError naming the fix when it is CUDA and there is none."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{who}: device={str(device)!r} but torch sees no CUDA device (no "
                         "GPU, no driver, or a CPU build of torch); use device=\"cpu\" "
                         "(pcrfs.torch.FastImageFolder decodes fastest on the CPU)")
    return device


def world(num_replicas: int | None = None, rank: int | None = None) -> tuple[int, int]:
    """(num_replicas, rank): the arguments where given, else the initialised process
    group's, else torchrun's environment (WORLD_SIZE, RANK), else 1 and 0."""
    pg = torch.distributed.is_available() and torch.distributed.is_initialized()
    if num_replicas is None:
        num_replicas = (torch.distributed.get_world_size() if pg
                        else int(os.environ.get("WORLD_SIZE", 1)))
    if rank is None:
        rank = torch.distributed.get_rank() if pg else int(os.environ.get("RANK", 0))
    if num_replicas < 1 or not 0 <= rank < num_replicas:
        raise ValueError(f"rank {rank} not in 0..{num_replicas - 1}")
    return num_replicas, rank


def _is_batch_sampler(s) -> bool:
    # BatchSampler, LocalityAwareBatchSampler and BalancedBatchSampler carry batch_size;
    # samplers of indices (DistributedSampler, RecordAwareSampler) do not
    return isinstance(s, torch.utils.data.BatchSampler) or hasattr(s, "batch_size")


class EpochPlan:
    """This rank's batches (lists of sample indices) of each epoch, and where the current
    epoch stands."""

    def __init__(self, n: int, batch_size: int, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, num_replicas: int | None = None,
                 rank: int | None = None, sampler=None):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if sampler is not None and (num_replicas is not None or rank is not None):
            raise ValueError("give num_replicas/rank to the sampler, not beside it")
        self.n, self.batch_size, self.shuffle, self.seed = n, batch_size, shuffle, seed
        self.drop_last, self.sampler = drop_last, sampler
        if sampler is None:
            self.num_replicas, self.rank = world(num_replicas, rank)
            self._split = torch.utils.data.DistributedSampler(
                range(n), self.num_replicas, self.rank, shuffle=shuffle, seed=seed,
                drop_last=drop_last)
        else:
            self.num_replicas = getattr(sampler, "num_replicas", 1)
            self.rank = getattr(sampler, "rank", 0)
            self._split = sampler
        self.batched = sampler is not None and _is_batch_sampler(sampler)
        self.epoch = 0
        self.next_batch = 0      # batches of this epoch handed out

    def __len__(self) -> int:
        if self.batched:
            return len(self._split)
        k = len(self._split)
        return k // self.batch_size if self.drop_last else math.ceil(k / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.next_batch = epoch, 0
        if hasattr(self._split, "set_epoch"):
            self._split.set_epoch(epoch)

    def batches(self) -> list[list[int]]:
        """Every batch of this rank in the current epoch, from its first."""
        if hasattr(self._split, "set_epoch"):
            self._split.set_epoch(self.epoch)
        if self.batched:
            return [list(b) for b in self._split]
        idx = [int(i) for i in self._split]
        b = self.batch_size
        out = [idx[i: i + b] for i in range(0, len(idx), b)]
        if self.drop_last and out and len(out[-1]) < b:
            out.pop()
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "next_batch": self.next_batch, "seed": self.seed,
                "samples": self.n, "num_replicas": self.num_replicas, "rank": self.rank}

    def load_state_dict(self, state: dict) -> None:
        if (state["samples"], state["seed"], state.get("num_replicas", 1)) != (
                self.n, self.seed, self.num_replicas):
            raise ValueError("state from another folder, seed or world size")
        self.set_epoch(int(state["epoch"]))
        self.next_batch = int(state["next_batch"])


class BatchLoader:
    """Batches of an EpochPlan, `prefetch` of them in flight on `threads` threads.

    Subclasses give `_submit(members, pos) -> job` (start reading/decoding on self._pool) and
    `_result(job) -> (x, labels, errors)`: x and labels hold the samples that loaded, in
    member order, and errors has, per member, None or its SampleError.

    on_error, for a sample that cannot be read or decoded (counted in `failed`, its
    message in `errors`):
    - "replace" (default): its slot gets another sample of the same batch that loaded
      (counted in `replaced`), so every batch keeps its size; if none of a batch loads,
      fresh samples are drawn (SUBSTITUTE_ROUNDS times, deterministic), then SampleError;
    - "skip": the batch is one shorter (counted in `skipped`), the number of batches is
      unchanged, so DDP ranks still take the same number of steps;
    - "raise": SampleError (under DDP the other ranks then wait for this one's step
      until the process group's timeout, or torchrun stops the job)."""

    def __init__(self, plan: EpochPlan, n: int, threads: int | None, prefetch: int,
                 on_error: str, thread_name: str):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error: one of {', '.join(ON_ERROR)}")
        self.plan, self.n = plan, n
        self.threads = threads or len(os.sched_getaffinity(0))
        self.prefetch, self.on_error = max(1, prefetch), on_error
        self.failed = self.replaced = self.skipped = 0
        self.errors: list[str] = []
        self._thread_name = thread_name
        self._pool: ThreadPoolExecutor | None = None
        self._resume: int | None = None      # load_state_dict's batch, for the next iter()
        self._latest: object | None = None   # the iterator state_dict() reports

    # -- epochs and state ------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.plan)

    @property
    def epoch(self) -> int:
        return self.plan.epoch

    @property
    def seed(self) -> int:
        return self.plan.seed

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next pass draws its order for.  The epoch a resume is pending in
        keeps it (a training loop calls set_epoch(e) before the resumed pass)."""
        if self._resume is not None and epoch == self.plan.epoch:
            return
        self._resume = None
        self.plan.set_epoch(epoch)

    def state_dict(self) -> dict:
        """Where the latest iterator stands: its epoch and the batches it handed out."""
        return self.plan.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """The next iter() resumes the saved epoch with its next batch."""
        self.plan.load_state_dict(state)
        self._resume = self.plan.next_batch

    def batches(self) -> list[list[int]]:
        """This rank's batches of the current epoch (sample indices)."""
        return self.plan.batches()

    # -- the pipeline -----------------------------------------------------------------------
    def _submit(self, members: list[int], pos: int):
        """Start loading batch `pos` of the epoch."""
        raise NotImplementedError

    def _result(self, job) -> tuple[torch.Tensor, list[int], list]:
        raise NotImplementedError

    def _stage(self, x: torch.Tensor, y: torch.Tensor):
        """Start handing the batch over (a subclass queues its upload here)."""
        return x, y

    def _handoff(self, staged):
        """The staged batch as training receives it."""
        return staged

    # batches staged before the first is handed over (1 keeps an upload in flight)
    lag = 0

    def _begin_epoch(self) -> None:
        """Called as an epoch's iteration starts."""

    def __iter__(self) -> Iterator:
        """A pass of its own over the current epoch (see the module's docstring)."""
        start = self._resume or 0
        self._resume = None
        self.plan.next_batch = start
        token = self._latest = object()
        return self._pass(start, token)

    def _pass(self, start: int, token: object) -> Iterator:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self._thread_name)
        epoch = self.plan.epoch          # as of the first next() (a set_epoch may come between)
        self._begin_epoch()
        batches = self.plan.batches()
        nxt = start
        pending: deque = deque()
        staged: deque = deque()
        while nxt < len(batches) and len(pending) < self.prefetch:
            pending.append((nxt, batches[nxt], self._submit(batches[nxt], nxt)))
            nxt += 1
        while pending or staged:
            if pending:
                pos, members, job = pending.popleft()
                if nxt < len(batches):
                    pending.append((nxt, batches[nxt], self._submit(batches[nxt], nxt)))
                    nxt += 1
                x, y = self._policy(members, job, pos)
                staged.append(self._stage(x, torch.tensor(y, dtype=torch.int64)))
                if len(staged) <= self.lag and pending:
                    continue
            start += 1
            if self._latest is token:
                self.plan.next_batch = start
            yield self._handoff(staged.popleft())
        if self.plan.epoch == epoch and self._latest is token:   # a whole pass: the next epoch
            self.set_epoch(epoch + 1)

    def _policy(self, members: list[int], job, pos: int) -> tuple[torch.Tensor, list[int]]:
        x, y, errs = self._result(job)
        bad = [e for e in errs if e is not None]
        if not bad:
            return x, y
        if self.on_error == "raise":
            raise bad[0]
        self.failed += len(bad)
        room = MAX_ERRORS_KEPT - len(self.errors)
        self.errors.extend(str(e) for e in bad[:max(0, room)])
        if self.on_error == "skip":
            self.skipped += len(bad)
            return x, y
        for r in range(SUBSTITUTE_ROUNDS):
            if len(y):
                break
            # nothing of this batch loaded: the same number of other samples, far from it
            subs = [(i + (r + 1) * (self.n // (SUBSTITUTE_ROUNDS + 1) + 1)) % self.n
                    for i in members]
            x, y, errs2 = self._result(self._submit(subs, pos))
            self.failed += sum(e is not None for e in errs2)
        if not len(y):
            raise SampleError(members[0], str(bad[0].path),
                              f"no sample of a batch of {len(members)} could be loaded "
                              f"(first: {bad[0]})")
        # each failed slot takes a loaded sample of the batch, spread over them
        ok = len(y)
        src, k = [], 0
        for e in errs:
            if e is None and k < ok:
                src.append(k)
                k += 1
            else:
                src.append(len(src) % ok)
        self.replaced += len(bad)
        return x[torch.tensor(src, device=x.device)], [y[s] for s in src]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
