"""Links a scenario leaves out come from the catalog (clouds.yaml ``network``, gpus.yaml's node
network): a pool estimates and plans without a network section, what the scenario gives wins,
links grow slower with distance, and the output says which links were defaulted."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from typer.testing import CliRunner

from shoal import catalog
from shoal.cli import app
from shoal.errors import SpecError
from shoal.estimate import estimate
from shoal.problem import build_problem
from shoal.profiles.network import bandwidth
from shoal.specs.plan import TrainingPlan
from shoal.specs.scenario import parse_scenario

F = "net.yaml"
ONE_ZONE = {
    "model": "OPT-350M",
    "job": {"global_batch": 16, "seq_len": 2048},
    "pool": {"regions": {"us-central1": {"zones": {
        "us-central1-a": {"gpus": {"A100-40GB": 8, "V100-16GB": 8}}}}}},
}
# OPT-350M's 26 layers in two stages: every microbatch crosses the link between them
PLAN = {"microbatch_size": 1, "stages": [
    {"layers": [0, 13], "replicas": [{"gpu": "A100-40GB", "tp": 1, "zone": "us-central1-a",
                                      "microbatches": 16}]},
    {"layers": [13, 26], "replicas": [{"gpu": "A100-40GB", "tp": 1, "zone": "ZONE",
                                       "microbatches": 16}]}]}


def build(data: dict):
    return build_problem(parse_scenario(copy.deepcopy(data), file=F), file=F)


def two_zones(region: str, zone: str) -> dict:
    data = copy.deepcopy(ONE_ZONE)
    data["pool"]["regions"].setdefault(region, {"zones": {}})["zones"][zone] = {
        "gpus": {"A100-40GB": 8}}
    return data


def plan_to(zone: str) -> TrainingPlan:
    doc = copy.deepcopy(PLAN)
    doc["stages"][1]["replicas"][0]["zone"] = zone
    return TrainingPlan.model_validate(doc)


def test_single_zone_without_links_builds_from_the_catalog():
    pb = build(ONE_ZONE)
    link = pb.network.link("us-central1-a", "us-central1-a", "A100-40GB", "A100-40GB")
    gpu = catalog.gpus().get("A100-40GB")
    # one flow gets its GPU's NIC (8 x 200 Gbit/s on an 8-GPU A100 server), at GCP's latency
    assert float(bandwidth(link.single, 1e9)) == pytest.approx(gpu.node_nic_bw_Bps / gpu.nics_per_node)
    assert link.latency_s == pytest.approx(catalog.network_defaults()["gcp"]["same_zone"].latency_s)
    kinds = {(d["kind"], d.get("distance"), tuple(d.get("gpus", [d.get("gpu")])))
             for d in pb.network_defaults}
    assert ("link", "same_zone", ("A100-40GB", "V100-16GB")) in kinds
    assert ("intra_node", None, ("A100-40GB",)) in kinds
    assert all(d["source"] for d in pb.network_defaults)


def test_a_shared_nic_bounds_flows_together():
    """A V100-16GB VM has one 25 Gbit/s NIC: four flows share it; A100 servers have one NIC per
    GPU, so four flows get four times one."""
    pb = build(ONE_ZONE)
    v100 = pb.network.link("us-central1-a", "us-central1-a", "V100-16GB", "V100-16GB")
    a100 = pb.network.link("us-central1-a", "us-central1-a", "A100-40GB", "A100-40GB")
    big = 4e9
    assert v100.transfer_time(big, 4) == pytest.approx(v100.transfer_time(big, 1), rel=1e-9)
    one, four = a100.transfer_time(big, 1), a100.transfer_time(big, 4)
    lat = a100.latency_s
    assert four - lat == pytest.approx((one - lat) / 4)


def test_what_the_scenario_gives_wins():
    data = copy.deepcopy(ONE_ZONE)
    data["network"] = {"defaults": {"same_zone": {"bandwidth": "10Gbps", "latency": "20us"}}}
    pb = build(data)
    link = pb.network.link("us-central1-a", "us-central1-a", "A100-40GB", "A100-40GB")
    assert float(bandwidth(link.single, 1e9)) == pytest.approx(10e9 / 8)
    assert link.latency_s == pytest.approx(20e-6)
    assert [d for d in pb.network_defaults if d["kind"] == "link"] == []
    # a link per zone pair wins too, and only that pair's GPUs are then taken as given
    data["network"] = {"links": [{"zones": ["us-central1-a", "us-central1-a"],
                                  "gpus": ["A100-40GB", "A100-40GB"], "bandwidth": "1GB/s"}]}
    pb = build(data)
    assert float(bandwidth(pb.network.link("us-central1-a", "us-central1-a", "A100-40GB",
                                           "A100-40GB").single, 1e9)) == pytest.approx(1e9)
    assert {tuple(d["gpus"]) for d in pb.network_defaults if d["kind"] == "link"} == {
        ("A100-40GB", "V100-16GB"), ("V100-16GB",)}
    # and the estimate follows the given link
    fast = estimate(build(ONE_ZONE), plan_to("us-central1-a")).iteration_time_s
    data["network"] = {"defaults": {"same_zone": {"bandwidth": "1Gbps", "latency": "5ms"}}}
    assert estimate(build(data), plan_to("us-central1-a")).iteration_time_s > fast


@pytest.mark.parametrize(("region", "zone", "distance"), [
    ("us-central1", "us-central1-b", "same_region"),
    ("us-west1", "us-west1-b", "same_continent"),
    ("europe-west4", "europe-west4-a", "intercontinental"),
])
def test_defaults_by_distance(region, zone, distance):
    pb = build(two_zones(region, zone))
    used = {d["distance"] for d in pb.network_defaults if d["kind"] == "link"}
    assert used == {"same_zone", distance}


def test_farther_zones_estimate_slower():
    """A pipeline over two regions (then two continents) is slower than inside one zone."""
    times = [estimate(build(two_zones(r, z)), plan_to(z)).iteration_time_s for r, z in (
        ("us-central1", "us-central1-a"), ("us-central1", "us-central1-b"),
        ("us-west1", "us-west1-b"), ("europe-west4", "europe-west4-a"))]
    assert times[0] <= times[1] < times[2] < times[3]


def test_no_default_without_a_published_number():
    """AWS publishes no latency: its links are the scenario's to give, and the error says so."""
    data = copy.deepcopy(ONE_ZONE)
    data["pool"] = {"regions": {"us-east-1": {"zones": {"us-east-1a": {"gpus": {"A100-40GB": 8}}}}}}
    with pytest.raises(SpecError) as ei:
        build(data)
    assert "no published number for aws same-zone" in str(ei.value)
    assert "network.defaults.same_zone" in ei.value.allowed


def test_network_cloud_names_the_cloud_of_other_zones():
    data = copy.deepcopy(ONE_ZONE)
    data["pool"] = {"regions": {"dc": {"zones": {"dc-1": {"gpus": {"A100-40GB": 8}}}}}}
    with pytest.raises(SpecError, match="in no cloud of the catalog"):
        build(data)
    data["network"] = {"cloud": "azure"}
    pb = build(data)
    link = pb.network.link("dc-1", "dc-1", "A100-40GB", "A100-40GB")
    assert link.latency_s == pytest.approx(catalog.network_defaults()["azure"]["same_zone"].latency_s)
    data["network"] = {"cloud": "azrue"}
    with pytest.raises(SpecError) as ei:
        build(data)
    assert ei.value.field == "network.cloud" and ei.value.suggestion == "azure"


def test_every_catalog_default_has_a_source():
    for cloud, classes in catalog.network_defaults().items():
        for cls, entry in classes.items():
            assert cls in catalog.DISTANCES, (cloud, cls)
            assert entry.source.strip(), (cloud, cls)
            assert entry.latency_s >= 0


# ---- the command line ---------------------------------------------------------------------------

runner = CliRunner()


@pytest.fixture
def files(tmp_path):
    scn = tmp_path / "one-zone.yaml"
    scn.write_text(yaml.safe_dump(ONE_ZONE))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_to("us-central1-a").to_json()))
    return scn, plan


def test_estimate_says_which_links_were_defaulted(files):
    scn, plan = files
    res = runner.invoke(app, ["estimate", str(scn), "--plan", str(plan)])
    assert res.exit_code == 0, res.output
    assert "network: catalog defaults for gcp same-zone" in res.stdout
    res = runner.invoke(app, ["estimate", str(scn), "--plan", str(plan), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    links = [d for d in doc["network_defaults"] if d["kind"] == "link"]
    assert {d["distance"] for d in links} == {"same_zone"} and links[0]["cloud"] == "gcp"


def test_plan_runs_without_links(files):
    scn, _ = files
    res = runner.invoke(app, ["plan", str(scn), "--budget", "5", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["plans"] and any(d["kind"] == "link" for d in doc["network_defaults"])
    res = runner.invoke(app, ["plan", str(scn), "--budget", "5"])
    assert res.exit_code == 0, res.output
    assert "network: catalog defaults for gcp same-zone" in res.stdout
