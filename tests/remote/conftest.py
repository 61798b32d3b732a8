"""A real SeaweedFS S3 server for the session, and helpers shared by the remote tests."""
import os

import pytest

from testkit.servers import SeaweedFS

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


CONTAINER = "pcrfs"


@pytest.fixture(scope="session")
def azurite(tmp_path_factory):
    from testkit.servers import Azurite
    a = Azurite(tmp_path_factory.mktemp("azurite"))
    a.start()
    try:
        a.create_container(CONTAINER)
        yield a
    finally:
        a.stop()


@pytest.fixture
def azenv(azurite, monkeypatch):
    """The account in the environment, the standard Azure way (a connection string), for
    every `pcrfs` subprocess of the test."""
    for k, v in azurite.env().items():
        monkeypatch.setenv(k, v)
    return azurite


@pytest.fixture(scope="session")
def az_corpus(azurite, corpus_ds) -> str:
    """corpus_ds pushed once: az://pcrfs/corpus."""
    url = f"az://{CONTAINER}/corpus"
    run_pcrfs("push", corpus_ds, url, "-q", env={**os.environ, **azurite.env()})
    return url
