"""One client for remote datasets: s3://bucket/prefix (AWS or any S3-compatible store),
gs://bucket/prefix (Google Cloud Storage), az://container/prefix (Azure Blob Storage) and
http(s)://host/path (plain range requests: nginx, a CDN).

obstore does the HTTP; this module owns the policy around it, so that it is the same for
every store and visible in stats:
- bounded retries with full-jitter exponential backoff on time-outs, connection errors,
  5xx and throttling; 403/404/416 are answered at once (retrying cannot help);
- a total time bound per call (`io_timeout`): each attempt is capped at a third of it and
  no attempt starts that could end past it, so a dead or hung server costs at most
  `io_timeout`, then the read fails (the mount answers EIO);
- error messages name the object (s3://bucket/key) and the HTTP status, never credentials:
  obstore's own text is not passed on, since it can carry request details.

Credentials follow the AWS conventions: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
AWS_SESSION_TOKEN, then the profile (AWS_PROFILE, default "default") of
~/.aws/credentials and ~/.aws/config (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE).
Region and endpoint come from --region/--endpoint, AWS_REGION / AWS_DEFAULT_REGION /
AWS_ENDPOINT_URL, or the profile; AWS_CA_BUNDLE (or the profile's ca_bundle) adds trusted
CAs for https endpoints.  An S3-compatible endpoint with no credentials anywhere
is read anonymously; on AWS, obstore's own chain (instance roles, web identity) applies.

gs:// and az:// follow their clouds' conventions (see _gcs_config, _azure_config); --endpoint
points either at an emulator or a private endpoint."""
from __future__ import annotations

import configparser
import json
import logging
import os
import random
import re
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pcrfs.errors import CorruptDataError, PcrfsError
from pcrfs.storage import DEFAULT_IO_TIMEOUT
from pcrfs.telemetry.stats import Stats

log = logging.getLogger("pcrfs.remote")

SCHEMES = ("s3://", "gs://", "az://", "http://", "https://")
WRITABLE = ("s3://", "gs://", "az://")     # build and push upload to these
# what a user checks when a store says 403, per scheme
_CREDENTIAL_HINT = {
    "s3": "the credentials (AWS_ACCESS_KEY_ID / AWS_PROFILE), the bucket policy and "
          "--endpoint/--region",
    "gs": "the credentials (GOOGLE_APPLICATION_CREDENTIALS / GOOGLE_SERVICE_ACCOUNT, or "
          "`gcloud auth application-default login`) and the bucket's IAM roles",
    "az": "the credentials (AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT_NAME with "
          "AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN, or a service principal) and "
          "the container's role assignments",
    "http": "the server's access rules"}
BACKOFF_FIRST = 0.1     # seconds; attempt n sleeps uniform(0, min(BACKOFF_MAX, first * 2**n))
BACKOFF_MAX = 5.0
FETCH_THREADS = 32      # concurrent range GETs per client
DOWNLOAD_CHUNK = 16 << 20


def is_remote(path: str) -> bool:
    return isinstance(path, str) and path.startswith(SCHEMES)


class RemoteError(PcrfsError):
    """A remote call failed for good: the message names the object and the status."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class RemoteNotFound(RemoteError):
    pass


class RemoteAccessDenied(RemoteError):
    pass


class RemoteUnavailable(RemoteError):
    """Retries ran out of time (server down, hung, throttling or failing)."""


@dataclass(frozen=True)
class RemoteOptions:
    endpoint: str | None = None        # S3-compatible store, e.g. http://127.0.0.1:8333
    region: str | None = None
    addressing: str = "auto"           # auto | path | virtual ("auto": path-style with --endpoint)
    io_timeout: float = DEFAULT_IO_TIMEOUT
    no_sign_request: bool = False      # anonymous reads of a public bucket


def _profile() -> dict[str, str]:
    """The active profile's settings from ~/.aws/credentials and ~/.aws/config."""
    name = os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE") or "default"
    home = os.path.expanduser("~")
    out: dict[str, str] = {}
    for path, section in (
            (os.environ.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"),
             name if name == "default" else f"profile {name}"),
            (os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"),
             name)):
        cp = configparser.RawConfigParser()
        try:
            cp.read(path)
        except (OSError, configparser.Error) as e:
            log.warning("ignoring unreadable AWS file %s: %s", path, type(e).__name__)
            continue
        if cp.has_section(section):
            out.update({k: v.strip() for k, v in cp.items(section)})
    return out


def _s3_config(opts: RemoteOptions) -> tuple[dict, bool]:
    """obstore S3 settings and whether the endpoint is plain http."""
    env, prof = os.environ, _profile()
    cfg: dict = {}
    key = env.get("AWS_ACCESS_KEY_ID") or prof.get("aws_access_key_id")
    secret = env.get("AWS_SECRET_ACCESS_KEY") or prof.get("aws_secret_access_key")
    token = env.get("AWS_SESSION_TOKEN") or prof.get("aws_session_token")
    if env.get("AWS_ACCESS_KEY_ID"):   # a session token belongs to the key it came with
        token = env.get("AWS_SESSION_TOKEN")
    endpoint = opts.endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") \
        or prof.get("endpoint_url")
    region = opts.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") \
        or prof.get("region") or "us-east-1"
    cfg["region"] = region
    if endpoint:
        cfg["endpoint"] = endpoint.rstrip("/")
    path_style = opts.addressing == "path" or (opts.addressing == "auto" and bool(endpoint))
    cfg["virtual_hosted_style_request"] = not path_style
    if opts.no_sign_request:
        cfg["skip_signature"] = True
    elif key and secret:
        cfg["access_key_id"], cfg["secret_access_key"] = key, secret
        if token:
            cfg["token"] = token
    elif endpoint and not any(env.get(v) for v in ("AWS_WEB_IDENTITY_TOKEN_FILE",
                                                    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                                                    "AWS_CONTAINER_CREDENTIALS_FULL_URI")):
        cfg["skip_signature"] = True  # an S3-compatible store with no credentials: anonymous
    return cfg, bool(endpoint and endpoint.startswith("http://"))


def _gcs_config(opts: RemoteOptions) -> dict:
    """Google's conventions: GOOGLE_APPLICATION_CREDENTIALS (a service-account or
    authorized-user JSON), GOOGLE_SERVICE_ACCOUNT / GOOGLE_SERVICE_ACCOUNT_KEY, else the
    application-default file of `gcloud auth application-default login`, else the
    metadata server on GCE/GKE (obstore reads all of these itself).  --endpoint (or
    STORAGE_EMULATOR_HOST, which Google's own SDKs honour) points at an emulator or a
    private endpoint."""
    cfg: dict = {}
    endpoint = opts.endpoint or os.environ.get("STORAGE_EMULATOR_HOST") or _gcs_key_base_url()
    if endpoint:
        if "://" not in endpoint:
            endpoint = "http://" + endpoint
        cfg["base_url"] = endpoint.rstrip("/")
    if opts.no_sign_request:
        cfg["skip_signature"] = True
    return cfg


def _gcs_key_base_url() -> str | None:
    """The gcs_base_url a service-account file may carry (emulators, private endpoints):
    read here too, since an http:// one must be allowed explicitly."""
    env = os.environ
    path = env.get("GOOGLE_SERVICE_ACCOUNT") or env.get("GOOGLE_SERVICE_ACCOUNT_PATH") \
        or env.get("GOOGLE_APPLICATION_CREDENTIALS")
    if not path:
        return None
    try:
        with open(os.path.expanduser(path)) as f:
            url = json.load(f).get("gcs_base_url")
    except (OSError, ValueError, AttributeError):
        return None       # obstore reports an unreadable file itself
    return url if isinstance(url, str) and url else None


def _azure_connection_string() -> dict[str, str]:
    """AZURE_STORAGE_CONNECTION_STRING ("AccountName=...;AccountKey=...;BlobEndpoint=...")
    as obstore settings; Azure's SDKs and CLI take it, obstore does not."""
    text = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
    parts = dict(p.split("=", 1) for p in text.split(";") if "=" in p)
    cfg = {}
    for name, key in (("AccountName", "account_name"), ("AccountKey", "account_key"),
                      ("SharedAccessSignature", "sas_key"), ("BlobEndpoint", "endpoint")):
        if parts.get(name):
            cfg[key] = parts[name].strip()
    if parts.get("UseDevelopmentStorage", "").lower() == "true":
        cfg["use_emulator"] = True
    return cfg


def _azure_config(opts: RemoteOptions) -> dict:
    """Azure's conventions: AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME
    with AZURE_STORAGE_ACCOUNT_KEY / AZURE_STORAGE_SAS_TOKEN, or a service principal
    (AZURE_CLIENT_ID, AZURE_CLIENT_SECRET, AZURE_TENANT_ID), workload identity, managed
    identity (obstore reads the environment itself).  --endpoint overrides the blob
    endpoint (Azurite: http://127.0.0.1:10000/devstoreaccount1)."""
    cfg = _azure_connection_string()
    if opts.endpoint:
        cfg["endpoint"] = opts.endpoint.rstrip("/")
    if opts.no_sign_request:
        cfg["skip_signature"] = True
    return cfg


def _ca_bundle() -> str | None:
    """Extra trusted CA certificates (PEM) for https endpoints behind a private CA:
    AWS_CA_BUNDLE, else the profile's ca_bundle.  Added to the system roots."""
    path = os.environ.get("AWS_CA_BUNDLE") or _profile().get("ca_bundle")
    if not path:
        return None
    try:
        with open(os.path.expanduser(path)) as f:
            return f.read()
    except OSError as e:
        raise PcrfsError(f"CA bundle {path}: {e.strerror}") from None


_STATUS = re.compile(r"status code: (\d{3})")
_NO_RETRY = {400, 401, 403, 404, 405, 411, 412, 416, 501}   # 501: the server lacks the call


def _status(e: BaseException) -> int | None:
    m = _STATUS.search(str(e))
    return int(m.group(1)) if m else None


def _kind(e: BaseException) -> str:
    """A short, secret-free description of an obstore error."""
    st = _status(e)
    if st:
        return f"HTTP {st}"
    text = str(e).lower()
    for needle, what in (("kind: timeout", "timed out"), ("dns", "name resolution failed"),
                         ("error sending request", "connection failed"),
                         ("connection", "connection failed"), ("timed out", "timed out")):
        if needle in text:
            return what
    return type(e).__name__


def _config_problem(e: BaseException) -> str:
    text = str(e).split("\n")[0]
    m = re.search(r"(missing field `\w+`|Unable to \w+( \w+)*|not found|No such file)", text)
    return m.group(0) if m else type(e).__name__


class ObjectClient:
    """Blocking calls (run them in worker threads); thread-safe."""

    def __init__(self, url: str, opts: RemoteOptions | None = None, stats: Stats | None = None):
        from obstore.store import AzureStore, GCSStore, HTTPStore, S3Store

        self.opts = opts = opts or RemoteOptions()
        if opts.io_timeout <= 0:
            raise PcrfsError("--io-timeout must be positive")
        self.url = url.rstrip("/")
        self.stats = stats or Stats()
        self.attempt_timeout = max(opts.io_timeout / 3, 0.5)
        # the segments of one image go out at once; threads, since each call blocks
        self._pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="pcrfs-get")
        client = {"timeout": f"{self.attempt_timeout:.3f}s",
                  "connect_timeout": f"{min(self.attempt_timeout, 5.0):.3f}s",
                  "pool_idle_timeout": "30s"}
        no_retry = {"max_retries": 0}    # retries are ours (counted, bounded in time)
        ca = _ca_bundle()
        if ca:
            client["root_certificate"] = ca
        parts = urlsplit(self.url)
        if parts.scheme == "s3":
            if not parts.netloc:
                raise PcrfsError(f"{url}: no bucket (expected s3://bucket/prefix)")
            self.bucket, self.prefix = parts.netloc, parts.path.strip("/")
            cfg, plain_http = _s3_config(opts)
            if plain_http:
                client["allow_http"] = True
            self.endpoint = cfg.get("endpoint")
            self._store = S3Store(self.bucket, prefix=self.prefix or None, config=cfg,
                                  client_options=client, retry_config=no_retry)
        elif parts.scheme in ("gs", "az"):
            if not parts.netloc:
                what = "bucket" if parts.scheme == "gs" else "container"
                raise PcrfsError(f"{url}: no {what} (expected {parts.scheme}://{what}/prefix)")
            self.bucket, self.prefix = parts.netloc, parts.path.strip("/")
            if parts.scheme == "gs":
                cfg = _gcs_config(opts)
                self.endpoint = cfg.get("base_url")
                make = GCSStore
            else:
                cfg = _azure_config(opts)
                self.endpoint = cfg.get("endpoint")
                make = AzureStore
            if (self.endpoint or "").startswith("http://"):
                client["allow_http"] = True
            try:
                self._store = make(self.bucket, prefix=self.prefix or None, config=cfg,
                                   client_options=client, retry_config=no_retry)
            except Exception as e:  # noqa: BLE001 - obstore's configuration errors
                # obstore's text can quote a key file; name the problem only
                raise PcrfsError(f"{url}: cannot set up the {parts.scheme}:// client "
                                 f"({_config_problem(e)}); check {_CREDENTIAL_HINT[parts.scheme]}"
                                 ) from None
        elif parts.scheme in ("http", "https"):
            self.bucket, self.prefix, self.endpoint = parts.netloc, parts.path.strip("/"), None
            if parts.scheme == "http":
                client["allow_http"] = True
            self._store = HTTPStore(self.url, client_options=client, retry_config=no_retry)
        else:
            raise PcrfsError(f"{url}: not a remote dataset URL (s3://, gs://, az://, http://, "
                             f"https://)")
        self.scheme = parts.scheme if parts.scheme != "https" else "http"

    def describe(self, key: str = "") -> str:
        return f"{self.url}/{key}" if key else self.url

    # -- the retry policy ----------------------------------------------------------------
    def _failed(self, cause: str) -> None:
        self.stats.add(remote_errors=1)
        self.stats.count("remote_error_causes", cause)

    def _call(self, what: str, key: str, fn, deadline: float | None = None,
              op: str | None = None):
        if deadline is None:
            deadline = time.monotonic() + self.opts.io_timeout
        attempt = 0
        timer = self.stats.latency_of("backend", op or what.lower())
        while True:
            attempt += 1
            t = time.perf_counter()
            try:
                result = fn()
                timer.observe(time.perf_counter() - t)
                return result
            except Exception as e:  # noqa: BLE001 - obstore's classes, sorted below
                from obstore import exceptions as ox
                timer.observe(time.perf_counter() - t)
                st = _status(e)
                if isinstance(e, (FileNotFoundError, ox.NotFoundError)) or st == 404:
                    # not counted as an error: optional files are probed
                    raise RemoteNotFound(f"{self.describe(key)}: not found (HTTP 404)", 404) from None
                if not isinstance(e, (ox.BaseError, OSError)):
                    raise
                if isinstance(e, (ox.PermissionDeniedError, ox.UnauthenticatedError)) or st in (401, 403):
                    self._failed(f"HTTP {st or 403}")
                    raise RemoteAccessDenied(
                        f"{self.describe(key)}: access denied (HTTP {st or 403}); check "
                        f"{_CREDENTIAL_HINT[self.scheme]}", st or 403) from None
                if "invalidcertificate" in str(e).lower():
                    self._failed("untrusted certificate")
                    raise RemoteError(f"{what} {self.describe(key)}: the server's TLS certificate "
                                      f"is not trusted (AWS_CA_BUNDLE adds a private CA)") from None
                if st in _NO_RETRY:
                    self._failed(_kind(e))
                    raise RemoteError(f"{what} {self.describe(key)}: {_kind(e)}", st) from None
                delay = random.uniform(0, min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** attempt))
                left = deadline - time.monotonic()
                if left < delay + self.attempt_timeout:
                    self._failed(_kind(e))
                    raise RemoteUnavailable(
                        f"{what} {self.describe(key)}: {_kind(e)}; gave up after {attempt} "
                        f"attempts ({self.opts.io_timeout:g} s --io-timeout)", st) from None
                self.stats.add(remote_retries=1)
                self.stats.count("remote_retry_causes", _kind(e))
                log.debug("%s %s: %s, retry %d in %.2f s", what, self.describe(key), _kind(e),
                          attempt, delay)
                time.sleep(delay)

    def _count(self, fn, *args):
        self.stats.add(remote_requests=1)
        return fn(self._store, *args)

    # -- reads ---------------------------------------------------------------------------
    def get(self, key: str) -> bytes:
        import obstore

        def fetch():
            self.stats.add(remote_requests=1)
            return bytes(obstore.get(self._store, key).bytes())
        data = self._call("GET", key, fetch)
        self.stats.add(remote_bytes=len(data))
        return data

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """[start, end) ranges, fetched concurrently, one GET each, each retried on its own
        within one shared deadline (callers coalesce adjacent ranges first; ranges with
        gaps are never merged, so no byte is read that was not asked for).  A range past
        the end of the object comes back short."""
        deadline = time.monotonic() + self.opts.io_timeout
        if len(ranges) <= 1:
            return [self._get_range(key, s, e, deadline) for s, e in ranges]
        futures = [self._pool.submit(self._get_range, key, s, e, deadline) for s, e in ranges]
        return [f.result() for f in futures]

    def _get_range(self, key: str, start: int, end: int, deadline: float) -> bytes:
        import obstore

        def fetch():
            self.stats.add(remote_requests=1)
            return bytes(obstore.get_range(self._store, key, start=start, end=end))
        try:
            data = self._call("GET", key, fetch, deadline, op="ranged_get")
        except RemoteError as e:
            if e.status == 416:    # the object is shorter than the index says
                raise CorruptDataError(f"{self.describe(key)} is shorter than its index "
                                       f"(HTTP 416)") from None
            raise
        self.stats.add(remote_bytes=len(data))
        return data

    def download(self, key: str, path: str, chunk: int = DOWNLOAD_CHUNK) -> int:
        """The object into a local file, in ranged GETs of `chunk` bytes, each retried on
        its own (a large index neither sits in memory nor races one request time-out)."""
        size = self.head(key)
        if size is None:
            raise RemoteNotFound(f"{self.describe(key)}: not found (HTTP 404)", 404)
        with open(path, "wb") as f:
            for off in range(0, size, chunk):
                (data,) = self.get_ranges(key, [(off, min(off + chunk, size))])
                if len(data) != min(chunk, size - off):
                    raise RemoteError(f"GET {self.describe(key)}: short read (object changed?)")
                f.write(data)
        return size

    def head(self, key: str) -> int | None:
        """Object size, or None if there is none."""
        import obstore
        try:
            return int(self._call("HEAD", key, lambda: self._count(obstore.head, key))["size"])
        except RemoteNotFound:
            return None

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        import obstore
        for batch in self._call("LIST", prefix,
                                lambda: list(self._count(obstore.list, prefix or None))):
            for m in batch:
                yield m["path"], int(m["size"])

    # -- writes (push) ------------------------------------------------------------------
    def put_file(self, key: str, path: str) -> None:
        import obstore
        # a Path is uploaded from disk, in parts when large
        self._call("PUT", key, lambda: self._count(obstore.put, key, Path(path)))

    def put_bytes(self, key: str, data: bytes) -> None:
        import obstore
        self._call("PUT", key, lambda: self._count(obstore.put, key, data))

    def delete(self, key: str) -> None:
        import obstore
        try:
            self._call("DELETE", key, lambda: self._count(obstore.delete, key))
        except RemoteNotFound:
            pass
