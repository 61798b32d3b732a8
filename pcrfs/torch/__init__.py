"""Optional PyTorch helpers (install the `torch` extra): batched JPEG decoding on the GPU
(decode_jpeg, GPUImageFolder), the fused CPU decode-crop-resize (decode_resized_crop,
FastImageFolder), GPU-friendly L3 decoding, the
samplers (record-aware, balanced, locality-aware), ThreadedDataset and the fidelity
autotuner.  Submodules import torch; this package
imports them lazily so `import pcrfs.torch.l3` stays light."""


def __getattr__(name):
    if name == "RecordAwareSampler":
        from pcrfs.torch.sampler import RecordAwareSampler
        return RecordAwareSampler
    if name == "BalancedBatchSampler":
        from pcrfs.torch.balanced import BalancedBatchSampler
        return BalancedBatchSampler
    if name in ("LocalityAwareBatchSampler", "balance"):
        from pcrfs.torch import locality
        return getattr(locality, name)
    if name == "ThreadedDataset":
        from pcrfs.torch.threaded import ThreadedDataset
        return ThreadedDataset
    if name in ("FidelityAutotuner", "AutotuneSchedule", "TuneResult", "batches_from"):
        from pcrfs.torch import autotune
        return getattr(autotune, name)
    if name in ("decode_jpeg", "DecodeError"):
        from pcrfs.torch import jpeg
        return getattr(jpeg, name)
    if name in ("FastImageFolder", "FastLoader", "SampleError"):
        from pcrfs.torch import fast_folder
        return getattr(fast_folder, name)
    if name in ("decode_resized_crop", "image_size", "random_resized_box"):
        from pcrfs.jpeg import crop
        return getattr(crop, name)
    if name in ("IMAGENET", "IMAGENET_MEAN", "IMAGENET_STD", "epoch_seed"):
        from pcrfs.torch import loading
        return getattr(loading, name)
    if name == "GPUImageFolder":
        from pcrfs.torch.gpu_folder import GPUImageFolder
        return GPUImageFolder
    raise AttributeError(name)
