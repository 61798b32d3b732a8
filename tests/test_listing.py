"""The listing policy's timing rules and the bare-entry write, without a mount
(test_mount.py checks both through the kernel)."""
import pyfuse3
import pytest

from pcrfs.fs.listing import BareEntries, ListingPolicy


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_evidence_turns_attributes_on_and_time_turns_them_off():
    clock = Clock()
    p = ListingPolicy("auto", clock)
    assert not p.files_plus()
    p.listed_bare(7)
    for _ in range(ListingPolicy.EVIDENCE - 1):
        p.looked_up(7)
    p.looked_up(8)                       # another directory: not evidence for 7
    assert not p.files_plus()
    p.looked_up(7)
    assert p.files_plus() and p.switches == 1
    clock.t += ListingPolicy.HOLD - 0.1
    assert p.files_plus()
    clock.t += 0.2
    assert not p.files_plus()            # the next listing probes bare again


def test_lookups_long_after_the_listing_are_not_evidence():
    clock = Clock()
    p = ListingPolicy("auto", clock)
    p.listed_bare(7)
    clock.t += ListingPolicy.WINDOW + 0.1   # e.g. a training epoch opening listed files
    for _ in range(100):
        p.looked_up(7)
    assert not p.files_plus() and p.switches == 0


def test_only_recent_directories_are_tracked():
    p = ListingPolicy("auto", Clock())
    for d in range(ListingPolicy.TRACKED + 1):
        p.listed_bare(d)
    for _ in range(ListingPolicy.EVIDENCE):
        p.looked_up(0)                   # evicted
    assert not p.files_plus()
    for _ in range(ListingPolicy.EVIDENCE):
        p.looked_up(ListingPolicy.TRACKED)
    assert p.files_plus()


@pytest.mark.parametrize("mode,plus", [("yes", True), ("no", False)])
def test_pinned_modes_ignore_evidence(mode, plus):
    p = ListingPolicy(mode, Clock())
    p.listed_bare(1)
    for _ in range(50):
        p.looked_up(1)
    assert p.files_plus() is plus


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="readdirplus='sometimes'"):
        ListingPolicy("sometimes")


def test_bare_entry_keeps_st_ino_and_zeroes_the_node_id():
    bare = BareEntries()
    assert bare.offset is not None      # the layout of the pinned pyfuse3
    a = pyfuse3.EntryAttributes()
    slot = bare.nodeid_slot(a)
    a.st_ino = 0x0123_4567_89AB_CDEF
    a.st_size = 1234
    slot.value = 0
    assert a.st_ino == 0                # the getter reads the node id
    assert a.st_size == 1234            # nothing else touched
    import ctypes
    st_ino = int.from_bytes(ctypes.string_at(id(a) + bare.offset + 24, 8), "little")
    assert st_ino == 0x0123_4567_89AB_CDEF   # what the kernel shows as d_ino
