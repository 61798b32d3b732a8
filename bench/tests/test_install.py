"""bench/install.py reads pytest's last line for the tests passed and the suite's time."""
from bench import install


def test_the_suite_summary_is_read_from_pytests_last_line():
    log = ("...\n= 3 passed in 2.00s =\n"
           "===== 524 passed, 3 warnings in 1058.21s (0:17:38) =====\n")
    m = list(install._SUMMARY.finditer(log))[-1]
    assert (int(m[1]), float(m[2])) == (524, 1058.21)
