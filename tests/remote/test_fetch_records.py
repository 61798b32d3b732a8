"""-o fetch=record on a remote dataset: a shuffled epoch fetches each record's groups 1..k
in one GET (kept in the disk tier), the same bytes as fetching every image's segments,
and far fewer requests; the next mount reads every image from the tier."""
import pcrfs
from remote.util import files_of, read, shuffled


def test_a_shuffled_epoch_fetches_whole_records(s3env, s3_corpus, corpus_ds, mount, tmp_path):
    local = pcrfs.open_dataset(str(corpus_ds))
    files = files_of(local, "q5")
    records = {local.lookup(p).record for p in files}
    cache = tmp_path / "cache"
    m = mount(s3_corpus, "--cache-dir", cache, "-o", "fetch=record")
    before = m.stats()
    for rel in shuffled(files, 4):
        assert read(m.mnt, "q5", rel) == local.read(rel, "q5")
    st = m.stats()
    # one GET per record (each extent fetched once, readers share it), and the bytes of
    # the images' segments: groups 1..5 hold exactly those
    assert st["remote_requests"] - before["remote_requests"] == len(records)
    assert st["remote_bytes"] - before["remote_bytes"] == sum(
        local.file_size(p, "q5") - 2 for p in files)
    assert st["extent_fetches"] == len(records)
    m.__exit__(None, None, None)

    # image by image (the default) the same epoch costs one GET per segment
    m = mount(s3_corpus, "--cache-dir", tmp_path / "cache-image")
    before = m.stats()
    for rel in shuffled(files, 4)[:20]:
        assert read(m.mnt, "q5", rel) == local.read(rel, "q5")
    per_image = m.stats()["remote_requests"] - before["remote_requests"]
    assert per_image >= 20 * 2
    m.__exit__(None, None, None)

    # a second mount on the tier: nothing fetched
    m = mount(s3_corpus, "--cache-dir", cache, "-o", "fetch=record")
    before = m.stats()
    for rel in shuffled(files, 5):
        assert read(m.mnt, "q5", rel) == local.read(rel, "q5")
    assert m.stats()["remote_requests"] == before["remote_requests"]
