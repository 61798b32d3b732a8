"""A real SeaweedFS S3 server for the session, and helpers shared by the remote tests."""
import os

import pytest
from servers import SeaweedFS

from conftest import run_pcrfs

BUCKET = "pcrfs"


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    s = SeaweedFS(tmp_path_factory.mktemp("seaweed"))
    s.start()
    try:
        s.create_bucket(BUCKET)
        yield s
    finally:
        s.stop()


@pytest.fixture
def s3env(seaweed, monkeypatch):
    """Credentials and endpoint in the environment, the standard AWS way, for every
    `pcrfs` subprocess of the test."""
    for k, v in seaweed.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweed.endpoint)
    return seaweed


@pytest.fixture(scope="session")
def s3_corpus(seaweed, corpus_ds) -> str:
    """corpus_ds pushed once: s3://pcrfs/corpus."""
    url = f"s3://{BUCKET}/corpus"
    run_pcrfs("push", corpus_ds, url, "--endpoint", seaweed.endpoint, "-q",
              env={**os.environ, **seaweed.env()})
    return url
