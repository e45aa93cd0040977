"""``shoal import sailor``'s checks of its inputs, on small files written here (no reference
data needed): a wrong cluster config, a bad count in a trace, and network coverage checked
over the pool's own (GPU, zone) pairs."""

from __future__ import annotations

import json

import pytest

from shoal.errors import SpecError
from shoal.io.sailor import SailorFiles, import_sailor

CONFIG = {"model": "OPT-350", "global_batch_size": 8, "sequence_length": 512, "optimizer": "Adam",
          "num_layers": 4, "num_all_layers": 6, "hidden_size": 256, "heads": 4,
          "vocab_size": 1000}
CURVE = {"1": [[0.0, 0.0, 1.0], 1e9]}


def _files(tmp_path, trace: str, *, links=None):
    cfg = tmp_path / "training_config.json"
    cfg.write_text(json.dumps(CONFIG))
    tr = tmp_path / "trace.csv"
    tr.write_text(trace)
    net = tmp_path / "network"
    net.mkdir()
    (net / "network_coeffs_all_homo.json").write_text(json.dumps({"inter": {"A100-40": CURVE}}))
    if links is not None:
        (net / "multizone_bandwidths_het.json").write_text(json.dumps(links))
    return cfg, tr, net


def _het(za, ga, zb, gb):
    return {za: {ga: {"1": {zb: {gb: CURVE}}}}}


def test_network_coverage_names_a_pair_the_pool_has(tmp_path):
    # A100s only in zone b, RTX-3090s only in zone a: the missing curve is between those two
    trace = ",Timestamp,RTX-3090_us-central1-a,A100-40_us-central1-b\n0,1,8,8\n"
    cfg, tr, net = _files(tmp_path, trace)
    with pytest.raises(SpecError) as e:
        import_sailor(SailorFiles(training_config=cfg, trace=tr, network=net), tmp_path / "out")
    assert "RTX-3090 in us-central1-a" in str(e.value)
    assert "A100-40GB in us-central1-a" not in str(e.value)  # the pool has no such pair
    assert not (tmp_path / "out").exists()


def test_network_covering_the_pools_pairs_imports(tmp_path):
    trace = ",Timestamp,RTX-3090_us-central1-a,A100-40_us-central1-b\n0,1,8,8\n"
    links = _het("us-central1-a", "RTX-3090", "us-central1-b", "A100-40")
    cfg, tr, net = _files(tmp_path, trace, links=links)
    # RTX-3090 to itself in zone a is still missing
    with pytest.raises(SpecError, match="RTX-3090 in us-central1-a and RTX-3090 in us-central1-a"):
        import_sailor(SailorFiles(training_config=cfg, trace=tr, network=net), tmp_path / "out")
    homo = {"inter": {"A100-40": CURVE, "RTX-3090": CURVE}}
    (net / "network_coeffs_all_homo.json").write_text(json.dumps(homo))
    written = import_sailor(SailorFiles(training_config=cfg, trace=tr, network=net),
                            tmp_path / "out")
    assert written["scenario.yaml"].exists()


@pytest.mark.parametrize("count", ["-8", "2.5", "many"])
def test_a_bad_count_in_the_trace_names_its_line_and_column(tmp_path, count):
    trace = f",Timestamp,A100-40_us-central1-a\n0,1,8\n1,2,{count}\n"
    cfg, tr, _ = _files(tmp_path, trace)
    with pytest.raises(SpecError) as e:
        import_sailor(SailorFiles(training_config=cfg, trace=tr, step=1), tmp_path / "out")
    assert e.value.file == str(tr) and e.value.field == "line 3, column A100-40_us-central1-a"
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_no_cluster_config_is_refused(tmp_path):
    cfg, tr, _ = _files(tmp_path, ",Timestamp,A100-40_us-central1-a\n0,1,8\n")
    with pytest.raises(SpecError, match="not a Sailor cluster config"):
        import_sailor(SailorFiles(training_config=cfg, cluster_config=cfg, trace=tr),
                      tmp_path / "out")
    good = tmp_path / "cluster.json"
    good.write_text(json.dumps({"A100-40": {"gpus_per_node": 4, "mem_per_gpu": 40e9}}))
    written = import_sailor(SailorFiles(training_config=cfg, cluster_config=good, trace=tr),
                            tmp_path / "out")
    import yaml

    scn = yaml.safe_load(written["scenario.yaml"].read_text())
    assert scn["pool"]["gpus_per_node"] == {"A100-40GB": 4}
