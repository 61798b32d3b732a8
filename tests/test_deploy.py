"""deploy/: the Kubernetes manifests validated offline against the API's schemas
(kubernetes-validate bundles them), the node plugin's Dockerfile linted (hadolint), and
both kept consistent with the plugin they deploy.  No cluster runs here: docs/KUBERNETES.md
says how a cluster test would go."""
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from pcrfs.csi.plugin import NAME

from conftest import REPO

DEPLOY = REPO / "deploy"
K8S_VERSION = "1.31.0"       # the oldest minor still supported upstream


def tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is not installed (make setup installs the test extra)"
    return found


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def validate(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([tool("kubernetes-validate"), "-k", K8S_VERSION, "--strict",
                           *map(str, paths)], capture_output=True, text=True)


def test_every_manifest_passes_the_api_schemas_strictly(tmp_path):
    manifests = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
    assert {p.name for p in manifests} == {"csidriver.yaml", "daemonset.yaml", "example.yaml",
                                           "rbac.yaml"}
    r = validate(*manifests)
    assert r.returncode == 0, r.stdout + r.stderr
    kinds = {d["kind"] for p in manifests for d in docs(p)}
    assert kinds == {"CSIDriver", "DaemonSet", "ServiceAccount", "ClusterRole",
                     "ClusterRoleBinding", "PersistentVolume", "PersistentVolumeClaim", "Pod"}
    # the validator rejects what the API server would: a misspelt field
    bad = tmp_path / "bad.yaml"
    bad.write_text((DEPLOY / "kubernetes" / "csidriver.yaml").read_text()
                   .replace("attachRequired", "attachRequird"))
    assert validate(bad).returncode != 0


def test_manifests_name_the_plugin_they_deploy():
    (driver,) = docs(DEPLOY / "kubernetes" / "csidriver.yaml")
    assert driver["metadata"]["name"] == NAME
    assert driver["spec"]["attachRequired"] is False      # a node plugin only
    (ds,) = docs(DEPLOY / "kubernetes" / "daemonset.yaml")
    pod = ds["spec"]["template"]["spec"]
    plugin, registrar = pod["containers"]
    assert plugin["args"][0] == "csi" and plugin["securityContext"]["privileged"] is True
    sock = plugin["args"][plugin["args"].index("--endpoint") + 1]
    assert sock == "unix:///csi/csi.sock"
    assert f"/var/lib/kubelet/plugins/{NAME}/csi.sock" in " ".join(registrar["args"])
    mounts = {m["name"]: m for m in plugin["volumeMounts"]}
    assert mounts["kubelet"]["mountPropagation"] == "Bidirectional"   # mounts reach pods
    assert {"fuse", "socket-dir", "state"} <= set(mounts)
    # on every node, tainted GPU nodes included
    assert {"operator": "Exists"} in pod["tolerations"]
    rbac = docs(DEPLOY / "kubernetes" / "rbac.yaml")
    assert pod["serviceAccountName"] in {d["metadata"]["name"] for d in rbac
                                         if d["kind"] == "ServiceAccount"}
    pv, pvc, example = docs(DEPLOY / "kubernetes" / "example.yaml")
    assert pv["spec"]["csi"]["driver"] == NAME and pv["spec"]["csi"]["readOnly"] is True
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pv["spec"]["accessModes"] == ["ReadOnlyMany"]
    script = example["spec"]["containers"][0]["args"][0]
    assert 'ImageFolder("/data/q5"' in script
    vol = example["spec"]["volumes"][0]["persistentVolumeClaim"]
    assert vol["claimName"] == pvc["metadata"]["name"]


def test_the_dockerfile_passes_hadolint(tmp_path):
    lint = [tool("hadolint"), "--config", str(DEPLOY / ".hadolint.yaml")]
    r = subprocess.run([*lint, str(DEPLOY / "Dockerfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    text = (DEPLOY / "Dockerfile").read_text()
    # tini is PID 1 (it reaps the volumes' supervisors: tests/test_csi.py runs the plugin
    # under it too)
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "pcrfs"]' in text and '".[csi]"' in text
    assert " tini" in text
    # the linter is live: an apt-get install that keeps recommends is flagged
    bad = tmp_path / "Dockerfile"
    bad.write_text(text.replace("--no-install-recommends ", ""))
    r = subprocess.run([*lint, str(bad)], capture_output=True, text=True)
    assert r.returncode != 0 and "DL3015" in r.stdout


def _mebibytes(q: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "K": 1e3 / 2**20, "M": 1e6 / 2**20,
             "G": 1e9 / 2**20}
    for u in sorted(units, key=len, reverse=True):
        if q.endswith(u):
            return float(q[: -len(u)]) * units[u]
    return float(q) / 2**20


PLUGIN_MI, PER_VOLUME_MI = 256, 384     # docs/KUBERNETES.md's sizing rule


def test_the_plugin_container_holds_its_volumes_daemons():
    """The daemons live in the plugin container's cgroup: its memory request and limit
    follow the rule for example.yaml's volumes (their cacheSize, in pcrfs's units)."""
    from pcrfs.storage.throttle import parse_size
    (ds,) = docs(DEPLOY / "kubernetes" / "daemonset.yaml")
    res = ds["spec"]["template"]["spec"]["containers"][0]["resources"]
    volumes = [d for d in docs(DEPLOY / "kubernetes" / "example.yaml")
               if d["kind"] == "PersistentVolume"]
    need = PLUGIN_MI + sum(parse_size(v["spec"]["csi"]["volumeAttributes"]["cacheSize"]) / 2**20
                           + PER_VOLUME_MI for v in volumes)
    assert _mebibytes(res["requests"]["memory"]) >= need
    assert res["limits"]["memory"] == res["requests"]["memory"]
    doc = (REPO / "docs" / "KUBERNETES.md").read_text()
    assert f"{PLUGIN_MI}Mi" in doc and f"cacheSize + {PER_VOLUME_MI}Mi" in doc


def test_kubelet_dir_rewrites_every_kubelet_path(tmp_path):
    root = "/var/snap/microk8s/common/var/lib/kubelet"
    r = subprocess.run([str(DEPLOY / "kubernetes" / "kubelet-dir.sh"), root],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "/var/lib/kubelet" not in r.stdout.replace(root, "")
    out = tmp_path / "microk8s.yaml"
    out.write_text(r.stdout)
    v = validate(out)
    assert v.returncode == 0, v.stdout + v.stderr
    (ds,) = [d for d in docs(out) if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert paths["kubelet"] == root and paths["socket-dir"].startswith(root + "/plugins/")
    plugin, registrar = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
    assert mounts["kubelet"] == root           # pods' target paths, as kubelet names them
    assert f"--kubelet-registration-path={root}/plugins/" in " ".join(registrar["args"])
    bad = subprocess.run([str(DEPLOY / "kubernetes" / "kubelet-dir.sh"), "relative/dir"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "absolute" in bad.stderr
