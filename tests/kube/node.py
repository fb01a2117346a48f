"""Tier 3: a real single-node Kubernetes cluster on this host.

Tier 2's control plane (etcd, kube-apiserver, controller-manager, scheduler) plus what runs real
pods: a containerd of its own with the CRI plugin and runc, Debian's CNI plugins (a bridge with
host-local addresses, portmap, firewall), a kubelet and kube-proxy from the same Kubernetes
release, CoreDNS, a storage provisioner (rancher's local-path-provisioner) and a NetworkPolicy
enforcer. Images come from the local Docker engine (``scripts/build-images.sh``); no registry is
reached. ``shared/notes/real-cluster.md`` has the facts behind each setting.

It needs root, Linux and a few Debian packages (:data:`PACKAGES`, installed when missing). Every
change to the host is written down first (:class:`~.host.HostLedger`) and undone at ``stop()``,
or by the next run if this one was killed. One node runs per host at a time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .controlplane import (
    POD_CIDR,
    REPO_ROOT,
    SERVICE_CIDR,
    TIER1_FILES,
    ControlPlane,
    ControlPlaneError,
    KubeCluster,
    _free_ports,
    _Http,
    _node_ready,
    _Pki,
    _Process,
    _wait_for,
)
from .host import CGROUP_FS, HostError, HostLedger, iptables_tables, run

NODE_NAME = "tether-node"
BRIDGE = "tether0"
NODE_IP = "10.244.0.1"
POD_SUBNET = "10.244.0.0/24"
CLUSTER_DNS = "10.0.0.10"
CGROUP_ROOT = "tether-node"
STORAGE_CLASS = "local-path"
NFT_TABLE = "tether-node"
#: The node's data dirs (and so its processes' command lines) carry this: tier 1 and 2 do not.
NODE_DATA_PREFIX = "tether-kube-node-"
#: Debian packages the node uses, by the command that tells they are there.
PACKAGES = {
    "containerd": "containerd",
    "runc": "runc",
    "/usr/lib/cni/bridge": "containernetworking-plugins",
    "iptables": "iptables",
    "ipset": "ipset",
    "nft": "nftables",
    "conntrack": "conntrack",
    "ip": "iproute2",
    "dockerd": "docker.io",  # the engine: a machine may carry the docker client alone
}
NODE_BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-node.sh"
NODE_FILES = ("kubelet", "kube-proxy", "local-path-provisioner", "kube-router")
#: Sysctls that kubelet, kube-proxy and the node set; restored at stop.
SYSCTLS = (
    "net.ipv4.ip_forward",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.ipv4.conf.all.route_localnet",
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
)


def check_host() -> list[str]:
    """What this host lacks to run a node, in words; empty when nothing."""
    problems = []
    if os.name != "posix" or not Path("/proc/sys").is_dir():
        problems.append("a Linux host")
    elif os.geteuid() != 0:
        problems.append("root (the kubelet, containerd and CNI change the host's network)")
    if not (CGROUP_FS / "memory").is_dir() and not (CGROUP_FS / "cgroup.controllers").exists():
        problems.append("cgroups mounted at /sys/fs/cgroup")
    return problems


def install_packages(packages: Mapping[str, str] = PACKAGES) -> None:
    """apt-get the Debian packages (by the command that tells they are there) that are missing."""
    missing = sorted(
        {
            package
            for probe, package in packages.items()
            if not (Path(probe).exists() if probe.startswith("/") else shutil.which(probe))
        }
    )
    if not missing:
        return
    if not shutil.which("apt-get"):
        raise HostError(f"missing {', '.join(missing)} and no apt-get to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise HostError(f"{' '.join(argv)} failed: {result.stderr.strip()[-2000:]}")


def node_bin_dir() -> Path:
    """kubelet, kube-proxy and the add-ons, built on first use by scripts/build-node.sh."""
    result = subprocess.run(
        ["bash", str(NODE_BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
    )
    if result.returncode != 0:
        raise ControlPlaneError(f"{NODE_BUILD_SCRIPT} failed ({result.returncode}); see above")
    path = Path(result.stdout.strip().splitlines()[-1])
    missing = [name for name in NODE_FILES if not (path / name).exists()]
    if missing:
        raise ControlPlaneError(f"{path} lacks {', '.join(missing)} after {NODE_BUILD_SCRIPT}")
    return path


class KubeNode(KubeCluster):
    """Tier 3: tier 2 without kwok, plus one real node. ``with KubeNode(images) as cp: ...``.

    ``images`` maps a role to a local Docker image: ``pause`` (the sandbox), ``coredns`` and
    ``base`` (local-path-provisioner's helper pods need ``sh``) are required; every other image
    in it is loaded into the node's containerd too. Pods find them by the same name.
    """

    required: tuple[str, ...] = (*TIER1_FILES, "kube-controller-manager", "kube-scheduler")
    api_host = NODE_IP
    data_dir_prefix = NODE_DATA_PREFIX

    def __init__(
        self,
        images: Mapping[str, str],
        *,
        node_bin: Path | None = None,
        start_timeout: float = 240.0,
        stop_grace: float = 10.0,
        keep_data_dir: bool | None = None,
    ) -> None:
        super().__init__(
            start_timeout=start_timeout, stop_grace=stop_grace, keep_data_dir=keep_data_dir
        )
        missing = [role for role in ("pause", "coredns", "base") if role not in images]
        if missing:
            raise ControlPlaneError(f"KubeNode needs images for {', '.join(missing)}")
        self.images = dict(images)
        self._node_bin = node_bin
        self._ledger = HostLedger()
        self._ledger_exit: Any = None
        self._control_plane_processes = 0
        self.containerd_socket: Path | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        if self._plane is not None:
            return self._plane
        problems = check_host()
        if problems:
            raise HostError("a real node needs " + " and ".join(problems))
        install_packages()
        if self._node_bin is None:
            self._node_bin = node_bin_dir()
        held = self._ledger.held()
        held.__enter__()
        self._ledger_exit = held.__exit__
        try:
            self._prepare_host()
        except BaseException:
            self._release_host()
            raise
        return super().start()

    def stop(self) -> None:
        try:
            # The node first: its processes, then what they left on the host (containers,
            # mounts, network namespaces, rules); the control plane and data dir after that.
            while len(self._processes) > self._control_plane_processes:
                self._processes.pop().stop(self.stop_grace)
            self._keep_logs()
            self._release_host()
        finally:
            super().stop()

    def _start(self, binaries: Path, data: Path) -> ControlPlane:
        # Recorded first, undone last: the data dir goes once nothing is mounted in it.
        self._ledger.record("path", path=str(data))
        self._ledger.record("mounts", under=str(data))
        return super()._start(binaries, data)

    def _spawn(
        self, name: str, argv: Sequence[str], log_dir: Path, env: dict[str, str] | None = None
    ) -> _Process:
        # Every process, the control plane's too: a killed run's orphans are found by pid.
        process = super()._spawn(name, argv, log_dir, env)
        self._ledger.track_process(process.popen.pid)
        return process

    def _keep_logs(self) -> None:
        """The components' and pods' logs, copied out of the data dir that the ledger removes."""
        data = self._data_dir
        if data is None or not (self._failed or self.keep_data_dir):
            return
        target = Path(tempfile.mkdtemp(prefix="tether-kube-node-logs-"))
        for source in (data / "logs", data / "node" / "pod-logs"):
            if source.is_dir():
                shutil.copytree(source, target / source.name, symlinks=True)
        print(f"real node logs kept in {target}")

    def _release_host(self) -> None:
        if self._ledger_exit is not None:
            exit_, self._ledger_exit = self._ledger_exit, None
            exit_(None, None, None)

    # -- the host ------------------------------------------------------------------------------

    def _prepare_host(self) -> None:
        ledger = self._ledger
        ledger.keep_sysctls(SYSCTLS)
        ledger.record("conntrack", cidrs=[POD_CIDR, SERVICE_CIDR])
        # Undone newest first: the rules go before the ipsets they use (a set in use stays).
        ledger.record("ipsets", prefixes=["KUBE-", "kube-router-", "inet:kube-router"])
        ledger.record("iptables", tables=iptables_tables())
        ledger.record("nft_table", family="inet", name=NFT_TABLE)
        for directory in (
            "/run/netns",
            "/var/log/containers",
            "/var/lib/cni",  # on a fresh host the plugins make `results` too
            "/var/lib/cni/results",
            "/run/containerd/s",
        ):
            ledger.track_new_entries(directory)
        ledger.set_sysctl("net.ipv4.ip_forward", "1")
        ledger.set_sysctl("net.bridge.bridge-nf-call-iptables", "1")
        # The bridge exists before anything binds to its address (the API server does).
        ledger.record("link", name=BRIDGE)
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
        run("ip", "link", "set", BRIDGE, "up")

    # -- hooks of the lower tiers ----------------------------------------------------------------

    def _kubelet_client_args(self, pki: _Pki) -> list[str]:
        return [
            f"--kubelet-client-certificate={pki.kubelet_client_cert}",
            f"--kubelet-client-key={pki.kubelet_client_key}",
            # The node's name is in no DNS: logs, exec and port-forward dial its address.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
        ]

    def _controller_manager_args(self) -> list[str]:
        return [
            "--allocate-node-cidrs=true",
            f"--cluster-cidr={POD_CIDR}",
            "--node-cidr-mask-size=24",
        ]

    def _start_more(self, plane: ControlPlane, pki: _Pki, logs: Path, deadline: float) -> None:
        assert self._node_bin is not None
        self._control_plane_processes = len(self._processes)
        node = plane.data_dir / "node"
        node.mkdir()
        self._start_controllers(plane, pki, logs, deadline)
        self._control_plane_processes = len(self._processes)
        self._ledger.record("cgroup", name=CGROUP_ROOT)
        for hierarchy in CGROUP_FS.iterdir():
            if (hierarchy / "cgroup.procs").exists():
                (hierarchy / CGROUP_ROOT).mkdir(exist_ok=True)
        self._guard_network()
        self._start_containerd(node, logs, deadline)
        self._load_images(deadline)
        self._start_kubelet(plane, pki, node, logs, deadline)
        self._start_kube_proxy(plane, node, logs, deadline)
        self._start_network_policies(plane, logs, deadline)
        self._start_storage(plane, node, logs)
        self._start_dns(plane, deadline)

    # -- containerd ----------------------------------------------------------------------------

    def _start_containerd(self, node: Path, logs: Path, deadline: float) -> None:
        root = node / "containerd"
        socket = root / "containerd.sock"
        cni_conf = node / "cni"
        cni_conf.mkdir(parents=True)
        # The firewall plugin opens FORWARD for each pod (Docker sets its policy to DROP).
        (cni_conf / "10-tether.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "tether-node",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": BRIDGE,
                            "isGateway": True,
                            "ipMasq": True,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(node / "cni-ipam"),
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                        {"type": "firewall", "backend": "iptables"},
                    ],
                },
                indent=1,
            )
        )
        pause = _containerd_ref(self.images["pause"])
        config = root / "config.toml"
        root.mkdir(exist_ok=True)
        config.write_text(
            f"""version = 2
root = "{root / "root"}"
state = "{root / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # root here lacks CAP_SYS_RESOURCE: runc may not lower oom_score_adj below its own.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{root / "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni_conf}"
"""
        )
        # Shims leave containerd's process group: found by the socket in their command line.
        self._ledger.record("processes_matching", needle=str(socket))
        self._spawn("containerd", ["containerd", f"--config={config}"], logs)
        self.containerd_socket = socket
        _wait_for(
            "containerd's socket",
            lambda: self._ctr("version", check=False).returncode == 0,
            deadline=deadline,
            watch=self._processes,
        )

    def _ctr(
        self, *args: str, check: bool = True, stdin: Any = None
    ) -> subprocess.CompletedProcess[str]:
        assert self.containerd_socket is not None
        result = subprocess.run(
            ["ctr", f"--address={self.containerd_socket}", "--namespace=k8s.io", *args],
            stdin=stdin,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def _load_images(self, deadline: float) -> None:
        """docker save | ctr import, all images in one stream."""
        refs = sorted(set(self.images.values()))
        save = subprocess.Popen(["docker", "save", *refs], stdout=subprocess.PIPE)
        try:
            self._ctr("images", "import", "--no-unpack", "-", stdin=save.stdout)
        finally:
            assert save.stdout is not None
            save.stdout.close()
            if save.wait() != 0:
                raise ControlPlaneError(f"docker save {' '.join(refs)} failed")

    def load_image(self, image: str) -> None:
        """Load one more local Docker image into the node (as `kind load docker-image` does)."""
        self.images[image] = image
        self._load_images(time.monotonic() + 120)

    # -- kubelet and kube-proxy -----------------------------------------------------------------

    def _start_kubelet(
        self, plane: ControlPlane, pki: _Pki, node: Path, logs: Path, deadline: float
    ) -> None:
        assert self._node_bin is not None and self.containerd_socket is not None
        port, healthz = _free_ports(2)
        config = node / "kubelet.yaml"
        # JSON is YAML; the kubelet reads either.
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubelet.config.k8s.io/v1beta1",
                    "kind": "KubeletConfiguration",
                    "address": NODE_IP,
                    "port": port,
                    "readOnlyPort": 0,
                    "healthzBindAddress": "127.0.0.1",
                    "healthzPort": healthz,
                    "authentication": {
                        "anonymous": {"enabled": False},
                        "webhook": {"enabled": True},
                        "x509": {"clientCAFile": str(pki.ca_cert)},
                    },
                    "authorization": {"mode": "Webhook"},
                    # cgroup v1 here: kubelet 1.36 refuses it unless told otherwise.
                    "failCgroupV1": False,
                    "cgroupDriver": "cgroupfs",
                    "cgroupRoot": f"/{CGROUP_ROOT}",
                    "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
                    "clusterDNS": [CLUSTER_DNS],
                    "clusterDomain": "cluster.local",
                    "resolvConf": "/etc/resolv.conf",
                    "podLogsDir": str(node / "pod-logs"),
                    "failSwapOn": False,
                    "serializeImagePulls": False,
                    # A busy build disk must not evict the e2e's pods or GC its images.
                    "evictionHard": {
                        "memory.available": "100Mi",
                        "nodefs.available": "1%",
                        "imagefs.available": "1%",
                        "nodefs.inodesFree": "1%",
                    },
                    "imageGCHighThresholdPercent": 100,
                    "imageGCLowThresholdPercent": 99,
                    "nodeStatusUpdateFrequency": "4s",
                },
                indent=1,
            )
        )
        self._spawn(
            "kubelet",
            [
                str(self._node_bin / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={plane.kubeconfig}",
                f"--root-dir={node / 'kubelet'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                "--v=1",
            ],
            logs,
        )
        api = self._api
        assert api is not None
        _wait_for(
            f"Node {NODE_NAME} Ready",
            lambda: _node_ready(api, NODE_NAME),
            deadline=deadline,
            watch=self._processes,
        )

    def _start_kube_proxy(
        self, plane: ControlPlane, node: Path, logs: Path, deadline: float
    ) -> None:
        assert self._node_bin is not None
        healthz, metrics = _free_ports(2)
        config = node / "kube-proxy.yaml"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                    "kind": "KubeProxyConfiguration",
                    "clientConnection": {"kubeconfig": str(plane.kubeconfig)},
                    "mode": "iptables",
                    "hostnameOverride": NODE_NAME,
                    "bindAddress": NODE_IP,
                    "clusterCIDR": POD_CIDR,
                    "healthzBindAddress": f"127.0.0.1:{healthz}",
                    "metricsBindAddress": f"127.0.0.1:{metrics}",
                    # Leave the host's conntrack table and route_localnet alone.
                    "conntrack": {
                        "maxPerCore": 0,
                        "min": 0,
                        "tcpEstablishedTimeout": "0s",
                        "tcpCloseWaitTimeout": "0s",
                    },
                    "iptables": {"localhostNodePorts": False},
                },
                indent=1,
            )
        )
        self._spawn("kube-proxy", [str(self._node_bin / "kube-proxy"), f"--config={config}"], logs)
        health = _Http(f"http://127.0.0.1:{healthz}", None, None)
        _wait_for(
            "kube-proxy /healthz",
            lambda: health.ok("/healthz"),
            deadline=deadline,
            watch=self._processes,
        )

    # -- add-ons --------------------------------------------------------------------------------

    def _start_network_policies(self, plane: ControlPlane, logs: Path, deadline: float) -> None:
        """kube-router, firewall only: NetworkPolicies as iptables rules and ipsets. (The
        NFQUEUE-based kube-network-policies needs nftables' queue, which this kernel lacks.)"""
        assert self._node_bin is not None
        (health,) = _free_ports(1)
        self._spawn(
            "kube-router",
            [
                str(self._node_bin / "kube-router"),
                f"--kubeconfig={plane.kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                "--run-firewall=true",
                "--run-router=false",
                "--run-service-proxy=false",
                "--enable-cni=false",
                "--enable-ipv6=false",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--health-port={health}",
            ],
            logs,
        )
        checks = _Http(f"http://127.0.0.1:{health}", None, None)
        _wait_for(
            "kube-router /healthz",
            lambda: checks.ok("/healthz"),
            deadline=deadline,
            watch=self._processes,
        )

    def _start_storage(self, plane: ControlPlane, node: Path, logs: Path) -> None:
        """rancher's local-path-provisioner (kind's default storage) as a host process: a PVC
        becomes a directory under the node's data dir, made and removed by helper pods."""
        assert self._node_bin is not None
        volumes = node / "local-path"
        volumes.mkdir()
        config = node / "local-path-config.json"
        config.write_text(
            json.dumps(
                {
                    "nodePathMap": [
                        {"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": [str(volumes)]}
                    ]
                }
            )
        )
        helper_pod = node / "local-path-helper-pod.yaml"
        helper_pod.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "helper-pod"},
                    "spec": {
                        "containers": [
                            {
                                "name": "helper-pod",
                                "image": _containerd_ref(self.images["base"]),
                                "imagePullPolicy": "Never",
                            }
                        ]
                    },
                }
            )
        )
        namespace, account = "local-path-storage", "local-path-provisioner-service-account"
        apply(plane, local_path_manifests(namespace, account))
        self._spawn(
            "local-path-provisioner",
            [
                str(self._node_bin / "local-path-provisioner"),
                "start",
                f"--kubeconfig={plane.kubeconfig}",
                f"--namespace={namespace}",
                f"--service-account-name={account}",
                f"--config={config}",
                f"--helper-pod-file={helper_pod}",
                "--configmap-name=local-path-config",
            ],
            logs,
        )

    def _start_dns(self, plane: ControlPlane, deadline: float) -> None:
        apply(plane, coredns_manifests(_containerd_ref(self.images["coredns"])))
        _wait_for(
            "CoreDNS Ready",
            lambda: deployment_available(plane, "kube-system", "coredns"),
            deadline=deadline,
            watch=self._processes,
        )

    def _guard_network(self) -> None:
        """Two rules of the node's own, in an nftables table that sees pods' packets before any
        iptables rule (kube-router's accept comes first there):

        - a connection to a ClusterIP that kube-proxy has not programmed yet is refused, as a
          real cluster's network would; otherwise it leaves by the default route, where these
          machines have a transparent proxy that answers anything (Restate pooled such a
          connection and got HTTP 404 from every registration after);
        - each new connection a pod opens to anything outside the cluster is recorded (pod
          address, peer, protocol, port) in the set ``attempts``; nothing is blocked.
        """
        script = f"""
table inet {NFT_TABLE} {{
  set attempts {{
    type ipv4_addr . ipv4_addr . inet_proto . inet_service
    flags dynamic
    size 4096
  }}
  chain forward {{
    type filter hook forward priority -10; policy accept;
    ip saddr {POD_CIDR} ip daddr {SERVICE_CIDR} ct status ! dnat reject
    ip saddr {POD_CIDR} ip daddr != {{ {POD_CIDR}, {SERVICE_CIDR} }} ct state new \\
      add @attempts {{ ip saddr . ip daddr . meta l4proto . th dport }}
  }}
}}
"""
        run("nft", "-f", "-", input=script)

    def kill_container(self, namespace: str, pod: str, container: str) -> None:
        """SIGKILL a container's main process, as an OOM kill or a crash would: no grace, the
        pod stays and the kubelet restarts the container."""
        status = json.loads(
            self.control_plane.kubectl("-n", namespace, "get", "pod", pod, "-o", "json").stdout
        )["status"]
        (found,) = [c for c in status["containerStatuses"] if c["name"] == container]
        container_id = found["containerID"].split("://", 1)[1]
        self._ctr("tasks", "kill", "--signal", "SIGKILL", container_id)

    def outside_attempts(self) -> list[str]:
        """Every connection a pod opened to something outside the cluster, in words; a lookup
        of an outside name shows as the name and who asked (CoreDNS's log)."""
        plane = self.control_plane
        pods = json.loads(plane.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
        by_ip = {
            p["status"].get("podIP"): f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            for p in pods
        }
        listing = json.loads(run("nft", "-j", "list", "set", "inet", NFT_TABLE, "attempts"))
        attempts = []
        for item in listing["nftables"]:
            for element in item.get("set", {}).get("elem", []):
                source, destination, protocol, port = element.get("elem", element)["concat"]
                who = by_ip.get(source, source)
                attempts.append(f"{who} -> {destination}:{port}/{protocol}")
                if who.startswith("kube-system/coredns-") and port == 53:
                    attempts += _outside_lookups(plane, who, by_ip)
        return attempts


def _outside_lookups(plane: ControlPlane, coredns: str, by_ip: dict[str, str]) -> list[str]:
    """The outside names CoreDNS was asked for, and by which pod (its `log` plugin's lines:
    `[INFO] <ip>:<port> - <id> "A IN api.github.com. udp ..."`)."""
    namespace, name = coredns.split("/")
    log = plane.kubectl("-n", namespace, "logs", name, check=False).stdout
    found = set()
    for match in re.finditer(r'\[INFO\] ([0-9.]+):\d+ - \d+ "(\S+) IN (\S+) ', log):
        client, kind, looked_up = match.groups()
        found.add(f"  {by_ip.get(client, client)} looked up {looked_up} ({kind})")
    return sorted(found)


def _containerd_ref(image: str) -> str:
    """The name containerd gives a Docker image (``tether:e2e`` -> docker.io/library/...)."""
    name = image
    first = name.split("/", 1)[0]
    if "/" not in name or ("." not in first and ":" not in first and first != "localhost"):
        name = f"docker.io/{name}" if "/" in name else f"docker.io/library/{name}"
    return name


def apply(plane: ControlPlane, manifests: Sequence[dict[str, Any]]) -> None:
    document = {"apiVersion": "v1", "kind": "List", "items": list(manifests)}
    plane.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(document))


def deployment_available(plane: ControlPlane, namespace: str, name: str) -> bool:
    result = plane.kubectl("-n", namespace, "get", "deployment", name, "-o", "json", check=False)
    if result.returncode != 0:
        return False
    status = json.loads(result.stdout).get("status", {})
    return bool(status.get("availableReplicas", 0) >= 1)


def local_path_manifests(namespace: str, account: str) -> list[dict[str, Any]]:
    """The namespace of the provisioner's helper pods, their account, the scripts they run,
    and the default StorageClass (as on kind: bound when the first pod uses the claim)."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": account, "namespace": namespace},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "local-path-config", "namespace": namespace},
            "data": {
                "setup": '#!/bin/sh\nset -eu\nmkdir -m 0777 -p "$VOL_DIR"\n',
                "teardown": '#!/bin/sh\nset -eu\nrm -rf "$VOL_DIR"\n',
            },
        },
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": "rancher.io/local-path",
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete",
        },
    ]


def coredns_manifests(image: str) -> list[dict[str, Any]]:
    """kubeadm's CoreDNS, listening on 1053 so it needs no capability (the Service maps 53)."""
    labels = {"k8s-app": "kube-dns"}
    # kubeadm's Corefile, split in two: names outside the cluster are answered by a block of
    # their own that logs each query, so the e2e can say who looked up what outside. No `loop`
    # plugin: its probe is a lookup of a random name upstream (the upstream is not CoreDNS).
    corefile = """cluster.local:1053 in-addr.arpa:1053 ip6.arpa:1053 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       ttl 30
    }
    prometheus :9153
    cache 30
    reload
    loadbalance
}
.:1053 {
    errors
    log
    forward . /etc/resolv.conf
    cache 30
    reload
}
"""
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
            "data": {"Corefile": corefile},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "coredns", "namespace": "kube-system", "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "dnsPolicy": "Default",
                        "priorityClassName": "system-cluster-critical",
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": 65532,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "containers": [
                            {
                                "name": "coredns",
                                "image": image,
                                "imagePullPolicy": "Never",
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"name": "dns", "containerPort": 1053, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": 1053},
                                    {"name": "metrics", "containerPort": 9153},
                                ],
                                "readinessProbe": {
                                    "httpGet": {"path": "/ready", "port": 8181},
                                    "periodSeconds": 1,
                                },
                                "livenessProbe": {
                                    "httpGet": {"path": "/health", "port": 8080},
                                    "periodSeconds": 10,
                                },
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
            "spec": {
                "selector": labels,
                "clusterIP": CLUSTER_DNS,
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": 1053, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": 1053, "protocol": "TCP"},
                ],
            },
        },
    ]


__all__ = ["NODE_IP", "NODE_NAME", "PACKAGES", "KubeNode", "check_host", "install_packages"]
