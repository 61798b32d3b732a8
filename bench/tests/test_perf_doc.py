"""bench/perf_doc.py's placeholders: a figure typed over in prose is refilled from its JSON
(so `--check`, which test_docs runs, fails on it), and a placeholder it cannot read is an
error rather than text left as typed."""
import pytest

from bench import perf_doc

FIG = "<!--fig peers targets.cpu_local_fused_tuned_over_ffcv.ratio .2f-->{}<!--/fig-->"


def test_a_typed_over_figure_is_refilled_from_the_json():
    right = perf_doc.fill(FIG.format("?"))
    value = perf_doc.figure("peers", "targets.cpu_local_fused_tuned_over_ffcv.ratio", ".2f")
    assert right == FIG.format(value)
    assert perf_doc.fill(FIG.format("9.99")) == right != FIG.format("9.99")


def test_records_ratios_and_escaped_keys_resolve():
    row = "rows[system=pcrfs,arm=q10,regime=cpu_local].images_per_s"
    assert float(perf_doc.figure("peers", f"{row}/{row}", ".3f")) == 1.0
    key = "cpu_bound.images_per_s.median." + perf_doc.fig_key("MNT/mix, -o skip_open=yes")
    assert float(perf_doc.figure("liquid", key, ".1f")) > 0


def test_a_malformed_placeholder_is_an_error():
    with pytest.raises(ValueError, match="malformed"):
        perf_doc.fill("<!--fig peers targets.x .2f;-->1<!--/fig-->")


def test_chained_divisions_constants_and_medians():
    w2 = perf_doc.figure("build_6000", "scaling.workers_2", "")
    hours = perf_doc.figure("build_6000", "2e8/scaling.workers_2/3600", "")
    assert float(hours) == pytest.approx(2e8 / float(w2) / 3600)
    epochs = perf_doc._lookup(perf_doc.json.loads((perf_doc.RESULTS / "cache.json").read_text())
                              ["result"], "memory." + perf_doc.fig_key("static@0.3"))
    assert float(perf_doc.figure("cache", "memory.static@0%2E3.median", "")) \
        == perf_doc._median(epochs)


def test_a_verdict_follows_the_json():
    ratio = "ratios.default_over_jpegtran/targets.default_over_jpegtran"
    met = float(perf_doc.figure("build", ratio, "")) >= 1
    assert perf_doc.figure("build", ratio, "atleast") == ("met" if met else "missed")
    assert perf_doc.figure("build", ratio, "atmost") == ("missed" if met else "met")
    assert perf_doc.fill(f"<!--fig build {ratio} atleast-->met<!--/fig-->").endswith(
        ("met" if met else "missed") + "<!--/fig-->")


def test_max_and_min_over_a_dict_of_numbers():
    # the light set's run has the second-epoch regime (the calibrated run has not measured it)
    peers = perf_doc.json.loads((perf_doc.RESULTS / "peers_light.json").read_text())["result"][
        "targets"]["second_epoch_30pct_hit_ratio"]["peers"]
    path = "targets.second_epoch_30pct_hit_ratio.peers."
    assert float(perf_doc.figure("peers_light", path + "max", "")) == max(peers.values())
    assert float(perf_doc.figure("peers_light", path + "min", "")) == min(peers.values())
