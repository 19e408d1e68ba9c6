"""Sharding: three real `vllm-drift serve` replicas given the same target list split it by a stable
hash — every target is owned (listed, scraped, exported) by exactly one replica, and a restarted
replica takes back the same share."""
from __future__ import annotations

import json
import zlib

import pytest

import loopback
from daemons import Daemon, get, samples, wait_for

REPLICAS = 3
TARGETS = 15


@pytest.fixture
def sites(captures):
    body = captures["vllm-0.10.1-v1-ngc2509-qwen3-4b.prom"]
    made = []
    try:
        for _ in range(TARGETS):
            site = loopback.Site(loopback.static({"/metrics": body, "/version": b'{"version":"0.10.1"}',
                                                  "/v1/models": b'{"data":[]}'}))
            site.__enter__()
            made.append(site)
        yield made
    finally:
        for s in made:
            s.__exit__(None, None, None)


def owned(daemon: Daemon) -> set[str]:
    return {t["target"] for t in json.loads(get(daemon.url + "/api/v1/targets")[1])["targets"]}


def up_targets(daemon: Daemon) -> dict[str, float]:
    return {k.split('"')[1]: v for k, v in samples(daemon.metrics(), "vllm_drift_target_up").items()}


def start(index: int, tmp_path, urls, cli_env) -> Daemon:
    cfg = tmp_path / f"replica{index}.yaml"
    cfg.write_text("scrape: {interval: 1s, timeout: 1s}\nevaluation: {interval: 2s, window: 60s}\n"
                   f"shard: {{index: {index}, count: {REPLICAS}}}\ntargets:\n" + "".join(f"  - url: {u}\n" for u in urls))
    return Daemon(cfg, cli_env)


def test_three_replicas_own_every_target_exactly_once(sites, tmp_path, cli_env):
    urls = [s.url for s in sites]
    daemons = [start(i, tmp_path, urls, cli_env) for i in range(REPLICAS)]
    try:
        # each replica scrapes its share: wait until every owned target reports up
        shares = []
        for d in daemons:
            wait_for(lambda d=d: samples(d.metrics(), "vllm_drift_scrape_cycles_total").get("", 0) >= 1)
            share = owned(d)
            assert set(up_targets(d)) == share
            shares.append(share)
        union = set().union(*shares)
        assert union == set(urls)                                   # nobody is dropped
        assert sum(len(s) for s in shares) == len(urls)             # nobody is owned twice
        for i, share in enumerate(shares):
            # the owner is a pure function of the target key, the same for every replica
            assert share == {u for u in urls if zlib.crc32(u.encode()) % REPLICAS == i}
            # every owned target reports up (a deadline, not one instant: on a loaded machine one
            # 1 s scrape may time out and the next one recovers)
            wait_for(lambda d=daemons[i], share=share: set(up_targets(d)) == share
                     and all(v == 1.0 for v in up_targets(d).values()))
        # findings also only cover the replica's own targets
        findings = json.loads(get(daemons[0].url + "/api/v1/findings")[1])
        assert {t["target"] for t in findings["targets"]} <= shares[0]

        # a restarted replica owns the same share again
        daemons[1].stop()
        daemons[1] = start(1, tmp_path, urls, cli_env)
        wait_for(lambda: samples(daemons[1].metrics(), "vllm_drift_scrape_cycles_total").get("", 0) >= 1)
        assert owned(daemons[1]) == shares[1]
    finally:
        for d in daemons:
            d.stop()
