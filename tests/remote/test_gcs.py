"""gs:// against gcp-storage-emulator, the GCS emulator that installs from PyPI.

It implements Google's JSON API, while obstore (like Google's own XML-API clients) reads
objects with XML-API requests: the emulator answers them without Last-Modified and ETag
headers, answers HEAD, listing and DELETE with HTTP 501, and answers 501 to any key that
contains "/" or "." (obstore percent-encodes them in the path), which every key of a
dataset does.  So no dataset object can be read or written through it.  What it can check
is that every way of pointing pcrfs at a GCS endpoint reaches it (the 501 comes from the
emulator), that such an answer fails at once naming bucket and key, and that a damaged
credentials file is reported without being quoted."""
import json

import pytest

from testkit.servers import GcsEmulator

from conftest import run_pcrfs

BUCKET = "pcrfs-gcs"


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    g = GcsEmulator(tmp_path_factory.mktemp("gcs"))
    g.start()
    try:
        g.create_bucket(BUCKET)
        yield g
    finally:
        g.stop()


def test_every_way_of_naming_the_endpoint_reaches_the_emulator(gcs, tmp_path, monkeypatch):
    for k in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_SERVICE_ACCOUNT", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(k, raising=False)
    url = f"gs://{BUCKET}/ds"
    want = f"GET {url}/manifest.json: HTTP 501"     # the emulator's answer
    # --endpoint
    r = run_pcrfs("info", url, "--endpoint", gcs.endpoint, "--no-sign-request", check=False)
    assert r.returncode == 2 and want in r.stderr, r.stderr
    # STORAGE_EMULATOR_HOST, as Google's SDKs read it
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint.removeprefix("http://"))
    r = run_pcrfs("info", url, "--no-sign-request", check=False)
    assert r.returncode == 2 and want in r.stderr, r.stderr
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    # a service-account file (GOOGLE_SERVICE_ACCOUNT) naming the endpoint, no OAuth
    sa = tmp_path / "sa.json"
    sa.write_text(json.dumps({"gcs_base_url": gcs.endpoint, "disable_oauth": True,
                              "client_email": "", "private_key": "", "private_key_id": ""}))
    monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT", str(sa))
    r = run_pcrfs("info", url, check=False)
    assert r.returncode == 2 and want in r.stderr, r.stderr
    # a damaged credentials file is named as such, its content is not quoted
    sa.write_text('{"private_key": "-----BEGIN SECRET-----"')
    r = run_pcrfs("info", url, check=False)
    assert r.returncode == 2 and "gs://" in r.stderr and "BEGIN SECRET" not in r.stderr


def test_an_unimplemented_call_fails_at_once_naming_the_object(gcs):
    """HTTP 501 is not retried: the server will never do it."""
    import time
    t = time.monotonic()
    r = run_pcrfs("info", f"gs://{BUCKET}/a/dataset", "--endpoint", gcs.endpoint,
                  "--no-sign-request", "--io-timeout", "60", check=False)
    assert r.returncode == 2 and f"gs://{BUCKET}/a/dataset/manifest.json: HTTP 501" in r.stderr
    # not retried until --io-timeout (60 s) ran out: a wall bound far from both
    assert time.monotonic() - t < 45


def test_push_refuses_http_urls_and_names_the_clouds(tmp_path):
    r = run_pcrfs("push", tmp_path, "http://example.com/ds", check=False)
    assert r.returncode == 2 and "s3://, gs:// or az://" in r.stderr
