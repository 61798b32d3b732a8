"""Unmodified torchvision over the mount: ImageFolder, DataLoader, a few training steps."""
import os

import torch
from torch import nn
from torchvision import datasets, transforms


def test_imagefolder_sees_the_same_dataset(crops_src, crops_ds, mount):
    m = mount(crops_ds)
    src = datasets.ImageFolder(str(crops_src))
    mnt = datasets.ImageFolder(str(m.mnt / "q5"))
    assert mnt.classes == src.classes and mnt.class_to_idx == src.class_to_idx
    assert len(mnt) == len(src) == 240
    assert [(os.path.relpath(p, m.mnt / "q5"), y) for p, y in mnt.samples] == \
        [(os.path.relpath(p, crops_src), y) for p, y in src.samples]
    img, label = mnt[0]
    assert img.size == (500, 375) and label == 0


def test_dataloader_epoch_and_training_steps(crops_ds, mount):
    m = mount(crops_ds)
    tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor()])
    ds = datasets.ImageFolder(str(m.mnt / "q5"), transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True, num_workers=2)
    seen, labels = 0, []
    for x, y in loader:
        assert x.shape[1:] == (3, 224, 224) and x.dtype == torch.float32
        assert 0.0 <= x.min() and x.max() <= 1.0
        seen += len(y)
        labels += y.tolist()
    assert seen == len(ds) and sorted(labels) == sorted(t for _, t in ds.samples)

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(8, len(ds.classes)))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    before = [p.detach().clone() for p in net.parameters()]
    losses = []
    for step, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step == 4:
            break
    assert len(losses) == 5 and all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
